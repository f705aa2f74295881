"""Benchmark of the env workers: ``python -m benchmarks.env_workers --json``.

Starts a local cloud and a redis-server (free ports, temporary state), then measures with the
system Chromium:

- ``step_p50_ms`` / ``step_p95_ms``: one step = parse the action, run it in the browser, wait
  for any navigation it started, take the observation (accessibility tree to text). The steps
  cycle through typing into a form field, a link to the user list and a link back to the form
  (``fill``, ``click``, ``click``): two in three navigate to another console page.
  ``step_p50_ms_same_page`` / ``step_p50_ms_navigating`` split the two kinds. ``step_p50_ms_screenshot``: the same with a
  JPEG screenshot in every observation.
- ``episodes_per_min``: complete episodes for 1, 2 and 4 concurrent workers (one asyncio loop,
  each worker its own Chromium): lease an account from Redis (heartbeat running), sign in,
  create a RAM user through the action space (3 steps), stop, close the context, release the
  lease. One worker per account lease, so at most as many workers as accounts.
- ``rss_mb_per_worker``: proportional set size (PSS) of the Chromium and Playwright-driver
  processes after the 4-worker run, divided by 4.

Prints one JSON object with ``--json``; progress goes to stderr.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

from consolerl.accounts import load_accounts
from consolerl.stats import percentile
from consolerl.types import EpisodeSpec
from env_workers.accounts import PoolConfig
from env_workers.driver import ScriptedDriver, expect_observation
from env_workers.pool import LeasedEnvWorker
from env_workers.worker import EnvWorker, WorkerConfig
from infra.console_sim.config import DEFAULT_ACCOUNTS_FILE
from infra.local_cloud import LocalCloud
from infra.redis_local import RedisServer


WARMUP_STEPS = 15   # a multiple of 3, so the timed steps keep the fill/click/click mix


def _progress(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def _pct(values: list[float], q: float) -> float:
    return round(percentile(values, q), 1)


async def _step_latency(url: str, screenshot: bool, samples: int
                        ) -> tuple[list[float], list[float], list[float]]:
    """(all steps, steps that stayed on the page, steps that loaded another page) in ms."""
    account = load_accounts(DEFAULT_ACCOUNTS_FILE)[0]
    worker = EnvWorker(WorkerConfig(console_url=url, screenshot=screenshot))
    times: list[float] = []
    same_page: list[float] = []
    navigating: list[float] = []
    try:
        d = ScriptedDriver(worker.step, expect_observation(await worker.reset(
            EpisodeSpec("/console/ram/users/create", max_steps=10_000), account)))
        for i in range(samples + WARMUP_STEPS):
            # fill on the form, then to the list, then back to the form, and again
            if i % 3 == 0:
                result = await d.fill("Logon Name", f"typed-{i}")
            elif i % 3 == 1:
                result = await d.click("link", "Users")
            else:
                result = await d.click("link", "Create User")
            if result.observation.last_action_error:
                raise RuntimeError(f"step failed: {result.observation.last_action_error}")
            if i >= WARMUP_STEPS:
                times.append(result.elapsed_ms)
                (same_page if i % 3 == 0 else navigating).append(result.elapsed_ms)
    finally:
        await worker.shutdown()
    return times, same_page, navigating


async def _episodes(url: str, redis_url: str, workers: int, per_worker: int, tag: str
                    ) -> tuple[float, int, float]:
    """(episodes per minute, episodes, PSS MB of the browsers at the end)."""
    pool_config = PoolConfig(redis_url=redis_url, key_prefix=f"bench:{tag}", lease_ttl_s=30)
    bodies = [LeasedEnvWorker(WorkerConfig(console_url=url), pool_config, f"bench-{tag}-{i}")
              for i in range(workers)]
    done = 0

    async def run(body: LeasedEnvWorker, index: int) -> None:
        nonlocal done
        for n in range(per_worker):
            start = await body.start_episode(EpisodeSpec("/console/ram/users"), 60)
            if start.env_error is not None:
                raise RuntimeError(f"episode start failed: {start.env_error}")
            d = ScriptedDriver(body.step, start.observation)
            await d.click("link", "Create User")
            await d.fill("Logon Name", f"{tag}-{index}-{n}")
            await d.click("button", "Create")
            if not d.observation.url.endswith(f"/{tag}-{index}-{n}"):
                raise RuntimeError(f"the flow did not create the user: {d.observation.url}")
            await d.act('stop("created")')
            if not await body.end_episode():
                raise RuntimeError("lease lost during an episode")
            done += 1

    # Browsers start before the clock: the rate is of episodes, not of Chromium launches.
    for body in bodies:
        await body.worker._ensure_browser()
    started = time.perf_counter()
    await asyncio.gather(*(run(b, i) for i, b in enumerate(bodies)))
    elapsed = time.perf_counter() - started
    pss = _browser_pss_mb()
    for body in bodies:
        await body.drain()
    return done / elapsed * 60, done, pss


def _browser_pss_mb() -> float:
    total = 0
    for child in psutil.Process().children(recursive=True):
        try:
            name = child.name().lower()
            if "chrom" in name or name in ("node", "playwright"):
                total += child.memory_full_info().pss
        except psutil.Error:
            continue
    return total / 2 ** 20


def run(samples: int, per_worker: int) -> dict:
    state = Path(tempfile.mkdtemp(prefix="env-bench-"))
    cloud = LocalCloud(state / "cloud", ("--lookup-qps", "0"))
    redis_server = RedisServer(state / "redis")
    try:
        redis_server.start()
        url = cloud.start().url
        _progress(f"step latency: {samples} steps, screenshots off")
        plain, same_page, navigating = asyncio.run(_step_latency(url, False, samples))
        _progress(f"step latency: {samples} steps, screenshots on")
        shots = asyncio.run(_step_latency(url, True, samples))[0]
        rates: dict[str, float] = {}
        counts: dict[str, int] = {}
        pss = 0.0
        for workers in (1, 2, 4):
            _progress(f"episodes: {workers} worker(s) x {per_worker}")
            rate, count, pss = asyncio.run(_episodes(url, redis_server.url, workers,
                                                     per_worker, f"w{workers}"))
            rates[str(workers)] = round(rate, 1)
            counts[str(workers)] = count
        return {
            "step_p50_ms": _pct(plain, 0.5), "step_p95_ms": _pct(plain, 0.95),
            "step_p50_ms_screenshot": _pct(shots, 0.5),
            "step_p95_ms_screenshot": _pct(shots, 0.95),
            "step_samples": len(plain),
            "step_p50_ms_same_page": _pct(same_page, 0.5),
            "step_p50_ms_navigating": _pct(navigating, 0.5),
            "episodes_per_min": rates, "episodes": counts,
            "rss_mb_per_worker": round(pss / 4, 1),
            "step_mean_ms": round(statistics.fmean(plain), 1),
        }
    finally:
        cloud.stop()
        redis_server.stop()
        shutil.rmtree(state, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.env_workers",
                                     description="Benchmark the browser env workers.")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--samples", type=int, default=60, help="steps per latency run")
    parser.add_argument("--episodes-per-worker", type=int, default=4)
    args = parser.parse_args(argv)
    if args.samples < 2 or args.episodes_per_worker < 1:
        parser.error("--samples must be >= 2 and --episodes-per-worker >= 1")
    result = run(args.samples, args.episodes_per_worker)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
