"""The trainer's side of the experience stream: a Redis consumer group with at-least-once
delivery, acknowledged only once the training step that used an entry is committed.

The orchestrator ``XADD``s one entry per finished GRPO group
(:class:`rollout_service.experience.ExperienceStream`). :class:`ExperienceConsumer` reads them
with ``XREADGROUP`` as one named consumer of one group:

- :meth:`~ExperienceConsumer.read` hands out, first, this consumer's own pending entries
  (delivered to a previous incarnation that crashed before ``XACK``; ``redelivered=True``),
  then new ones (``>``). The caller ``ack``s them after its checkpoint is written, so a crash
  anywhere re-delivers; group ids in the checkpoint make training on them idempotent.
- A malformed entry is copied to the dead-letter stream ``<stream><dead_letter_suffix>`` with
  the error text and acknowledged in one ``MULTI``; training never stops on one bad entry.
- An entry trimmed from the stream (``MAXLEN ~``) while pending comes back with no fields: it
  is acknowledged and counted as lost.
- Redis connection errors (a server restarting, loading its AOF) are retried with backoff for
  ``retry_s``, then :class:`StreamUnavailable` names the URL (password redacted). A consumer
  group lost with the server's data is created again (``NOGROUP``).

Single consumer name, single reader: one :class:`ExperienceConsumer` object per consumer name
at a time (a restarted trainer replaces the crashed one; it does not run beside it).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import redis
from prometheus_client import CollectorRegistry, Counter, Gauge
from redis.backoff import NoBackoff
from redis.retry import Retry

from consolerl.config import AtLeast, Checked, NonEmpty
from consolerl.errors import ConfigError, ConsoleRLError
from rollout_service.experience import StreamConfig
from consolerl.experience import Group, decode_group

log = logging.getLogger(__name__)

T = TypeVar("T")

# Errors that mean "the server is not there right now" (BusyLoadingError, a server loading its
# AOF after a restart, is a ConnectionError in redis-py).
_TRANSIENT = (redis.ConnectionError, redis.TimeoutError)


class StreamError(ConsoleRLError, RuntimeError):
    """The experience stream's Redis answered with an error (wrong key type, ...)."""


class StreamUnavailable(StreamError, ConnectionError):
    """Redis at ``url`` stayed unreachable for ``waited_s`` seconds of retries."""

    def __init__(self, url: str, waited_s: float, cause: str = ""):
        super().__init__(f"experience stream: Redis at {url} unreachable for "
                         f"{waited_s:.1f} s{': ' + cause if cause else ''}")
        self.url, self.waited_s, self.cause = url, waited_s, cause

    def __reduce__(self):
        return (type(self), (self.url, self.waited_s, self.cause))


def redact_url(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``: safe for logs and errors."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


@dataclass(frozen=True)
class ConsumerConfig(Checked):
    """``group``/``consumer``: the Redis consumer group and this trainer's name in it (keep the
    name stable across restarts: pending entries belong to the name). ``block_ms``: how long
    :meth:`ExperienceConsumer.read` waits for new entries (0: not at all). ``retry_s``: how long
    Redis may stay unreachable (a restart) before :class:`StreamUnavailable`."""

    group: Annotated[str, NonEmpty(trimmed=True)] = "trainer"
    consumer: Annotated[str, NonEmpty(trimmed=True)] = "trainer-0"
    block_ms: Annotated[int, AtLeast(0)] = 1000
    dead_letter_suffix: Annotated[str, NonEmpty(trimmed=True)] = ":dead"
    retry_s: Annotated[float, AtLeast(0)] = 30.0


@dataclass(frozen=True)
class Delivery:
    """One group handed to the trainer: ``entry_id`` is what :meth:`ExperienceConsumer.ack`
    takes; ``redelivered`` marks an entry pending from an earlier consumer incarnation."""

    entry_id: str
    group: Group
    redelivered: bool


def dead_letter_stream(stream: StreamConfig, consumer: ConsumerConfig) -> str:
    """Where the consumer of ``stream`` moves malformed entries."""
    return stream.stream + consumer.dead_letter_suffix


class _Metrics:
    def __init__(self, registry: CollectorRegistry):
        self.delivered = Counter("consolerl_trainer_stream_delivered_total",
                                 "Groups handed to the trainer; kind=redelivered for entries "
                                 "pending from an earlier consumer incarnation.",
                                 ["kind"], registry=registry)
        self.acked = Counter("consolerl_trainer_stream_acked_total",
                             "Entries acknowledged by the trainer after a committed step "
                             "(dead-lettered and lost entries are counted apart).",
                             registry=registry)
        self.dead = Counter("consolerl_trainer_stream_dead_lettered_total",
                            "Malformed entries moved to the dead-letter stream.",
                            registry=registry)
        self.lost = Counter("consolerl_trainer_stream_lost_total",
                            "Pending entries trimmed from the stream before they were "
                            "trained on.", registry=registry)
        self.pending = Gauge("consolerl_trainer_stream_pending",
                             "Entries delivered to the consumer group and not acknowledged.",
                             registry=registry)
        for kind in ("new", "redelivered"):
            self.delivered.labels(kind=kind)
        self.backlog = Gauge("consolerl_trainer_stream_backlog",
                             "Entries in the stream not yet delivered to the trainer's consumer "
                             "group (read on scrape; NaN when Redis does not answer).",
                             registry=registry)


class ExperienceConsumer:
    """Reads :class:`Group` entries from ``stream_config.stream`` as ``config.consumer`` of
    ``config.group``. ``client`` must return bytes (``decode_responses=False``): the group is
    zlib-compressed. Metrics go to ``registry`` (a new one by default)."""

    def __init__(self, stream_config: StreamConfig, config: ConsumerConfig,
                 client: redis.Redis | None = None, registry: CollectorRegistry | None = None):
        self.stream_config = stream_config
        self.config = config
        self.url = redact_url(stream_config.url)
        if client is None:
            # No redis-py retries of its own (this class retries, with backoff, for retry_s);
            # the socket timeout leaves room for the longest block.
            client = redis.Redis.from_url(
                stream_config.url, socket_timeout=max(5.0, config.block_ms / 1000 + 5.0),
                retry=Retry(NoBackoff(), 1))
        elif client.get_encoder().decode_responses:
            raise ConfigError("ExperienceConsumer.client: must use decode_responses=False "
                              "(entries hold compressed bytes)")
        self.redis = client
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = _Metrics(self.registry)
        self.metrics.backlog.set_function(self.backlog)
        self.stream = stream_config.stream
        self.dead_letter_stream = dead_letter_stream(stream_config, config)
        # Entry ids handed out by this object and not acknowledged: a rescan of the pending
        # list skips them. The scan cursor is None once the pending list is read through; a
        # connection error during a read of new entries resets it to "0" (a lost XREADGROUP
        # reply leaves entries pending that were never handed out).
        self._handed: set[str] = set()
        self._pel_cursor: str | None = "0"
        self._transient_errors = 0

    # -- public API -----------------------------------------------------------------------

    def ensure_group(self) -> None:
        """Create the consumer group at the stream's start (and the stream) if missing."""
        try:
            self._call(lambda: self.redis.xgroup_create(self.stream, self.config.group,
                                                        id="0", mkstream=True))
        except StreamError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def read(self, count: int, block_ms: int | None = None) -> list[Delivery]:
        """At most ``count`` groups: this consumer's pending entries not yet handed out by this
        object first, then new entries, waiting up to ``block_ms`` (default
        ``config.block_ms``; 0: no wait) for new ones when nothing pending was found."""
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ConfigError(f"read: 'count' must be an integer >= 1, got {count!r}")
        if block_ms is None:
            block_ms = self.config.block_ms
        if isinstance(block_ms, bool) or not isinstance(block_ms, int) or block_ms < 0:
            raise ConfigError(f"read: 'block_ms' must be an integer >= 0, got {block_ms!r}")
        out: list[Delivery] = []
        if self._pel_cursor is not None:
            out.extend(self._read_pending(count))
        if len(out) < count:
            out.extend(self._read_new(count - len(out), 0 if out else block_ms))
        self._refresh_pending()
        return out

    def ack(self, entry_ids: Iterable[str]) -> int:
        """Acknowledge entries (after the step that used them is committed); returns how many
        were still pending. Acknowledging an entry twice is harmless."""
        ids = [i.decode() if isinstance(i, bytes) else str(i) for i in entry_ids]
        if not ids:
            return 0
        n = int(self._call(lambda: self.redis.xack(self.stream, self.config.group, *ids)))
        self._handed.difference_update(ids)
        self.metrics.acked.inc(n)
        self._refresh_pending()
        return n

    def backlog(self) -> float:
        """Entries not yet delivered to the group (Redis 7's XINFO GROUPS ``lag``); NaN when
        Redis does not answer or cannot tell."""
        try:
            for info in self.redis.xinfo_groups(self.stream):
                name = info.get("name", b"")
                if (name.decode() if isinstance(name, bytes) else name) == self.config.group:
                    lag = info.get("lag")
                    return float(lag) if lag is not None else float("nan")
        except redis.RedisError:
            pass
        return float("nan")

    def pending(self) -> int:
        """Entries delivered to the group (any consumer) and not acknowledged."""
        summary = self._call(lambda: self.redis.xpending(self.stream, self.config.group))
        n = int(summary["pending"])
        self.metrics.pending.set(n)
        return n

    # -- reading ----------------------------------------------------------------------------

    def _read_pending(self, limit: int) -> list[Delivery]:
        out: list[Delivery] = []
        while len(out) < limit and self._pel_cursor is not None:
            cursor = self._pel_cursor
            entries = self._xreadgroup(cursor, limit - len(out), None)
            if not entries:
                self._pel_cursor = None
                break
            for entry_id, fields in entries:
                if entry_id not in self._handed:
                    delivery = self._accept(entry_id, fields, redelivered=True)
                    if delivery is not None:
                        out.append(delivery)
                self._pel_cursor = entry_id
        return out

    def _read_new(self, limit: int, block_ms: int) -> list[Delivery]:
        out: list[Delivery] = []
        block: int | None = block_ms or None
        while len(out) < limit:
            errors = self._transient_errors
            entries = self._xreadgroup(">", limit - len(out), block)
            if self._transient_errors != errors:
                # The reply of an attempt that failed may have been lost after Redis had
                # delivered its entries to this consumer: rescan the pending list next time.
                self._pel_cursor = "0"
            if not entries:
                break
            for entry_id, fields in entries:
                delivery = self._accept(entry_id, fields, redelivered=False)
                if delivery is not None:
                    out.append(delivery)
            block = None        # only dead letters so far: look again, without waiting
        return out

    def _xreadgroup(self, entry_id: str, count: int, block_ms: int | None
                    ) -> list[tuple[str, dict[bytes, bytes]]]:
        block_ms = self._cap_block(block_ms)
        response = self._call(lambda: self.redis.xreadgroup(
            self.config.group, self.config.consumer, {self.stream: entry_id}, count=count,
            block=block_ms))
        if not response:
            return []
        # RESP2 gives [[stream, entries]], RESP3 {stream: [entries]}.
        pairs = response.items() if isinstance(response, dict) else response
        out = []
        for _stream, entries in pairs:
            for raw_id, fields in entries or ():
                out.append((raw_id.decode() if isinstance(raw_id, bytes) else str(raw_id),
                            fields or {}))
        return out

    def _accept(self, entry_id: str, fields: dict, redelivered: bool) -> Delivery | None:
        """A delivery, or None after acknowledging a lost or malformed entry."""
        if not fields:
            self._call(lambda: self.redis.xack(self.stream, self.config.group, entry_id))
            self.metrics.lost.inc()
            log.warning("experience entry %s was trimmed from %s before it was trained on; "
                        "acknowledged as lost", entry_id, self.stream)
            return None
        try:
            group = decode_group(fields)
        except ConfigError as exc:
            self._dead_letter(entry_id, fields, str(exc))
            return None
        self._handed.add(entry_id)
        self.metrics.delivered.labels(kind="redelivered" if redelivered else "new").inc()
        return Delivery(entry_id, group, redelivered)

    def _dead_letter(self, entry_id: str, fields: dict, error: str) -> None:
        record: dict[Any, Any] = dict(fields)
        record.update({b"dead_letter_error": error.encode(),
                       b"dead_letter_entry_id": entry_id.encode(),
                       b"dead_letter_group": self.config.group.encode(),
                       b"dead_letter_consumer": self.config.consumer.encode(),
                       b"dead_letter_time": repr(time.time()).encode()})

        def move() -> None:
            # One MULTI: the copy and the acknowledgement happen together or not at all.
            pipe = self.redis.pipeline(transaction=True)
            pipe.xadd(self.dead_letter_stream, record, maxlen=self.stream_config.max_len,
                      approximate=True)
            pipe.xack(self.stream, self.config.group, entry_id)
            pipe.execute()

        self._call(move)
        self.metrics.dead.inc()
        log.warning("experience entry %s moved to %s: %s", entry_id, self.dead_letter_stream,
                    error)

    def _refresh_pending(self) -> None:
        try:
            self.pending()
        except StreamError as exc:     # the gauge is best-effort; the read or ack succeeded
            log.warning("could not refresh the pending gauge: %s", exc)

    def _cap_block(self, block_ms: int | None) -> int | None:
        """Keep a blocking read below the client's socket timeout (else it reads as a dead
        server)."""
        if not block_ms:
            return None
        timeout = self.redis.connection_pool.connection_kwargs.get("socket_timeout", 5.0)
        if timeout is None:
            return block_ms
        return max(1, min(block_ms, int((timeout - 1.0) * 1000)))

    # -- Redis calls with retries -----------------------------------------------------------

    def _call(self, fn: Callable[[], T]) -> T:
        """``fn()``, retrying connection errors with backoff for ``config.retry_s`` and
        re-creating a consumer group the server lost (``NOGROUP``) once."""
        start = time.monotonic()
        delay = 0.05
        regrouped = False
        while True:
            try:
                return fn()
            except _TRANSIENT as exc:
                self._transient_errors += 1
                waited = time.monotonic() - start
                if waited >= self.config.retry_s:
                    raise StreamUnavailable(self.url, waited, f"{type(exc).__name__}: {exc}"
                                            ) from None
                log.warning("experience stream: Redis at %s unreachable (%s); retrying",
                            self.url, exc)
                time.sleep(min(delay, max(0.0, self.config.retry_s - waited)))
                delay = min(delay * 2, 1.0)
            except redis.ResponseError as exc:
                if str(exc).startswith("NOGROUP") and not regrouped:
                    # The server lost the group (restarted without the data): start it again
                    # at the stream's beginning; group ids keep re-training idempotent.
                    log.warning("consumer group %r missing on %s; creating it again",
                                self.config.group, self.stream)
                    regrouped = True
                    self._pel_cursor = "0"
                    self.ensure_group()
                    continue
                raise StreamError(f"experience stream {self.stream!r} at {self.url}: "
                                  f"{exc}") from None
            except redis.RedisError as exc:
                raise StreamError(f"experience stream {self.stream!r} at {self.url}: "
                                  f"{type(exc).__name__}: {exc}") from None
