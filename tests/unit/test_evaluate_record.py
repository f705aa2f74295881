"""A stopped evaluation goes on where it stopped: finished runs are recorded one per line and
taken from the record when the same evaluation is asked again (no policy, no episodes)."""
from __future__ import annotations

import json

from cluster.config import JobConfig
from cluster.evaluate import append_record, evaluate, recorded_runs
from consolerl.config import load_config

KEY = {"label": "model", "model": "runs/x/final", "split": "heldout", "tasks": "^ram-",
       "temperature": 1.0, "episodes_per_task": 1}


def _results(wins: dict[str, int], **cost: float) -> list[dict]:
    return [{"task_id": t, "env_error": None, "reward": float(w), "verdict": "v",
             "end_reason": "stop", "steps": 3, "version": 0, **cost} for t, w in wins.items()]


def test_records_round_trip_and_a_cut_line_is_skipped(tmp_path, capsys):
    path = tmp_path / "eval.runs.jsonl"
    append_record(path, {**KEY, "run": 0, "results": [], "summary": {}})
    append_record(path, {**KEY, "temperature": 0.5, "run": 1, "results": [], "summary": {}})
    with path.open("a") as f:
        f.write('{"label": "model", "run": 2, "res')          # a crash mid-write
    got = recorded_runs(path, KEY)
    assert list(got) == [0]                                # other settings: not this one's
    assert "not a whole record" in capsys.readouterr().err
    assert recorded_runs(tmp_path / "none.jsonl", KEY) == {}


def test_an_evaluation_whose_runs_are_recorded_is_not_run_again(tmp_path):
    config = load_config(JobConfig, "configs/learning-check.yaml",
                         ["eval.tasks=^ram-(create|delete)-user-[0-9]+$"])
    from consolerl.tasks import TASKS_DIR, load_suite
    import re
    tasks = [t.id for t in load_suite(TASKS_DIR) if t.split == config.eval.split
             and re.search(config.eval.tasks, t.id)]
    assert len(tasks) >= 2
    key = {"label": "eval", "model": "m", "split": config.eval.split,
           "tasks": config.eval.tasks, "temperature": config.eval.temperature,
           "episodes_per_task": config.eval.episodes_per_task}
    path = tmp_path / "r.jsonl"
    # Run 0 as recorded before the cost was kept; run 1 with it.
    costs = ({}, {"prompt_tokens": 900, "completion_tokens": 30, "env_s": 12.5})
    for run, wins in enumerate(({tasks[0]: 1, tasks[1]: 0}, {tasks[0]: 1, tasks[1]: 1})):
        append_record(path, {**key, "run": run, "results": _results(wins, **costs[run]),
                             "summary": {"env_errors": run, "leaked_resources": 0}})
    # No Ray, no policy: both runs come from the record.
    out = evaluate(config, "m", runs=2, record=path)
    assert out["success_per_run"] == [0.5, 1.0]
    assert out["episodes"] == 4 and out["env_errors"] == 1
    assert out["per_task_runs"][tasks[1]] == [[0.0], [1.0]]
    assert out["pass_at_1"]["per_run"] == [0.5, 1.0] and out["pass_at_1"]["mean"] == 0.75
    assert out["pass_at_3"] == {"value": None, "tasks": 0, "tasks_short": len(tasks)}
    assert out["by_product"]["ram"] == {"success": 0.75, "episodes": 4, "tasks": len(tasks)}
    assert sum(g["tasks"] for g in out["by_family"].values()) == len(tasks)
    assert out["cost"]["episodes"] == 4
    assert out["cost"]["prompt_tokens"] == {"mean": 900, "total": 1800, "episodes": 2}
    assert len(path.read_text().splitlines()) == 2          # nothing appended
    assert json.loads(path.read_text().splitlines()[0])["run"] == 0
