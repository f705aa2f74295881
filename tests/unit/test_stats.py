"""The shared statistics (:mod:`consolerl.stats`): bootstrap intervals of a success rate and
of a difference between two models on the same tasks, paired or by task; mean with its
standard deviation; the pass@k estimator."""
from __future__ import annotations

from itertools import combinations

import pytest

from consolerl.stats import (bootstrap_mean_ci, grouped_diff_ci, mean_std, paired_diff_ci,
                             paired_lists_diff_ci95, pass_at_k, stratified_diff_ci)


def test_bootstrap_mean_ci_brackets_the_mean_and_narrows_with_more_data():
    small = [1.0, 0.0] * 5
    large = [1.0, 0.0] * 200
    lo_s, hi_s = bootstrap_mean_ci(small)
    lo_l, hi_l = bootstrap_mean_ci(large)
    assert lo_s < 0.5 < hi_s and lo_l < 0.5 < hi_l
    assert (hi_l - lo_l) < (hi_s - lo_s)
    assert bootstrap_mean_ci([1.0] * 7) == (1.0, 1.0)          # no spread: a point
    # Roughly the normal interval for p=0.5, n=400: +-1.96*0.025.
    assert hi_l - lo_l == pytest.approx(2 * 1.96 * 0.025, abs=0.02)
    with pytest.raises(ValueError):
        bootstrap_mean_ci([])


def test_grouped_difference_resamples_groups():
    before = {"a": [0, 0, 0], "b": [1, 1, 1], "c": [0, 0, 1]}
    after = {"a": [1, 1, 1], "b": [1, 1, 1], "c": [1, 1, 1], "only-after": [1]}
    diff, (lo, hi) = grouped_diff_ci(before, after)
    assert diff == pytest.approx((1 + 0 + 2 / 3) / 3)
    assert 0.0 <= lo <= diff <= hi <= 1.0
    same, (lo0, hi0) = grouped_diff_ci(before, before)
    assert same == 0.0 and lo0 == hi0 == 0.0
    with pytest.raises(ValueError):
        grouped_diff_ci({"a": [1]}, {"b": [1]})


def test_stratified_difference_resamples_outcomes_within_groups():
    before = {"a": [0.0] * 9, "b": [1.0, 0.0, 0.0] * 3}
    after = {"a": [1.0, 1.0, 0.0] * 3, "b": [1.0, 1.0, 0.0] * 3, "only-after": [1.0]}
    diff, (lo, hi) = stratified_diff_ci(before, after)
    assert diff == pytest.approx((2 / 3 + 1 / 3) / 2)
    assert 0.0 < lo < diff < hi < 1.0        # 9 outcomes a group: clearly above 0, not a point
    # Uniform outcomes have no spread within a group: the interval is the point.
    d, (lo1, hi1) = stratified_diff_ci({"a": [0.0] * 4}, {"a": [1.0] * 4})
    assert d == lo1 == hi1 == 1.0
    # More outcomes, narrower interval.
    _, (lo3, hi3) = stratified_diff_ci({t: v * 3 for t, v in before.items()},
                                       {t: v * 3 for t, v in after.items()})
    assert hi3 - lo3 < hi - lo
    with pytest.raises(ValueError):
        stratified_diff_ci({"a": [1.0]}, {"a": []})


def test_paired_diff_interval():
    # 100 pairs: 30 gained, 5 lost, the rest the same: +0.25 with an interval above 0.
    pairs = [(0.0, 1.0)] * 30 + [(1.0, 0.0)] * 5 + [(1.0, 1.0)] * 20 + [(0.0, 0.0)] * 45
    diff, (lo, hi) = paired_diff_ci(pairs)
    assert diff == pytest.approx(0.25)
    assert 0.0 < lo < diff < hi < 0.5
    same, (lo0, hi0) = paired_diff_ci([(b, b) for b, _ in pairs])
    assert same == 0.0 and lo0 == hi0 == 0.0
    with pytest.raises(ValueError):
        paired_diff_ci([])


def test_paired_lists_interval_brackets_the_difference():
    before = [0.0] * 50 + [1.0] * 50
    after = [1.0] * 80 + [0.0] * 20
    lo, hi = paired_lists_diff_ci95(before, after)
    assert lo < 0.3 < hi and lo > 0
    lo, hi = paired_lists_diff_ci95(before, before)
    assert lo == hi == 0


def test_pass_at_k_by_hand():
    assert pass_at_k(5, 2, 3) == pytest.approx(1 - 1 / 10)      # 1 - C(3,3)/C(5,3)
    assert pass_at_k(6, 2, 3) == pytest.approx(1 - 4 / 20)      # 1 - C(4,3)/C(6,3)
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)            # pass@1 is c/n
    assert pass_at_k(3, 1, 3) == 1.0 and pass_at_k(3, 0, 3) == 0.0
    assert pass_at_k(2, 2, 3) is None                           # fewer attempts than k
    for bad in ((3, 4, 1), (3, -1, 1), (3, 1, 0)):
        with pytest.raises(ValueError):
            pass_at_k(*bad)


def test_pass_at_k_is_the_share_of_k_subsets_with_a_success():
    outcomes = [1, 0, 0, 1, 0, 0, 0]
    for k in range(1, len(outcomes) + 1):
        subsets = list(combinations(outcomes, k))
        share = sum(any(s) for s in subsets) / len(subsets)
        assert pass_at_k(len(outcomes), sum(outcomes), k) == pytest.approx(share)


def test_mean_std_uses_the_sample_deviation():
    mean, std = mean_std([0.5, 0.75, 1.0])
    assert mean == pytest.approx(0.75) and std == pytest.approx(0.25)   # sqrt(0.125 / 2)
    assert mean_std([0.4]) == (0.4, None) and mean_std([]) == (None, None)
