"""Episodes as the trainer sees them: token-faithful turns, trajectories, and GRPO groups with
their encoding as one Redis stream entry (small plain fields for people and tools, the group
itself as zlib-compressed JSON in ``data``). Written by the orchestrator, read by the trainer.
"""
from __future__ import annotations

import hashlib
import json
import zlib
from dataclasses import dataclass, field
from typing import Any

from consolerl.errors import ConfigError
from consolerl.page import comparable, parse
from consolerl.types import EnvError


@dataclass(frozen=True)
class Turn:
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    loss_mask: tuple[int, ...]
    version: int
    response_text: str                # the decoded output (for logs and judges; not trained on)
    action_text: str                  # the canonical action the env ran ("" if it did not parse)
    action_error: str = ""


@dataclass(frozen=True)
class Trajectory:
    trajectory_id: str
    task_id: str
    turns: tuple[Turn, ...]
    end_reason: str
    answer: str | None = None
    infeasible: str | None = None
    env_error: EnvError | None = None
    final_observation: str = ""
    started_at: float = 0.0
    ended_at: float = 0.0
    end_detail: str = ""              # why it ended, where end_reason alone does not say
    # The pages the agent saw (:func:`page_seen`): pages[i] before turn i, the last one after
    # the final turn; what the evidence channel checks an infeasibility claim against.
    pages: tuple[str, ...] = ()

    @property
    def versions(self) -> tuple[int, ...]:
        return tuple(sorted({t.version for t in self.turns}))

    @property
    def actions(self) -> list[str]:
        return [t.action_text or f"(invalid: {t.action_error})" for t in self.turns]


MAX_PAGES = 64                        # a trajectory keeps at most this many pages
MAX_PAGE_CHARS = 30_000


def page_seen(url: str, text: str) -> str:
    """One page as a trajectory keeps it: the URL on the first line, then the observation's
    text (cut to :data:`MAX_PAGE_CHARS`)."""
    return f"{url}\n{text[:MAX_PAGE_CHARS]}"


def keep_pages(pages: list[str]) -> tuple[str, ...]:
    """At most :data:`MAX_PAGES`: the first and the last ones (where an episode starts and
    where it gave up)."""
    if len(pages) <= MAX_PAGES:
        return tuple(pages)
    head = MAX_PAGES // 4
    return tuple(pages[:head] + pages[len(pages) - (MAX_PAGES - head):])


def state_key(page: str) -> str:
    """The state a page (:func:`page_seen`: URL and text) stands for, as a short digest of its
    :func:`consolerl.page.comparable` form with the element ids (``[12]``) taken out: two
    visits of one state (other resource ids, times, account, element numbering) get the same
    key, two different pages different keys."""
    url, _, text = page.partition("\n")
    lines = text.split("\n")
    # Each id the parser read is blanked on the line that draws it (ids are unique on a page;
    # a line with inline controls holds several).
    for node in parse(text).nodes:
        if node.bid:
            lines[node.line] = lines[node.line].replace(f"[{node.bid}]", "[]", 1)
    plain = comparable(url + "\n" + "\n".join(lines))
    return hashlib.blake2b(plain.encode(), digest_size=8).hexdigest()


def turn_states(trajectory: Trajectory) -> tuple[str, ...]:
    """The :func:`state_key` of the page the agent saw before each turn ("" where
    :func:`keep_pages` left that page out of a long trajectory, or no page was kept)."""
    n, pages = len(trajectory.turns), trajectory.pages
    if len(pages) >= n + 1:
        by_turn: list[str | None] = list(pages[:n])
    else:
        # keep_pages kept the first ``head`` pages and the last ones, the final page included.
        head = min(MAX_PAGES // 4, len(pages))
        tail = len(pages) - head
        by_turn = [None] * n
        by_turn[:head] = pages[:head]
        for i in range(tail - 1):              # the last kept page follows the final turn
            by_turn[n - (tail - 1) + i] = pages[head + i]
    return tuple("" if page is None else state_key(page) for page in by_turn)


FORMAT_VERSION = 1


@dataclass(frozen=True)
class Sample:
    """One episode of a group as the trainer needs it. ``states``: the :func:`state_key` of
    the page before each turn (:func:`turn_states`; step-level advantages group turns by it),
    or empty where the orchestrator did not record them."""

    trajectory_id: str
    turns: tuple[Turn, ...]
    reward: float
    verdict: str = ""
    end_reason: str = ""
    states: tuple[str, ...] = ()

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


def sample_of(trajectory: Trajectory, reward: float, verdict: str = "",
              states: bool = False) -> Sample:
    """The trajectory as a group's sample; ``states``: with its :func:`turn_states`."""
    return Sample(trajectory.trajectory_id, trajectory.turns, float(reward), verdict,
                  trajectory.end_reason, turn_states(trajectory) if states else ())


def _turn_body(t: Turn) -> dict[str, Any]:
    return {"prompt_ids": t.prompt_ids, "response_ids": t.response_ids,
            "logprobs": t.logprobs, "loss_mask": t.loss_mask, "version": t.version,
            "response_text": t.response_text, "action_text": t.action_text,
            "action_error": t.action_error}


def group_body(group: Group) -> dict[str, Any]:
    """``asdict(group)`` without its deep copy of every token id (json.dumps writes tuples
    as lists): a group's ~12,000 ids took ~10 ms through ``asdict`` on the rollout actor's
    CPU. Tests hold it equal to ``asdict``, so a new field cannot be left out."""
    return {"group_id": group.group_id, "task_id": group.task_id,
            "samples": [{"trajectory_id": s.trajectory_id,
                         "turns": [_turn_body(t) for t in s.turns], "reward": s.reward,
                         "verdict": s.verdict, "end_reason": s.end_reason,
                         "states": s.states}
                        for s in group.samples],
            "created_at": group.created_at, "meta": group.meta}


def encode_group(group: Group) -> dict[str, str | bytes]:
    body = {"format": FORMAT_VERSION, **group_body(group)}
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
                   float(s["reward"]), s.get("verdict", ""), s.get("end_reason", ""),
                   tuple(str(k) for k in s.get("states", ())))
            for s in body["samples"])
        return Group(body["group_id"], body["task_id"], samples, body.get("created_at", 0.0),
                     body.get("meta", {}))
    except (zlib.error, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"experience entry is malformed: {type(exc).__name__}: {exc}") from None
