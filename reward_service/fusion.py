"""Fusion: the rule channel's, the evidence channel's and the judge channel's verdicts, and the
episode's env error, into one :class:`RewardResult` (what crosses the Ray boundary to the
orchestrator).

Policy, first match wins:

1. ``env_error``: the environment broke, not the agent -> reward 0, ``trainable=False``,
   ``decided_by="env_error"``.
2. The rule channel (audit log + end state) decides whenever it is decisive (success or
   failure). For an ``infeasible`` task a rule *success* is not decisive: the rule cannot
   witness that the agent correctly reported the procedure infeasible (its rule usually only
   forbids side effects), so only a rule failure decides there.
3. The evidence channel (:mod:`reward_service.evidence`: an infeasibility claim checked against
   the audit log and the pages the agent saw) decides next. On an ``infeasible`` task a
   confirmed claim is a success and a contradicted or unsupported one (or no report at all) a
   failure. On a task expected to succeed only its failures decide (a claim contradicted by
   the pages): a confirmed claim there says the documentation is wrong for this console, which
   the task's author did not expect, so it is recorded and left to the next channel.
4. Otherwise the judges decide (for infeasible tasks they judge the agent's report_infeasible
   reason) when their verdict is success or failure: only where both channels above abstain, so
   a judge can never flip a decisive verdict.
5. Otherwise ``undetermined``: :attr:`RewardConfig.undetermined_reward`, trainable only when
   :attr:`RewardConfig.undetermined_trainable`.

A trainable result pays ``forbidden_penalty`` per forbidden audit event on top (never below
``min_reward``). Every channel's outcome is recorded whichever decided.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from consolerl.config import AtMost, Checked, Finite
from consolerl.errors import ConfigError
from consolerl.rewards import EvidenceOutcome, JudgeVerdict, RewardResult, RuleOutcome
from consolerl.types import EnvError

from .rules import RuleVerdict

EXPECTED = ("success", "infeasible")
DECIDERS = ("rule", "evidence", "judges", "none", "env_error")
Reward = Annotated[float, Finite()]


@dataclass(frozen=True)
class RewardConfig(Checked):
    """Rewards per verdict. ``forbidden_penalty`` (<= 0) is added once per forbidden audit
    event, the total floored at ``min_reward``; ``undetermined_trainable`` says whether an
    episode neither channel could decide goes into the training signal."""

    success_reward: Reward = 1.0
    failure_reward: Reward = 0.0
    forbidden_penalty: Annotated[float, AtMost(0)] = -0.1
    min_reward: Reward = -1.0
    undetermined_reward: Reward = 0.0
    undetermined_trainable: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.min_reward > min(self.success_reward, self.failure_reward,
                                 self.undetermined_reward):
            raise ConfigError("RewardConfig.min_reward: must not exceed success_reward, "
                              "failure_reward or undetermined_reward")


def rule_outcome_from(rule_verdict: RuleVerdict, *, decisive: bool,
                      forbidden_hits: int = 0) -> RuleOutcome:
    """Adapt :func:`reward_service.rules.evaluate`'s verdict. ``decisive=False`` (e.g. the
    audit window may not have settled yet, or the rule is empty) makes it ``undetermined``
    while keeping its evidence and reasons."""
    verdict = ("success" if rule_verdict.passed else "failure") if decisive else "undetermined"
    return RuleOutcome(verdict, tuple(rule_verdict.matched), tuple(rule_verdict.reasons),
                       forbidden_hits)


def evidence_decides(task_expected: str, evidence: EvidenceOutcome | None) -> bool:
    """Whether the evidence channel's verdict decides the episode (step 3 of the policy)."""
    if evidence is None or evidence.verdict not in ("success", "failure"):
        return False
    return task_expected == "infeasible" or evidence.verdict == "failure"


def fuse(task_expected: str, rule: RuleOutcome | None, judges: JudgeVerdict | None,
         env_error: EnvError | None, config: RewardConfig | None = None, *,
         evidence: EvidenceOutcome | None = None) -> RewardResult:
    """Combine the channels into one reward (policy in the module docstring)."""
    cfg = config or RewardConfig()
    if task_expected not in EXPECTED:
        raise ConfigError(f"fuse.task_expected: must be one of {', '.join(EXPECTED)}, "
                          f"got {task_expected!r}")
    events = rule.evidence if rule else ()
    both = dict(rule_verdict=rule, judge_verdict=judges, evidence_verdict=evidence)
    if env_error is not None:
        return RewardResult(0.0, False, "failure", "env_error", env_error=env_error,
                            reasons=(f"env_error {env_error.kind}: {env_error.message}",),
                            evidence=events, **both)
    rule_decides = rule is not None and (
        rule.verdict == "failure" or (rule.verdict == "success" and task_expected == "success"))
    if rule_decides:
        verdict, by = rule.verdict, "rule"
        reasons = rule.reasons or ("rule passed",)
    elif evidence_decides(task_expected, evidence):
        assert evidence is not None
        verdict, by = evidence.verdict, "evidence"
        reasons = tuple(f"evidence ({evidence.kind}): {r}" for r in evidence.reasons) or \
            (f"evidence: {evidence.kind}",)
        events = tuple(dict.fromkeys((*events, *evidence.events)))
    elif judges is not None and judges.verdict in ("success", "failure"):
        verdict, by, reasons = judges.verdict, "judges", (f"judges: {judges.reason}",)
    else:
        verdict, by = "undetermined", "none"
        reasons = ("no channel decided"
                   + (f"; rule: {rule.verdict}" if rule else "; no rule")
                   + (f"; evidence: {evidence.kind}" if evidence else "")
                   + (f"; judges: {judges.reason}" if judges else "; no judges"),)
    if verdict == "undetermined":
        reward, trainable = cfg.undetermined_reward, cfg.undetermined_trainable
    else:
        reward = cfg.success_reward if verdict == "success" else cfg.failure_reward
        trainable = True
    hits = rule.forbidden_hits if rule else 0
    if trainable and hits:
        reward = max(reward + cfg.forbidden_penalty * hits, cfg.min_reward)
        reasons = (*reasons, f"{hits} forbidden event(s): {cfg.forbidden_penalty * hits:+.2f}")
    return RewardResult(float(reward), trainable, verdict, by, reasons=tuple(reasons),
                        evidence=events, **both)
