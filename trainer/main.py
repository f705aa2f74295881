"""``python -m trainer.main`` runs :mod:`cluster.job` (the training job), so that commands
written before the composition root moved to ``cluster/`` keep working (``ray job submit
... -- python -m trainer.main``). It runs that module as a program and imports nothing from
it: ``trainer`` sits below ``cluster`` in the layers."""
import runpy

if __name__ == "__main__":
    runpy.run_module("cluster.job", run_name="__main__", alter_sys=True)
