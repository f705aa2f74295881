"""The evidence channel: infeasibility claims confirmed, refused, contradicted or unsupported
from the pages the agent saw and the audit log; and fusion, where no judge can flip it."""
from __future__ import annotations

import itertools

import pytest

from consolerl.audit import AuditEvent
from consolerl.experience import MAX_PAGES, keep_pages, page_seen
from consolerl.rewards import EvidenceOutcome, JudgeVerdict, RuleOutcome
from consolerl.tasks import TASKS_DIR, load_task, parse_task
from reward_service.evidence import Claim, acted_labels, anchors_of, check_claim, steps_of
from reward_service.fusion import fuse

ACCESSKEY = load_task(TASKS_DIR / "ram" / "ram-create-accesskey-wrongdoc.yaml")
GRANT = load_task(TASKS_DIR / "ram" / "ram-grant-policy-0.yaml")
VALUES = {"dev": "dev-ep1", "episode": "ep1"}

USERS = page_seen("http://c/console/ram/users", "# Users\n[1] link \"Create User\"\n"
                  "table \"Users\":\n - Logon Name | Actions\n"
                  " - [2]dev-ep1 | [3]Add Permissions | [4]Delete")
USER = page_seen("http://c/console/ram/users/dev-ep1", "# dev-ep1\n[1] tab \"Permissions\"\n"
                 "[2] tab \"Groups\"\n[3] button \"Add Permissions\"")
RIGHT = "The user page has no Authentication tab and no Create AccessKey button."


def claim(task=ACCESSKEY, reason=RIGHT, pages=(USERS, USER), actions=("click(\"2\")",),
          events=(), labels=None, values=VALUES, answer=None):
    return check_claim(task, Claim(reason, answer, values, pages, actions, events), labels)


def test_anchors_are_the_names_a_step_gives_to_console_things():
    assert anchors_of("On the Authentication tab, click Create AccessKey.") == \
        ["authentication", "create accesskey"]
    assert anchors_of("Click More > Network and Security Group > Modify Bandwidth for vm-1.",
                      ["vm-1"]) == ["more", "network and security group", "modify bandwidth"]
    assert anchors_of("Open the RAM console in the China (Hangzhou) region and choose VPCs.") \
        == ["vpcs"]
    # option codes count, addresses and the episode's own names do not
    assert anchors_of("Enter sw-ep1 as the name, choose zone cn-hangzhou-z, enter "
                      "192.168.2.0/24.", ["sw-ep1"]) == ["cn-hangzhou-z"]
    assert anchors_of('Click **Create Bucket** and choose "Deep Cold Archive".') == \
        ["create bucket", "deep cold archive"]


def test_steps_fill_placeholders_and_name_their_targets():
    steps = steps_of(ACCESSKEY.procedure, VALUES)
    assert [s.number for s in steps] == [1, 2, 3, 4]
    assert steps[1].targets == ("dev-ep1",) and steps[1].anchors == ()
    assert steps[2].anchors == ("authentication", "create accesskey")


def test_acted_labels_resolve_bids_on_the_page_before_the_action():
    labels = acted_labels([USERS, USER], ['click("2")', 'click("3")'])
    assert "dev-ep1" in labels and "add permissions" in labels


def test_confirmed_when_the_named_control_is_on_no_page_and_the_agent_got_there():
    out = claim()
    assert (out.verdict, out.kind) == ("success", "confirmed"), out
    assert out.missing == ("authentication", "create accesskey")
    assert out.confirms_claim


def test_without_inventory_a_claim_made_before_reaching_the_step_is_unchecked():
    out = claim(pages=(USERS,), actions=())
    assert (out.verdict, out.kind) == ("undetermined", "unchecked")
    assert "step 2" in out.reasons[0]
    # The console's inventory knows the whole console: absent there is absent.
    inventory = {"users", "create user", "add permissions", "permissions", "groups"}
    out = claim(pages=(USERS,), actions=(), labels=inventory)
    assert (out.verdict, out.kind) == ("success", "confirmed")
    assert "inventory" in out.reasons[0]


def test_contradicted_when_the_inventory_has_it_though_the_agent_never_saw_it():
    out = claim(labels={"create accesskey", "authentication"}, pages=(USERS,), actions=())
    assert (out.verdict, out.kind) == ("failure", "contradicted")
    assert any("inventory" in p for p in out.present)


def test_an_agent_failure_reported_as_a_broken_doc_is_contradicted():
    out = claim(task=GRANT, reason="There is no Add Permissions button for the user.",
                values={"dev": "dev-ep1", "episode": "ep1"}, pages=(USERS,), actions=())
    assert (out.verdict, out.kind) == ("failure", "contradicted")
    assert out.present == ("'add permissions' on http://c/console/ram/users",)


@pytest.mark.parametrize("reason", ["The page took too long to load.",
                                    "I could not do it.", "The console has no button for "
                                    "this step."])
def test_a_reason_naming_nothing_of_the_procedure_is_unsupported(reason):
    out = claim(reason=reason)
    assert (out.verdict, out.kind) == ("failure", "unsupported")


def test_no_report_on_a_known_wrong_doc_fails_and_on_a_working_one_abstains():
    out = claim(reason=None, answer="Done.")
    assert (out.verdict, out.kind) == ("failure", "not_reported")
    out = claim(task=GRANT, reason=None, answer="Done.")
    assert (out.verdict, out.kind) == ("undetermined", "no_claim")


def _event(name, error="", message="", service="Vpc", **params):
    return AuditEvent.from_trail({
        "eventId": f"e-{name}", "eventName": name, "serviceName": service, "errorCode": error,
        "errorMessage": message, "requestParameters": params,
        "userAgent": "vpc.console.aliyun.com"})


RESIZE = parse_task({
    "schema": 1, "id": "vpc-shrink-refused", "product": "vpc", "title": "Create a vSwitch",
    "procedure": "1. Open the VPC console and choose VPCs.\n"
                 "2. Click Create vSwitch in the row of VPC {net}.\n"
                 "3. Enter 10.9.0.0/24 as the IPv4 CIDR block and click Create.\n",
    "start_page": "/console/vpc/vpcs", "split": "train", "difficulty": 2,
    "expected": "infeasible", "infeasible_reason": "The CIDR is outside the VPC.",
    "success": {"forbidden_events": [{"event": "DeleteVpc", "service": "Vpc"}]},
}, "test")


def test_refused_when_the_console_rejected_the_documented_values_as_reported():
    ev = _event("CreateVSwitch", "InvalidCidrBlock.Mismatch", "The CIDR block is not in "
                "the VPC", VpcId="vpc-1", CidrBlock="10.9.0.0/24")
    out = check_claim(RESIZE, Claim("The console refuses it: InvalidCidrBlock.Mismatch",
                                    values={"net": "vpc-1"}, events=[ev]))
    assert (out.verdict, out.kind, out.events) == ("success", "refused", ("e-CreateVSwitch",))


def test_a_refusal_of_values_the_agent_made_up_proves_nothing():
    ev = _event("CreateVSwitch", "InvalidCidrBlock.Mismatch", "The CIDR block is not in "
                "the VPC", VpcId="vpc-1", CidrBlock="10.7.0.0/24")
    out = check_claim(RESIZE, Claim("Refused: InvalidCidrBlock.Mismatch",
                                    values={"net": "vpc-1"}, events=[ev]))
    assert (out.verdict, out.kind) == ("failure", "unsupported")
    assert "10.7.0.0/24" in out.reasons[0]


def test_the_operation_or_a_forbidden_event_contradicts_a_claim():
    done = _event("AttachPolicyToUser", service="Ram", UserName="dev-ep1",
                  PolicyName="ReadOnlyAccess")
    out = claim(task=GRANT, reason="There is no Add Permissions button.", events=[done])
    assert (out.verdict, out.kind) == ("failure", "contradicted")
    assert out.events == ("e-AttachPolicyToUser",)
    bad = _event("DeleteUser", service="Ram", UserName="dev-ep1")
    out = claim(events=[bad])
    assert (out.verdict, out.kind) == ("failure", "contradicted")


def test_pages_kept_are_bounded_first_and_last():
    pages = [page_seen(f"u{i}", "x" * 40_000) for i in range(100)]
    kept = keep_pages(pages)
    assert len(kept) == MAX_PAGES and kept[0].startswith("u0\n") and kept[-1].startswith("u99\n")
    assert max(map(len, kept)) <= 30_010


# ---- fusion: rule, then evidence, then judges -------------------------------------------------
RULES = {"success": RuleOutcome("success", ("e1",)), "failure": RuleOutcome("failure"),
         "undetermined": RuleOutcome("undetermined")}
EVIDENCE = {"confirmed": EvidenceOutcome("success", "confirmed", ("gone",)),
            "contradicted": EvidenceOutcome("failure", "contradicted", ("there",)),
            "unchecked": EvidenceOutcome("undetermined", "unchecked"), None: None}


def _wrong_judge(right: str) -> JudgeVerdict:
    """A judge that always answers the opposite of the truth."""
    return JudgeVerdict("failure" if right == "success" else "success", (), "always wrong")


@pytest.mark.parametrize("expected,rule,evidence", list(itertools.product(
    ("success", "infeasible"), RULES, EVIDENCE)))
def test_a_judge_that_is_always_wrong_never_flips_a_decisive_verdict(expected, rule, evidence):
    r, e = RULES[rule], EVIDENCE[evidence]
    rule_decides = rule == "failure" or (rule == "success" and expected == "success")
    ev_decides = e is not None and e.verdict != "undetermined" and (
        expected == "infeasible" or e.verdict == "failure")
    for truth in ("success", "failure"):
        out = fuse(expected, r, _wrong_judge(truth), None, evidence=e)
        if rule_decides:
            assert (out.verdict, out.decided_by) == (rule, "rule")
        elif ev_decides:
            assert (out.verdict, out.decided_by) == (e.verdict, "evidence")
            assert out.evidence_verdict is e
        else:
            assert out.decided_by == "judges"      # only where both abstain


def test_a_confirmed_claim_on_a_task_expected_to_work_is_not_a_success():
    out = fuse("success", RULES["undetermined"], None, None, evidence=EVIDENCE["confirmed"])
    assert (out.verdict, out.decided_by, out.trainable) == ("undetermined", "none", False)
    assert out.evidence_verdict.confirms_claim
    out = fuse("infeasible", RULES["undetermined"], None, None, evidence=EVIDENCE["confirmed"])
    assert (out.verdict, out.decided_by, out.reward) == ("success", "evidence", 1.0)
