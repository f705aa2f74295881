"""The validation report on its CI sample: one real episode per scripted behaviour (oracle,
stop early, half done, undone, wrong region, forbidden deletion, a working procedure reported
broken, and on a wrong document: the oracle's report, a lazy true one, a claim of being done,
an unrelated reason, a false one) in Chromium against the local cloud, scored by the rule and
evidence channels without any judge. The whole set runs as ``python -m
benchmarks.reward_validate --json``; with a served judge, ``--judge live``."""
from __future__ import annotations

import json
import subprocess
import sys

from benchmarks.reward_validate import BEHAVIOURS


def test_the_sample_is_decided_right_by_the_rule_and_the_evidence_alone(tmp_path):
    out = tmp_path / "cases.jsonl"
    run = subprocess.run([sys.executable, "-m", "benchmarks.reward_validate", "--json", "--sample",
                          "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout)
    cases = [json.loads(line) for line in out.read_text().splitlines()]
    assert {c["behaviour"] for c in cases} == set(BEHAVIOURS)
    assert report["env_errors"] == 0 and report["script_errors"] == [], run.stderr[-3000:]
    assert report["n"] == len(BEHAVIOURS)
    assert report["judge_kind"] == "none" and report["judge_coverage"] == 0.0
    assert report["rule_accuracy_decisive"] == 1.0, report["rule_errors"]
    assert 0 < report["rule_coverage"] < 1           # infeasibility claims are not the rule's
    assert report["evidence_accuracy_decisive"] == 1.0, report["evidence_errors"]
    assert report["leaked_resources"] == 0
    by = {c["behaviour"]: c for c in cases}
    assert by["infeasible_right"]["evidence_kind"] == "confirmed"
    assert by["infeasible_right"]["decided_by"] == "evidence"
    assert by["infeasible_names_present"]["evidence_kind"] == "contradicted"
    assert by["infeasible_wrong_reason"]["evidence_kind"] == "unsupported"
    assert by["infeasible_claim_done"]["evidence_kind"] == "not_reported"
    # Every case decided, and every wrong behaviour denied the reward.
    assert report["undetermined_rate"] == 0.0 and report["fused_accuracy"] == 1.0, \
        report["fused_errors"]
    for c in cases:
        if c["label"] == "failure":
            assert c["fused"] != "success", c
