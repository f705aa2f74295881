"""What the reward service answers for one episode, as it crosses the Ray boundary to the
orchestrator and the HTTP API: the rule channel's outcome, the judge channel's votes and
verdict, and their fusion into one :class:`RewardResult` (policy in :mod:`reward_service.fusion`).
"""
from __future__ import annotations

from dataclasses import dataclass

from consolerl.errors import ConfigError
from consolerl.types import EnvError

OUTCOMES = ("success", "failure", "undetermined")


@dataclass(frozen=True)
class RuleOutcome:
    """The rule channel's result: ``verdict`` success | failure | undetermined, the audit
    event ids that decided it (evidence), why it failed, how many forbidden events happened,
    and whether an undetermined verdict is ``pending`` (events still in delivery)."""

    verdict: str
    evidence: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()
    forbidden_hits: int = 0
    pending: bool = False          # undetermined because the audit log had not caught up

    def __post_init__(self) -> None:
        if self.verdict not in OUTCOMES:
            raise ConfigError(f"RuleOutcome.verdict: must be one of {', '.join(OUTCOMES)}, "
                              f"got {self.verdict!r}")
        if isinstance(self.forbidden_hits, bool) or not isinstance(self.forbidden_hits, int) \
                or self.forbidden_hits < 0:
            raise ConfigError(f"RuleOutcome.forbidden_hits: must be an integer >= 0, "
                              f"got {self.forbidden_hits!r}")
        object.__setattr__(self, "evidence", tuple(self.evidence))
        object.__setattr__(self, "reasons", tuple(self.reasons))


@dataclass(frozen=True)
class JudgeVote:
    """One judge's vote: ``verdict`` is success | failure | invalid (an abstention: bad reply,
    endpoint error, deadline); ``reason`` the judge's reason or why the vote is invalid."""

    judge: str
    verdict: str
    reason: str


@dataclass(frozen=True)
class JudgeVerdict:
    """The channel's verdict (success | failure | undetermined), every vote, and why."""

    verdict: str
    votes: tuple[JudgeVote, ...]
    reason: str

    @property
    def valid_votes(self) -> int:
        return sum(v.verdict != "invalid" for v in self.votes)


@dataclass(frozen=True)
class RewardResult:
    """The reward of one episode. ``verdict``: success | failure | undetermined (``failure``
    also for env errors, with ``trainable=False``); ``decided_by``: rule | judges | none |
    env_error; ``rule_verdict`` / ``judge_verdict``: both channels as they came (``None`` when
    a channel did not run); ``evidence``: audit event ids; ``reasons``: why, in order."""

    reward: float
    trainable: bool
    verdict: str
    decided_by: str
    rule_verdict: RuleOutcome | None = None
    judge_verdict: JudgeVerdict | None = None
    evidence: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()
    env_error: EnvError | None = None
