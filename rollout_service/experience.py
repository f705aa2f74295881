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

import json
import zlib
from dataclasses import asdict, dataclass, field
from typing import Any

import redis

from consolerl.config import check_int
from consolerl.errors import ConfigError

from .agent import Trajectory, Turn

FORMAT_VERSION = 1


@dataclass(frozen=True)
class Sample:
    """One episode of a group as the trainer needs it."""

    trajectory_id: str
    turns: tuple[Turn, ...]
    reward: float
    verdict: str = ""
    end_reason: str = ""

    @property
    def versions(self) -> tuple[int, ...]:
        return tuple(sorted({t.version for t in self.turns}))


@dataclass(frozen=True)
class Group:
    group_id: str
    task_id: str
    samples: tuple[Sample, ...]
    created_at: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def versions(self) -> tuple[int, ...]:
        return tuple(sorted({v for s in self.samples for v in s.versions}))

    @property
    def rewards(self) -> tuple[float, ...]:
        return tuple(s.reward for s in self.samples)


def sample_of(trajectory: Trajectory, reward: float, verdict: str = "") -> Sample:
    return Sample(trajectory.trajectory_id, trajectory.turns, float(reward), verdict,
                  trajectory.end_reason)


def encode_group(group: Group) -> dict[str, str | bytes]:
    body = {"format": FORMAT_VERSION, **asdict(group)}
    versions = group.versions or (-1,)
    return {"group_id": group.group_id, "task_id": group.task_id, "n": str(len(group.samples)),
            "min_version": str(versions[0]), "max_version": str(versions[-1]),
            "data": zlib.compress(json.dumps(body, separators=(",", ":")).encode(), 3)}


def decode_group(fields: dict[bytes | str, bytes | str]) -> Group:
    """A stream entry's fields back to a :class:`Group`; :class:`ConfigError` if malformed."""
    raw = fields.get(b"data", fields.get("data"))
    if raw is None:
        raise ConfigError("experience entry has no 'data' field")
    try:
        body = json.loads(zlib.decompress(raw if isinstance(raw, bytes) else raw.encode()))
        if body.pop("format") != FORMAT_VERSION:
            raise ConfigError(f"experience entry format is not {FORMAT_VERSION}")
        samples = tuple(
            Sample(s["trajectory_id"],
                   tuple(Turn(tuple(t["prompt_ids"]), tuple(t["response_ids"]),
                              tuple(t["logprobs"]), tuple(t["loss_mask"]), t["version"],
                              t["response_text"], t["action_text"], t.get("action_error", ""))
                         for t in s["turns"]),
                   float(s["reward"]), s.get("verdict", ""), s.get("end_reason", ""))
            for s in body["samples"])
        return Group(body["group_id"], body["task_id"], samples, body.get("created_at", 0.0),
                     body.get("meta", {}))
    except (zlib.error, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"experience entry is malformed: {type(exc).__name__}: {exc}") from None


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
