"""Small statistics shared by the benchmarks."""
from __future__ import annotations


def percentile(values: list[float], q: float) -> float:
    """The sample at index ``int(q * n)`` of the sorted values (capped at the last one)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
