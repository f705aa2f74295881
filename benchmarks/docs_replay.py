"""The replay of drafted procedures in a browser, for ``python -m benchmarks.docs --run``.

Each drafted task that carries a replay plan (:mod:`doccheck.replay`) runs once through the
one episode runner (:class:`rollout_service.episode.EpisodeRunner`): a leased account of the
local cloud, its prerequisites provisioned, the replay's actions sent to a real Chromium env
worker, the episode judged by the reward service from the audit log, everything destroyed
after. The outcome becomes a rollout as the jobs API keeps it (:func:`jobsapi.scheduler.
completed_fields`: verdict, claim, deciding events) and goes to the same verdict the API
reports (:func:`doccheck.verdict.procedure_verdict`, ``executor="replay"``).
"""
from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Sequence
from typing import Any

from consolerl.tasks import Task, parse_task
from jobsapi.scheduler import SchedulerConfig, completed_fields
from jobsapi.schema import Rollout
from datagen.oracle import ORACLE_MAX_STEPS, run_oracle
from env_workers.accounts import PoolConfig, local_cloud_accounts
from env_workers.pool import LeasedEnvWorker
from env_workers.worker import WorkerConfig
from reward_service.actiontrail import TrailConfig
from reward_service.service import RewardService
from rollout_service.episode import EpisodeRunner, scripted_policy


MAX_ATTEMPTS = SchedulerConfig().max_attempts


def _run_of(task_id: str, outcome: Any, seconds: float) -> Rollout:
    """The replay episode as the jobs API keeps a rollout (the verdict reads it)."""
    run = Rollout(id=f"replay-{task_id}", job_id="replay", task_id=task_id, sample=0,
                  model="replay", env_seconds=round(seconds, 1))
    if outcome.env_error is not None:
        run.state = "failed"
        run.reasons = [str(outcome.env_error.message)[:300], *outcome.reasons[:3]]
        return run
    run.state = "completed"
    for name, value in completed_fields(outcome).items():
        setattr(run, name, value)
    return run


async def _replay_all(tasks: Sequence[Task], cloud: Any, redis_url: str, workers: int,
                      progress: Any) -> dict[str, Rollout]:
    accounts = local_cloud_accounts()
    scorer = RewardService(list(tasks), accounts, cloud.endpoint,
                           trail_config=TrailConfig(qps=20.0, settle_s=5.0, poll_s=0.25)).score
    runner = EpisodeRunner(accounts, cloud.endpoint, scorer)
    pool = PoolConfig(redis_url=redis_url, key_prefix="consolerl:docs-replay:pool")
    queue: asyncio.Queue[Task] = asyncio.Queue()
    for t in tasks:
        queue.put_nowait(t)
    out: dict[str, Rollout] = {}

    async def worker(n: int) -> None:
        env = LeasedEnvWorker(WorkerConfig(console_url=cloud.url), pool, f"replay-{n}")
        try:
            while not queue.empty():
                task = queue.get_nowait()
                started = time.monotonic()
                # Infrastructure errors (a provisioning call the local cloud reset) are tried
                # again, as the jobs API does (SchedulerConfig.max_attempts); the replay's own
                # failures are not.
                for attempt in range(1, MAX_ATTEMPTS + 1):
                    outcome = await runner.run(env, task, scripted_policy(run_oracle),
                                               max_steps=ORACLE_MAX_STEPS,
                                               trajectory_id=f"replay-{task.id}-{attempt}",
                                               seed=0)
                    if outcome.env_error is None:
                        break
                    progress(f"{task.id}: attempt {attempt} met an infrastructure error: "
                             f"{str(outcome.env_error.message)[:120]}")
                run = _run_of(task.id, outcome, time.monotonic() - started)
                out[task.id] = run
                progress(f"replayed {len(out)}/{len(tasks)} {task.id}: {run.state} "
                         f"{run.verdict} {run.env_seconds:.0f} s"
                         + (f" ({run.end_detail[:120]})" if run.end_detail else "")
                         + (f" (claim {run.claim.kind} {run.claim.verdict})" if run.claim
                            else ""))
        finally:
            await env.drain()
    await asyncio.gather(*(worker(n) for n in range(max(1, workers))))
    return out


def replay_tasks(drafts: Sequence[dict[str, Any]], cloud: Any, redis_url: str,
                 workers: int = 2, progress: Any = None) -> dict[str, Rollout]:
    """task id -> its replay run, for every drafted task (data) that carries a replay plan."""
    say = progress or (lambda m: print(f"[replay] {m}", file=sys.stderr, flush=True))
    tasks = [parse_task(d, f"drafted task {d['id']}") for d in drafts
             if (d.get("oracle") or {}).get("family") == "replay"]
    return asyncio.run(_replay_all(tasks, cloud, redis_url, workers, say))


__all__ = ["replay_tasks"]
