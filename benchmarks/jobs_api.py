"""Benchmark of the jobs API: ``python -m benchmarks.jobs_api --json``.

Starts what ``make serve`` starts (a local cloud, Redis, embedded Ray, the scheduler actor with
the policy and ``--workers`` env workers, the HTTP side: ``--hosting actor`` uvicorn in a Ray
actor, or ``serve`` Ray Serve with FastAPI ingress), then measures:

- ``submit_to_first_episode_ms``: from just before ``POST /v1/jobs`` to the first episode's
  start (its ``rollout.started`` event, timed by Redis's clock on this machine) with a worker
  free; the median of ``--submits`` jobs (each one task, one sample, one step, waited out);
- ``p50_ms`` / ``p99_ms`` of ``GET /v1/jobs/{id}`` under ``--clients`` concurrent clients for
  ``--seconds`` s, ``errors`` (anything but 200), ``rps``. Each client sends its next request
  ``--interval-ms`` after the previous one started (a status poller; 0: back to back, a
  closed loop). The load generator (aiohttp) runs in this process, on the same cores.

With ``--active-jobs N`` it measures submission cost instead (no Ray, no scheduler, no
policy): a Redis holding ``N`` active jobs of ``--other-teams`` other teams (queued and
running), the HTTP side alone in a process of its own (uvicorn, uvloop, as ``make serve``
hosts it), and one client in this process that sends ``--submits`` ``POST /v1/jobs`` (one
task each, team ``bench``) one after the other, then as many ``GET /v1/quota``:
``submit_p50_ms`` / ``submit_p99_ms``, ``quota_p50_ms`` / ``quota_p99_ms``, ``errors``,
``seed_s``, ``commit`` (the code measured).

Prints one JSON object.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import ray

from benchmarks.services import cloud_and_redis, wait_http
from cluster.config import JobConfig
from cluster.serve import Stack
from consolerl.config import load_config
from infra.local_cloud import free_port
from infra.redis_local import RedisServer
from jobsapi.auth import TeamQuota, TokenBook
from jobsapi.schema import Job, Sampling
from jobsapi.store import JobStore

ROOT = Path(__file__).resolve().parents[1]


def _log(msg: str) -> None:
    print(f"[benchmarks.jobs_api] {msg}", file=sys.stderr, flush=True)


async def load(url: str, token: str, clients: int, seconds: float, interval_s: float
               ) -> dict[str, Any]:
    latencies: list[float] = []
    errors = 0
    headers = {"Authorization": f"Bearer {token}"}
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:
        end = time.monotonic() + seconds

        async def client(i: int) -> None:
            nonlocal errors
            await asyncio.sleep(interval_s * i / clients)       # spread the first requests
            while time.monotonic() < end:
                t0 = time.perf_counter()
                try:
                    async with session.get(url) as r:
                        await r.read()
                        errors += r.status != 200
                except aiohttp.ClientError:
                    errors += 1
                took = time.perf_counter() - t0
                latencies.append(took * 1000)
                if interval_s:
                    await asyncio.sleep(max(0.0, interval_s - took))
        t0 = time.monotonic()
        await asyncio.gather(*(client(i) for i in range(clients)))
        wall = time.monotonic() - t0
    latencies.sort()
    return {"requests": len(latencies), "rps": round(len(latencies) / wall, 1),
            "p50_ms": round(latencies[len(latencies) // 2], 2),
            "p99_ms": round(latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))], 2),
            "max_ms": round(latencies[-1], 2), "errors": errors}


def submit_to_first_episode(http: httpx.Client) -> float:
    """One job; ms from just before the POST to its rollout.started (Redis's clock)."""
    t0_ms = time.time() * 1000
    r = http.post("/v1/jobs", json={"tasks": {"ids": ["ram-create-user-0"]},
                                    "sampling": {"max_steps": 1}})
    r.raise_for_status()
    job = r.json()["id"]
    started = None
    deadline = time.monotonic() + 120
    cursor = "0"
    while time.monotonic() < deadline:
        with http.stream("GET", f"/v1/jobs/{job}/events", params={"after": cursor}) as s:
            event_id = kind = None
            for line in s.iter_lines():
                if line.startswith("id: "):
                    event_id = line[4:]
                elif line.startswith("event: "):
                    kind = line[7:]
                elif line == "" and event_id:
                    cursor = event_id
                    if kind == "rollout.started" and started is None:
                        started = int(event_id.split("-")[0])
                    if kind == "job.completed":
                        assert started is not None
                        return started - t0_ms
    raise RuntimeError(f"job {job} did not complete within 120 s")


def run(args: argparse.Namespace) -> dict[str, Any]:
    with cloud_and_redis("bench-api-", ["--lookup-qps", "0", "--transition", "0.3",
                                        "--network-ready", "0.1"]) as (cloud, redis):
        tmp = Path(tempfile.mkdtemp(prefix="bench-api-"))
        overrides = [
            f"cloud.endpoint={cloud.endpoint}", f"env.worker.console_url=http://{cloud.endpoint}",
            f"stream.url={redis.url}", f"api.tokens_file={tmp / 'tokens.json'}",
            f"api.port={free_port()}", f"api.workers={args.workers}",
            f"api.hosting={args.hosting}", "agent.max_new_tokens=12",
            "trail.qps=20", "trail.settle_s=20", "trail.poll_s=0.25", "trail.clock_skew_s=5"]
        if args.model:
            overrides.append(f"policy.model={args.model}")
        config = load_config(JobConfig, ROOT / "configs" / "serve.yaml", overrides)
        token = TokenBook(Path(config.api.tokens_file)).create(
            "bench", ["jobs:write", "jobs:read"], TeamQuota(queued_jobs=1000))
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
        stack = Stack(config)
        try:
            _log(f"starting the stack ({args.hosting})")
            stack.start_scheduler()
            url = stack.start_http()
            with httpx.Client(base_url=url, timeout=60,
                              headers={"Authorization": f"Bearer {token}"}) as http:
                wait_http(f"{url}/readyz", 300)
                submits = []
                for i in range(args.submits):
                    submits.append(round(submit_to_first_episode(http), 1))
                    _log(f"submit {i + 1}/{args.submits}: {submits[-1]} ms to the first "
                         "episode")
                job = http.get("/v1/jobs", params={"limit": 1}).json()["data"][0]["id"]
            _log(f"{args.clients} clients, {args.seconds} s of GET /v1/jobs/{{id}}")
            figures = asyncio.run(load(f"{url}/v1/jobs/{job}", token, args.clients,
                                       args.seconds, args.interval_ms / 1000))
        finally:
            stack.stop()
            ray.shutdown()
    return {"hosting": args.hosting, "clients": args.clients, "seconds": args.seconds,
            "interval_ms": args.interval_ms, **figures,
            "submit_to_first_episode_ms": statistics.median(submits),
            "submit_to_first_episode_runs_ms": submits, "env_workers": args.workers}


# ---- --active-jobs: submission cost with many active jobs of other teams ----------------------

PREFIX = "bench:api"


async def seed(redis_url: str, n: int, teams: int) -> None:
    """``n`` active jobs (3 in 4 queued, the rest running) of ``teams`` teams, through the
    store as the API makes them."""
    store = JobStore(redis_url, PREFIX)
    rng = random.Random(0)
    semaphore = asyncio.Semaphore(64)

    async def one(i: int) -> None:
        async with semaphore:
            now = time.time()
            job = Job(id=await store.new_job_id(), team=f"team{i % teams:03d}",
                      state="queued", created_at=now, model="live", samples_per_task=3,
                      sampling=Sampling(), priority=5,
                      task_ids=[f"ram-create-user-{rng.randrange(3)}"])
            await store.create_job(job, {"tasks": [{"id": t} for t in job.task_ids]})
            if i % 4 == 3:
                await store.update_job(job.id, lambda j: j.model_copy(update={
                    "state": "running", "started_at": now}))
    await asyncio.gather(*(one(i) for i in range(n)))
    await store.close()


def _serve(redis_url: str, tokens_file: str, port: int) -> None:
    """The HTTP side alone (a process of its own)."""
    import uvicorn  # noqa: PLC0415 - the child's only

    from consolerl.tasks import TASKS_DIR, load_suite  # noqa: PLC0415
    from jobsapi.app import build_app  # noqa: PLC0415
    app = build_app(JobStore(redis_url, PREFIX), TokenBook(Path(tokens_file)),
                    {t.id: t for t in load_suite(TASKS_DIR)}, scheduler_required=False)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False,
                loop="uvloop", http="httptools")


def _quantiles(ms: list[float]) -> tuple[float, float]:
    ms = sorted(ms)
    return (round(ms[len(ms) // 2], 2),
            round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 2))


def run_active(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="bench-submit-"))
    redis = RedisServer(tmp / "redis").start()
    server = None
    try:
        t0 = time.monotonic()
        asyncio.run(seed(redis.url, args.active_jobs, args.other_teams))
        seed_s = round(time.monotonic() - t0, 1)
        _log(f"seeded {args.active_jobs} active jobs of {args.other_teams} teams in {seed_s} s")
        book = TokenBook(tmp / "tokens.json")
        token = book.create("bench", ["jobs:write", "jobs:read"],
                            TeamQuota(queued_jobs=args.submits + 10, samples_per_job=1000))
        port = free_port()
        server = multiprocessing.get_context("spawn").Process(
            target=_serve, args=(redis.url, str(book.path), port), daemon=True)
        server.start()
        errors = 0
        submit_ms: list[float] = []
        quota_ms: list[float] = []
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120,
                          headers={"Authorization": f"Bearer {token}"}) as http:
            wait_http(f"http://127.0.0.1:{port}/healthz", 60, poll_s=0.2)
            body = {"tasks": {"ids": ["ram-create-user-0"]}, "samples_per_task": 1}
            for _ in range(3):                     # warm up (imports, connections)
                http.get("/v1/quota")
            for i in range(args.submits):
                t = time.perf_counter()
                r = http.post("/v1/jobs", json=body)
                submit_ms.append((time.perf_counter() - t) * 1000)
                errors += r.status_code != 202
                if (i + 1) % 25 == 0:
                    _log(f"{i + 1}/{args.submits} submissions, p50 "
                         f"{_quantiles(submit_ms)[0]} ms")
            for _ in range(args.submits):
                t = time.perf_counter()
                r = http.get("/v1/quota")
                quota_ms.append((time.perf_counter() - t) * 1000)
                errors += r.status_code != 200
            used = http.get("/v1/quota").json()["used"]["queued_jobs"]
    finally:
        if server is not None:
            server.terminate()
            server.join(10)
        redis.stop()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    submit, quota = _quantiles(submit_ms), _quantiles(quota_ms)
    return {"mode": "active_jobs", "active_jobs": args.active_jobs,
            "other_teams": args.other_teams, "submits": args.submits,
            "submit_p50_ms": submit[0], "submit_p99_ms": submit[1],
            "quota_p50_ms": quota[0], "quota_p99_ms": quota[1], "errors": errors,
            "queued_after": used, "seed_s": seed_s, "commit": commit}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.jobs_api", description=__doc__
                                     .split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--hosting", choices=("actor", "serve"), default="actor")
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--interval-ms", type=float, default=100.0)
    parser.add_argument("--submits", type=int, default=None,
                        help="jobs submitted (default 3; 100 with --active-jobs)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--model", default="", help="the policy (default: configs/serve.yaml's)")
    parser.add_argument("--active-jobs", type=int, default=0,
                        help="measure submission with this many active jobs of other teams")
    parser.add_argument("--other-teams", type=int, default=50)
    args = parser.parse_args(argv)
    if args.submits is None:
        args.submits = 100 if args.active_jobs else 3
    if args.active_jobs:
        result = run_active(args)
        print(json.dumps(result) if args.json else json.dumps(result, indent=2))
        return 0 if result["errors"] == 0 else 1
    result = run(args)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0 if result["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
