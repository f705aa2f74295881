"""The jobs API as ``make serve`` runs it: ``python -m cluster.serve`` in processes of its own
(embedded Ray, the scheduler actor, Chromium env workers, the tiny policy, the HTTP actor)
against a real Redis and local cloud, used over HTTP.

- ``model: oracle``: a job over three catalogue tasks runs to completion through the same
  scheduler, runner and report, with rewards, in seconds an episode, no model acting.
- A scheduler killed with SIGKILL mid-episode (the whole API, every process of it): the
  episode's prerequisites are still in the cloud and its account still leased; on restart,
  before any new episode starts, they are destroyed (by the scheduler's start-up sweep, not
  by an episode) and the lease is ended long before its TTL; the rollout runs again and the
  job completes with nothing left behind.
"""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

pytest.importorskip("torch")       # the tiny policy the API serves (oracle jobs never use it)

from consolerl.accounts import load_accounts  # noqa: E402
from env_workers.accounts import PoolConfig  # noqa: E402
from env_workers.leases import AccountPool  # noqa: E402
from infra.cloud import CloudClient, CloudConfig, Credentials  # noqa: E402
from infra.console_sim.config import DEFAULT_ACCOUNTS_FILE  # noqa: E402
from infra.local_cloud import free_port  # noqa: E402
from infra.provisioning.sdk import SdkProvisioner  # noqa: E402
from jobsapi.auth import TokenBook  # noqa: E402
from rollout_service.models import tiny_model  # noqa: E402
from tests.conftest import ROOT, CloudServer, _server  # noqa: E402
from tests.faults.harness import MARK, processes  # noqa: E402

PREFIX = "test:crash"
POOL = "test:crash:pool"
LEASE_TTL_S = 300          # a dead holder's lease would free its account only after this
SCOPES = ["jobs:write", "jobs:read", "jobs:cancel", "artifacts:read"]
CREATES = ("CreateVpc", "CreateVSwitch", "CreateSecurityGroup", "RunInstances", "CreateUser",
           "PutBucket")
ACCOUNTS = {a.account_id: a for a in load_accounts(DEFAULT_ACCOUNTS_FILE)}


@pytest.fixture(scope="module")
def crash_cloud(tmp_path_factory) -> Iterator[CloudServer]:
    yield from _server(tmp_path_factory, "crash-cloud", ["--lookup-qps", "0", "--transition",
                                                         "0.3", "--network-ready", "0.1"])


class Api:
    """``python -m cluster.serve`` with its own process group, every process of it marked
    (``MARK``) so that all of them can be killed at once."""

    def __init__(self, cloud: CloudServer, redis_url: str, tmp: Path):
        self.tmp, self.port = tmp, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.marker = f"jobs-crash-{os.getpid()}"
        self.token = TokenBook(tmp / "tokens.json").create("docs", SCOPES)
        self.args = [
            sys.executable, "-m", "cluster.serve", "--config", "configs/serve.yaml",
            f"cloud.endpoint={cloud.endpoint}", "cloud.local=false",
            f"env.worker.console_url={cloud.url}", f"env.pool.key_prefix={POOL}",
            f"env.pool.lease_ttl_s={LEASE_TTL_S}", "env.num_cpus_per_worker=0.5",
            f"policy.model={tiny_model(tmp / 'tiny')}", "policy.backend=transformers",
            "policy.num_cpus_per_replica=0.5", "agent.max_new_tokens=12",
            f"stream.url={redis_url}", "run.redis=false", f"run.dir={tmp / 'run'}",
            "run.ray_num_cpus=4", "observe.enabled=false",
            f"api.tokens_file={tmp / 'tokens.json'}", f"api.port={self.port}",
            "api.workers=2", f"api.prefix={PREFIX}", "api.scheduler.step_event_interval_s=0.2"]
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self, timeout_s: float = 300) -> float:
        """Start it; wall clock when it was started."""
        self.starts += 1
        log = open(self.tmp / f"serve-{self.starts}.log", "ab")
        started = time.time()
        self.proc = subprocess.Popen(self.args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True,
                                     env={**os.environ, MARK: self.marker,
                                          "PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"cluster.serve exited {self.proc.returncode}: "
                                   f"{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return started
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"cluster.serve not ready in {timeout_s} s: {self.log_tail()}")

    def log_tail(self) -> str:
        return (self.tmp / f"serve-{self.starts}.log").read_text(errors="replace")[-3000:]

    def kill(self) -> None:
        """SIGKILL to every process of the API (driver, Ray, scheduler, workers, browsers)."""
        for _ in range(3):           # a process may fork while we kill
            for p in processes(self.marker):
                try:
                    os.kill(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.2)
        if self.proc is not None:
            self.proc.wait()
        self.wait_gone(30)

    def stop(self) -> None:
        """SIGTERM to the driver: it drains (episodes end, accounts released) and exits."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(180)
            except subprocess.TimeoutExpired:
                pass
        self.kill()

    def wait_gone(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while processes(self.marker) and time.monotonic() < deadline:
            time.sleep(0.3)

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=60,
                            headers={"Authorization": f"Bearer {self.token}"})


@pytest.fixture(scope="module")
def api(crash_cloud, redis_server, tmp_path_factory) -> Iterator[Api]:
    served = Api(crash_cloud, redis_server.url, tmp_path_factory.mktemp("crash-api"))
    served.start()
    try:
        yield served
    finally:
        served.stop()


def wait_job(http: httpx.Client, job: str, timeout_s: float = 300) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        body = http.get(f"/v1/jobs/{job}").json()
        if body["state"] in ("completed", "failed", "cancelled", "expired"):
            return body
        time.sleep(0.5)
    raise AssertionError(f"job {job} did not end: {body}")


def rollouts(http: httpx.Client, job: str) -> list[dict]:
    return [http.get(f"/v1/jobs/{job}/rollouts/{r['id']}").json()
            for r in http.get(f"/v1/jobs/{job}/results").json()["data"]]


def provisioner(cloud: CloudServer, account_id: str) -> SdkProvisioner:
    account = ACCOUNTS[account_id]
    return SdkProvisioner(lambda: CloudClient(
        CloudConfig(endpoint=cloud.endpoint),
        Credentials(account.access_key_id, account.access_key_secret)))


def cloud_db(cloud: CloudServer) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{cloud.state_dir / 'cloud.db'}?mode=ro", uri=True)


def test_an_oracle_job_runs_catalogue_tasks_in_seconds_with_rewards(api):
    tasks = ["ram-create-user-0", "ecs-add-rule-0", "vpc-create-vpc-0"]
    with api.http() as http:
        assert "oracle" in http.get("/v1/models").json()["data"]
        r = http.post("/v1/jobs", json={"tasks": {"ids": tasks}, "model": "oracle"})
        assert r.status_code == 202, r.text
        job = wait_job(http, r.json()["id"])
        assert job["state"] == "completed" and job["model"] == "oracle", job
        assert job["episodes"]["completed"] == 3 and job["verdicts"]["success"] == 3, job
        assert job["usage"]["tokens"] == 0 and job["policy_version"] is None
        done = rollouts(http, job["id"])
        assert sorted(r["task_id"] for r in done) == sorted(tasks)
        for r in done:
            assert r["model"] == "oracle" and r["reward"] == 1.0 and r["tokens"] == 0, r
            assert r["policy_version"] is None and r["leaked"] == [] and r["steps"], r
            # Seconds an episode (the policy's episodes here take minutes).
            assert r["env_seconds"] < 60, (r["task_id"], r["env_seconds"])
        report = http.get(f"/v1/jobs/{job['id']}/report").json()
        assert report["model"] == "oracle" and report["scripted"] is True
        assert {p["verdict"] for p in report["procedures"]} <= {"works", "works_text_stale"}
        html = http.get(f"/v1/jobs/{job['id']}/report",
                        headers={"Accept": "text/html"}).text
        assert "the scripted teacher" in html


def killed_mid_episode(api: Api, cloud: CloudServer, rclient: redis.Redis, job: str,
                       prerequisites: int, timeout_s: float = 240) -> tuple[str, str, list[str]]:
    """Wait until an episode of the job has all its prerequisites in the cloud (the
    scheduler's record names its account and episode), then SIGKILL the whole API. Returns
    the account, the episode and what it had provisioned."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for field, raw in rclient.hgetall(f"{PREFIX}:inflight").items():
            record = json.loads(raw)
            if record["job_id"] != job:
                continue
            episode = field.split("/", 1)[1]
            made = provisioner(cloud, record["account_id"]).leftovers(episode)
            if len(made) >= prerequisites:
                api.kill()
                return record["account_id"], episode, made
        time.sleep(0.1)
    raise AssertionError(f"no episode of {job} provisioned within {timeout_s} s")


def test_a_scheduler_killed_mid_job_is_swept_before_new_work(api, crash_cloud, redis_server):
    rclient = redis.Redis.from_url(redis_server.url, decode_responses=True)
    pool = AccountPool.from_config(PoolConfig(redis_url=redis_server.url, key_prefix=POOL))
    with cloud_db(crash_cloud) as db:
        baseline = set(db.execute("SELECT account_id, rtype, rid FROM resources "
                                  "WHERE rtype != 'client_token'"))
    try:
        with api.http() as http:
            r = http.post("/v1/jobs", json={"tasks": {"ids": ["ecs-add-rule-0"]},
                                            "samples_per_task": 2, "model": "oracle"})
            assert r.status_code == 202, r.text
            job = r.json()["id"]
            account, episode, made = killed_mid_episode(api, crash_cloud, rclient, job, 2)
        # Killed: what the episode provisioned is still there, its account still leased.
        assert provisioner(crash_cloud, account).leftovers(episode) == made
        assert rclient.exists(f"{POOL}:lease:{account}")
        assert episode in pool.unfinished_episodes(account)
        time.sleep(1.0)            # calls the cloud was answering as the API died land
        with cloud_db(crash_cloud) as db:
            killed_at = db.execute("SELECT MAX(seq) FROM events").fetchone()[0]
        restarted = api.start()
        with api.http() as http:
            finished = wait_job(http, job)
            assert finished["state"] == "completed", finished
            assert finished["episodes"]["completed"] == 2, finished
            again = rollouts(http, job)
            metrics = httpx.get(f"{api.url}/metrics").text
        # Gone, and by the sweep: before the first new episode's provisioning...
        assert provisioner(crash_cloud, account).leftovers(episode) == []
        ids = [m.split(" ", 1)[1] for m in made]
        with cloud_db(crash_cloud) as db:
            deletes = [db.execute(
                "SELECT seq, event_ms FROM events WHERE seq > ? AND account_id = ? AND "
                "event_name LIKE 'Delete%' AND body LIKE ? ORDER BY seq LIMIT 1",
                (killed_at, account, f'%"{rid}"%')).fetchone() for rid in ids]
            first_create = db.execute(
                f"SELECT MIN(seq) FROM events WHERE seq > ? AND event_name IN "
                f"({','.join('?' * len(CREATES))})", (killed_at, *CREATES)).fetchone()[0]
        assert all(deletes), (made, deletes)
        assert first_create is not None and max(s for s, _ in deletes) < first_create
        # ...and before any rollout started again (its attempt's start, same clock)...
        swept_at = max(ms for _, ms in deletes) / 1000
        interrupted = [r for r in again if r["attempts"][0]["env_error"]]
        assert interrupted, again
        for r in again:
            assert r["state"] == "completed" and r["model"] == "oracle", r
            assert all(a["started_at"] > swept_at for a in r["attempts"][1:]), r["attempts"]
        for r in interrupted:
            assert r["attempts"][0]["env_error"].startswith("interrupted"), r["attempts"]
            assert len(r["attempts"]) == 2
        # ...by the scheduler's start-up sweep (an episode cleaning orphans counts nothing
        # here), with the dead lease ended, not waited out (its TTL is 300 s).
        swept = _sample(metrics, "consolerl_api_swept_resources_total")
        assert swept >= len(made), metrics
        assert _sample(metrics, "consolerl_api_reclaimed_leases_total") >= 1
        assert swept_at - restarted < LEASE_TTL_S / 3
    finally:
        api.stop()                  # drained: episodes ended, accounts released
    try:
        # Nothing left: no episode's resources, no lease, no record.
        with cloud_db(crash_cloud) as db:
            now = set(db.execute("SELECT account_id, rtype, rid FROM resources "
                                 "WHERE rtype != 'client_token'"))
        assert now - baseline == set()
        assert all(pool.unfinished_episodes(a) == [] for a in ACCOUNTS)
        assert pool.status().leased == 0
        assert rclient.hlen(f"{PREFIX}:inflight") == 0
    finally:
        pool.close()
        rclient.close()


def _sample(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in the metrics")
