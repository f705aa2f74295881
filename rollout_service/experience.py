"""The experience stream: finished GRPO groups on a Redis stream, from the orchestrator to the
trainer.

One stream entry per group (``XADD <stream> MAXLEN ~ <max_len>``) with small plain fields for
people and tools (``group_id``, ``task_id``, ``n``, ``min_version``, ``max_version``) and the
group itself in ``data``: zlib-compressed JSON of :class:`Group` (token ids, log-probs, loss
masks, versions, rewards). Trajectory and group ids make consumption idempotent.

The trainer's weight version lives beside the stream (``<stream>:trainer_version``): the trainer
sets it after publishing weights, the orchestrator's staleness control reads it.
"""
from __future__ import annotations

from dataclasses import dataclass

import redis

from consolerl.config import check_int
from consolerl.errors import ConfigError
from consolerl.experience import Group, encode_group


@dataclass(frozen=True)
class StreamConfig:
    url: str = "redis://127.0.0.1:6390/0"
    stream: str = "consolerl:experience"
    max_len: int = 10_000            # approximate (MAXLEN ~): older groups are trimmed

    def __post_init__(self) -> None:
        if not self.url.startswith(("redis://", "rediss://", "unix://")):
            raise ConfigError(f"StreamConfig.url: must be a redis:// URL, got {self.url!r}")
        check_int("StreamConfig.max_len", self.max_len, 1)


class ExperienceStream:
    """The producer side, and the shared trainer-version key."""

    def __init__(self, config: StreamConfig, client: redis.Redis | None = None):
        self.config = config
        self.redis = client or redis.Redis.from_url(config.url)

    @property
    def version_key(self) -> str:
        return f"{self.config.stream}:trainer_version"

    def push(self, group: Group) -> str:
        entry = self.redis.xadd(self.config.stream, encode_group(group),
                                maxlen=self.config.max_len, approximate=True)
        return entry.decode() if isinstance(entry, bytes) else str(entry)

    def length(self) -> int:
        return int(self.redis.xlen(self.config.stream))

    def trainer_version(self) -> int:
        value = self.redis.get(self.version_key)
        return int(value) if value is not None else 0

    def set_trainer_version(self, version: int) -> None:
        self.redis.set(self.version_key, int(version))
