"""The training job under ``ray job submit`` on an existing cluster (``ray start --head``), as
an ML engineer launches it: the working directory is uploaded with the runtime-env file from
``cluster/deploy``, the driver joins the cluster through ``RAY_ADDRESS``, and the smoke config
completes its 2 GRPO steps. Slow (a cluster start plus the smoke run): ``make test-slow``."""
from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from infra.local_cloud import free_port

ROOT = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).with_name("ray"))

pytestmark = pytest.mark.slow


# Ray >= 2.59 authenticates local clusters by token: the head and the CLI share one, as they
# would on a real cluster (a Secret there).
AUTH = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}


@pytest.fixture
def head():
    dashboard = free_port()
    env = {**os.environ, "RAY_ADDRESS": "", **AUTH}
    # Ray's Unix socket paths must stay short: not under pytest's long tmp_path.
    temp = Path(tempfile.mkdtemp(prefix="rj-", dir="/tmp"))
    subprocess.run([RAY, "start", "--head", "--port", str(free_port()), "--num-cpus", "4",
                    "--include-dashboard", "true", "--dashboard-host", "127.0.0.1",
                    "--dashboard-port", str(dashboard),
                    "--temp-dir", str(temp)],
                   check=True, capture_output=True, env=env, timeout=120)
    try:
        yield f"http://127.0.0.1:{dashboard}"
    finally:
        subprocess.run([RAY, "stop", "--force"], capture_output=True, timeout=120, env=env)
        shutil.rmtree(temp, ignore_errors=True)


def test_trainer_main_runs_under_ray_job_submit(head, tmp_path):
    run_dir = tmp_path / "run"
    for _attempt in range(4):
        proc = subprocess.run(
            [RAY, "job", "submit", "--address", head, "--working-dir", ".",
             "--runtime-env", "cluster/deploy/runtime-env.yaml", "--",
             sys.executable, "-m", "cluster.job", "--config", "configs/smoke.yaml",
             "--run-dir", str(run_dir)],
            cwd=ROOT, capture_output=True, text=True, timeout=1200,
            env={**os.environ, "RAY_ADDRESS": "", **AUTH})
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
