"""A run's embedded Ray cluster and the services it starts sit in process groups other than
the driver's (cluster.runtime.own_process_groups, infra.local_cloud.service_process): a signal
to the run's group (Ctrl-C, ``kill -TERM -PGID``) reaches the driver only, which then stops
them in order. Ray starts its processes through a private launcher; this fails if a Ray
upgrade moves it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_PROBE = """
import json, os, psutil, ray
from cluster.config import RunSection
from cluster.runtime import ray_init
from infra.local_cloud import free_port
from infra.redis_local import RedisServer
ray_init(RunSection(ray_num_cpus=1))
redis = RedisServer(__import__("pathlib").Path(os.environ["PROBE_DIR"]), port=free_port()).start()
try:
    mine = os.getpgid(0)
    kids = {}
    for p in psutil.Process().children(recursive=True):
        name = " ".join(p.cmdline())
        for kind in ("gcs_server", "raylet", "redis-server"):
            if kind in name:
                kids[kind] = os.getpgid(p.pid) != mine
    print(json.dumps(kids))
finally:
    redis.stop()
    ray.shutdown()
"""


def test_ray_and_the_services_are_not_in_the_drivers_process_group(tmp_path):
    # A group of its own for the probe, as a run started by make or a shell has.
    proc = subprocess.run([sys.executable, "-c", _PROBE], cwd=ROOT, capture_output=True,
                          text=True, timeout=180, start_new_session=True,
                          env={**os.environ, "PROBE_DIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    groups = json.loads(proc.stdout.strip().splitlines()[-1])
    assert groups == {"gcs_server": True, "raylet": True, "redis-server": True}, groups
