"""The learning check's statistics: bootstrap intervals of a success rate and of a paired
difference between two models on the same tasks."""
from __future__ import annotations

import pytest

from cluster.evaluate import (bootstrap_ci, compare, episode_pairs, paired_bootstrap_diff,
                              paired_episode_diff,
                              stratified_bootstrap_diff)


def test_bootstrap_ci_brackets_the_mean_and_narrows_with_more_data():
    small = [1.0, 0.0] * 5
    large = [1.0, 0.0] * 200
    lo_s, hi_s = bootstrap_ci(small)
    lo_l, hi_l = bootstrap_ci(large)
    assert lo_s < 0.5 < hi_s and lo_l < 0.5 < hi_l
    assert (hi_l - lo_l) < (hi_s - lo_s)
    assert bootstrap_ci([1.0] * 7) == (1.0, 1.0)          # no spread: a point
    # Roughly the normal interval for p=0.5, n=400: +-1.96*0.025.
    assert hi_l - lo_l == pytest.approx(2 * 1.96 * 0.025, abs=0.02)
    with pytest.raises(ValueError):
        bootstrap_ci([])


def test_paired_difference_resamples_tasks():
    before = {"a": [0, 0, 0], "b": [1, 1, 1], "c": [0, 0, 1]}
    after = {"a": [1, 1, 1], "b": [1, 1, 1], "c": [1, 1, 1], "only-after": [1]}
    diff, (lo, hi) = paired_bootstrap_diff(before, after)
    assert diff == pytest.approx((1 + 0 + 2 / 3) / 3)
    assert 0.0 <= lo <= diff <= hi <= 1.0
    same, (lo0, hi0) = paired_bootstrap_diff(before, before)
    assert same == 0.0 and lo0 == hi0 == 0.0
    with pytest.raises(ValueError):
        paired_bootstrap_diff({"a": [1]}, {"b": [1]})


def test_stratified_difference_resamples_episodes_within_tasks():
    before = {"a": [0.0] * 9, "b": [1.0, 0.0, 0.0] * 3}
    after = {"a": [1.0, 1.0, 0.0] * 3, "b": [1.0, 1.0, 0.0] * 3, "only-after": [1.0]}
    diff, (lo, hi) = stratified_bootstrap_diff(before, after)
    assert diff == pytest.approx((2 / 3 + 1 / 3) / 2)
    assert 0.0 < lo < diff < hi < 1.0        # 9 episodes a task: clearly above 0, not a point
    # Uniform outcomes have no spread within a task: the interval is the point.
    d, (lo1, hi1) = stratified_bootstrap_diff({"a": [0.0] * 4}, {"a": [1.0] * 4})
    assert d == lo1 == hi1 == 1.0
    # More episodes, narrower interval.
    _, (lo3, hi3) = stratified_bootstrap_diff({t: v * 3 for t, v in before.items()},
                                              {t: v * 3 for t, v in after.items()})
    assert hi3 - lo3 < hi - lo
    with pytest.raises(ValueError):
        stratified_bootstrap_diff({"a": [1.0]}, {"a": []})


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


def test_paired_episode_diff_interval():
    # 100 pairs: 30 gained, 5 lost, the rest the same: +0.25 with an interval above 0.
    pairs = [(0.0, 1.0)] * 30 + [(1.0, 0.0)] * 5 + [(1.0, 1.0)] * 20 + [(0.0, 0.0)] * 45
    diff, (lo, hi) = paired_episode_diff(pairs)
    assert diff == pytest.approx(0.25)
    assert 0.0 < lo < diff < hi < 0.5
    same, (lo0, hi0) = paired_episode_diff([(b, b) for b, _ in pairs])
    assert same == 0.0 and lo0 == hi0 == 0.0
    with pytest.raises(ValueError):
        paired_episode_diff([])


def test_compare_adds_the_paired_interval_when_runs_are_known():
    before = {"per_task": {"a": [0.0, 1.0]}, "per_task_runs": {"a": [[0.0], [1.0]]}}
    after = {"per_task": {"a": [1.0, 1.0]}, "per_task_runs": {"a": [[1.0], [1.0]]}}
    out = compare(before, after)
    assert out["pairs"] == 2 and out["paired_diff"] == pytest.approx(0.5)
    assert "paired_diff" not in compare({"per_task": before["per_task"]},
                                        {"per_task": after["per_task"]})
