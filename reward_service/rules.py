"""Rule-based verdicts from the audit log and the end state (the first part of the reward
service): a task's :class:`~infra.provisioning.tasks.SuccessRule` against the ActionTrail events
of an episode's account and time window, and Describe calls after the episode."""
from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import oss2

from consolerl.errors import CloudAPIError
from infra.cloud import CloudClient
from infra.provisioning.meta import fill
from infra.provisioning.tasks import EventRule, StateCheck, SuccessRule


@dataclass
class RuleVerdict:
    passed: bool
    reasons: list[str] = field(default_factory=list)      # why it failed (empty when passed)
    matched: list[str] = field(default_factory=list)      # eventIds that satisfied the rule


def dotted(value: Any, path: str) -> Any:
    """``requestParameters.UserName`` / ``Instances.Instance.0.Status`` into nested data."""
    for part in path.split("."):
        if isinstance(value, list) and part.isdigit():
            index = int(part)
            value = value[index] if index < len(value) else None
        elif isinstance(value, dict):
            value = value.get(part)
        else:
            return None
    return value


def _as_text(value: Any) -> str:
    if isinstance(value, (list, dict)):
        return json.dumps(value, separators=(",", ":"))
    if isinstance(value, bool):
        return str(value).lower()
    return "" if value is None else str(value)


def matches(event: Mapping[str, Any], rule: EventRule, values: Mapping[str, str]) -> bool:
    if event.get("eventName") != rule.event or event.get("errorCode"):
        return False
    if rule.service and event.get("serviceName") != rule.service:
        return False
    return all(_as_text(dotted(event, path)) == fill(want, values) for path, want in rule.where)


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


def evaluate(rule: SuccessRule, events: list[dict[str, Any]], client: CloudClient,
             values: Mapping[str, str], settle_s: float = 15.0, poll_s: float = 0.25
             ) -> RuleVerdict:
    verdict = RuleVerdict(True)
    for req in rule.required_events:
        hits = [e for e in events if matches(e, req, values)]
        if not hits:
            verdict.passed = False
            verdict.reasons.append(f"no successful {req.event} matching "
                                   f"{dict((k, fill(v, values)) for k, v in req.where)}")
        verdict.matched += [e["eventId"] for e in hits]
    for bad in rule.forbidden_events:
        hits = [e for e in events if matches(e, bad, values)]
        if hits:
            verdict.passed = False
            verdict.reasons.append(f"forbidden {bad.event} happened ({len(hits)}x)")
    for check in rule.end_state:
        # The cloud is eventually consistent (Stopping -> Stopped takes a while): a check may
        # become true shortly after the episode; give it ``settle_s``.
        deadline = time.monotonic() + settle_s
        while (why := check_state(client, check, values)) and time.monotonic() < deadline:
            time.sleep(poll_s)
        if why:
            verdict.passed = False
            verdict.reasons.append(why)
    return verdict
