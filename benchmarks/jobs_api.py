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

Prints one JSON object.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import ray

from benchmarks.services import cloud_and_redis
from cluster.config import JobConfig
from cluster.serve import Stack
from consolerl.config import load_config
from infra.local_cloud import free_port
from rollout_service.jobs.auth import TeamQuota, TokenBook

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
                deadline = time.monotonic() + 300
                while http.get("/readyz").status_code != 200:
                    if time.monotonic() > deadline:
                        raise RuntimeError("the API never became ready")
                    time.sleep(0.5)
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.jobs_api", description=__doc__
                                     .split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--hosting", choices=("actor", "serve"), default="actor")
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--interval-ms", type=float, default=100.0)
    parser.add_argument("--submits", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--model", default="", help="the policy (default: configs/serve.yaml's)")
    args = parser.parse_args(argv)
    result = run(args)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0 if result["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
