"""Run the task suite: ``python -m benchmarks.suite --policy oracle --json``.

Starts a local cloud (free port, temporary state) and a Redis for the account leases, then for
each task runs one episode through the episode runner (:mod:`rollout_service.episode`: lease,
provision, act, score, destroy, verify) with the oracle in the system Chromium, one env worker.
Prints one JSON object: ``total``, ``solved`` (solvable tasks whose success rule passed),
``infeasible_reported`` (wrong-documentation tasks the oracle reported), ``per_product``
success rates, ``provision_p50_s`` / ``provision_p95_s`` (cold provisioning of the tasks that
have prerequisites, inside their episodes), ``warm_provision_p50_s`` / ``_p95_s`` (the wait for
the same prerequisites from a filled warm pool: ``WarmPool.take``, K sets per task, refilled in
the background), ``env_errors``, ``leaked_resources`` (must be 0, episodes and warm sets) and
the failures with their reasons. Progress goes to stderr.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from pathlib import Path

from benchmarks.services import cloud_and_redis
from consolerl.accounts import load_accounts
from consolerl.stats import percentile
from consolerl.tasks import TASKS_DIR, Task, load_suite
from env_workers.accounts import PoolConfig, load_pool_accounts
from env_workers.pool import LeasedEnvWorker
from env_workers.worker import WorkerConfig
from infra.cloud import CloudClient, CloudConfig, Credentials
from infra.console_sim.config import DEFAULT_ACCOUNTS_FILE
from infra.provisioning.sdk import SdkProvisioner
from infra.provisioning.warm_pool import WarmPool
from reward_service.service import RewardService
from rollout_service.episode import EpisodeOutcome, EpisodeRunner, scripted_policy
from datagen.oracle import run_oracle

MAX_STEPS = 40


def _progress(msg: str) -> None:
    print(f"[suite] {msg}", file=sys.stderr, flush=True)


def _pct(values: list[float], q: float) -> float | None:
    return round(percentile(values, q), 4) if values else None


async def run_tasks(tasks: list[Task], url: str, endpoint: str, redis_url: str
                    ) -> list[EpisodeOutcome]:
    pool = PoolConfig(redis_url=redis_url, key_prefix="suite:pool")
    accounts = load_pool_accounts(pool)
    runner = EpisodeRunner(accounts, endpoint, RewardService(tasks, accounts, endpoint).score,
                           ready_timeout_s=60)
    env = LeasedEnvWorker(WorkerConfig(console_url=url), pool, "suite-0")
    policy = scripted_policy(run_oracle)
    outcomes = []
    try:
        for i, task in enumerate(tasks, 1):
            outcome = await runner.run(env, task, policy, max_steps=MAX_STEPS)
            outcomes.append(outcome)
            _progress(f"{i}/{len(tasks)} {task.id}: {outcome.status}"
                      + (f" ({'; '.join(outcome.reasons)[:200]})" if outcome.reasons else ""))
    finally:
        await env.drain()
    return outcomes


def measure_warm(tasks: list[Task], endpoint: str, k: int = 1, account_index: int = 0,
                 fill_timeout_s: float = 300.0) -> tuple[list[float], int]:
    """How long an episode waits for its prerequisites with a filled warm pool: the wall
    time of ``WarmPool.take`` per task (each set is destroyed right after). Returns the
    times and how many resources those sets leaked (must be 0)."""
    account = load_accounts(DEFAULT_ACCOUNTS_FILE)[account_index]

    def client() -> CloudClient:
        return CloudClient(CloudConfig(endpoint=endpoint),
                           Credentials(account.access_key_id, account.access_key_secret))
    provisioner = SdkProvisioner(client, ready_timeout_s=60, poll_s=0.05)
    templates = {t.id: list(t.prerequisites) for t in tasks if t.prerequisites}
    pool = WarmPool(provisioner, templates, k=k)
    times: list[float] = []
    taken: list[str] = []
    pool.start()
    try:
        deadline = time.monotonic() + fill_timeout_s
        while any(pool.ready_count(t) < k for t in templates) and time.monotonic() < deadline:
            time.sleep(0.2)
        _progress(f"warm pool filled ({sum(pool.ready_count(t) for t in templates)} sets)")
        for template in templates:
            started = time.perf_counter()
            result = pool.take(template)
            times.append(time.perf_counter() - started)
            taken.append(result.episode_id)
            provisioner.destroy(result.episode_id)
    finally:
        unused = pool.stop(destroy_unused=True)
    leaked = sum(len(provisioner.leftovers(e)) for e in taken + list(unused))
    return times, leaked


def summarize(tasks: list[Task], outcomes: list[EpisodeOutcome]) -> dict:
    by_id = {t.id: t for t in tasks}
    per_product: dict[str, list[int]] = {}
    for o in outcomes:
        ok = o.status in ("solved", "infeasible_reported")
        per_product.setdefault(by_id[o.task_id].product, []).append(int(ok))
    provision = [o.provision_s for o in outcomes if by_id[o.task_id].prerequisites
                 and o.status != "env_error"]
    return {
        "total": len(outcomes),
        "solved": sum(o.status == "solved" for o in outcomes),
        "solvable": sum(by_id[o.task_id].expected == "success" for o in outcomes),
        "infeasible_reported": sum(o.status == "infeasible_reported" for o in outcomes),
        "infeasible_tasks": sum(by_id[o.task_id].expected == "infeasible" for o in outcomes),
        "env_errors": sum(o.status == "env_error" for o in outcomes),
        "per_product": {p: round(sum(v) / len(v), 3) for p, v in sorted(per_product.items())},
        "provision_p50_s": _pct(provision, 0.5), "provision_p95_s": _pct(provision, 0.95),
        "leaked_resources": sum(len(o.leaked) for o in outcomes),
        "broken_prerequisites": sum(len(o.broken_prerequisites) for o in outcomes),
        "failures": {o.task_id: o.reasons[:3] for o in outcomes
                     if o.status not in ("solved", "infeasible_reported")},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.suite",
                                     description="Run the task suite with a policy.")
    parser.add_argument("--policy", choices=("oracle",), default="oracle")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--tasks", default="", help="regular expression over task ids")
    parser.add_argument("--suite", type=Path, default=TASKS_DIR)
    parser.add_argument("--warm-pool", type=int, default=1, metavar="K",
                        help="prerequisite sets kept ready per task for the warm measurement "
                             "(0: skip it)")
    args = parser.parse_args(argv)
    tasks = [t for t in load_suite(args.suite) if re.search(args.tasks, t.id)]
    if not tasks:
        parser.error(f"no task id matches {args.tasks!r}")
    with cloud_and_redis("suite-", ("--lookup-qps", "0", "--transition", "1",
                                    "--network-ready", "0.3")) as (cloud, redis_server):
        _progress(f"{len(tasks)} tasks against {cloud.url}")
        outcomes = asyncio.run(run_tasks(tasks, cloud.url, cloud.endpoint, redis_server.url))
        warm, warm_leaked = ([], 0) if args.warm_pool == 0 else measure_warm(
            tasks, cloud.endpoint, k=args.warm_pool)
    summary = summarize(tasks, outcomes)
    summary["warm_provision_p50_s"] = _pct(warm, 0.5)
    summary["warm_provision_p95_s"] = _pct(warm, 0.95)
    summary["leaked_resources"] += warm_leaked
    print(json.dumps(summary) if args.json else json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
