"""``python -m trainer.evaluate`` runs :mod:`cluster.evaluate` (evaluation), so that commands
written before the composition root moved to ``cluster/`` keep working (``ray job submit
... -- python -m trainer.evaluate``). It runs that module as a program and imports nothing from
it: ``trainer`` sits below ``cluster`` in the layers."""
import runpy

if __name__ == "__main__":
    runpy.run_module("cluster.evaluate", run_name="__main__", alter_sys=True)
