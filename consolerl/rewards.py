"""What the reward service answers for one episode, as it crosses the Ray boundary to the
orchestrator and the HTTP API: the rule channel's outcome, the evidence channel's check of an
infeasibility claim, the judge channel's votes and verdict, and their fusion into one
:class:`RewardResult` (policy in :mod:`reward_service.fusion`).
"""
from __future__ import annotations

from dataclasses import dataclass

from consolerl.errors import ConfigError
from consolerl.types import EnvError

OUTCOMES = ("success", "failure", "undetermined")
# The fused reward of a successful episode (fusion: 1 for success, at most 0 otherwise, with
# penalties); a success is a reward of at least this, wherever episodes are counted.
SUCCESS_REWARD = 1.0


def is_success(reward: float) -> bool:
    """Whether an episode's reward counts as a success: the one success predicate of the
    project (curriculum, GRPO's success rate, evaluation, the rollout summaries)."""
    return reward >= SUCCESS_REWARD


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


CLAIM_KINDS = ("confirmed", "refused", "contradicted", "unsupported", "not_reported", "no_claim",
               "unchecked")


@dataclass(frozen=True)
class EvidenceOutcome:
    """The evidence channel's check of how an episode ended (:mod:`reward_service.evidence`).

    ``verdict``: success | failure | undetermined. ``kind`` says why:

    - ``confirmed``: the agent reported the procedure infeasible, and what its reason names as
      missing is on no page it saw (nor in the console's inventory), with nothing done;
    - ``refused``: it reported the console's refusal, and the audit log has that refusal of the
      documented values;
    - ``contradicted``: what the reason names was on a page the agent saw (or in the inventory),
      or the operation happened after all;
    - ``unsupported``: the reason names nothing the procedure names;
    - ``not_reported``: the procedure is known not to work, and the agent ended otherwise;
    - ``no_claim``: nothing to check (the agent did not report the task infeasible);
    - ``unchecked``: a claim the channel can neither confirm nor contradict.

    ``missing``: the names the evidence shows absent; ``present``: those it found, each with where
    (``"Create User" on /console/ram/users``); ``events``: deciding audit event ids."""

    verdict: str
    kind: str
    reasons: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    present: tuple[str, ...] = ()
    events: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.verdict not in OUTCOMES:
            raise ConfigError(f"EvidenceOutcome.verdict: must be one of {', '.join(OUTCOMES)}, "
                              f"got {self.verdict!r}")
        if self.kind not in CLAIM_KINDS:
            raise ConfigError(f"EvidenceOutcome.kind: must be one of {', '.join(CLAIM_KINDS)}, "
                              f"got {self.kind!r}")
        for name in ("reasons", "missing", "present", "events"):
            object.__setattr__(self, name, tuple(getattr(self, name)))

    @property
    def confirms_claim(self) -> bool:
        """The agent's infeasibility claim is backed by evidence (a doc defect, not the agent's
        failure)."""
        return self.kind in ("confirmed", "refused")


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
    also for env errors, with ``trainable=False``); ``decided_by``: rule | evidence | judges |
    none | env_error; ``rule_verdict`` / ``evidence_verdict`` / ``judge_verdict``: the channels
    as they came (``None`` when a channel did not run); ``evidence``: audit event ids;
    ``reasons``: why, in order."""

    reward: float
    trainable: bool
    verdict: str
    decided_by: str
    rule_verdict: RuleOutcome | None = None
    judge_verdict: JudgeVerdict | None = None
    evidence: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()
    env_error: EnvError | None = None
    evidence_verdict: EvidenceOutcome | None = None
