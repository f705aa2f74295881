"""The data engine end to end: tasks synthesised from the committed inventory, the teacher
(their replay plans, the wrong-doc oracle) run on them in real episodes (the local cloud, the
system Chromium, leases in a real Redis), and only what the audit log and the evidence channel
confirm kept."""
from __future__ import annotations

import json

from consolerl.tasks import load_suite
from datagen.engine import make_tasks
from datagen.export import ExportConfig, run_export
from rollout_service.agent import AgentConfig
from tests.conftest import run_async


def test_engine_tasks_give_confirmed_teacher_trajectories(tmp_path):
    root = tmp_path / "tasks"
    made = make_tasks(root, count=3, wrong=1, seed=4, exclude=r"^ram-create-user-[0-9]+$")
    assert made["tasks"] == 3 and made["wrong_docs"] == 1
    tasks = {t.id: t for t in load_suite(root)}
    out = tmp_path / "engine.jsonl"
    agent = AgentConfig(history_turns=2, max_prompt_tokens=3072, max_observation_chars=6000,
                        response="grounded", system_prompt="grounded", page_view="compact",
                        random_ids=True)
    summary = run_async(run_export(ExportConfig(out=str(out), split="all", suite=str(root),
                                                workers=2, agent=agent)))
    assert summary["episodes"] == 4, summary
    statuses = summary["statuses"]
    # Kept: exactly the episodes the rules confirmed (solved, or the wrong document reported
    # for a reason the evidence channel confirms); anything else is dropped, not kept.
    assert summary["written"] == statuses.get("solved", 0) + statuses.get(
        "infeasible_reported", 0)
    assert statuses.get("solved", 0) >= 2 and statuses.get("infeasible_reported", 0) == 1
    records = [json.loads(line) for line in out.read_text().splitlines()]
    for record in records:
        task = tasks[record["task_id"]]
        assert record["reward"] == 1.0 and record["turns"]
        if task.expected == "infeasible":
            assert record["status"] == "infeasible_reported"
            assert "report_infeasible" in record["turns"][-1]["completion"]
