"""ActionTrail client for scoring episodes: paged, rate-limited, retrying LookupEvents.

ActionTrail is the reward's ground truth, and it is slow and stingy: LookupEvents allows about
2 queries per second per account, and events can take up to 10 minutes to appear. This module
keeps every caller in the process under the per-account limit (one :class:`TokenBucket` per
account id), retries throttling and server errors with exponential backoff and jitter, pages
through ``NextToken``, and waits for late events with :meth:`TrailClient.wait_for`, whose
"pending" result means "not delivered yet", never "the agent failed".

Public API: :class:`TrailConfig`, :class:`TrailClient` (``events``, ``wait_for``),
:class:`TrailResult`, :func:`episode_events`, :class:`TokenBucket`, :class:`BucketRegistry`,
:func:`call_with_retry`, :func:`is_retryable`.
"""
from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import Annotated, Any, Literal, TypeVar

from alibabacloud_actiontrail20200706 import models as at
from prometheus_client import CollectorRegistry, Counter, Histogram

from consolerl.audit import AuditEvent
from consolerl.config import AtLeast, Between, Checked
from consolerl.errors import CloudAPIError, ConfigError
from infra.cloud import CloudClient

log = logging.getLogger(__name__)
T = TypeVar("T")

LOOKUP_KEYS = ("EventName", "ServiceName", "User", "EventId", "ResourceType", "ResourceName",
               "EventRW", "EventAccessKeyId")
_RETRY_CODES = ("ServiceUnavailable", "InternalError")
_END_PAD_S = 1.0        # the window ends a little after "now" so the newest second is included
# ActionTrail keeps 90 days of events, and one LookupEvents window spans at most 90 days.
LOOKUP_MAX_WINDOW_S = 90 * 86_400.0


@dataclass(frozen=True)
class TrailConfig(Checked):
    """How :class:`TrailClient` queries ActionTrail.

    ``qps``/``burst``: the per-account token bucket (the cloud allows 2 LookupEvents per second
    per account; ``burst`` 1 leaves headroom for network jitter). ``max_retries``: retries of
    one request after ``Throttling*`` or a 5xx; the delay is ``min(backoff_max_s,
    backoff_base_s * 2**attempt)`` with jitter. ``clock_skew_s``: the query window starts this
    long before the episode start. ``settle_s``: how long :meth:`TrailClient.wait_for` waits for
    late events; 30 s suits the local cloud, the real ActionTrail may need ~600 s (events take
    up to 10 minutes to appear). ``poll_s``: pause between polls. ``max_results``: page size
    (1-50).
    """

    qps: Annotated[float, AtLeast(0, open=True)] = 2.0
    burst: Annotated[float, AtLeast(1)] = 1.0
    max_retries: Annotated[int, AtLeast(0)] = 6
    backoff_base_s: Annotated[float, AtLeast(0, open=True)] = 0.25
    backoff_max_s: Annotated[float, AtLeast(0, open=True)] = 8.0
    clock_skew_s: Annotated[float, AtLeast(0)] = 60.0
    settle_s: Annotated[float, AtLeast(0)] = 30.0
    poll_s: Annotated[float, AtLeast(0, open=True)] = 1.0
    max_results: Annotated[int, Between(1, 50)] = 50

    def oldest_start(self, now: float) -> float:
        """The earliest episode start :meth:`TrailClient.wait_for` can query at ``now``: its
        window (``clock_skew_s`` before the start to just after now, for up to ``settle_s``)
        must stay within :data:`LOOKUP_MAX_WINDOW_S`; 2 s for rounding both ends to seconds."""
        return now + _END_PAD_S + 2 + self.settle_s + self.clock_skew_s - LOOKUP_MAX_WINDOW_S


@dataclass(frozen=True)
class TrailResult:
    """What :meth:`TrailClient.wait_for` saw. ``status`` "pending" means the predicate did not
    hold before the settle deadline: events may still be in delivery; it is not a failure.
    ``queries`` counts LookupEvents requests sent (pages and retries)."""

    status: Literal["complete", "pending"]
    events: list[AuditEvent] = field(default_factory=list)
    waited_s: float = 0.0
    queries: int = 0


class TokenBucket:
    """A blocking token bucket: ``acquire()`` returns once the caller may send one request.
    Thread-safe; waiters are served in arrival order (each reserves its slot under the lock and
    sleeps outside it). ``clock``/``sleep`` are injectable for tests."""

    def __init__(self, rate: float, burst: float = 1.0,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._sleep = sleep
        self._tokens = burst
        self._at = clock()
        self._lock = threading.Lock()

    def reserve(self) -> float:
        """Take a token now (possibly going into debt); return how long to wait before using it."""
        with self._lock:
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
            self._at = now
            self._tokens -= 1.0
            return 0.0 if self._tokens >= 0 else -self._tokens / self.rate

    def acquire(self) -> float:
        """Block until a token is ours; return the seconds waited."""
        wait = self.reserve()
        if wait > 0:
            self._sleep(wait)
        return wait

    def slow_to(self, rate: float, burst: float) -> None:
        with self._lock:
            self.rate = min(self.rate, rate)
            self.burst = min(self.burst, burst)


class BucketRegistry:
    """One :class:`TokenBucket` per account id. The module's :data:`BUCKETS` is shared by every
    :class:`TrailClient` in the process; when callers ask for different limits on one account,
    the slowest wins (the cloud's limit is per account, not per caller)."""

    def __init__(self) -> None:
        self._buckets: dict[str, TokenBucket] = {}
        self._lock = threading.Lock()

    def get(self, account_id: str, rate: float, burst: float) -> TokenBucket:
        with self._lock:
            bucket = self._buckets.get(account_id)
            if bucket is None:
                bucket = self._buckets[account_id] = TokenBucket(rate, burst)
            else:
                bucket.slow_to(rate, burst)
            return bucket


BUCKETS = BucketRegistry()


class TrailMetrics:
    def __init__(self, registry: CollectorRegistry):
        self.queries = Counter("consolerl_reward_trail_queries_total", "LookupEvents requests, "
                               "by outcome (ok, throttled, server_error, error).", ["outcome"],
                               registry=registry)
        self.throttled_retries = Counter("consolerl_reward_trail_throttled_retries_total",
                                         "Requests retried after a Throttling error.",
                                         registry=registry)
        self.foreign_events = Counter("consolerl_reward_trail_foreign_events_total",
                                      "Events of another account that LookupEvents returned "
                                      "and the client dropped.", registry=registry)
        self.query_seconds = Histogram(
            "consolerl_reward_trail_query_seconds", "Time of one LookupEvents request "
            "(every attempt, throttled ones included).", registry=registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
        for outcome in ("ok", "throttled", "server_error", "error"):
            self.queries.labels(outcome)
        self.wait = Histogram("consolerl_reward_trail_wait_seconds", "wait_for duration, by "
                              "status (complete, pending).", ["status"], registry=registry,
                              buckets=(0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 900))


def is_retryable(exc: CloudAPIError) -> bool:
    """Throttling (any ``Throttling*`` code) and server-side errors are worth retrying."""
    return (exc.code.startswith("Throttling") or exc.code in _RETRY_CODES
            or exc.status >= 500)


def call_with_retry(fn: Callable[[], T], config: TrailConfig, *,
                    before: Callable[[], object] = lambda: None,
                    on_error: Callable[[CloudAPIError, bool], None] = lambda exc, retry: None,
                    sleep: Callable[[float], None] = time.sleep,
                    rng: random.Random | None = None) -> T:
    """``fn()`` with up to ``config.max_retries`` retries of retryable :class:`CloudAPIError`.

    ``before`` runs ahead of every attempt (the rate limiter); ``on_error(exc, will_retry)``
    sees every failure. The n-th retry waits ``d/2 + uniform(0, d/2)`` with
    ``d = min(backoff_max_s, backoff_base_s * 2**n)``: jitter spreads callers that were
    throttled together, the floor keeps the backoff meaningful. The last error propagates.
    """
    rng = rng or random.Random()
    attempt = 0
    while True:
        before()
        try:
            return fn()
        except CloudAPIError as exc:
            retry = is_retryable(exc) and attempt < config.max_retries
            on_error(exc, retry)
            if not retry:
                raise
        delay = min(config.backoff_max_s, config.backoff_base_s * 2 ** attempt)
        sleep(delay / 2 + rng.uniform(0, delay / 2))
        attempt += 1


def _endpoint(client: Any) -> str:
    """The endpoint a client talks to ("" for one that does not say: no clock measured;
    "aliyun" for the real cloud, whose config names no endpoint)."""
    config = getattr(client, "config", None)
    if config is None:
        return ""
    return str(getattr(config, "endpoint", None) or "aliyun")


def _copy(client: CloudClient) -> CloudClient:
    copy = CloudClient(client.config, client.credentials)
    copy.user_agent = client.user_agent
    return copy


def _epoch(t: float | datetime) -> float:
    if isinstance(t, datetime):
        if t.tzinfo is None:
            raise ConfigError(f"naive datetime {t!r}: give a timezone-aware time (UTC)")
        return t.timestamp()
    return float(t)


def _iso(epoch_s: float) -> str:
    return datetime.fromtimestamp(int(epoch_s), timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def episode_events(events: Iterable[AuditEvent], account_id: str,
                   started_at: float | datetime) -> list[AuditEvent]:
    """The events of one episode: by ``account_id`` at or after ``started_at`` (epoch seconds or
    an aware datetime). ``eventTime`` has one-second resolution, so the start is floored to the
    second: an event in the episode's first second is kept (one whose time does not parse is
    dropped)."""
    floor = int(_epoch(started_at))
    return [e for e in events if e.account_id == account_id and e.epoch >= floor]


def _attributes(attributes: Mapping[str, str] | Sequence[tuple[str, str]]
                ) -> list[at.LookupEventsRequestLookupAttribute]:
    pairs = list(attributes.items()) if isinstance(attributes, Mapping) else list(attributes)
    if len(pairs) > 2:
        raise ConfigError(f"attributes: LookupEvents allows at most 2, got {len(pairs)}")
    for key, value in pairs:
        if key not in LOOKUP_KEYS:
            raise ConfigError(f"attributes: unknown key {key!r}; allowed: {', '.join(LOOKUP_KEYS)}")
        if not value:
            raise ConfigError(f"attributes: {key} needs a non-empty value")
    return [at.LookupEventsRequestLookupAttribute(key=k, value=v) for k, v in pairs]


# The cloud's clock minus this machine's, per endpoint, from the ``Date`` header of the last
# LookupEvents answer. The header has one-second resolution: an estimate within
# ``_CLOCK_NOISE_S`` reads as 0 (``clock_skew_s`` covers that much).
_CLOCK_OFFSETS: dict[str, float] = {}
_CLOCK_NOISE_S = 2.0


def _observe_clock(endpoint: str, date: str, sent: float, received: float) -> None:
    try:
        cloud = parsedate_to_datetime(date).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return
    # The header is the second the answer was made, floored: +0.5 centres it.
    offset = cloud + 0.5 - (sent + received) / 2
    _CLOCK_OFFSETS[endpoint] = 0.0 if abs(offset) <= _CLOCK_NOISE_S else round(offset, 1)


class TrailClient:
    """ActionTrail queries for one account.

    ``client`` is a :class:`CloudClient` or a zero-argument factory of one; since a CloudClient
    is not thread-safe, each calling thread gets its own (a copy of the given one, or a fresh
    one from the factory). ``account_id`` is the account the credentials belong to: events of
    any other account are dropped. Thread-safe.
    """

    def __init__(self, client: CloudClient | Callable[[], CloudClient],
                 config: TrailConfig | None = None, registry: CollectorRegistry | None = None,
                 *, account_id: str, buckets: BucketRegistry | None = None,
                 metrics: TrailMetrics | None = None,
                 sleep: Callable[[float], None] = time.sleep):
        if not account_id:
            raise ConfigError("TrailClient.account_id must be the queried account's id")
        self.config = config if config is not None else TrailConfig()
        self.account_id = account_id
        # ``metrics``: share one TrailMetrics between clients (a registry takes each name once).
        self.metrics = metrics or TrailMetrics(
            registry if registry is not None else CollectorRegistry())
        self.bucket = (buckets or BUCKETS).get(account_id, self.config.qps, self.config.burst)
        if isinstance(client, CloudClient):
            given = client
            self._factory: Callable[[], CloudClient] = lambda: _copy(given)
        else:
            self._factory = client
        self._local = threading.local()
        self._sleep = sleep

    @property
    def clock_offset_s(self) -> float | None:
        """The cloud's clock minus this machine's (None until a query measured it): event
        times are the cloud's; windows in this machine's time are shifted by it."""
        endpoint = _endpoint(self._client())
        return _CLOCK_OFFSETS.get(endpoint) if endpoint else 0.0

    def _offset(self) -> float:
        """The clock offset, measured first with one small query when still unknown."""
        offset = self.clock_offset_s
        if offset is None:
            now = time.time()
            self._lookup(at.LookupEventsRequest(start_time=_iso(now - 60), end_time=_iso(now + 1),
                                                max_results="1"), [0])
            offset = self.clock_offset_s
        return offset or 0.0

    def _client(self) -> CloudClient:
        client = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = self._factory()
        return client

    def _on_error(self, exc: CloudAPIError, retry: bool) -> None:
        throttled = exc.code.startswith("Throttling")
        outcome = "throttled" if throttled else ("server_error" if is_retryable(exc) else "error")
        self.metrics.queries.labels(outcome).inc()
        if throttled and retry:
            self.metrics.throttled_retries.inc()
        log.log(logging.DEBUG if retry else logging.WARNING, "LookupEvents %s (%s)",
                exc.code, "retrying" if retry else "giving up")

    def _lookup(self, request: at.LookupEventsRequest, counter: list[int]) -> Any:
        client = self._client()

        def attempt() -> Any:
            counter[0] += 1
            t0 = time.perf_counter()
            sent = time.time()
            try:
                if hasattr(client, "call_with_headers"):
                    body, headers = client.call_with_headers(
                        client.actiontrail.lookup_events_with_options, request, "LookupEvents")
                else:                                   # a client that keeps no headers
                    body, headers = client.call(client.actiontrail.lookup_events_with_options,
                                                request, "LookupEvents"), {}
            finally:
                self.metrics.query_seconds.observe(time.perf_counter() - t0)
            if headers.get("date") and _endpoint(client):
                _observe_clock(_endpoint(client), headers["date"], sent, time.time())
            self.metrics.queries.labels("ok").inc()
            return body
        return call_with_retry(attempt, self.config, before=self.bucket.acquire,
                               on_error=self._on_error, sleep=self._sleep)

    def events(self, start: float | datetime, end: float | datetime,
               attributes: Mapping[str, str] | Sequence[tuple[str, str]] = ()
               ) -> list[AuditEvent]:
        """Every event of this account from ``start`` to ``end`` (epoch seconds or aware
        datetimes; ``start`` is floored and ``end`` ceiled to the second), oldest first, each
        eventId once, as :class:`~consolerl.audit.AuditEvent`. ``attributes``: at most two
        (key, value) LookupAttribute filters (AND). Raises :class:`CloudAPIError` for
        non-retryable errors or when retries run out.
        ``start`` and ``end`` are this machine's times: the window sent is shifted by the
        cloud's clock offset (:attr:`clock_offset_s`); event times stay the cloud's."""
        offset = self._offset()
        return self._events(_epoch(start) + offset, _epoch(end) + offset,
                            _attributes(attributes), [0])

    def _events(self, lo: float, hi: float, attrs: list[at.LookupEventsRequestLookupAttribute],
                counter: list[int]) -> list[AuditEvent]:
        if lo > hi:
            raise ConfigError(f"events: start {_iso(lo)} is after end {_iso(hi)}")
        start_iso, end_iso = _iso(lo), _iso(-int(-hi // 1))
        pages: list[AuditEvent] = []
        token = None
        while True:
            request = at.LookupEventsRequest(start_time=start_iso, end_time=end_iso,
                                             lookup_attribute=attrs or None,
                                             max_results=str(self.config.max_results),
                                             next_token=token)
            body = self._lookup(request, counter)
            pages.extend(AuditEvent.from_trail(e) for e in body.events or [])
            token = body.next_token
            if not token:
                break
        # Pages run newest first; reversing keeps the cloud's order inside one second, the
        # stable sort fixes anything a page boundary (or a late event) put out of order.
        ordered = sorted(reversed(pages), key=lambda e: e.epoch)
        seen: set[str] = set()
        out: list[AuditEvent] = []
        for event in ordered:
            if event.account_id != self.account_id:
                self.metrics.foreign_events.inc()
                log.warning("dropped event %s of account %r from a query of account %s",
                            event.event_id, event.account_id, self.account_id)
                continue
            if event.event_id in seen:
                continue
            seen.add(event.event_id)
            out.append(event)
        return out

    def wait_for(self, start: float | datetime,
                 predicate: Callable[[list[AuditEvent]], bool],
                 deadline_s: float | None = None) -> TrailResult:
        """Poll the window ``start - clock_skew_s`` .. now until ``predicate(events)`` holds
        ("complete") or ``deadline_s`` (default ``config.settle_s``) passes ("pending").

        ``events`` are the whole window's, skew margin included; narrow them to the episode
        with :func:`episode_events`. A ``start`` ahead of this machine's clock (the caller's
        clock runs ahead) polls from now. A ``start`` before :meth:`TrailConfig.oldest_start`
        makes a window the cloud refuses. Errors other than throttling propagate.
        """
        settle = self.config.settle_s if deadline_s is None else deadline_s
        t0 = time.monotonic()
        deadline = t0 + settle
        counter = [0]
        while True:
            # This machine's times to the cloud's, by the offset measured so far.
            offset = self._offset()
            lo = _epoch(start) - self.config.clock_skew_s + offset
            hi = time.time() + _END_PAD_S + offset
            events = self._events(min(lo, hi), hi, [], counter)
            if predicate(events):
                status: Literal["complete", "pending"] = "complete"
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                status = "pending"
                break
            self._sleep(min(self.config.poll_s, remaining))
        waited = time.monotonic() - t0
        self.metrics.wait.labels(status).observe(waited)
        return TrailResult(status, events, waited, counter[0])
