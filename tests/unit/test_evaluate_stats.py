"""The evaluation's comparison of two models: which intervals :func:`cluster.evaluate.compare`
reports and how episodes are paired (the intervals themselves: ``test_stats.py``)."""
from __future__ import annotations

import pytest

from cluster.evaluate import compare, episode_pairs, success_by_expected


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


def test_success_is_reported_separately_for_tasks_expected_infeasible():
    per_task = {"a": [1.0, 0.0], "b": [1.0, 1.0], "a-wrongdoc": [0.0, 0.0, 1.0]}
    expected = {"a": "success", "b": "success", "a-wrongdoc": "infeasible"}
    out = success_by_expected(per_task, expected)
    assert out["success"]["tasks"] == 2 and out["success"]["episodes"] == 4
    assert out["success"]["success"] == pytest.approx(0.75)
    assert out["infeasible"] == {"tasks": 1, "episodes": 3,
                                 "success": pytest.approx(1 / 3),
                                 "success_ci95": out["infeasible"]["success_ci95"]}
    lo, hi = out["infeasible"]["success_ci95"]
    assert lo <= 1 / 3 <= hi
    # A group without tasks says so instead of a made-up 0.
    empty = success_by_expected({"a": [1.0]}, {"a": "success"})["infeasible"]
    assert empty == {"tasks": 0, "episodes": 0, "success": None, "success_ci95": [None, None]}


def test_compare_reports_the_difference_per_expected_outcome():
    expected = {"a": "success", "w": "infeasible"}
    before = {"per_task": {"a": [1.0, 1.0], "w": [0.0, 0.0]},
              "per_task_runs": {"a": [[1.0], [1.0]], "w": [[0.0], [0.0]]},
              "expected": expected}
    after = {"per_task": {"a": [1.0, 0.0], "w": [1.0, 1.0]},
             "per_task_runs": {"a": [[1.0], [0.0]], "w": [[1.0], [1.0]]},
             "expected": expected}
    out = compare(before, after)
    assert out["success_diff"] == pytest.approx((-0.5 + 1.0) / 2)
    groups = out["by_expected"]
    assert groups["success"]["tasks"] == ["a"] and groups["infeasible"]["tasks"] == ["w"]
    assert groups["success"]["success_diff"] == pytest.approx(-0.5)
    assert groups["infeasible"]["success_diff"] == pytest.approx(1.0)
    assert groups["infeasible"]["paired_diff"] == pytest.approx(1.0)
    assert groups["infeasible"]["pairs"] == 2
    # Results without the expected outcomes (older records) compare as before.
    assert "by_expected" not in compare({"per_task": before["per_task"]},
                                        {"per_task": after["per_task"]})
