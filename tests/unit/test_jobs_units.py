"""The jobs API's pure parts: the job state machine, per-procedure verdicts and where a failing
sample left the procedure, verdicts of episodes, the element an action named, the token file
(hashes only, reloaded on change, refusing bad scopes), the event payloads' wire format, and
the OpenAPI document kept in the repository being the one the app generates."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from consolerl.audit import AuditEvent
from consolerl.errors import ConfigError
from consolerl.experience import Trajectory
from consolerl.rewards import RewardResult, RuleOutcome
from consolerl.tasks import TASKS_DIR, load_suite
from rollout_service.episode import EpisodeOutcome
from jobsapi.auth import TeamQuota, TokenBook, hash_token
from doccheck.verdict import procedure_verdict
from jobsapi.report import (build_report, failed_step, procedure_steps,
                            render_html)
from jobsapi.client import StreamEvent
from jobsapi.schema import (ClaimCheck, EVENT_MODELS, EVENT_TYPES, JOB_STATES, TERMINAL,
                            TRANSITIONS, EpisodeCounts, Job, JobCompletedEvent,
                            JobStatusEvent, Rollout, RolloutCompletedEvent,
                            RolloutStartedEvent, RolloutStepEvent, Sampling, Step,
                            TaskSummaryEvent, VerdictCounts, event_data,
                            may_move, parse_event)
from jobsapi.scheduler import deciding_events, target_of, verdict_of

SUITE = {t.id: t for t in load_suite(TASKS_DIR)}
ROOT = Path(__file__).resolve().parents[2]
OPENAPI = ROOT / "jobsapi" / "openapi.json"


def test_state_machine():
    assert set(TRANSITIONS) == set(JOB_STATES)
    assert may_move("queued", "running") and may_move("running", "completed")
    assert may_move("queued", "cancelled") and may_move("running", "expired")
    assert not may_move("running", "queued") and not may_move("completed", "running")
    for state in TERMINAL:
        assert not TRANSITIONS[state]


def rollout(verdict: str | None, state: str = "completed", **kw) -> Rollout:
    return Rollout(id="r", job_id="j", task_id="t", sample=0, state=state, verdict=verdict, **kw)


@pytest.mark.parametrize("verdicts,samples,expected", [
    (["success", "success"], 2, "works"),
    # The agent failing is no evidence the procedure is wrong (doccheck.verdict).
    (["failure", "infeasible"], 2, "inconclusive"),
    (["success", "failure", "success"], 3, "works"),  # no flaky: a pass is evidence
    (["success"], 3, "works"),                        # even when few completed
    (["failure"], 3, "inconclusive"),                 # fewer than half completed
    (["undetermined", "undetermined"], 2, "inconclusive"),
    (["success", "undetermined"], 2, "works"),        # the judges' abstention is left out
    ([], 2, "inconclusive"),
])
def test_procedure_verdicts(verdicts, samples, expected):
    assert procedure_verdict((), [rollout(v) for v in verdicts], samples=samples).verdict == expected


def test_env_failures_never_count_as_broken():
    job = Job(id="j", team="a", state="completed", created_at=1.0, model="live",
              samples_per_task=3, sampling=Sampling(), priority=5,
              task_ids=["ram-create-user-0"])
    rows = [rollout(None, "failed").model_copy(update={"task_id": "ram-create-user-0"})
            for _ in range(2)] + \
        [rollout("failure").model_copy(update={"task_id": "ram-create-user-0"})]
    (proc,) = build_report(job, SUITE, rows)["procedures"]
    assert proc["verdict"] == "inconclusive" and proc["env_failed"] == 2


def test_failed_step_is_the_first_step_whose_controls_were_never_used():
    task = SUITE["ecs-add-rule-0"]
    steps = procedure_steps(task.procedure)
    assert len(steps) == 5 and steps[0].startswith("Open the ECS console")
    went = rollout("failure", steps=[
        Step(index=1, target='link "Security Groups"', title="Security Groups"),
        Step(index=2, target='button "Manage Rules"', title="Rules")])
    assert failed_step(task, went)["index"] == 3           # never clicked Add Rule
    nowhere = rollout("failure", steps=[Step(index=1, target='link "Instances"')])
    assert failed_step(task, nowhere)["index"] == 1


def test_report_html_escapes_what_it_shows_and_embeds_the_screenshot():
    job = Job(id="j", team="a", state="completed", created_at=1.0, model="live",
              samples_per_task=1, sampling=Sampling(), priority=5,
              task_ids=["ram-create-user-0"])
    row = rollout("infeasible").model_copy(update={
        "task_id": "ram-create-user-0", "infeasible_reason": "<script>alert(1)</script>",
        "steps": [Step(index=1, screenshot="art_1")]})
    report = build_report(job, SUITE, [row])
    # An unconfirmed infeasibility claim: the agent's word, not evidence.
    assert report["procedures"][0]["verdict"] == "inconclusive"
    assert report["procedures"][0]["screenshot"] == "art_1"
    page = render_html(report, {"art_1": ("image/png", b"\x89PNG-bytes")})
    assert "<script>alert" not in page and "&lt;script&gt;" in page
    assert 'src="data:image/png;base64,iVBORy1ieXRlcw=="' in page
    assert "/v1/artifacts/art_1" in render_html(report)      # not embedded: named, not linked
    assert 'src="/v1/artifacts' not in render_html(report)


def test_a_catalogue_task_known_infeasible_is_broken_only_when_the_evidence_confirms_it():
    tid = "ecs-instance-bandwidth-wrongdoc"
    job = Job(id="j", team="a", state="completed", created_at=1.0, model="live",
              samples_per_task=1, sampling=Sampling(), priority=5, task_ids=[tid])
    confirmed = ClaimCheck(kind="confirmed", verdict="success",
                           reasons=["'modify bandwidth' is on no page the agent saw"])
    row = rollout("infeasible", reward=1.0, infeasible_reason="no Modify Bandwidth",
                  claim=confirmed, reward_verdict="success", decided_by="evidence"
                  ).model_copy(update={"task_id": tid})
    (proc,) = build_report(job, SUITE, [row])["procedures"]
    assert proc["verdict"] == "broken" and proc["evidence"][0]["kind"] == "infeasibility"
    assert SUITE[tid].infeasible_reason in proc["evidence"][0]["detail"]
    assert "on no page the agent saw" in proc["evidence"][0]["detail"]
    # The same report with a positive reward but no confirmed claim: not broken.
    judged = row.model_copy(update={"claim": None, "decided_by": "judges"})
    (proc,) = build_report(job, SUITE, [judged])["procedures"]
    assert proc["verdict"] == "inconclusive"


def outcome(answer=None, infeasible=None, verdict="success") -> EpisodeOutcome:
    o = EpisodeOutcome("t", "success", "e")
    o.trajectory = Trajectory("x", "t", (), "stop", answer, infeasible)
    o.reward = RewardResult(1.0 if verdict == "success" else 0.0, True, verdict, "rule",
                            RuleOutcome(verdict))
    return o


def test_episode_verdicts():
    assert verdict_of(outcome(answer="done")) == "success"
    assert verdict_of(outcome(answer=None)) == "failure"       # never said it was done
    assert verdict_of(outcome(answer="done", verdict="failure")) == "failure"
    assert verdict_of(outcome(infeasible="no such button")) == "infeasible"
    assert verdict_of(outcome(answer="done", verdict="undetermined")) == "undetermined"


def test_deciding_events_are_the_evidence_or_else_the_refusals():
    def event(eid, name, error=""):
        return AuditEvent.from_trail({"eventId": eid, "eventName": name, "errorCode": error,
                                      "eventTime": "2026-11-28T15:20:05Z",
                                      "requestParameters": {"VpcId": "vpc-1"}}).brief()
    o = outcome(verdict="failure")
    o.audit_events = [event("e1", "CreateVpc"), event("e2", "DeleteVpc", "DependencyViolation"),
                      event("e3", "CreateVSwitch")]
    assert [e.model_dump() for e in deciding_events(o)] == [
        {"event_id": "e2", "event_name": "DeleteVpc", "event_time": "2026-11-28T15:20:05Z",
         "error_code": "DependencyViolation"}]
    o.reward = RewardResult(1.0, True, "success", "rule", RuleOutcome("success", ("e3", "e1")),
                            evidence=("e3", "e1"))
    assert [e.event_id for e in deciding_events(o)] == ["e1", "e3"]     # in audit order
    o.audit_events = [event(f"x{i}", "DeleteVpc", "Refused") for i in range(12)]
    assert len(deciding_events(o)) == 10


def test_target_of_an_action():
    page = '# Users\n[3] link "Create User"\n[12] button "Save"\n- [7]i-bp1 web | [8]Manage'
    assert target_of('click("12")', page) == 'button "Save"'
    assert target_of("click(3)", page) == 'link "Create User"'
    assert target_of('scroll("down")', page) == ""
    assert target_of('click("99")', page) == ""


def test_token_file_keeps_only_hashes_and_reloads(tmp_path):
    book = TokenBook(tmp_path / "tokens.json")
    token = book.create("docs", ["jobs:read"], TeamQuota(queued_jobs=4))
    stored = (tmp_path / "tokens.json").read_text()
    assert token not in stored and hash_token(token) in stored
    assert oct((tmp_path / "tokens.json").stat().st_mode)[-3:] == "600"
    who = book.verify(token)
    assert who.team == "docs" and who.may("jobs:read") and not who.may("jobs:write")
    assert book.quota("docs").queued_jobs == 4
    assert book.verify(token + "x") is None
    # Another process (the operator's CLI) adds a token: this book sees it.
    other = TokenBook(tmp_path / "tokens.json").create("eval", ["admin"])
    book._checked = 0.0
    assert book.verify(other).may("jobs:write")
    with pytest.raises(ConfigError, match="scopes"):
        book.create("docs", ["jobs:everything"])
    with pytest.raises(ConfigError, match="team"):
        book.create("no spaces", ["jobs:read"])
    with pytest.raises(ConfigError, match="queued_jobs"):
        TeamQuota(queued_jobs=0)


def test_a_broken_token_file_is_a_clear_error(tmp_path):
    (tmp_path / "tokens.json").write_text("{not json")
    with pytest.raises(ConfigError, match="tokens.json"):
        TokenBook(tmp_path / "tokens.json")


def current_openapi() -> dict:
    from jobsapi.app import build_app
    from jobsapi.store import JobStore
    app = build_app(JobStore("redis://127.0.0.1:1/0"), TokenBook(Path("/nonexistent/t.json")),
                    SUITE)
    return app.openapi()


def test_the_committed_openapi_document_is_current():
    """jobsapi/openapi.json is what the app serves; regenerate it with
    ``python -m jobsapi.app > jobsapi/openapi.json``."""
    assert json.loads(OPENAPI.read_text()) == json.loads(json.dumps(current_openapi())), \
        "the OpenAPI document changed: regenerate jobsapi/openapi.json"


# ---- the events of a job's stream ----------------------------------------------------------------
# Each event as the scheduler and the API write it, and the exact JSON text of its SSE ``data:``
# line (what clients of every version parse): the models must not change it.
WIRE = [
    (JobStatusEvent(state="queued"), '{"state": "queued", "error": null}'),
    (JobStatusEvent(state="failed", error="the job's tasks cannot be loaded: x"),
     '{"state": "failed", "error": "the job\'s tasks cannot be loaded: x"}'),
    (RolloutStartedEvent(rollout_id="r0000s001", task_id="t", sample=1, attempt=2),
     '{"rollout_id": "r0000s001", "task_id": "t", "sample": 1, "attempt": 2}'),
    (RolloutStepEvent(rollout_id="r0000s000", step=3, action='click("12")', url="/ram",
                      error=""),
     '{"rollout_id": "r0000s000", "step": 3, "action": "click(\\"12\\")", "url": "/ram", '
     '"error": ""}'),
    (RolloutCompletedEvent(rollout_id="r0000s001", task_id="t", state="queued", verdict=None,
                           attempts=1),
     '{"rollout_id": "r0000s001", "task_id": "t", "state": "queued", "verdict": null, '
     '"attempts": 1}'),
    (TaskSummaryEvent(task_id="t", samples=2, completed=2, passes=1),
     '{"task_id": "t", "samples": 2, "completed": 2, "passes": 1}'),
    (JobCompletedEvent(state="cancelled", episodes=EpisodeCounts(cancelled=2),
                       verdicts=VerdictCounts()),
     '{"state": "cancelled", "episodes": {"queued": 0, "running": 0, "completed": 0, '
     '"failed": 0, "cancelled": 2}, "verdicts": {"success": 0, "failure": 0, '
     '"infeasible": 0, "undetermined": 0}}'),
]


@pytest.mark.parametrize("event,wire", WIRE, ids=[e.kind for e, _ in WIRE])
def test_event_payloads_keep_their_wire_format(event, wire):
    assert json.dumps(event_data(event)) == wire
    assert parse_event(event.kind, json.loads(wire)) == event
    assert StreamEvent("1-0", event.kind, json.loads(wire)).payload == event


def test_every_event_type_has_a_model_and_unknown_ones_are_refused():
    assert {e.kind for e, _ in WIRE} == set(EVENT_TYPES) == set(EVENT_MODELS)
    with pytest.raises(ValueError, match="rollout.paused"):
        parse_event("rollout.paused", {})
    with pytest.raises(ValueError, match="state"):
        parse_event("job.status", {"state": "sleeping"})
    # A newer server's extra field does not break an older client.
    assert parse_event("job.status", {"state": "running", "error": None, "why": "x"}) == \
        JobStatusEvent(state="running")


def test_the_client_imports_no_server_code():
    """The client is for other teams: pydantic (the event models) but not the task suite, Redis,
    FastAPI or the scheduler."""
    code = "import sys, jobsapi.client; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout.split()
    heavy = {"yaml", "redis", "fastapi", "consolerl.tasks", "jobsapi.store",
             "jobsapi.scheduler", "prometheus_client"}
    assert not heavy & set(out), sorted(heavy & set(out))


def test_the_openapi_document_describes_every_event():
    document = current_openapi()
    stream = document["paths"]["/v1/jobs/{job_id}/events"]["get"]["responses"]["200"]
    pairs = {branch["properties"]["event"]["const"]:
             branch["properties"]["data"]["contentSchema"]["$ref"].rsplit("/", 1)[1]
             for branch in stream["content"]["text/event-stream"]["schema"]["oneOf"]}
    assert pairs == {kind: model.__name__ for kind, model in EVENT_MODELS.items()}
    schemas = document["components"]["schemas"]
    assert all(list(schemas[name]["properties"]) == list(EVENT_MODELS[kind].model_fields)
               for kind, name in pairs.items())


# ---- outside input against Redis' domain ---------------------------------------------------------

def test_at_most_is_the_decimal_range():
    import re
    from jobsapi.store import at_most
    for n in (0, 1, 2, 9, 10, 11, 99, 100, 101, 255, 1000, 1999, 2024):
        pattern = re.compile(at_most(n))
        assert [k for k in range(3000) if pattern.fullmatch(str(k))] == list(range(n + 1)), n
        assert pattern.fullmatch("000" + str(n)) and not pattern.fullmatch(str(n + 1))


@pytest.mark.parametrize("text,canonical", [
    ("0", "0-0"), ("0-0", "0-0"), ("5", "5-0"), ("1700000000000-3", "1700000000000-3"),
    ("000123-0007", "123-7"), ("18446744073709551615-18446744073709551615",
                               "18446744073709551615-18446744073709551615"),
    ("0" * 40 + "1-1", "1-1")])
def test_stream_ids_in_redis_domain_are_canonical(text, canonical):
    from jobsapi.store import stream_id
    assert stream_id(text) == canonical


@pytest.mark.parametrize("text", [
    "18446744073709551616", "99999999999999999999-0", "0-99999999999999999999",
    "18446744073709551615-18446744073709551616", "-1", "1--1", "1-2-3", "1-", "-", "+", "$",
    ">", "*", "", " 1", "1e3", "0x1", "１", "9" * 64, "0" * 65])
def test_stream_ids_out_of_redis_domain_are_refused(text):
    from jobsapi.store import OutOfDomain, stream_id
    with pytest.raises(OutOfDomain, match="18446744073709551615"):
        stream_id(text)


def test_key_parts():
    from jobsapi.store import OutOfDomain, key_part
    assert key_part("job_0123456789abcdef") == "job_0123456789abcdef"
    for bad in ("", "a:b", "job_*", "a?", "[a]", "a b", "ä", "x" * 65, "a.b"):
        with pytest.raises(OutOfDomain, match="not an id"):
            key_part(bad)


def test_a_token_file_with_a_team_that_is_no_key_part_is_refused(tmp_path):
    (tmp_path / "tokens.json").write_text(json.dumps({"teams": {"a:b": {}}, "tokens": []}))
    with pytest.raises(ConfigError, match="team.*'a:b'"):
        TokenBook(tmp_path / "tokens.json")


def test_the_oracle_has_a_script_for_every_catalogue_task_and_says_when_it_has_none():
    from dataclasses import replace

    from datagen.oracle import why_no_oracle
    assert [why_no_oracle(t) for t in SUITE.values() if why_no_oracle(t)] == []
    task = SUITE["ram-create-user-0"]
    assert "no oracle family" in why_no_oracle(replace(task, oracle_family=""))
    assert "'nope'" in why_no_oracle(replace(task, oracle_family="nope"))
    # A task known not to work as written needs no script: the oracle reports it.
    known = replace(SUITE["ecs-instance-bandwidth-wrongdoc"], oracle_family="")
    assert why_no_oracle(known) == ""


def test_an_oracle_report_says_a_scripted_teacher_acted():
    job = Job(id="j", team="a", state="completed", created_at=1.0, model="oracle",
              samples_per_task=1, sampling=Sampling(), priority=5,
              task_ids=["ram-create-user-0"])
    row = rollout("success", reward=1.0).model_copy(update={
        "task_id": "ram-create-user-0", "model": "oracle"})
    report = build_report(job, SUITE, [row])
    assert report["model"] == "oracle" and report["scripted"] is True
    page = render_html(report)
    assert "the scripted teacher, not a trained agent" in page and "policy version" not in page
    live = build_report(job.model_copy(update={"model": "live"}), SUITE, [row])
    assert live["scripted"] is False and "policy version" in render_html(live)


@pytest.mark.parametrize("name", ["oracle", "replay"])
def test_a_scripted_executor_is_no_name_for_a_registered_model(name):
    from cluster.config import ApiSection
    with pytest.raises(ConfigError, match=f"'{name}' is a scripted executor"):
        ApiSection(models={name: "/some/checkpoint"})


def test_a_replay_report_says_the_replay_acted_and_where_it_stopped():
    job = Job(id="j", team="a", state="completed", created_at=1.0, model="replay",
              samples_per_task=1, sampling=Sampling(), priority=5,
              task_ids=["ram-create-user-0"])
    row = rollout("failure", reward=0.0).model_copy(update={
        "task_id": "ram-create-user-0", "model": "replay",
        "end_detail": "step 2: no button or link 'Create User' on /console/ram/users"})
    report = build_report(job, SUITE, [row])
    assert report["scripted"] is True and report["executor"] == "replay"
    entry = report["procedures"][0]
    assert entry["failure"]["end_detail"].startswith("step 2: no button")
    assert any("the replay stopped: step 2" in e["detail"] for e in entry["evidence"])
    assert "the replay, not a trained agent" in render_html(report)
    assert build_report(job.model_copy(update={"model": "live"}), SUITE, [row])[
        "executor"] == "agent"
