"""The training job under ``ray job submit`` on an existing cluster (``ray start --head``), as
an ML engineer launches it: the working directory is uploaded with the runtime-env file from
``cluster/deploy``, the driver joins the cluster through ``RAY_ADDRESS``, and the smoke config
completes its 2 GRPO steps. Slow (a cluster start plus the smoke run): ``make test-slow``."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.ray_cluster import RAY, RayCluster

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture
def head():
    """A one-node cluster (``ray start --head`` with the dashboard), stopped by its own
    processes (tests.integration.ray_cluster: ``ray stop`` would stop every cluster here)."""
    cluster = RayCluster({}, head_cpus=4).start()
    try:
        yield cluster
    finally:
        cluster.stop()


def test_cluster_job_runs_under_ray_job_submit(head, tmp_path):
    run_dir = tmp_path / "run"
    for _attempt in range(4):
        proc = subprocess.run(
            [RAY, "job", "submit", "--address", head.dashboard, "--working-dir", ".",
             "--runtime-env", "cluster/deploy/runtime-env.yaml", "--",
             sys.executable, "-m", "cluster.job", "--config", "configs/smoke.yaml",
             "--run-dir", str(run_dir)],
            cwd=ROOT, capture_output=True, text=True, timeout=1200, env=head.env)
        # A fresh head's job agent may not have registered yet: the submission is refused
        # before anything runs, and Ray's own message says to try again.
        if "No available agent to submit job" not in proc.stderr:
            break
        time.sleep(5)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    assert "succeeded" in proc.stdout.lower()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["completed"] and summary["replica_versions"] == [2]
    assert summary["pending_entries"] == 0 and summary["leases_held"] == 0
