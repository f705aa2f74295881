"""A representative sample of the task suite, end to end in real Chromium against the local
cloud: provision, the oracle acts through the action space, the success rule is checked in
the audit log and the end state, and everything of the episode is destroyed. (The whole suite:
``python -m benchmarks.suite --policy oracle --json``.)"""
from __future__ import annotations

from collections import Counter

from benchmarks.suite import run_tasks, summarize
from consolerl.tasks import TASKS_DIR, load_suite
from tests.conftest import _server, run_async

SAMPLE = [
    "ram-create-user-1", "ram-grant-policy-3", "ram-revoke-policy-1", "ram-delete-user-2",
    "ram-create-accesskey-wrongdoc", "oss-create-bucket-2", "oss-set-acl-2",
    "oss-delete-bucket-1", "vpc-create-vpc-5", "vpc-create-vswitch-2", "vpc-delete-vpc-1",
    "ecs-create-sg-2", "ecs-add-rule-3", "ecs-delete-rule-1", "ecs-instance-stop-1",
    "ecs-rename-instance-2", "ecs-create-instance-2", "ecs-instance-delete-6",
    "vpc-delete-vpc-with-vswitch-wrongdoc",
]
INFEASIBLE = {"ram-create-accesskey-wrongdoc", "vpc-delete-vpc-with-vswitch-wrongdoc"}


def test_a_sample_of_the_suite_is_solved_and_leaves_nothing(tmp_path_factory, redis_server):
    tasks = [t for t in load_suite(TASKS_DIR) if t.id in SAMPLE]
    assert len(tasks) == len(SAMPLE)
    assert set(Counter(t.product for t in tasks)) == {"ecs", "vpc", "ram", "oss"}
    gen = _server(tmp_path_factory, "suite-cloud", ["--transition", "0.5", "--network-ready",
                                                    "0.2", "--lookup-qps", "0"])
    server = next(gen)
    try:
        outcomes = run_async(run_tasks(tasks, server.url, server.endpoint, redis_server.url))
    finally:
        next(gen, None)
    summary = summarize(tasks, outcomes)
    assert summary["failures"] == {}
    assert summary["solved"] == summary["solvable"] == len(SAMPLE) - len(INFEASIBLE)
    assert summary["infeasible_reported"] == len(INFEASIBLE)
    assert summary["leaked_resources"] == 0 and summary["env_errors"] == 0
    # Solved through the action space: several steps each; the wrong documents too (the
    # oracle opens the page the doc names, or sends the documented values, then reports).
    assert all(len(o.trajectory.turns) >= 2 for o in outcomes)
    by_id = {o.task_id: o for o in outcomes}
    assert by_id["ram-create-accesskey-wrongdoc"].trajectory.end_reason == "report_infeasible"
    refused = by_id["vpc-delete-vpc-with-vswitch-wrongdoc"]
    assert "DependencyViolation.VSwitch" in refused.trajectory.infeasible
    assert ("DeleteVpc", "DependencyViolation.VSwitch") in {
        (e.event_name, e.error_code) for e in refused.audit_events}
