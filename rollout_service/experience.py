"""The experience stream: finished GRPO groups on a Redis stream, from the orchestrator to the
trainer.

One stream entry per group (``XADD <stream> MAXLEN ~ <max_len>``) with small plain fields for
people and tools (``group_id``, ``task_id``, ``n``, ``min_version``, ``max_version``) and the
group itself in ``data``: zlib-compressed JSON of :class:`Group` (token ids, log-probs, loss
masks, versions, rewards). Trajectory and group ids make consumption idempotent.

The trainer's weight version lives beside the stream (``<stream>:trainer_version``): the trainer
sets it after publishing weights, the orchestrator's staleness control reads it.

A Redis that is restarting (connection refused, loading its AOF) is waited for, with backoff,
for up to ``retry_s``; then the error propagates. An ``XADD`` retried after a lost reply may
add a group twice: the trainer skips a group id it already has (the ids make it idempotent).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, TypeVar

import redis

from consolerl.config import AtLeast, Checked, Matches
from consolerl.experience import Group, encode_group


@dataclass(frozen=True)
class StreamConfig(Checked):
    url: Annotated[str, Matches(r"(redis|rediss|unix)://.*", "a redis:// URL")] = \
        "redis://127.0.0.1:6390/0"
    stream: str = "consolerl:experience"
    # approximate (MAXLEN ~): older groups are trimmed
    max_len: Annotated[int, AtLeast(1)] = 10_000
    # how long a restarting Redis is waited for
    retry_s: Annotated[float, AtLeast(0)] = 60.0


log = logging.getLogger("rollout_service.experience")
T = TypeVar("T")


class ExperienceStream:
    """The producer side, and the shared trainer-version key."""

    def __init__(self, config: StreamConfig, client: redis.Redis | None = None):
        self.config = config
        self.redis = client or redis.Redis.from_url(config.url)

    @property
    def version_key(self) -> str:
        return f"{self.config.stream}:trainer_version"

    def _call(self, fn: Callable[[], T]) -> T:
        deadline = time.monotonic() + self.config.retry_s
        delay = 0.1
        while True:
            try:
                return fn()
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                if time.monotonic() + delay > deadline:
                    raise
                log.warning("experience stream: Redis unavailable (%s); retrying", exc)
                time.sleep(delay)
                delay = min(2 * delay, 2.0)

    def clear(self, *also: str) -> None:
        """Empty the stream and its trainer version (a fresh run: groups of an earlier one
        were sampled by other weights), with the stream's other keys in ``also``."""
        self._call(lambda: self.redis.delete(self.config.stream, self.version_key, *also))

    def push(self, group: Group) -> str:
        fields = encode_group(group)
        entry = self._call(lambda: self.redis.xadd(self.config.stream, fields,
                                                   maxlen=self.config.max_len, approximate=True))
        return entry.decode() if isinstance(entry, bytes) else str(entry)

    def length(self) -> int:
        return int(self._call(lambda: self.redis.xlen(self.config.stream)))

    def trainer_version(self) -> int:
        value = self._call(lambda: self.redis.get(self.version_key))
        return int(value) if value is not None else 0

    def set_trainer_version(self, version: int) -> None:
        self._call(lambda: self.redis.set(self.version_key, int(version)))
