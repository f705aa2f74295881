"""Rule-based verdicts from the audit log and the end state (the first part of the reward
service): a task's :class:`~consolerl.tasks.SuccessRule` against the ActionTrail events
of an episode's account and time window, and Describe calls after the episode."""
from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import oss2

from consolerl.audit import AuditEvent, dotted
from consolerl.errors import CloudAPIError
from consolerl.patterns import compile_pattern, fullmatch
from infra.cloud import CloudClient
from consolerl.resources import fill
from consolerl.tasks import EventRule, Predicate, StateCheck, SuccessRule


@dataclass
class RuleVerdict:
    passed: bool
    reasons: list[str] = field(default_factory=list)      # why it failed (empty when passed)
    matched: list[str] = field(default_factory=list)      # eventIds that satisfied the rule
    forbidden: list[str] = field(default_factory=list)    # eventIds of forbidden events


def _as_text(value: Any) -> str:
    if isinstance(value, (list, dict)):
        return json.dumps(value, separators=(",", ":"))
    if isinstance(value, bool):
        return str(value).lower()
    return "" if value is None else str(value)


def _test(pred: Predicate, got: Any, values: Mapping[str, str],
          bound: Mapping[str, AuditEvent] | None) -> bool:
    if pred.op == "exists":
        return (got is not None and got != "") == (pred.value == "true")
    text = _as_text(got)
    if pred.op == "eq":
        return text == fill(pred.value, values)
    if pred.op == "in":
        return text in {fill(v, values) for v in pred.value}
    if pred.op == "prefix":
        return text.startswith(fill(pred.value, values))
    if pred.op == "contains":
        return fill(pred.value, values) in text
    if pred.op == "regex":          # RE2 (linear time): the task may be a user's inline one
        return fullmatch(compile_pattern(pred.value, "regex"), text)
    if pred.op == "ref":
        rule_id, path = pred.value.split(".", 1)
        if bound is None:                 # pre-filtering candidates: references come later
            return True
        other = bound.get(rule_id)
        return other is not None and got is not None and text == _as_text(other.at(path))
    raise ValueError(f"unknown predicate {pred.op!r}")


def matches(event: AuditEvent, rule: EventRule, values: Mapping[str, str],
            bound: Mapping[str, AuditEvent] | None = None) -> bool:
    """Whether ``event`` satisfies ``rule``; ``bound``: the events already matched by the
    required rules named in ``ref`` predicates (a reference to an unbound rule fails;
    ``bound=None`` skips the references)."""
    if event.event_name != rule.event:
        return False
    if rule.service and event.service_name != rule.service:
        return False
    if event.refused and not any(path == "errorCode" for path, _ in rule.where):
        return False
    return all(_test(pred, event.at(path), values, bound)
               for path, pred in rule.where)


def assign(rules: tuple[EventRule, ...] | list[EventRule], events: list[AuditEvent],
           values: Mapping[str, str]) -> tuple[list[int] | None, int]:
    """Choose one event per required rule so that every predicate, reference and ordering
    holds (depth-first over the rules in declaration order; references and ``after`` only name
    earlier rules). ``events`` are in audit order. Returns the chosen event indices (``None``
    when no choice satisfies all rules) and how many leading rules the deepest partial choice
    satisfied (to say which rule failed)."""
    candidates = [[k for k, e in enumerate(events) if matches(e, r, values, None)]
                  for r in rules]
    # Only a rule that a later rule references can need a later event than its first fit;
    # for ordering alone the earliest fit is always best.
    referenced = {p.value.split(".", 1)[0] for r in rules for _, p in r.where if p.op == "ref"}
    chosen: list[int] = []
    deepest = 0

    def search(i: int) -> bool:
        nonlocal deepest
        deepest = max(deepest, i)
        if i == len(rules):
            return True
        rule = rules[i]
        bound = {rules[j].id: events[chosen[j]] for j in range(i) if rules[j].id}
        not_before = max((chosen[j] for j in range(i) if rules[j].id in rule.after),
                         default=-1)
        for k in candidates[i]:
            if k <= not_before or not matches(events[k], rule, values, bound):
                continue
            chosen.append(k)
            if search(i + 1):
                return True
            chosen.pop()
            if rule.id not in referenced:
                break
        return False

    return (list(chosen) if search(0) else None), deepest


def forbidden(rule: SuccessRule, events: list[AuditEvent], values: Mapping[str, str],
              chosen: list[int] | None) -> list[tuple[EventRule, list[AuditEvent]]]:
    """The forbidden rules that ``events`` break, each with its events. ``chosen``: the
    required rules' events from :func:`assign` (what ``ref`` predicates point at; with
    ``None`` a referencing forbidden rule cannot match)."""
    bound = {} if chosen is None else {
        r.id: events[k] for r, k in zip(rule.required_events, chosen) if r.id}
    out = []
    for bad in rule.forbidden_events:
        hits = [e for e in events if matches(e, bad, values, bound)]
        if hits:
            out.append((bad, hits))
    return out


def describe(rule: EventRule, values: Mapping[str, str]) -> str:
    parts = []
    for path, pred in rule.where:
        if pred.op == "eq":
            parts.append(f"{path}={fill(pred.value, values)!r}")
        else:
            parts.append(f"{path} {pred.op} {pred.value!r}")
    after = f" after {', '.join(rule.after)}" if rule.after else ""
    return f"{rule.event}({', '.join(parts)}){after}"


def check_state(client: CloudClient, check: StateCheck, values: Mapping[str, str]) -> str:
    """'' when the end-state check holds, else why not."""
    params = {k: fill(v, values) for k, v in check.params}
    try:
        if check.service == "Oss":
            body = _oss_read(client, check.action, params)
        else:
            body = client.rpc(check.service, check.action, params)
    except (CloudAPIError, oss2.exceptions.OssError) as exc:
        if check.expect_error and exc.code == check.expect_error:
            return ""
        return f"{check.service}.{check.action} failed: {exc.code}"
    if check.expect_error:
        return f"{check.service}.{check.action} succeeded, expected {check.expect_error}"
    for path, want in check.expect:
        got = _as_text(dotted(body, path))
        if got != fill(want, values):
            return f"{check.service}.{check.action}: {path} is {got!r}, expected {fill(want, values)!r}"
    return ""


def _oss_read(client: CloudClient, action: str, params: Mapping[str, str]) -> dict[str, Any]:
    bucket = client.oss_bucket(params["BucketName"])
    if action == "GetBucketAcl":
        return {"Acl": bucket.get_bucket_acl().acl}
    if action == "GetBucketInfo":
        info = bucket.get_bucket_info()
        return {"Bucket": {"Name": info.name, "Acl": info.acl.grant,
                           "StorageClass": info.storage_class}}
    raise ValueError(f"no OSS read action {action!r}")


def evaluate(rule: SuccessRule, events: list[AuditEvent], client: CloudClient | None,
             values: Mapping[str, str], settle_s: float = 15.0, poll_s: float = 0.25
             ) -> RuleVerdict:
    """The rule over the episode's events (in audit order) and the end state. ``client`` may be
    ``None`` only for a rule without end-state checks."""
    verdict = RuleVerdict(True)
    chosen, deepest = assign(rule.required_events, events, values)
    if chosen is None:
        verdict.passed = False
        missing = rule.required_events[deepest]
        verdict.reasons.append(f"no successful {describe(missing, values)}"
                               + (" after the events matched before it" if deepest else ""))
    else:
        verdict.matched += [events[k].event_id for k in chosen]
    for bad, hits in forbidden(rule, events, values, chosen):
        verdict.passed = False
        verdict.forbidden += [e.event_id for e in hits]
        verdict.reasons.append(f"forbidden {describe(bad, values)} happened ({len(hits)}x)")
    for check in rule.end_state:
        if client is None:
            raise ValueError("evaluate: the rule has end-state checks but no client was given")
        # The cloud is eventually consistent (Stopping -> Stopped takes a while): a check may
        # become true shortly after the episode; give it ``settle_s``.
        # No waiting when the verdict is already a failure: the check is only evidence then.
        deadline = time.monotonic() + (settle_s if verdict.passed else 0.0)
        while (why := check_state(client, check, values)) and time.monotonic() < deadline:
            time.sleep(poll_s)
        if why:
            verdict.passed = False
            verdict.reasons.append(why)
    return verdict
