"""The soak run: ``python -m benchmarks.soak --json --minutes N``.

Starts what ``make serve`` starts (a local cloud, Redis, embedded Ray, the scheduler actor with
``--workers`` env workers and the HTTP side) with Redis capped by ``maxmemory`` (no eviction:
at the cap it refuses writes, as production's would) and retention shortened to seconds so that
it cycles within the run; a stand-in for a training run holds ``--training-leases`` accounts of
the shared pool (leased and renewed as a training job's workers do) and the training beacon for
the whole run. Then ``--teams`` teams each submit one job every ``--submit-every-s`` seconds
(``model: oracle``, one catalogue task with an oracle family, one sample, screenshots on),
follow it to the end (status polls, the events page, the report, a screenshot), and read their
quota; every request is timed.

Prints one JSON object:

- ``jobs`` (submitted), ``jobs_completed``, ``episodes``, ``errors`` (requests answered with
  anything but the expected status, jobs that failed or did not finish, episodes with an
  environment error; must be 0), ``error_samples``;
- ``api_p50_ms`` / ``api_p99_ms`` over the first and the last window (10 minutes, or a third
  of a shorter run), all requests of all teams;
- ``redis_used_mb``: first / peak / last (``INFO memory``), with ``redis_maxmemory_mb``;
- ``rss_mb``: the scheduler actor's and the HTTP actor's resident size, first / last;
- ``api_gc``: the HTTP side's timed full collections (``consolerl_api_gc_pause_seconds``):
  how many and their mean pause;
- ``leases_leaked``: leases still held once the stack and the stand-in have stopped (must
  be 0); ``resources_leaked``: what the episodes provisioned and the cloud still holds, by
  the provisioner's own inventory of every episode of the run (must be 0).

Progress goes to stderr every ``--progress-s`` seconds.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import psutil
import ray
import redis
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.services import cloud_and_redis, wait_http
from cluster.config import JobConfig
from cluster.serve import TEAM_SCOPES, Stack
from consolerl.accounts import load_accounts
from consolerl.config import load_config
from consolerl.stats import percentile
from consolerl.tasks import TASKS_DIR, load_suite
from infra.cloud import CloudClient, CloudConfig, Credentials
from infra.console_sim.config import DEFAULT_ACCOUNTS_FILE
from infra.local_cloud import free_port
from infra.provisioning.sdk import SdkProvisioner
from jobsapi.auth import TeamQuota, TokenBook
from datagen.oracle import why_no_oracle

ROOT = Path(__file__).resolve().parents[1]


def _log(msg: str) -> None:
    print(f"[benchmarks.soak] {msg}", file=sys.stderr, flush=True)


@dataclass
class Tally:
    """Every request's (time since start, latency ms), and what went wrong."""

    started: float = field(default_factory=time.monotonic)
    requests: list[tuple[float, float]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    jobs: int = 0
    jobs_completed: int = 0
    episodes: int = 0
    job_ids: list[str] = field(default_factory=list)

    async def call(self, http: httpx.AsyncClient, method: str, url: str, expect: int = 200,
                   **kw: Any) -> httpx.Response | None:
        t0 = time.perf_counter()
        try:
            answer = await http.request(method, url, **kw)
        except httpx.HTTPError as exc:
            self.errors.append(f"{method} {url}: {type(exc).__name__}: {exc}"[:300])
            return None
        self.requests.append((time.monotonic() - self.started,
                              (time.perf_counter() - t0) * 1000))
        if answer.status_code != expect:
            self.errors.append(f"{method} {url}: {answer.status_code} "
                               f"{answer.text[:200]}")
            return None
        return answer

    def window(self, first: bool, seconds: float) -> dict[str, float | int]:
        if not self.requests:
            return {"requests": 0}
        end = max(t for t, _ in self.requests)
        times = [ms for t, ms in self.requests
                 if (t <= seconds if first else t >= end - seconds)]
        return {"requests": len(times), "p50_ms": round(percentile(times, 0.50), 1),
                "p99_ms": round(percentile(times, 0.99), 1)}


async def team_load(url: str, token: str, tasks: list[str], tally: Tally, until: float,
                    every_s: float, seed: int) -> None:
    """One team: a job every ``every_s`` (offset by the team's seed), each followed to its
    end by its own coroutine."""
    rng = random.Random(seed)
    following: list[asyncio.Task] = []
    async with httpx.AsyncClient(base_url=url, timeout=60,
                                 headers={"Authorization": f"Bearer {token}"}) as http:
        await asyncio.sleep(rng.uniform(0, every_s))
        while time.monotonic() < until:
            body = {"tasks": {"ids": [rng.choice(tasks)]}, "model": "oracle",
                    "samples_per_task": 1}
            answer = await tally.call(http, "POST", "/v1/jobs", expect=202, json=body)
            if answer is not None:
                tally.jobs += 1
                job = answer.json()["id"]
                tally.job_ids.append(job)
                following.append(asyncio.ensure_future(follow(http, job, tally)))
            await tally.call(http, "GET", "/v1/quota")
            await asyncio.sleep(every_s)
        if following:
            await asyncio.gather(*following)


async def follow(http: httpx.AsyncClient, job: str, tally: Tally, limit_s: float = 600
                 ) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        await asyncio.sleep(2.0)
        answer = await tally.call(http, "GET", f"/v1/jobs/{job}")
        if answer is None:
            return
        state = answer.json()["state"]
        if state in ("queued", "running"):
            continue
        if state != "completed":
            tally.errors.append(f"job {job} ended {state}: {answer.json().get('error')}")
            return
        tally.jobs_completed += 1
        # The whole event stream of a finished job (it ends after job.completed).
        await tally.call(http, "GET", f"/v1/jobs/{job}/events")
        await tally.call(http, "GET", f"/v1/jobs/{job}/report")
        results = await tally.call(http, "GET", f"/v1/jobs/{job}/results")
        if results is None:
            return
        for summary in results.json()["data"]:
            tally.episodes += 1
            if summary["state"] != "completed" or summary["verdict"] != "success":
                tally.errors.append(f"rollout {summary['id']} of {job} ended "
                                    f"{summary['state']} / {summary['verdict']}: "
                                    f"{summary.get('end_reason')}")
            rollout = await tally.call(http, "GET", f"/v1/jobs/{job}/rollouts/{summary['id']}")
            shots = [s["screenshot"] for s in (rollout.json()["steps"] if rollout else [])
                     if s.get("screenshot")]
            if shots:
                await tally.call(http, "GET", f"/v1/artifacts/{shots[-1]}")
        return
    tally.errors.append(f"job {job} did not finish within {limit_s:.0f} s")


class TrainingStandIn:
    """What a training run does to the shared pool, without the model: ``leases`` accounts
    leased and renewed by a heartbeat thread, and the training beacon on, until ``stop``."""

    def __init__(self, config: JobConfig, leases: int) -> None:
        from env_workers.leases import AccountPool           # noqa: PLC0415
        from jobsapi.store import TrainingBeacon  # noqa: PLC0415

        self.pool = AccountPool.from_config(replace(
            config.env.pool, redis_url=config.stream.url,
            accounts_file=config.cloud.accounts_path))
        self.beacon = TrainingBeacon(config.stream.url, config.api.prefix)
        self.held = [self.pool.acquire("soak-training", timeout_s=30) for _ in range(leases)]
        self.beacon.start()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        while not self._stop.wait(5.0):
            self.held = [self.pool.renew(lease) for lease in self.held]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)
        for lease in self.held:
            self.pool.release(lease)
        self.beacon.stop()
        self.pool.close()


def _rss_mb(title: str) -> float | None:
    """Resident size of the Ray worker process whose title is ``ray::<title>...``."""
    for proc in psutil.process_iter(["cmdline"]):
        try:
            cmd = " ".join(proc.info["cmdline"] or [])
        except psutil.Error:
            continue
        if cmd.startswith(f"ray::{title}"):
            return round(proc.memory_info().rss / 2 ** 20, 1)
    return None


def run(args: argparse.Namespace) -> dict[str, Any]:
    with cloud_and_redis("bench-soak-", ["--lookup-qps", "0", "--transition", "0.3",
                                         "--network-ready", "0.1"]) as (cloud, redis_server):
        tmp = Path(tempfile.mkdtemp(prefix="bench-soak-"))
        r = redis.Redis.from_url(redis_server.url)
        r.config_set("maxmemory", f"{args.redis_maxmemory_mb}mb")
        r.config_set("maxmemory-policy", "noeviction")
        overrides = [
            f"cloud.endpoint={cloud.endpoint}", f"env.worker.console_url=http://{cloud.endpoint}",
            f"stream.url={redis_server.url}", f"api.tokens_file={tmp / 'tokens.json'}",
            f"api.port={free_port()}", f"api.workers={args.workers}",
            "trail.qps=20", "trail.settle_s=20", "trail.poll_s=0.25", "trail.clock_skew_s=5",
            *retention_overrides(args, tmp)]
        config = load_config(JobConfig, ROOT / "configs" / "serve.yaml", overrides)
        book = TokenBook(Path(config.api.tokens_file))
        tokens = [book.create(f"team-{i}", TEAM_SCOPES,
                              TeamQuota(queued_jobs=100, concurrent_episodes=args.workers))
                  for i in range(args.teams)]
        tasks = sorted(t.id for t in load_suite(TASKS_DIR) if t.expected == "success"
                       and t.split == "train" and t.difficulty <= 2 and not why_no_oracle(t))
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
        stack = Stack(config)
        samples: list[dict[str, Any]] = []
        tally = Tally()
        stand_in: TrainingStandIn | None = None
        try:
            _log(f"starting the stack: {args.workers} env workers, Redis capped at "
                 f"{args.redis_maxmemory_mb} MB, results kept {args.results_ttl_s} s, "
                 f"screenshots {args.screenshots_ttl_s} s")
            stack.start_scheduler()
            url = stack.start_http()
            wait_http(f"{url}/readyz", 300)
            before = cloud_inventory(cloud.endpoint)
            stand_in = TrainingStandIn(config, args.training_leases) \
                if args.training_leases else None
            tally.started = time.monotonic()
            until = tally.started + args.minutes * 60
            stop = threading.Event()
            sampler = threading.Thread(target=_sample, args=(r, samples, stop, tally,
                                                             args.progress_s), daemon=True)
            sampler.start()

            async def load_all() -> None:
                await asyncio.gather(*(team_load(url, token, tasks, tally, until,
                                                 args.submit_every_s, seed=i)
                                       for i, token in enumerate(tokens)))
            asyncio.run(load_all())
            stop.set()
            sampler.join(timeout=30)
            api_gc = gc_pauses(httpx.get(f"{url}/metrics", timeout=30).text)
        finally:
            if stand_in is not None:
                stand_in.stop()
            stack.stop()
            ray.shutdown()
        leases = len(list(r.scan_iter(f"{config.env.pool.key_prefix}:lease:*")))
        leaked = sorted(cloud_inventory(cloud.endpoint) - before)
    window = min(600.0, args.minutes * 60 / 3)
    used = [s["redis_used_mb"] for s in samples]
    first, last = tally.window(True, window), tally.window(False, window)
    return {
        "minutes": args.minutes, "teams": args.teams, "workers": args.workers,
        "jobs": tally.jobs, "jobs_completed": tally.jobs_completed,
        "episodes": tally.episodes, "errors": len(tally.errors),
        "error_samples": tally.errors[:10],
        "window_s": window, "api_first": first, "api_last": last,
        "api_p99_ms": {"first": first.get("p99_ms"), "last": last.get("p99_ms")},
        "redis_maxmemory_mb": args.redis_maxmemory_mb,
        "redis_used_mb": {"first": used[0] if used else None, "peak": max(used, default=None),
                          "last": used[-1] if used else None},
        "rss_mb": {name: {"first": next((s[name] for s in samples if s[name]), None),
                          "last": next((s[name] for s in reversed(samples) if s[name]), None)}
                   for name in ("scheduler", "http")},
        "api_gc": api_gc,
        "leases_leaked": leases, "resources_leaked": len(leaked),
        "resources_leaked_samples": leaked[:10],
        "samples": samples,
    }


def gc_pauses(metrics: str) -> dict[str, float]:
    """How many timed full collections the HTTP side ran, and their mean pause."""
    found = {sample.name: sample.value
             for family in text_string_to_metric_families(metrics)
             if family.name == "consolerl_api_gc_pause_seconds" for sample in family.samples}
    count = found.get("consolerl_api_gc_pause_seconds_count", 0.0)
    total = found.get("consolerl_api_gc_pause_seconds_sum", 0.0)
    return {"collections": int(count),
            "mean_pause_ms": round(1000 * total / count, 2) if count else None}


def retention_overrides(args: argparse.Namespace, tmp: Path) -> list[str]:
    """The retention and blob settings of the run (the API's config keys)."""
    return [f"api.blobs.dir={tmp / 'blobs'}",
            f"api.retention.results_s={args.results_ttl_s}",
            f"api.retention.screenshots_s={args.screenshots_ttl_s}",
            f"api.retention.sweep_every_s={min(30.0, args.screenshots_ttl_s / 3)}"]


def cloud_inventory(endpoint: str) -> set[str]:
    """Every resource of the kinds episodes provision, in every account of the local cloud
    (``"<account> <kind> <id>"``)."""
    found: set[str] = set()
    for account in load_accounts(DEFAULT_ACCOUNTS_FILE):
        def client(account=account) -> CloudClient:
            return CloudClient(CloudConfig(endpoint=endpoint),
                               Credentials(account.access_key_id, account.access_key_secret))
        found |= {f"{account.account_id} {item}"
                  for item in SdkProvisioner(client).inventory()}
    return found


def _sample(r: redis.Redis, samples: list[dict[str, Any]], stop: threading.Event,
            tally: Tally, progress_s: float) -> None:
    last_progress = 0.0
    while True:
        info = r.info("memory")
        samples.append({"t_s": round(time.monotonic() - tally.started, 1),
                        "redis_used_mb": round(info["used_memory"] / 2 ** 20, 2),
                        "scheduler": _rss_mb("JobsScheduler"), "http": _rss_mb("HttpServer")})
        if time.monotonic() - last_progress >= progress_s:
            last_progress = time.monotonic()
            s = samples[-1]
            _log(f"{s['t_s']:.0f} s: {tally.jobs} jobs, {tally.jobs_completed} done, "
                 f"{tally.episodes} episodes, {len(tally.errors)} errors, Redis "
                 f"{s['redis_used_mb']} MB, scheduler {s['scheduler']} MB, "
                 f"HTTP {s['http']} MB")
        if stop.wait(15.0):
            return


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--teams", type=int, default=4)
    parser.add_argument("--submit-every-s", type=float, default=30.0,
                        help="each team's interval between jobs")
    parser.add_argument("--workers", type=int, default=2, help="the API's env workers")
    parser.add_argument("--training-leases", type=int, default=1,
                        help="accounts the training stand-in holds (0: none)")
    parser.add_argument("--redis-maxmemory-mb", type=int, default=256)
    parser.add_argument("--results-ttl-s", type=float, default=180.0)
    parser.add_argument("--screenshots-ttl-s", type=float, default=90.0)
    parser.add_argument("--progress-s", type=float, default=60.0)
    args = parser.parse_args(argv)
    result = run(args)
    if not args.json:
        result.pop("samples")
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0 if result["errors"] == 0 and not result["leases_leaked"] \
        and not result["resources_leaked"] else 1


if __name__ == "__main__":
    sys.exit(main())
