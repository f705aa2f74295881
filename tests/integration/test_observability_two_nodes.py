"""Discovery on a two-node Ray cluster on one machine (``ray start --head`` plus a second
``ray start --address ...`` with its own resources): a job whose env workers and policy
replicas are spread over both nodes (SPREAD) has every one of them discovered and scraped by
Prometheus, with no port configured anywhere. Slow (two raylets and a training job)."""
from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from infra.local_cloud import free_port
from infra.observability.observe import ObserveConfig, Observatory
from tests.integration.ray_cluster import terminate

ROOT = Path(__file__).resolve().parents[2]
RUN = "observe-two-nodes"
RAY = str(Path(sys.executable).with_name("ray"))
AUTH = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    shutil.which("prometheus") is None or shutil.which("prometheus-redis-exporter") is None,
    reason="prometheus / prometheus-redis-exporter not installed: make setup installs them")]


def _kill_cluster(temp_dir: str) -> None:
    """Stop only this test's raylets and workers (ray stop would stop every cluster here)."""
    found: dict[int, psutil.Process] = {}
    for p in psutil.process_iter(["cmdline"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
            if temp_dir in cmd or temp_dir in p.environ().get("RAY_TMPDIR", ""):
                # With their children: the agents rename themselves (ray::DashboardAgent).
                for q in [p, *p.children(recursive=True)]:
                    found[q.pid] = q
        except psutil.Error:
            continue
    terminate(list(found.values()))


@pytest.fixture
def two_nodes():
    temp_dir = f"/tmp/rn{secrets.token_hex(3)}"
    port = free_port()
    env = {**os.environ, "RAY_TMPDIR": temp_dir, "RAY_ADDRESS": "", **AUTH}
    common = ["--temp-dir", temp_dir, "--disable-usage-stats"]
    try:
        subprocess.run([RAY, "start", "--head", f"--port={port}", "--num-cpus=3",
                        "--resources={\"head_node\": 1}", "--include-dashboard=false",
                        *common], check=True, capture_output=True, env=env, timeout=120)
        subprocess.run([RAY, "start", f"--address=127.0.0.1:{port}", "--num-cpus=3",
                        "--resources={\"second_node\": 1}", *common],
                       check=True, capture_output=True, env=env, timeout=120)
        yield f"127.0.0.1:{port}", env
    finally:
        _kill_cluster(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_actors_on_both_nodes_are_discovered_and_scraped(two_nodes, tmp_path):
    address, env = two_nodes
    obs = Observatory(ObserveConfig("redis://127.0.0.1:6391/0", tmp_path / "observe",
                                    free_port(), free_port(), "1s", "2s",
                                    streams="consolerl:smoke:experience*",
                                    sd_interval_s=0.5)).start()
    try:
        started = time.time()
        proc = subprocess.run(
            [sys.executable, "-m", "cluster.job", "--config", "configs/smoke.yaml",
             "--run-dir", str(tmp_path / "run"), f"run.ray_address={address}",
             "env.scheduling_strategy=SPREAD", "policy.scheduling_strategy=SPREAD",
             "policy.replicas=2", f"observe.run={RUN}"],
            cwd=ROOT, capture_output=True, text=True, timeout=1200, env=env)
        ended = time.time()
        assert proc.returncode == 0, proc.stderr[-4000:]
        ups = obs.query(f'up{{job="consolerl", run="{RUN}"}}', start=started,
                        end=ended + 5, step="1s")
    finally:
        obs.stop()
    scraped = {}
    for s in ups:
        if any(v == "1" for _, v in s["values"]):
            scraped[(s["metric"]["component"], s["metric"]["name"])] = s["metric"]["node"]
    artifacts = ROOT / "test-artifacts" / "observability"
    artifacts.mkdir(parents=True, exist_ok=True)
    (artifacts / "targets-two-nodes.txt").write_text("".join(
        f"{m['component']:<12} {m['name']:<14} {m['instance']:<22} node {m['node'][:12]}\n"
        for m in sorted((s["metric"] for s in ups), key=lambda m: (m["component"],
                                                                   m["name"]))))
    workers = {n: node for (c, n), node in scraped.items() if c == "env_worker"}
    policies = {n: node for (c, n), node in scraped.items() if c == "policy"}
    assert set(workers) == {"env-worker-0", "env-worker-1"}, scraped
    assert set(policies) == {"policy-0", "policy-1"}, scraped
    # Both nodes of the cluster host some of them, and every node id is a real Ray node.
    listed = subprocess.run(
        [sys.executable, "-c", "import json, ray; ray.init(log_to_driver=False); "
         "print(json.dumps([n['NodeID'] for n in ray.nodes() if n['Alive']]))"],
        capture_output=True, text=True, timeout=120, env={**env, "RAY_ADDRESS": address})
    assert listed.returncode == 0, listed.stderr[-2000:]
    nodes = set(json.loads(listed.stdout.strip().splitlines()[-1]))
    assert len(nodes) == 2
    assert set(workers.values()) == nodes, (workers, nodes)
    assert set(policies.values()) == nodes, (policies, nodes)
    assert {"trainer", "rollout", "cloud"} <= {c for c, _ in scraped}
