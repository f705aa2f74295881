"""The job on a multi-node Ray cluster on one machine (:mod:`tests.integration.ray_cluster`:
a head plus worker nodes, each with its own custom resources).

- fast: the services a job starts on a cluster listen on the node's address, not loopback;
- slow: the smoke config under ``ray job submit`` runs to completion with every actor on a
  node that offers the resources its config names (from Ray's state API);
- slow: a worker node's raylet killed mid-run: its env workers' episodes become env errors,
  their leases expire and are leased again, the run completes.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
import redis

from cluster.addresses import is_loopback
from cluster.builders import env_pool
from cluster.config import JobConfig
from cluster.runtime import LocalServices
from consolerl.accounts import load_accounts
from consolerl.config import load_config
from env_workers.accounts import PoolConfig
from env_workers.leases import AccountPool
from infra.console_sim.config import DEFAULT_ACCOUNTS_FILE
from infra.local_cloud import free_port
from infra.redis_local import RedisServer
from tests.integration.ray_cluster import RAY, RayCluster, host_ip

ROOT = Path(__file__).resolve().parents[2]


def test_services_of_a_cluster_job_listen_on_the_node_address(tmp_path, monkeypatch):
    ip = host_ip()
    monkeypatch.setenv("RAY_ADDRESS", "10.9.9.9:6379")        # as under ray job submit
    redis_port, cloud_port = free_port(), free_port()
    config = load_config(JobConfig, "configs/smoke.yaml", [
        f"stream.url=redis://127.0.0.1:{redis_port}/0", f"cloud.endpoint=127.0.0.1:{cloud_port}"])
    services = LocalServices(config, tmp_path)
    try:
        advertised = services.start(node_ip=ip)
        assert advertised.stream.url == f"redis://{ip}:{redis_port}/0"
        assert advertised.cloud.endpoint == f"{ip}:{cloud_port}"
        # The console is the endpoint's: the env workers browse the node's address too.
        assert env_pool(advertised, None).worker.console_url == f"http://{ip}:{cloud_port}"
        assert redis.Redis.from_url(advertised.stream.url, socket_timeout=5).ping()
        with urllib.request.urlopen(f"http://{ip}:{cloud_port}/healthz", timeout=5) as r:
            assert r.status == 200
        if not is_loopback(ip):
            # Tools on this machine still reach the Redis on loopback.
            assert redis.Redis(port=redis_port, socket_timeout=5).ping()
    finally:
        services.stop()


# ---- the smoke run on a cluster ------------------------------------------------------------------

# What each actor kind needs, as the config names it (the smoke config plus these overrides).
PLACED = ("env.resources={browser: 1}", "policy.resources={policy: 1}",
          "trainer.engine.resources={trainer: 1}")
NEEDS = {"LeasedEnvWorker": "browser", "PolicyServer": "policy", "TrainerWorker": "trainer"}


@pytest.fixture
def three_nodes():
    """The head (the driver, the trainer), a node of browsers, a node for the policy."""
    cluster = RayCluster({"browsers": {"browser": 2}, "policy": {"policy": 1}},
                         head_resources={"trainer": 2}).start()
    try:
        yield cluster
    finally:
        cluster.stop()


class Job:
    """``python -m cluster.job --config configs/smoke.yaml`` under ``ray job submit`` on
    ``cluster`` (blocking submit in the background: it ends with the job's status)."""

    def __init__(self, cluster: RayCluster, run_dir: Path, overrides: tuple[str, ...]):
        self.cluster, self.run_dir = cluster, run_dir
        self.log = run_dir.parent / f"{run_dir.name}-submit.log"
        cmd = [RAY, "job", "submit", "--address", cluster.dashboard, "--working-dir", ".",
               "--runtime-env", "cluster/deploy/runtime-env.yaml", "--", sys.executable,
               "-m", "cluster.job", "--config", "configs/smoke.yaml", "--run-dir",
               str(run_dir), *PLACED, *overrides]
        for _attempt in range(6):
            with self.log.open("w") as out:
                self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out,
                                             stderr=subprocess.STDOUT, text=True,
                                             env=cluster.env)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                return                            # submitted and running
            # A fresh head's job agent may not have registered yet: refused before anything
            # ran, and Ray's own message says to try again.
            if "No available agent to submit job" not in self.output():
                return
            time.sleep(5)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def running(self) -> bool:
        return self.proc.poll() is None

    def wait(self, timeout_s: float) -> tuple[int, dict]:
        rc = self.proc.wait(timeout_s)
        summary = self.run_dir / "summary.json"
        assert summary.exists(), self.output()[-6000:]
        return rc, json.loads(summary.read_text())


def placement(cluster: RayCluster, seen: dict[str, dict]) -> dict[str, list[str]]:
    """Check every actor of a placed kind ran on a node that offers the resource its config
    names, and asked for it; the rollout actor on the driver's node (the head). Returns the
    node names of each kind."""
    nodes: dict[str, list[str]] = {}
    for actor in seen.values():
        node = cluster.node_named(actor["node_id"] or "")
        kind = actor["class_name"]
        if kind in NEEDS:
            resource = NEEDS[kind]
            assert node, f"{kind} {actor['actor_id']} on no node of ours: {actor}"
            assert resource in cluster.nodes[node].resources, (
                f"{kind} placed on node {node} ({cluster.nodes[node].resources}), which "
                f"does not offer {resource!r}")
            # In a placement group (the trainer ranks) Ray names a bundle's share of a
            # resource "<resource>_group_<bundle>_<group id>".
            asked = actor["required_resources"] or {}
            assert any(k == resource or k.startswith(f"{resource}_group_")
                       for k, v in asked.items() if v), (
                f"{kind} started without the resource {resource!r} of its config: {actor}")
        if kind in (*NEEDS, "TrainingRollouts"):
            nodes.setdefault(kind, []).append(node)
    assert nodes.get("TrainingRollouts") == ["head"], nodes
    return nodes


def watch_actors(cluster: RayCluster, seen: dict[str, dict]) -> None:
    for actor in cluster.actors():
        if actor["node_id"]:
            seen[actor["actor_id"]] = actor


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_smoke_run_under_ray_job_submit_on_three_nodes(three_nodes, tmp_path):
    cluster = three_nodes
    job = Job(cluster, tmp_path / "run", ())
    seen: dict[str, dict] = {}
    deadline = time.monotonic() + 780
    while job.running() and time.monotonic() < deadline:
        watch_actors(cluster, seen)               # while they live: where each one ran
        time.sleep(15)
    rc, summary = job.wait(max(1.0, deadline - time.monotonic()))
    watch_actors(cluster, seen)
    assert rc == 0 and "succeeded" in job.output().lower(), job.output()[-6000:]
    assert summary["completed"] and summary["replica_versions"] == [2]
    assert summary["pending_entries"] == 0 and summary["leases_held"] == 0
    # The services were reached by the node's address, not loopback.
    assert summary["services"]["cloud"] == f"{cluster.ip}:18090"
    assert summary["services"]["redis"] == f"redis://{cluster.ip}:6391/0"
    nodes = placement(cluster, seen)
    assert sorted(nodes["LeasedEnvWorker"]) == ["browsers", "browsers"]
    assert nodes["PolicyServer"] == ["policy"]
    assert sorted(nodes["TrainerWorker"]) == ["head", "head"]


# ---- a worker node lost mid-run ----------------------------------------------------------------

@pytest.fixture
def browsers_on_two_nodes():
    """The head (the driver, the trainer), a node with one browser slot (killed by the test),
    a node with the policy and one browser slot."""
    cluster = RayCluster({"browsers": {"browser": 1}, "policy": {"policy": 1, "browser": 1}},
                         head_resources={"trainer": 2}).start()
    try:
        yield cluster
    finally:
        cluster.stop()


LEASE_TTL_S = 15.0
PREFIX = "consolerl:smoke:pool"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_worker_node_killed_mid_run_is_survived(browsers_on_two_nodes, tmp_path):
    cluster = browsers_on_two_nodes
    # Redis of the test's own, on the node's address (it outlives the job: the leases are
    # checked after it).
    server = RedisServer(tmp_path / "redis", host=cluster.ip).start()
    try:
        _node_kill_run(cluster, server, tmp_path)
    finally:
        server.stop()


def _node_kill_run(cluster: RayCluster, server: RedisServer, tmp_path: Path) -> None:
    r = redis.Redis.from_url(server.url, decode_responses=True)
    job = Job(cluster, tmp_path / "run", (f"stream.url={server.url}", "run.redis=false",
                                          f"env.pool.lease_ttl_s={LEASE_TTL_S:g}"))
    seen: dict[str, dict] = {}
    deadline = time.monotonic() + 780
    # Both env workers inside an episode (each holds a lease): then the node goes.
    leased: list[str] = []
    while job.running() and time.monotonic() < deadline:
        leased = sorted(r.scan_iter(f"{PREFIX}:lease:*"))
        if len(leased) == 2:
            break
        time.sleep(0.5)
    assert len(leased) == 2, ("no moment with both workers in an episode", job.output()[-4000:])
    watch_actors(cluster, seen)
    on_killed = [a for a in seen.values() if a["class_name"] == "LeasedEnvWorker"
                 and cluster.node_named(a["node_id"]) == "browsers"]
    assert len(on_killed) == 1, seen
    killed_at = time.monotonic()
    cluster.kill_node("browsers")
    # The lost worker's lease is renewed no more and expires; the other is renewed or
    # released. Each key's PTTL, read every 0.5 s until it is gone.
    last_pttl: dict[str, int] = {}
    gone_at: dict[str, float] = {}
    while len(gone_at) < len(leased) and time.monotonic() < killed_at + LEASE_TTL_S + 30:
        for key in leased:
            if key in gone_at:
                continue
            pttl = r.pttl(key)
            if pttl < 0:
                gone_at[key] = time.monotonic() - killed_at
            else:
                last_pttl[key] = pttl
        time.sleep(0.5)
    expired = [k for k in leased if k in gone_at and last_pttl.get(k, 0) <= 1500
               and gone_at[k] <= LEASE_TTL_S + 2]
    assert expired, (last_pttl, gone_at)
    rc, summary = job.wait(max(1.0, deadline - time.monotonic()))
    assert rc == 0 and "succeeded" in job.output().lower(), job.output()[-6000:]
    rollout = summary["rollout"]
    assert summary["completed"] and summary["steps"] == 2, summary
    assert rollout["workers_lost"] >= 1 and rollout["env_errors_by_kind"].get("worker_lost"), \
        rollout
    assert rollout["groups_pushed"] >= 2 and rollout["leaked_resources"] == 0, rollout
    assert summary["pending_entries"] == 0 and summary["leases_held"] == 0
    # Every account, the lost worker's included, is leased again.
    accounts = load_accounts(DEFAULT_ACCOUNTS_FILE)
    pool = AccountPool.from_config(PoolConfig(redis_url=server.url, key_prefix=PREFIX,
                                              lease_ttl_s=LEASE_TTL_S,
                                              accounts_file=str(DEFAULT_ACCOUNTS_FILE)))
    try:
        leases = [pool.acquire(f"probe-{i}", timeout_s=10) for i in range(len(accounts))]
        assert {lease.account_id for lease in leases} == {a.account_id for a in accounts}
        for lease in leases:
            pool.release(lease)
    finally:
        pool.close()


# ---- the jobs API on a cluster -------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_jobs_apis_env_workers_keep_their_placement_and_restarts(tmp_path):
    """``python -m cluster.serve`` on a head plus a node of browsers: the API's env workers go
    only to the node offering ``env.resources`` and Ray restarts a killed one
    (``env.max_restarts``); SIGTERM then stops it all within 30 s with 143."""
    cluster = RayCluster({"browsers": {"browser": 2}}).start()
    port = free_port()
    log = tmp_path / "serve.log"
    proc = None
    try:
        with log.open("w") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "cluster.serve", "--config", "configs/serve.yaml",
                 "env.resources={browser: 1}", "env.max_restarts=1", "api.workers=2",
                 "policy.model=tiny", f"api.port={port}", f"run.dir={tmp_path / 'run'}",
                 f"stream.url=redis://127.0.0.1:{free_port()}/0",
                 f"cloud.endpoint=127.0.0.1:{free_port()}",
                 f"api.tokens_file={tmp_path / 'tokens.json'}", "observe.enabled=false"],
                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                env={**cluster.env, "RAY_ADDRESS": cluster.address})
        deadline = time.monotonic() + 300
        while "the jobs API is on" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(2)
        # The scheduler actor starts its env workers as it comes up, after the HTTP side.
        deadline = time.monotonic() + 180
        while True:
            actors = cluster.actors()
            workers = [a for a in actors
                       if a["class_name"] == "LeasedEnvWorker" and a["state"] == "ALIVE"]
            if len(workers) == 2:
                break
            assert time.monotonic() < deadline, (actors, log.read_text()[-4000:])
            time.sleep(3)
        for worker in workers:
            assert cluster.node_named(worker["node_id"]) == "browsers", worker
            assert worker["required_resources"].get("browser") == 1.0, worker
        # Ray restarts a worker whose process died: the API's pool asked for a restart.
        killed = workers[0]
        psutil.Process(killed["pid"]).kill()
        deadline = time.monotonic() + 120
        while True:
            again = next(a for a in cluster.actors() if a["actor_id"] == killed["actor_id"])
            if again["state"] == "ALIVE" and again["num_restarts"] == 1:
                break
            assert time.monotonic() < deadline, again
            time.sleep(3)
        assert cluster.node_named(again["node_id"]) == "browsers", again
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(60)
        assert rc == 128 + signal.SIGTERM and time.monotonic() - t0 < 30, log.read_text()[-4000:]
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        cluster.stop()
