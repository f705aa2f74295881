"""The replay (doccheck.replay) in a real browser against the local cloud: pages of the
development corpus read by the documentation service, their drafted tasks' replay plans carried
out by the oracle's driver through a Chromium env worker, each episode judged by the reward
service from the audit log and cleaned up (benchmarks.docs_replay, the runner behind
``python -m benchmarks.docs --run``). A correct procedure works, a stale one under the renamed
console works with stale text, and a replay that cannot do a step names it and decides
nothing."""
from __future__ import annotations

import json
from pathlib import Path

from benchmarks.docs import content_type
from benchmarks.docs_replay import replay_tasks
from doccheck import PageIn, procedure_verdict
from doccheck.service import DocsService
from tests.conftest import in_thread

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "docs" / "corpus"


def drafted(page: str, drift: str = "") -> tuple:
    path = CORPUS / page
    (result,) = DocsService.default().read([PageIn(page, path.read_text(), content_type(path))],
                                           drift)
    (proc,) = [p for p in result.procedures if p.task is not None][:1]
    assert proc.task["oracle"]["family"] == "replay", proc.reason
    return proc


def test_replays_are_judged_by_the_audit_log_and_a_failure_names_its_step(cloud, redis_server):
    correct = drafted("ram/create-user.md")
    stale = drafted("ram/create-app-user.md", "rename")
    broken = json.loads(json.dumps(correct.task))
    broken["id"] = correct.task["id"] + "-x"
    ops = json.loads(broken["oracle"]["args"]["plan"])
    ops[0][-1] = "Create Userz"          # a control no page has
    broken["oracle"]["args"]["plan"] = json.dumps(ops)
    runs = in_thread(replay_tasks, [correct.task, stale.task, broken], cloud, redis_server.url,
                     workers=2)
    ok, old, bad = (runs[t["id"]] for t in (correct.task, stale.task, broken))
    assert (ok.state, ok.verdict) == ("completed", "success"), ok.reasons
    assert (old.state, old.verdict) == ("completed", "success"), old.reasons
    assert bad.state == "completed" and bad.verdict == "failure"
    assert bad.end_detail.startswith(f"step {ops[0][0]}: no button or link 'Create Userz'")
    v = procedure_verdict(correct.checks, [ok], samples=1, executor="replay")
    assert v.verdict == "works" and "the replay passed 1 of 1" in v.evidence[0].detail
    v = procedure_verdict(stale.checks, [old], samples=1, executor="replay")
    assert v.verdict == "works_text_stale"
    v = procedure_verdict(correct.checks, [bad], samples=1, executor="replay")
    assert v.verdict == "inconclusive"
    assert any("the replay stopped: step" in e.detail for e in v.evidence)
