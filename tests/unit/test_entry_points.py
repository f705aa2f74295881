"""The old entry points forward to the composition root: ``python -m trainer.main`` is
``python -m cluster.job`` and ``python -m trainer.evaluate`` is ``python -m cluster.evaluate``
(``ray job submit`` commands written before the move keep working)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("old,new", [("trainer.main", "cluster.job"),
                                     ("trainer.evaluate", "cluster.evaluate")])
def test_the_old_module_runs_the_new_one(old, new):
    usage = subprocess.run([sys.executable, "-m", old, "--help"], cwd=ROOT,
                           capture_output=True, text=True, timeout=180)
    # The new module's own parser answered (its usage line names it), not the old module.
    assert usage.returncode == 0, usage.stderr[-2000:]
    assert usage.stdout.startswith(f"usage: python -m {new} ")
