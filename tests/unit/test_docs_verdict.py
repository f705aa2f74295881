"""Every branch of a procedure's verdict, on hand-built static checks and rollouts: broken only
with evidence (a static defect, or an infeasibility claim the evidence channel confirmed),
works with the pass rate (no flaky), works_text_stale naming each stale step, and
inconclusive when the agent failed with nothing to show or too few samples completed."""
from __future__ import annotations

import pytest

from doccheck.model import StepCheck
from doccheck.verdict import NO_EVIDENCE, NOT_RUN, procedure_verdict
from jobsapi.schema import AuditEvent, ClaimCheck, Rollout

OK = [StepCheck("1", "ok"), StepCheck("2", "ok"), StepCheck("3", "ok")]
STALE = [StepCheck("1", "ok"), StepCheck("2", "label_differs", mention="Create User",
                                         closest="Add User", score=0.9)]
MISSING = [StepCheck("1", "ok"), StepCheck("2", "missing", mention="Frobnicate",
                                           closest="Create User", score=0.4,
                                           detail="no control 'Frobnicate' on the Users page")]


def event(name: str, error: str = "") -> AuditEvent:
    return AuditEvent(event_id="e", event_name=name, event_time="t", error_code=error)


def run(verdict: str | None, sample: int = 0, state: str = "completed", **kw) -> Rollout:
    return Rollout(id=f"r{sample}", job_id="j", task_id="t", sample=sample, state=state,
                   verdict=verdict, **kw)


def test_a_pass_is_evidence_and_the_rate_is_kept():
    v = procedure_verdict(OK, [run("success", 0, deciding_events=[event("CreateUser")]),
                               run("failure", 1), run("failure", 2)], samples=3)
    assert v.verdict == "works" and (v.passes, v.samples) == (1, 3)
    assert v.evidence[0].kind == "audit" and "CreateUser" in v.evidence[0].detail


def test_works_but_the_text_is_stale():
    v = procedure_verdict(STALE, [run("success")], samples=1)
    assert v.verdict == "works_text_stale"
    stale = [e for e in v.evidence if e.kind == "static"]
    assert [e.ref for e in stale] == ["2"] and "'Add User'" in stale[0].detail \
        and "'Create User'" in stale[0].detail


@pytest.mark.parametrize("rollouts", [[], [run("success"), run("success", 1)]])
def test_a_static_defect_is_broken_with_the_step_and_closest_control(rollouts):
    v = procedure_verdict(MISSING, rollouts, samples=len(rollouts))
    assert v.verdict == "broken"
    first = v.evidence[0]
    assert first.kind == "static" and first.ref == "2" and "missing" in first.detail
    assert "'Create User'" in first.detail
    if rollouts:        # the passes are kept, said as what they are
        assert v.passes == 2 and "another way" in v.evidence[-1].detail


@pytest.mark.parametrize("label", ["missing", "unreachable", "ambiguous"])
def test_every_defect_label_is_broken(label):
    v = procedure_verdict([StepCheck("4", label, mention="X")], [], samples=0)
    assert v.verdict == "broken" and v.evidence[0].ref == "4" and label in v.evidence[0].detail


def test_an_optional_step_the_console_lacks_is_no_defect():
    v = procedure_verdict([StepCheck("3", "ok"), StepCheck("4", "not_applicable",
                                                           mention="Add Tag")], [], samples=0)
    assert v.verdict == "inconclusive" and v.evidence[0].detail == NOT_RUN


def test_static_only_without_a_defect_is_inconclusive_and_says_not_run():
    v = procedure_verdict(OK, [], samples=0)
    assert v.verdict == "inconclusive" and v.evidence[0].detail == NOT_RUN
    v = procedure_verdict(STALE, [], samples=0)
    assert v.verdict == "inconclusive" and [e.ref for e in v.evidence[1:]] == ["2"]


def checked(kind: str, verdict: str = "success", *reasons: str) -> ClaimCheck:
    return ClaimCheck(kind=kind, verdict=verdict, reasons=list(reasons))


def test_an_infeasibility_claim_the_console_refusal_confirms_is_broken():
    claim = run("infeasible", infeasible_reason="the console refuses the name",
                deciding_events=[event("CreateUser", "InvalidUserName.Malformed")],
                claim=checked("refused", "success", "the console refused CreateUser"))
    v = procedure_verdict(OK, [claim, run("failure", 1)], samples=2,
                          operations={"CreateUser"})
    assert v.verdict == "broken"
    kinds = [e.kind for e in v.evidence]
    assert kinds == ["audit", "infeasibility"]
    assert "InvalidUserName.Malformed" in v.evidence[0].detail and v.evidence[0].ref == \
        "CreateUser"
    assert "confirmed: the console refused CreateUser" in v.evidence[1].detail


def test_a_refusal_in_the_log_without_the_channel_confirming_the_claim_is_not_broken():
    claim = run("infeasible", infeasible_reason="it failed",
                deciding_events=[event("CreateUser", "InvalidUserName.Malformed")],
                claim=checked("unsupported", "failure", "names nothing of the procedure"))
    v = procedure_verdict(OK, [claim], samples=1, operations={"CreateUser"})
    assert v.verdict == "inconclusive"
    assert any("not confirmed: unsupported" in e.detail for e in v.evidence)


def test_a_missing_control_confirmed_is_broken_and_a_contradicted_one_is_not():
    gone = run("infeasible", infeasible_reason="no Create AccessKey button",
               claim=checked("confirmed", "success", "'create accesskey' is on no page"))
    v = procedure_verdict(OK, [gone], samples=1)
    assert v.verdict == "broken" and v.evidence[-1].kind == "infeasibility"
    there = run("infeasible", infeasible_reason="no Create User button",
                claim=checked("contradicted", "failure", "'create user' on /console/ram/users"))
    v = procedure_verdict(OK, [there], samples=1)
    assert v.verdict == "inconclusive"
    assert any("contradicted" in e.detail and "/console/ram/users" in e.detail
               for e in v.evidence)


def test_a_refusal_of_another_operation_or_without_a_claim_decides_nothing():
    other = run("infeasible", deciding_events=[event("DeleteUser", "Forbidden")])
    v = procedure_verdict(OK, [other, run("failure", 1)], samples=2, operations={"CreateUser"})
    assert v.verdict == "inconclusive" and v.evidence[0].detail == NO_EVIDENCE
    unclaimed = run("failure", deciding_events=[event("CreateUser", "Invalid")])
    v = procedure_verdict(OK, [unclaimed], samples=1, operations={"CreateUser"})
    assert v.verdict == "inconclusive"
    assert any(e.kind == "audit" and "Invalid" in e.detail for e in v.evidence)   # shown


def test_an_unconfirmed_infeasibility_claim_is_inconclusive():
    v = procedure_verdict(OK, [run("infeasible", infeasible_reason="no such button")],
                          samples=1, operations={"CreateUser"})
    assert v.verdict == "inconclusive" and v.evidence[0].kind == "agent"


def test_a_known_defect_is_broken_only_with_the_claim_confirmed():
    claim = run("infeasible", reward=1.0, infeasible_reason="no Modify Bandwidth action",
                claim=checked("confirmed", "success", "'modify bandwidth' is on no page"))
    v = procedure_verdict((), [claim], samples=1,
                          known_defect="The console offers no Modify Bandwidth action.")
    assert v.verdict == "broken" and v.evidence[0].kind == "infeasibility"
    assert "known defect" in v.evidence[0].detail
    # A positive reward from the judges alone (no confirmed claim) is not evidence.
    judged = run("infeasible", reward=1.0, infeasible_reason="no Modify Bandwidth action",
                 claim=checked("unchecked", "undetermined"))
    assert procedure_verdict((), [judged], samples=1, known_defect="x").verdict == \
        "inconclusive"
    wrong = run("infeasible", reward=0.0, infeasible_reason="I am tired")
    assert procedure_verdict((), [wrong], samples=1, known_defect="x").verdict == "inconclusive"


def test_the_agent_failing_is_inconclusive_never_broken():
    v = procedure_verdict(OK, [run("failure"), run("failure", 1)], samples=2)
    assert v.verdict == "inconclusive" and v.evidence[0].detail == NO_EVIDENCE
    v = procedure_verdict(OK, [run("undetermined"), run("failure", 1)], samples=2)
    assert "could not decide 1 of 2" in v.evidence[0].detail


def test_environment_failures_never_count():
    rows = [run(None, 0, "failed"), run(None, 1, "failed"), run("failure", 2)]
    v = procedure_verdict(OK, rows, samples=3)
    assert v.verdict == "inconclusive" and v.samples == 1
    assert "only 1 of 3 samples completed (2 lost to the environment)" in v.evidence[0].detail
    # ... and a pass among too few still works: success is evidence.
    rows[2] = run("success", 2)
    assert procedure_verdict(OK, rows, samples=3).verdict == "works"


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="samples"):
        procedure_verdict(OK, [], samples=-1)


def test_a_claim_that_a_renamed_control_is_missing_is_not_broken():
    claim = run("infeasible", infeasible_reason="there is no Create User button",
                claim=ClaimCheck(kind="confirmed", verdict="success", missing=["create user"],
                                 reasons=["'create user' is on no page the agent saw"]))
    v = procedure_verdict(STALE, [claim], samples=1)
    assert v.verdict == "inconclusive"
    assert any("'create user' is now 'Add User'" in e.detail for e in v.evidence)
    # ... while a missing name the static check did not find renamed still is.
    other = claim.model_copy(update={"claim": claim.claim.model_copy(
        update={"missing": ["create accesskey"]})})
    assert procedure_verdict(STALE, [other], samples=1).verdict == "broken"


# ---- sure defects and suspicions (issue 56: a verdict policy that weighs evidence) ----------
SUSPECT = [StepCheck("1", "ok"), StepCheck("2", "missing", mention="Add a user",
                                           closest="Create User", score=0.6, suspect=True,
                                           detail="no control named 'Add a user' where the "
                                                  "step is; closest: 'Create User'")]


def test_a_suspicion_alone_is_inconclusive_never_broken():
    v = procedure_verdict(SUSPECT, [], samples=0)
    assert v.verdict == "inconclusive" and "suspected defect" in v.evidence[0].detail
    assert [e.ref for e in v.evidence[1:]] == ["2"] and "suspected" in v.evidence[1].detail


@pytest.mark.parametrize("executor", ["agent", "replay"])
def test_a_run_that_gets_past_a_suspicion_makes_the_text_stale_there(executor):
    v = procedure_verdict(SUSPECT, [run("success")], samples=1, executor=executor)
    assert v.verdict == "works_text_stale" and v.passes == 1
    assert v.evidence[0].kind == "audit" and f"the {executor} passed" in v.evidence[0].detail
    past = v.evidence[1]
    assert past.ref == "2" and "got past it" in past.detail and "'Create User'" in past.detail


def test_a_replay_that_stops_at_a_suspected_step_is_inconclusive_and_says_where():
    stopped = run("failure", end_detail="step 2: no button or link 'Create User' on "
                                        "/console/ram/users")
    v = procedure_verdict(SUSPECT, [stopped], samples=1, executor="replay")
    assert v.verdict == "inconclusive"
    details = [e.detail for e in v.evidence]
    assert "the replay did not complete it" in details[0]
    assert any("the replay stopped: step 2: no button" in d for d in details)
    assert any(e.ref == "2" and "suspected" in e.detail for e in v.evidence)


def test_a_sure_defect_stays_broken_beside_a_suspicion_and_a_pass():
    checks = SUSPECT + [StepCheck("3", "missing", mention="Frobnicate", detail="nothing")]
    v = procedure_verdict(checks, [run("success")], samples=1, executor="replay")
    assert v.verdict == "broken" and [e.ref for e in v.evidence if e.kind == "static"] == ["3"]


def test_an_unknown_executor_is_refused():
    with pytest.raises(ValueError, match="executor"):
        procedure_verdict(OK, [], samples=0, executor="robot")
