"""The rule channel over hand-written audit logs: every predicate kind (table-driven), ordering,
resource references, forbidden events, end-state checks, and every verdict of the verifier."""
from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any

import pytest

from consolerl.audit import AuditEvent
from consolerl.errors import CloudAPIError, ConfigError
from consolerl.tasks import parse_task
from reward_service.actiontrail import TrailResult
from reward_service.rules import assign, evaluate, matches
from reward_service.verifier import RuleVerifier, record

ACCOUNT = "1000000001"
T0 = 1_800_000_000          # an episode start, epoch seconds


def event(name: str, at: float = T0 + 5, *, service: str = "Ecs", error: str = "",
          account: str = ACCOUNT, request: dict | None = None, response: dict | None = None,
          console: bool = True, eid: str = "") -> AuditEvent:
    return AuditEvent.from_trail({
        "eventId": eid or f"{name}-{at}", "eventName": name, "serviceName": service,
        "eventTime": datetime.fromtimestamp(at, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "errorCode": error, "acsRegion": "cn-hangzhou",
        "eventType": "ConsoleOperation" if console else "ApiCall",
        "userAgent": f"{service.lower()}.console.aliyun.com" if console else "Python SDK",
        "userIdentity": {"accountId": account, "type": "root-account"},
        "requestParameters": request or {}, "responseElements": response or {},
    })


def changed(e: AuditEvent, **fields: Any) -> AuditEvent:
    """``e`` with some fields of its ActionTrail JSON replaced."""
    return AuditEvent.from_trail({**e.to_json(), **fields})


def task_with(success: dict, expected: str = "success", **extra: Any):
    doc = {"schema": 1, "id": "t-rules", "product": "ecs", "title": "t",
           "procedure": "1. Do it.", "start_page": "/console/ecs/instances", "split": "train",
           "difficulty": 1, "expected": expected, "success": success, **extra}
    if expected == "infeasible":
        doc["infeasible_reason"] = "the console has no such button"
    return parse_task(doc, "tasks/t-rules.yaml")


def rule_of(where: dict, event_name: str = "AuthorizeSecurityGroup") -> Any:
    return task_with({"required_events": [{"event": event_name, "where": where}]}) \
        .success.required_events[0]


SG_EVENT = event("AuthorizeSecurityGroup", request={
    "SecurityGroupId": "sg-abc123", "PortRange": "22/22", "IpProtocol": "TCP",
    "Priority": 1, "Tags": ["a", "b"]}, response={"RequestId": "r-1"})


# ---- every predicate kind, table-driven ---------------------------------------------------
@pytest.mark.parametrize("where,hit", [
    ({"requestParameters.SecurityGroupId": "{sg}"}, True),                    # eq + placeholder
    ({"requestParameters.SecurityGroupId": "sg-other"}, False),
    ({"requestParameters.Priority": 1}, True),                                # eq, number as text
    ({"requestParameters.Priority": 2}, False),
    ({"requestParameters.PortRange": {"in": ["80/80", "22/22"]}}, True),
    ({"requestParameters.PortRange": {"in": ["80/80", "443/443"]}}, False),
    ({"requestParameters.SecurityGroupId": {"prefix": "sg-"}}, True),
    ({"requestParameters.SecurityGroupId": {"prefix": "vpc-"}}, False),
    ({"requestParameters.Tags": {"contains": '"b"'}}, True),                  # lists as JSON
    ({"requestParameters.Tags": {"contains": '"c"'}}, False),
    ({"requestParameters.IpProtocol": {"regex": "(?i)tcp"}}, True),
    ({"requestParameters.IpProtocol": {"regex": "TC"}}, False),               # full match only
    ({"responseElements.RequestId": {"exists": True}}, True),
    ({"responseElements.InstanceId": {"exists": True}}, False),
    ({"responseElements.InstanceId": {"exists": False}}, True),
    ({"requestParameters.Missing.Deep.Path": "x"}, False),
    ({"serviceName": "Ecs", "acsRegion": "cn-hangzhou"}, True),
    ({"acsRegion": "cn-shanghai"}, False),                                    # wrong region
])
def test_each_predicate_kind(where, hit):
    assert matches(SG_EVENT, rule_of(where), {"sg": "sg-abc123"}) is hit


def test_event_name_service_and_error_code():
    values = {"sg": "sg-abc123"}
    assert not matches(SG_EVENT, rule_of({}, "RevokeSecurityGroup"), values)
    wrong_service = task_with({"required_events": [
        {"event": "AuthorizeSecurityGroup", "service": "Vpc"}]}).success.required_events[0]
    assert not matches(SG_EVENT, wrong_service, values)
    failed = changed(SG_EVENT, errorCode="InvalidPort.Malformed")
    assert not matches(failed, rule_of({}), values)              # failed calls do not count...
    assert matches(failed, rule_of({"errorCode": "InvalidPort.Malformed"}), values)  # ...unless
    assert not matches(SG_EVENT, rule_of({"errorCode": {"exists": True}}), values)   # asked for


@pytest.mark.parametrize("where,message", [
    ({"a": {"between": [1, 2]}}, "unknown predicate 'between'"),
    ({"a": {"in": []}}, "non-empty list"),
    ({"a": {"regex": "("}}, "where.a.regex: not an RE2 regular expression"),
    # A task's pattern runs in RE2 (consolerl.patterns), as every user's pattern does.
    ({"a": {"regex": r"(x)\1"}}, "where.a.regex: backreferences"),
    ({"a": {"regex": "x(?=y)"}}, "where.a.regex: lookaround"),
    ({"a": {"regex": "x" * 201}}, "where.a.regex: at most 200 characters"),
    ({"a": {"exists": "yes"}}, "true or false"),
    ({"a": {"ref": "nope"}}, "'<rule id>.<dotted field>'"),
    ({"a": {"ref": "ghost.responseElements.Id"}}, "must name an earlier required event's id"),
    ({"a": {"prefix": "x", "contains": "y"}}, "a scalar or a mapping with one of"),
    ({"a": [1, 2]}, "a scalar or a mapping with one of"),
])
def test_bad_predicates_name_the_field(where, message):
    with pytest.raises(ConfigError, match="tasks/t-rules.yaml: success.required_events") as err:
        rule_of(where)
    assert message in str(err.value)


def test_a_pattern_that_backtracks_in_re_is_matched_in_linear_time():
    """An inline task (POST /v1/jobs) brings its own patterns: (?:a|a)*b on 24 a's takes
    seconds in Python's re (twice as long per a) and microseconds in RE2."""
    rule = rule_of({"requestParameters.UserName": {"regex": "(?:a|a)*b"}}, "CreateUser")
    user = event("CreateUser", service="Ram", request={"UserName": "a" * 24})
    started = time.perf_counter()
    assert not matches(user, rule, {})
    assert time.perf_counter() - started < 0.2


def test_after_and_ids_are_checked():
    with pytest.raises(ConfigError, match="'later' must name an earlier"):
        task_with({"required_events": [{"event": "A", "after": ["later"]},
                                       {"id": "later", "event": "B"}]})
    with pytest.raises(ConfigError, match="used twice"):
        task_with({"required_events": [{"id": "a", "event": "A"}, {"id": "a", "event": "B"}]})
    with pytest.raises(ConfigError, match="only for required_events"):
        task_with({"required_events": [{"event": "A"}],
                   "forbidden_events": [{"event": "B", "after": []}, {"id": "x", "event": "C"}]})


# ---- ordering and resource references ----------------------------------------------------
TWO_STEP = {"required_events": [
    {"id": "sg", "event": "CreateSecurityGroup",
     "where": {"requestParameters.SecurityGroupName": "web"}},
    {"event": "AuthorizeSecurityGroup", "after": ["sg"],
     "where": {"requestParameters.SecurityGroupId": {"ref": "sg.responseElements.SecurityGroupId"}}},
], "forbidden_events": [
    {"event": "DeleteSecurityGroup",
     "where": {"requestParameters.SecurityGroupId": {"ref": "sg.responseElements.SecurityGroupId"}}},
]}


def create(sg: str, at: float, name: str = "web") -> AuditEvent:
    return event("CreateSecurityGroup", at, request={"SecurityGroupName": name},
                 response={"SecurityGroupId": sg}, eid=f"create-{sg}")


def authorize(sg: str, at: float) -> AuditEvent:
    return event("AuthorizeSecurityGroup", at, request={"SecurityGroupId": sg},
                 eid=f"auth-{sg}-{at}")


@pytest.mark.parametrize("log,passed,evidence", [
    ([create("sg-1", T0 + 1), authorize("sg-1", T0 + 2)], True, ["create-sg-1", f"auth-sg-1-{T0 + 2}"]),
    # the rule event came before the group's creation: ordering fails
    ([authorize("sg-1", T0 + 1), create("sg-1", T0 + 2)], False, []),
    # the rule went to a different group than the one created
    ([create("sg-1", T0 + 1), authorize("sg-9", T0 + 2)], False, []),
    # two groups named web: the second one got the rule -> the search finds that pairing
    ([create("sg-1", T0 + 1), create("sg-2", T0 + 2), authorize("sg-2", T0 + 3)], True,
     ["create-sg-2", f"auth-sg-2-{T0 + 3}"]),
    # done, then the group was deleted: forbidden, by reference to the created group
    ([create("sg-1", T0 + 1), authorize("sg-1", T0 + 2),
      event("DeleteSecurityGroup", T0 + 3, request={"SecurityGroupId": "sg-1"}, eid="del")],
     False, []),
    # deleting some other group is not forbidden
    ([create("sg-1", T0 + 1), authorize("sg-1", T0 + 2),
      event("DeleteSecurityGroup", T0 + 3, request={"SecurityGroupId": "sg-7"}, eid="del")],
     True, ["create-sg-1", f"auth-sg-1-{T0 + 2}"]),
])
def test_ordering_and_references(log, passed, evidence):
    task = task_with(TWO_STEP)
    verdict = evaluate(task.success, log, None, {})
    assert verdict.passed is passed, verdict.reasons
    assert verdict.matched == evidence or not passed
    if not passed:
        assert verdict.reasons


def test_the_search_stays_fast_on_long_logs():
    rules = task_with(TWO_STEP).success.required_events
    log = [create(f"sg-{i}", T0 + i) for i in range(300)] + [authorize("sg-nope", T0 + 400)] * 300
    t = time.perf_counter()
    chosen, deepest = assign(rules, log, {})
    assert chosen is None and deepest == 1
    assert time.perf_counter() - t < 5


# ---- the verifier's verdicts -------------------------------------------------------------
class FakeTrail:
    """Stands in for TrailClient.wait_for (the real one is tested against the local cloud)."""

    def __init__(self, events: list[AuditEvent], status: str = "complete"):
        self.events, self.status = events, status

    def wait_for(self, start, predicate, deadline_s=None):
        window = [e for e in self.events]
        done = predicate(window)
        return TrailResult("complete" if done or self.status == "complete" else "pending",
                           window, 0.0, 1)


class FakeCloud:
    """Answers the end-state Describe calls from a dict."""

    def __init__(self, answers: dict[str, Any]):
        self.answers = answers

    def rpc(self, service, action, params):
        answer = self.answers[action]
        if isinstance(answer, Exception):
            raise answer
        return answer


CREATE_USER = {
    "required_events": [{"event": "CreateUser", "service": "Ram",
                         "where": {"requestParameters.UserName": "{user}"}}],
    "forbidden_events": [{"event": "DeleteUser", "service": "Ram"}],
    "end_state": [{"service": "Ram", "action": "GetUser", "params": {"UserName": "{user}"},
                   "expect": {"User.UserName": "{user}"}}],
}
USER_OK = {"GetUser": {"User": {"UserName": "alice"}}}
USER_GONE = {"GetUser": CloudAPIError("EntityNotExist.User", "no such user", 404)}
WATERMARK = event("LookupEvents", T0 + 100, service="Actiontrail", console=False, eid="wm")
MADE = event("CreateUser", T0 + 5, service="Ram", request={"UserName": "alice"}, eid="made")
DELETED = event("DeleteUser", T0 + 8, service="Ram", request={"UserName": "alice"}, eid="del")


@pytest.mark.parametrize("name,success,expected,log,status,cloud,verdict,evidence", [
    ("done", CREATE_USER, "success", [MADE], "complete", USER_OK, "success", ("made",)),
    ("nothing done, log caught up", CREATE_USER, "success", [WATERMARK], "complete", USER_OK,
     "failure", ()),
    ("done then undone", CREATE_USER, "success", [MADE, DELETED, WATERMARK], "complete",
     USER_GONE, "failure", ("del",)),
    ("event but end state wrong", CREATE_USER, "success", [MADE], "complete", USER_GONE,
     "failure", ()),
    ("late: not delivered by the deadline", CREATE_USER, "success", [], "pending", USER_OK,
     "undetermined", ()),
    ("event before the episode", CREATE_USER, "success",
     [changed(MADE, eventTime="2027-01-15T07:59:00Z"), WATERMARK], "complete", USER_OK,
     "failure", ()),
    ("event of another account", CREATE_USER, "success",
     [changed(MADE, userIdentity={"accountId": "1999999999"}), WATERMARK], "complete", USER_OK,
     "failure", ()),
    ("made through the API, not the console", CREATE_USER, "success",
     [changed(MADE, eventType="ApiCall", userAgent="Python SDK"), WATERMARK], "complete",
     USER_OK, "failure", ()),
    ("infeasible, no side effects", CREATE_USER, "infeasible", [WATERMARK], "complete",
     USER_OK, "undetermined", ()),
    ("infeasible, forbidden side effect", CREATE_USER, "infeasible", [DELETED, WATERMARK],
     "complete", USER_OK, "failure", ("del",)),
])
def test_every_verdict(name, success, expected, log, status, cloud, verdict, evidence):
    task = task_with(success, expected, parameters={"user": "alice"})
    verifier = RuleVerifier(FakeTrail(log, status), FakeCloud(cloud), end_state_settle_s=0)
    outcome = verifier.verify(task, record(ACCOUNT, T0, {"user": "alice"}, ended_at=T0 + 10))
    assert outcome.verdict == verdict, (name, outcome)
    assert outcome.evidence == evidence, name
    if verdict == "failure":
        assert outcome.reasons, name
