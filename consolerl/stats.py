"""Small statistics shared by the evaluation and the benchmarks: a percentile, a mean with its
sample standard deviation, the unbiased pass@k estimator, and percentile bootstrap intervals
of a mean and of a difference between two models.

Every interval is seeded (``seed``) and drawn with :class:`random.Random`, so the same inputs
give the same numbers on every run. The differences are ``after - before`` and come in three
shapes, by what the two models share:

- :func:`paired_diff_ci`: pairs of outcomes (same task, same seed); resamples the pairs;
- :func:`grouped_diff_ci`: outcomes per group (a task); resamples the groups, each group's
  outcomes staying together;
- :func:`stratified_diff_ci`: outcomes per group, the set of groups fixed; resamples each
  model's outcomes within each group.

:func:`paired_lists_diff_ci95` is a paired interval too, over two aligned lists, with a
different resampler (``random.Random.choices``) and round count: it is kept as is because the
learning benchmark's figures are defined by it.

Imports nothing of the project: the standard library only.
"""
from __future__ import annotations

import math
import random
import statistics


def percentile(values: list[float], q: float) -> float:
    """The sample at index ``int(q * n)`` of the sorted values (capped at the last one)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def mean_std(values: list[float]) -> tuple[float | None, float | None]:
    """The mean of ``values`` and their sample standard deviation (``n - 1`` in the
    denominator); the mean is ``None`` without values, the deviation ``None`` below two."""
    if not values:
        return None, None
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None


def pass_at_k(n: int, c: int, k: int) -> float | None:
    """The unbiased estimate of pass@k (the chance that at least one of ``k`` attempts
    succeeds) from ``n`` attempts of which ``c`` succeeded: ``1 - C(n-c, k) / C(n, k)``
    (Chen et al. 2021, "Evaluating large language models trained on code"). ``None`` when
    ``n < k``: ``n`` attempts say nothing unbiased about ``k``."""
    if k < 1 or n < 0 or not 0 <= c <= n:
        raise ValueError(f"pass_at_k: need k >= 1 and 0 <= c <= n (got n={n}, c={c}, k={k})")
    if n < k:
        return None
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def _interval(boots: list[float], n: int, level: float) -> tuple[float, float]:
    """The ``level`` percentile interval of ``n`` sorted bootstrap statistics."""
    return boots[int((1 - level) / 2 * n)], boots[min(n - 1, int((1 + level) / 2 * n))]


def bootstrap_mean_ci(values: list[float], *, n: int = 10_000, seed: int = 0,
                      level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``values`` (``n`` resamples)."""
    if not values:
        raise ValueError("bootstrap_mean_ci: no values")
    rng = random.Random(seed)
    k = len(values)
    means = sorted(sum(values[rng.randrange(k)] for _ in range(k)) / k for _ in range(n))
    return _interval(means, n, level)


def grouped_diff_ci(before: dict[str, list[float]], after: dict[str, list[float]], *,
                    n: int = 10_000, seed: int = 0, level: float = 0.95
                    ) -> tuple[float, tuple[float, float]]:
    """Mean over the groups both saw of ``mean(after[g]) - mean(before[g])``, and its interval
    from resampling groups (each group's outcomes stay together: tasks differ in difficulty)."""
    groups = sorted(set(before) & set(after))
    if not groups:
        raise ValueError("grouped_diff_ci: no group in both before and after")

    def mean(xs: list[float]) -> float:
        return sum(xs) / len(xs)

    diffs = [mean(after[g]) - mean(before[g]) for g in groups]
    rng = random.Random(seed)
    k = len(diffs)
    boots = sorted(sum(diffs[rng.randrange(k)] for _ in range(k)) / k for _ in range(n))
    return sum(diffs) / k, _interval(boots, n, level)


def stratified_diff_ci(before: dict[str, list[float]], after: dict[str, list[float]], *,
                       n: int = 10_000, seed: int = 0, level: float = 0.95
                       ) -> tuple[float, tuple[float, float]]:
    """Difference ``after - before`` of the mean averaged over the groups both saw (non-empty
    in both), and its interval from resampling each model's outcomes within each group (the
    group set is fixed: the question is whether this model beats that one on these groups,
    with few groups and several outcomes each)."""
    groups = sorted(g for g in set(before) & set(after) if before[g] and after[g])
    if not groups:
        raise ValueError("stratified_diff_ci: no group with outcomes in both before and after")
    rng = random.Random(seed)

    def resampled_mean(xs: list[float]) -> float:
        return sum(xs[rng.randrange(len(xs))] for _ in xs) / len(xs)

    point = sum(sum(after[g]) / len(after[g]) - sum(before[g]) / len(before[g])
                for g in groups) / len(groups)
    boots = sorted(sum(resampled_mean(after[g]) - resampled_mean(before[g]) for g in groups)
                   / len(groups) for _ in range(n))
    return point, _interval(boots, n, level)


def paired_diff_ci(pairs: list[tuple[float, float]], *, n: int = 10_000, seed: int = 0,
                   level: float = 0.95) -> tuple[float, tuple[float, float]]:
    """Mean of ``after - before`` over ``(before, after)`` pairs and its paired bootstrap
    interval (resampling pairs: what the two sides of a pair share stays together)."""
    if not pairs:
        raise ValueError("paired_diff_ci: no pairs")
    diffs = [a - b for b, a in pairs]
    rng = random.Random(seed)
    k = len(diffs)
    boots = sorted(sum(diffs[rng.randrange(k)] for _ in range(k)) / k for _ in range(n))
    return sum(diffs) / k, _interval(boots, n, level)


def paired_lists_diff_ci95(before: list[float], after: list[float], *, seed: int = 0,
                           rounds: int = 4000) -> tuple[float, float]:
    """95% interval of ``mean(after - before)`` over two aligned lists (``zip``: the shorter
    one sets the length), resampling positions with ``random.Random.choices``, ``rounds``
    resamples."""
    diffs = [a - b for a, b in zip(after, before)]
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choices(diffs, k=len(diffs))) for _ in range(rounds))
    return means[int(0.025 * rounds)], means[int(0.975 * rounds) - 1]
