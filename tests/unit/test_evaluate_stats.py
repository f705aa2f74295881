"""The evaluation's comparison of two models: which intervals :func:`cluster.evaluate.compare`
reports and how episodes are paired (the intervals themselves: ``test_stats.py``)."""
from __future__ import annotations

import pytest

from cluster.evaluate import compare, episode_pairs


def test_compare_reports_both_intervals_over_common_tasks():
    before = {"per_task": {"a": [0.0, 0.0, 1.0], "b": [0.0, 1.0, 1.0]}}
    after = {"per_task": {"a": [1.0, 1.0, 1.0], "b": [0.0, 1.0, 1.0], "c": [1.0]}}
    out = compare(before, after)
    assert out["tasks"] == ["a", "b"]
    assert out["success_diff"] == pytest.approx((2 / 3 + 0) / 2)
    lo, hi = out["success_diff_ci95"]
    assert lo <= out["success_diff"] <= hi
    tlo, thi = out["success_diff_ci95_resampling_tasks"]
    assert (tlo, thi) == (0.0, pytest.approx(2 / 3))


def test_episode_pairs_follow_task_and_run_and_skip_the_unpaired():
    before = {"a": [[0.0], [1.0]], "b": [[0.0], []], "only-before": [[1.0]]}
    after = {"a": [[1.0], [1.0]], "b": [[1.0], [1.0]]}
    assert episode_pairs(before, after) == [(0.0, 1.0), (1.0, 1.0), (0.0, 1.0)]


def test_compare_adds_the_paired_interval_when_runs_are_known():
    before = {"per_task": {"a": [0.0, 1.0]}, "per_task_runs": {"a": [[0.0], [1.0]]}}
    after = {"per_task": {"a": [1.0, 1.0]}, "per_task_runs": {"a": [[1.0], [1.0]]}}
    out = compare(before, after)
    assert out["pairs"] == 2 and out["paired_diff"] == pytest.approx(0.5)
    assert "paired_diff" not in compare({"per_task": before["per_task"]},
                                        {"per_task": after["per_task"]})
