"""The validation report on its CI sample: one real episode per scripted behaviour (oracle,
stop early, half done, undone, wrong region, forbidden deletion, infeasible reports right and
wrong) in Chromium against the local cloud, scored by the rule channel and the scripted
judges. The whole set runs as ``python -m benchmarks.reward_validate --json``."""
from __future__ import annotations

import json
import subprocess
import sys

from benchmarks.reward_validate import BEHAVIOURS


def test_the_sample_report_has_a_perfect_rule_channel_where_it_decides(tmp_path):
    out = tmp_path / "cases.jsonl"
    run = subprocess.run([sys.executable, "-m", "benchmarks.reward_validate", "--json", "--sample",
                          "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout)
    cases = [json.loads(line) for line in out.read_text().splitlines()]
    assert {c["behaviour"] for c in cases} == set(BEHAVIOURS)
    assert report["env_errors"] == 0 and report["script_errors"] == [], run.stderr[-3000:]
    assert report["n"] == len(BEHAVIOURS)
    assert report["rule_accuracy_decisive"] == 1.0, report["rule_errors"]
    assert 0 < report["rule_coverage"] < 1           # infeasible reports are the judges' job
    assert report["leaked_resources"] == 0
    for key in ("judge_accuracy", "fused_accuracy"):
        assert 0 <= report[key] <= 1
    for channel in ("rule", "judge", "fused"):
        assert set(report[channel]) >= {"precision", "recall", "accuracy", "coverage"}
    # Every wrong behaviour is caught by one channel or the other: none earns the reward.
    for c in cases:
        if c["label"] == "failure":
            assert c["fused"] != "success", c
