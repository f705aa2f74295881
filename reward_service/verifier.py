"""The rule channel: a task's success rule over the episode's audit events, with late-event
waiting, to a :class:`~reward_service.fusion.RuleOutcome` (success, failure, undetermined).

Only events by the episode's account, at or after the episode began, made from the console
(what the agent could do) count. Events arrive late (ActionTrail takes up to minutes), so:

- when every required event has arrived, the rule is decided (forbidden events and end-state
  checks included);
- when they have not, a missing event is only a failure once the log has caught up with the
  episode: an event of the account stamped after the episode ended (the watermark — the
  verifier's own first LookupEvents call is one) shows that everything before it is delivered;
- when neither happens before the settle deadline, the verdict is ``undetermined``
  ("pending"), never a false failure.
Tasks whose documentation is wrong (``expected: infeasible``) are left to the judges unless a
forbidden event decides them.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from consolerl.audit import AuditEvent
from infra.cloud import CloudClient
from consolerl.tasks import Task

from .actiontrail import TrailClient, TrailResult, episode_events
from consolerl.rewards import RuleOutcome
from .rules import RuleVerdict, assign, evaluate, forbidden


@dataclass(frozen=True)
class EpisodeRecord:
    """What the verifier needs to know about an episode (picklable)."""

    account_id: str
    started_at: float                 # epoch seconds
    ended_at: float
    values: tuple[tuple[str, str], ...] = field(default=())   # placeholder values


class RuleVerifier:
    def __init__(self, trail: TrailClient, client: CloudClient, settle_s: float | None = None,
                 end_state_settle_s: float = 15.0):
        self.trail = trail
        self.client = client
        self.settle_s = settle_s
        self.end_state_settle_s = end_state_settle_s

    def verify(self, task: Task, episode: EpisodeRecord) -> RuleOutcome:
        return self.verify_with_events(task, episode)[0]

    def verify_with_events(self, task: Task, episode: EpisodeRecord
                           ) -> tuple[RuleOutcome, list[AuditEvent]]:
        """The outcome and the agent's events it was decided on (console events of the
        episode's account since it began, in audit order)."""
        values = dict(episode.values)
        rule = task.success

        def offset() -> float:
            # Event times are the cloud's clock; the episode's are this machine's.
            return getattr(self.trail, "clock_offset_s", None) or 0.0

        def agent_events(window: list[AuditEvent]) -> list[AuditEvent]:
            return [e for e in episode_events(window, episode.account_id,
                                              episode.started_at + offset())
                    if e.by_console]

        def required_met(events: list[AuditEvent]) -> bool:
            return assign(rule.required_events, events, values)[0] is not None

        def caught_up(window: list[AuditEvent]) -> bool:
            return any(e.epoch > episode.ended_at + offset() + 1 for e in window)

        result = self.trail.wait_for(
            episode.started_at,
            lambda window: required_met(agent_events(window)) or caught_up(window),
            deadline_s=self.settle_s)
        events = agent_events(result.events)
        return self._decide(task, events, values, result), events

    def _decide(self, task: Task, events: list[AuditEvent], values: dict[str, str],
                result: TrailResult) -> RuleOutcome:
        rule = task.success
        chosen = assign(rule.required_events, events, values)[0]
        bad = [e.event_id for _, hits in forbidden(rule, events, values, chosen) for e in hits]
        if result.status == "pending" and chosen is None:
            return RuleOutcome("undetermined", reasons=(
                f"pending: the required events had not arrived after {result.waited_s:.1f} s",),
                forbidden_hits=len(bad), pending=True)
        if task.expected == "infeasible":
            if bad:
                return RuleOutcome("failure", tuple(bad), ("a forbidden event happened",),
                                   forbidden_hits=len(bad))
            return RuleOutcome("undetermined", reasons=("infeasible task: left to the judges",))
        if not rule.required_events and not rule.end_state:
            return RuleOutcome("undetermined", reasons=("the rule decides nothing",),
                               forbidden_hits=len(bad))
        verdict: RuleVerdict = evaluate(rule, events, self.client, values,
                                        settle_s=self.end_state_settle_s)
        # Evidence: the events that decided it (the matched ones for a success, the
        # forbidden ones when they made it fail; an absence has none).
        evidence = verdict.matched if verdict.passed else verdict.forbidden
        return RuleOutcome("success" if verdict.passed else "failure", tuple(evidence),
                           tuple(verdict.reasons), len(verdict.forbidden))


def record(account_id: str, started_at: float, values: dict[str, str] | None = None,
           ended_at: float | None = None) -> EpisodeRecord:
    return EpisodeRecord(account_id, started_at, ended_at if ended_at is not None
                         else time.time(), tuple(sorted((values or {}).items())))
