"""Benchmark of the reward service: ``python -m benchmarks.reward --json``.

Starts a local cloud (fresh state dir, a generated accounts file of ``--episodes`` + 1
accounts, the real LookupEvents limit of 2 queries per second per account, no delivery delay)
and a :class:`~reward_service.service.RewardService` over it with the default
:class:`~reward_service.actiontrail.TrailConfig`, then:

1. Seeds ``--events`` audit events by real ACS3-signed API calls (``--seeders`` processes,
   GetUser with a CreateUser in ten): half spread over the episode accounts, half on one
   "noise" account, the episode accounts' first. Before the episodes begin it waits until that
   history is older than the verifier's query window (``clock_skew_s`` before an episode's
   start), as a leased account's previous episodes would be.
2. Runs one episode per account, as production does (each episode has its own leased
   account): 8 API calls just before the start (provisioning: noise inside the query window),
   then over HTTP, as a browser would, the console sign-in and the task's "Create User" form
   (``--task``, a ``ram_create_user`` task, its values from ``Task.values``). Every
   ``--failure-every``-th episode fails: half of those create a wrongly named user, half do
   nothing. After the last episode, once every ``ended_at + 2 s`` has passed, one API call per
   account (the environment's reset) is the later event that shows the log has caught up, so
   a failure is decided on the first LookupEvents and the benchmark measures scoring, not the
   verifier's watermark wait (with no delivery delay there is nothing else to wait for).
3. Scores every episode ``--rounds`` times in turn through ``RewardService.score`` in process:
   ``score_p50_ms`` / ``score_p95_ms`` over all of them, and per expected verdict. Rescores
   of one account are spaced at least ``1/qps`` apart (untimed): the client's rate limiter
   would otherwise hold them, a cost the one score of a fresh episode does not pay. Then all
   episodes at once on a pool of one thread per episode, ``--rounds`` times:
   ``scores_per_s`` (episodes / wall time, median pass; ``concurrent_score_p50_ms``: one
   score's time there). Then the same over HTTP (``build_app`` served by uvicorn on a free
   port, one httpx.AsyncClient request per episode at once):
   ``http_scores_per_s``, ``http_score_p50_ms``. Every verdict must be the expected one, or the
   benchmark fails.

``score_success_p50_ms`` / ``score_failure_p50_ms`` split the latency by verdict (a failure
checks its end state once, without the settle wait a success's check may get).

Prints one JSON object with ``--json``; progress goes to stderr. The target: p50 under
50 ms with 100,000 events stored and no delivery delay.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import queue as queue_module
import re
import secrets
import shutil
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import yaml

from benchmarks.cloud_api import LightClient
from consolerl.accounts import Account, load_accounts
from consolerl.errors import ConfigError
from consolerl.resources import fill
from consolerl.rewards import RewardResult
from consolerl.stats import percentile
from consolerl.tasks import TASKS_DIR, Task, load_suite
from infra.local_cloud import LocalCloud, free_port
from reward_service.actiontrail import TrailConfig
from reward_service.service import RewardService, ScoreRequest, build_app

LOOKUP_QPS = 2.0             # the cloud's LookupEvents limit per account (the real one)
PRE_EPISODE_CALLS = 8        # provisioning's API calls inside the episode's query window
SEED_USER = "seed-user"


def _progress(msg: str) -> None:
    print(f"[reward-bench] {msg}", file=sys.stderr, flush=True)


def write_accounts(path: Path, n: int) -> list[Account]:
    """``n`` fresh accounts (random ids and keys) in the local cloud's accounts format."""
    rows, ids = [], set()
    while len(ids) < n:
        ids.add(str(2_000_000_000_000_000 + secrets.randbelow(10 ** 15)))
    for i, account_id in enumerate(sorted(ids)):
        rows.append({"account_id": account_id, "login_name": f"bench{i:03d}",
                     "password": secrets.token_urlsafe(18),
                     "access_key_id": "LTAI5tBench" + secrets.token_hex(6),
                     "access_key_secret": secrets.token_urlsafe(24)})
    path.write_text("# benchmarks.reward: generated, local only\n"
                    + yaml.safe_dump(rows, sort_keys=False))
    return load_accounts(path)


# ---- seeding ---------------------------------------------------------------------------------
def _seed_calls(client: LightClient, count: int, tag: str, create_seed_user: bool) -> int:
    """``count`` audited calls; returns how many failed."""
    errors = 0
    for i in range(count):
        if create_seed_user and i == 0:
            status, _ = client.call("Ram", "CreateUser", {"UserName": SEED_USER})
        elif i % 10 == 0:
            status, _ = client.call("Ram", "CreateUser", {"UserName": f"{tag}-{i}"})
        else:
            status, _ = client.call("Ram", "GetUser", {"UserName": SEED_USER})
        errors += status != 200
    return errors


def _seeder(port: int, history: list[tuple[str, str, int]], noise: tuple[str, str, int],
            index: int, done: Any, out: mp.Queue) -> None:
    """Phase A: the history of this seeder's episode accounts (each starts by creating the
    seed user); phase B: its share of the noise account (whose seed user exists). Reports
    (errors, when phase A ended)."""
    errors = 0
    for slot, (key, secret, count) in enumerate(history):
        client = LightClient(port, key, secret)
        for start in range(0, count, 500):
            n = min(500, count - start)
            errors += _seed_calls(client, n, f"h{index}-{slot}-{start}", start == 0)
            with done.get_lock():
                done.value += n
        client.conn.close()
    history_end = time.time()
    key, secret, count = noise
    client = LightClient(port, key, secret)
    for start in range(0, count, 500):
        n = min(500, count - start)
        errors += _seed_calls(client, n, f"n{index}-{start}", False)
        with done.get_lock():
            done.value += n
    client.conn.close()
    out.put((errors, history_end))


def seed(port: int, episode_accounts: list[Account], noise: Account, events: int,
         seeders: int) -> float:
    """Seed exactly ``events`` audit events (half on the episode accounts, half on ``noise``);
    returns when the episode accounts' history ended (epoch seconds)."""
    history_total = events // 2
    per = [history_total // len(episode_accounts)] * len(episode_accounts)
    for i in range(history_total - sum(per)):
        per[i] += 1
    # The noise account's seed user first (one event), so every seeder can read it.
    if LightClient(port, noise.access_key_id, noise.access_key_secret).call(
            "Ram", "CreateUser", {"UserName": SEED_USER})[0] != 200:
        raise RuntimeError("seeding: CreateUser on the noise account failed")
    noise_total = events - history_total - 1
    noise_per = [noise_total // seeders + (w < noise_total % seeders) for w in range(seeders)]
    done = mp.Value("i", 1)
    queue: mp.Queue = mp.Queue()
    procs = [mp.Process(target=_seeder, args=(
        port, [(a.access_key_id, a.access_key_secret, per[i])
               for i, a in enumerate(episode_accounts) if i % seeders == w],
        (noise.access_key_id, noise.access_key_secret, noise_per[w]), w, done, queue))
        for w in range(seeders)]
    t0 = time.perf_counter()
    for p in procs:
        p.start()
    results: list[tuple[int, float]] = []
    while len(results) < len(procs):
        try:
            results.append(queue.get(timeout=2))
        except queue_module.Empty:
            if not any(p.is_alive() for p in procs):
                raise RuntimeError("seeding: the seeder processes died") from None
        rate = done.value / max(time.perf_counter() - t0, 1e-9)
        _progress(f"seeding audit events: {done.value}/{events} ({rate:.0f}/s)")
    for p in procs:
        p.join()
    errors = sum(r[0] for r in results)
    if errors:
        raise RuntimeError(f"seeding: {errors} calls failed")
    return max(r[1] for r in results)


# ---- episodes ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Episode:
    account: Account
    values: dict[str, str]
    expected: str               # success | failure
    started_at: float
    ended_at: float

    def request(self, task: Task) -> ScoreRequest:
        return ScoreRequest(task_id=task.id, account_id=self.account.account_id,
                            started_at=self.started_at, ended_at=self.ended_at,
                            values=self.values)


def _console_create_user(base_url: str, account: Account, user_name: str,
                         display_name: str) -> None:
    """Sign in and submit the RAM "Create User" form, as a browser would."""
    with httpx.Client(base_url=base_url, follow_redirects=False, timeout=30) as web:
        # The form's CSRF token: a cookie and the same value in a hidden field.
        csrf = re.search(r'name="_csrf" value="([^"]+)"', web.get("/console/signin").text)[1]
        r = web.post("/console/signin", data={"_csrf": csrf, "login_name": account.login_name,
                                              "password": account.password})
        if r.status_code != 303:
            raise RuntimeError(f"console sign-in as {account.login_name}: {r.status_code}")
        page = web.get("/console/ram/users/create").text
        form = {k: re.search(rf'name="{k}" value="([^"]+)"', page)[1]
                for k in ("_csrf", "_form_token")}
        r = web.post("/console/ram/users/create",
                     data={**form, "UserName": user_name, "DisplayName": display_name})
        if r.status_code != 303 or not r.headers["location"].endswith(f"/{user_name}"):
            raise RuntimeError(f"console Create User {user_name}: {r.status_code} "
                               f"{r.headers.get('location')}")


def make_episode(cloud: LocalCloud, task: Task, account: Account, index: int,
                 outcome: str) -> Episode:
    """A scripted episode's audit trail made with signed API and console calls (no browser, no
    provisioning: the benchmark measures scoring). ``outcome``: success, typo (a wrongly named
    user: failure) or idle (nothing: failure)."""
    values = task.values(f"b{index:03d}{secrets.token_hex(2)}", {})
    args = {k: fill(v, values) for k, v in task.oracle_args}
    api = LightClient(cloud.port, account.access_key_id, account.access_key_secret)
    for _ in range(PRE_EPISODE_CALLS):
        if api.call("Ram", "GetUser", {"UserName": SEED_USER})[0] != 200:
            raise RuntimeError("pre-episode GetUser failed")
    api.conn.close()
    started = time.time()
    if outcome != "idle":
        name = args["user_name"] + ("-typo" if outcome == "typo" else "")
        _console_create_user(cloud.url, account, name, args.get("display_name", ""))
    return Episode(account, values, "success" if outcome == "success" else "failure", started,
                   time.time())


def outcome_of(index: int, failure_every: int) -> str:
    """Every ``failure_every``-th episode fails, alternately typo and idle."""
    if not failure_every or index % failure_every != failure_every - 1:
        return "success"
    return "typo" if (index // failure_every) % 2 == 0 else "idle"


# ---- scoring ----------------------------------------------------------------------------------
def check(episode: Episode, verdict: str, decided_by: str, where: str) -> None:
    if (verdict, decided_by) != (episode.expected, "rule"):
        raise RuntimeError(f"{where}: episode of account {episode.account.account_id} scored "
                           f"{verdict} (decided by {decided_by}), expected {episode.expected} "
                           f"decided by rule")


def timed(fn: Callable[[], RewardResult]) -> tuple[RewardResult, float]:
    t = time.perf_counter()
    result = fn()
    return result, (time.perf_counter() - t) * 1000


def _ms(values: list[float], q: float) -> float:
    return round(percentile(values, q), 2) if values else float("nan")


async def _http_pass(url: str, task: Task, episodes: list[Episode]) -> tuple[float, list[float]]:
    limits = httpx.Limits(max_connections=len(episodes), max_keepalive_connections=len(episodes))
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=600) as http:
        async def one(episode: Episode) -> float:
            t = time.perf_counter()
            r = await http.post("/v1/score", json=episode.request(task).model_dump())
            elapsed = (time.perf_counter() - t) * 1000
            if r.status_code != 200:
                raise RuntimeError(f"POST /v1/score: {r.status_code} {r.text[:300]}")
            body = r.json()
            check(episode, body["verdict"], body["decided_by"], "http")
            return elapsed
        t0 = time.perf_counter()
        latencies = await asyncio.gather(*(one(e) for e in episodes))
        return time.perf_counter() - t0, list(latencies)


def serve(app: Any) -> tuple[Any, threading.Thread, str]:
    import uvicorn
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           access_log=False))
    thread = threading.Thread(target=server.run, name="reward-http", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the reward service's HTTP server did not start")
        time.sleep(0.05)
    return server, thread, f"http://127.0.0.1:{port}"


def run(events: int = 100_000, episodes: int = 64, rounds: int = 3, failure_every: int = 8,
        seeders: int = 4, task_id: str = "ram-create-user-0",
        trail_config: TrailConfig | None = None) -> dict[str, Any]:
    t_start = time.perf_counter()
    trail_config = trail_config or TrailConfig()
    tasks = {t.id: t for t in load_suite(TASKS_DIR)}
    task = tasks.get(task_id)
    if task is None or task.oracle_family != "ram_create_user":
        raise ConfigError(f"--task: must name a ram_create_user task of {TASKS_DIR}, "
                          f"got {task_id!r}")
    state = Path(tempfile.mkdtemp(prefix="reward-bench-"))
    cloud = LocalCloud(state, ("--accounts", str(state / "accounts.yaml"),
                               "--lookup-qps", str(LOOKUP_QPS), "--delivery-delay", "0"))
    server = thread = None
    try:
        accounts = write_accounts(state / "accounts.yaml", episodes + 1)
        episode_accounts, noise = accounts[:episodes], accounts[episodes]
        cloud.start()
        _progress(f"local cloud on {cloud.url}: {len(accounts)} accounts, LookupEvents "
                  f"limited to {LOOKUP_QPS:g}/s per account")
        history_end = seed(cloud.port, episode_accounts, noise, events, seeders)
        db = sqlite3.connect(state / "cloud.db")
        stored = db.execute("SELECT COUNT(*) FROM events").fetchone()[0]
        db.close()
        if stored != events:
            raise RuntimeError(f"seeding: the store holds {stored} events, expected {events}")
        quiet = history_end + trail_config.clock_skew_s + 1 - time.time()
        if quiet > 0:
            _progress(f"waiting {quiet:.0f} s until the seeded history is older than the "
                      f"query window ({trail_config.clock_skew_s:g} s before an episode)")
            time.sleep(quiet)

        _progress(f"{episodes} episodes of {task.id} through the console")
        eps = [make_episode(cloud, task, a, i, outcome_of(i, failure_every))
               for i, a in enumerate(episode_accounts)]
        time.sleep(max(0.0, max(e.ended_at for e in eps) + 2.05 - time.time()))
        for a in episode_accounts:          # the environment's reset: a later event
            reset = LightClient(cloud.port, a.access_key_id, a.access_key_secret)
            if reset.call("Ram", "GetUser", {"UserName": SEED_USER})[0] != 200:
                raise RuntimeError("post-episode GetUser failed")
            reset.conn.close()

        service = RewardService(list(tasks.values()), accounts, cloud.endpoint, trail_config)
        _progress(f"sequential: {rounds} rounds of {episodes} scores")
        gap = 1.0 / trail_config.qps + 0.05
        last: dict[str, float] = {}
        by_verdict: dict[str, list[float]] = {"success": [], "failure": []}
        for r in range(rounds):
            for e in eps:
                # A rescore of one account within 1/qps would wait for the rate limiter,
                # which scoring a fresh episode does not: space them (untimed).
                time.sleep(max(0.0, last.get(e.account.account_id, 0.0) + gap - time.monotonic()))
                result, ms = timed(lambda: service.score(e.request(task)))
                last[e.account.account_id] = time.monotonic()
                check(e, result.verdict, result.decided_by, f"sequential round {r + 1}")
                by_verdict[e.expected].append(ms)
        latencies = by_verdict["success"] + by_verdict["failure"]

        _progress(f"concurrent: {rounds} passes of {episodes} scores at once")
        walls, concurrent_ms = [], []
        with ThreadPoolExecutor(max_workers=episodes) as pool:
            for _ in range(rounds):
                time.sleep(gap)
                t0 = time.perf_counter()
                futures = [(e, pool.submit(timed, partial(service.score, e.request(task))))
                           for e in eps]
                for e, f in futures:
                    result, ms = f.result()
                    check(e, result.verdict, result.decided_by, "concurrent")
                    concurrent_ms.append(ms)
                walls.append(time.perf_counter() - t0)

        _progress(f"HTTP: {episodes} POST /v1/score at once")
        server, thread, url = serve(build_app(service, max_concurrent_scores=episodes))
        time.sleep(gap)
        http_wall, http_ms = asyncio.run(_http_pass(url, task, eps))

        db = sqlite3.connect(state / "cloud.db")
        stored_end = db.execute("SELECT COUNT(*) FROM events").fetchone()[0]
        db.close()
        sample = service.registry.get_sample_value
        return {
            "score_p50_ms": _ms(latencies, 0.5),
            "score_p95_ms": _ms(latencies, 0.95),
            "score_success_p50_ms": _ms(by_verdict["success"], 0.5),
            "score_failure_p50_ms": _ms(by_verdict["failure"], 0.5),
            "scores_per_s": round(episodes / statistics.median(walls), 2),
            "concurrent_score_p50_ms": _ms(concurrent_ms, 0.5),
            "http_scores_per_s": round(episodes / http_wall, 2),
            "http_score_p50_ms": _ms(http_ms, 0.5),
            "http_score_p95_ms": _ms(http_ms, 0.95),
            "scores": len(latencies) + episodes * len(walls) + len(http_ms),
            "verdicts": {"success": sum(e.expected == "success" for e in eps),
                         "failure": sum(e.expected == "failure" for e in eps)},
            "verdicts_ok": True,
            "events_stored": stored,
            "events_stored_end": stored_end,
            "episodes": episodes,
            "accounts": len(accounts),
            "rounds": rounds,
            "task": task.id,
            "lookup_qps": LOOKUP_QPS,
            "delivery_delay_s": 0.0,
            "clock_skew_s": trail_config.clock_skew_s,
            "trail_queries": int(sample("consolerl_reward_trail_queries_total",
                                        {"outcome": "ok"}) or 0),
            "trail_throttled_retries": int(sample(
                "consolerl_reward_trail_throttled_retries_total") or 0),
            "wall_s": round(time.perf_counter() - t_start, 1),
        }
    finally:
        if server is not None:
            server.should_exit = True
            thread.join(10)
        cloud.stop()
        shutil.rmtree(state, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.reward",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--events", type=int, default=100_000,
                        help="audit events to seed (default: 100000)")
    parser.add_argument("--episodes", type=int, default=64,
                        help="episodes, one account each, scored at once (default: 64)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="times each episode is scored per phase (default: 3)")
    parser.add_argument("--failure-every", type=int, default=8, metavar="N",
                        help="every N-th episode fails (0: none; default: 8)")
    parser.add_argument("--seeders", type=int, default=4, help="seeding processes (default: 4)")
    parser.add_argument("--task", default="ram-create-user-0",
                        help="a ram_create_user task id (default: ram-create-user-0)")
    parser.add_argument("--clock-skew", type=float, default=TrailConfig().clock_skew_s,
                        metavar="SECONDS", help="TrailConfig.clock_skew_s (default: "
                        "%(default)g, the service's default)")
    args = parser.parse_args(argv)
    for name in ("events", "episodes", "rounds", "seeders"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if args.events < 2 * (args.episodes + 1):
        parser.error(f"--events must be at least 2 per account ({2 * (args.episodes + 1)}), "
                     f"got {args.events}")
    if args.failure_every < 0:
        parser.error(f"--failure-every must be 0 or more, got {args.failure_every}")
    result = run(args.events, args.episodes, args.rounds, args.failure_every, args.seeders,
                 args.task, TrailConfig(clock_skew_s=args.clock_skew))
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
