"""The fault-injection suite: every fault of :data:`tests.faults.harness.FAULTS` injected into
a real short training run at three points drawn from seeds 0-2, then the invariants checked
from outside (see the harness). Two of the fastest cases run in ``make test``; all of them in
``make test-faults`` (about 2-4 minutes each), which prints the table at the end."""
from __future__ import annotations

import pytest

from tests.faults.harness import FAULTS, Case

SEEDS = (0, 1, 2)
IN_MAKE_TEST = {("chromium", 0), ("redis", 0)}


def _cases():
    for fault in FAULTS:
        for seed in SEEDS:
            marks = [] if (fault, seed) in IN_MAKE_TEST else [pytest.mark.faults]
            yield pytest.param(fault, seed, marks=marks, id=f"{fault}-{seed}")


@pytest.mark.timeout(1200)
@pytest.mark.parametrize(("fault", "seed"), _cases())
def test_fault_is_survived(fault: str, seed: int) -> None:
    result = Case(fault, seed).run()
    assert result.injected, f"the fault was not injected: {result.injection['detail']}"
    assert not result.violations, (f"{fault} ({result.injection['detail']}, "
                                   f"{result.injection['after_first_lease_s']} s after the first "
                                   f"lease): " + "; ".join(result.violations))
