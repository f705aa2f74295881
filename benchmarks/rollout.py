"""Benchmark of the rollout side, async against sync on the same workload:
``python -m benchmarks.rollout --json``.

Starts a local cloud, a Redis server, ``--workers`` env workers (Chromium, leased accounts), the
CPU policy (``--backend``: vLLM on CPU where ``.venv-vllm`` exists, else transformers; the
default SmolLM2-135M-Instruct unless ``--model``), the reward
service, and a stand-in trainer that consumes groups from the experience stream, ``--groups-
per-step`` per step, spends ``--train-seconds`` per step (the time an optimizer step would take;
the real trainer is trainer.grpo) and then advances the trainer version the staleness control reads.

Each mode runs until ``--groups`` groups of ``--group-size`` episodes are trained:

- ``async``: workers run episodes back to back, groups flow as they complete, admission within
  ``--max-staleness`` versions;
- ``sync``: a batch of ``--groups-per-step`` groups, the barrier, training, the next batch.

The policy is warmed up before the first mode, and ``--rounds`` > 1 repeats the pair in
alternating order (async first, then sync first, ...) and sums the rounds, so neither mode
gains from going second.

Prints one JSON object: ``episodes_per_min``, ``env_utilization`` (the fraction of the rollout
time, from the start until the last episode ends, that a worker is inside an episode, lease to
release; ``env_utilization_of_wall`` divides by the whole wall time instead, which adds the
trainer's last step), ``policy_utilization`` (the fraction of wall
time the policy engine is generating) for both modes, and ``sync_over_async_wall_time``.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from typing import Any

from benchmarks.services import cloud_and_redis
from consolerl.accounts import load_accounts
from consolerl.errors import ConfigError
from consolerl.tasks import TASKS_DIR, load_suite
from env_workers.accounts import PoolConfig
from env_workers.pool import LeasedEnvWorker
from env_workers.worker import WorkerConfig
from infra.console_sim.config import DEFAULT_ACCOUNTS_FILE
from infra.local_cloud import LocalCloud
from reward_service.actiontrail import TrailConfig
from reward_service.service import RewardService
from rollout_service.agent import AgentConfig, AgentLoop, SamplingParams
from rollout_service.experience import ExperienceStream, StreamConfig
from rollout_service.models import HFChatTokenizer, resolve_model
from rollout_service.orchestrator import Orchestrator, OrchestratorConfig
from rollout_service.policy import Engine, PolicyConfig, PolicyRouter, PolicyServer, make_engine


def _progress(msg: str) -> None:
    print(f"[rollout-bench] {msg}", file=sys.stderr, flush=True)


async def _trainer(stream: ExperienceStream, groups_per_step: int, train_s: float,
                   target: int, trained: list[int]) -> None:
    """Consume groups (XREAD from the start), one step per ``groups_per_step``."""
    last = "0-0"
    buffered = 0
    while trained[0] < target:
        entries = await asyncio.to_thread(stream.redis.xread, {stream.config.stream: last},
                                          count=100, block=200)
        for _, items in entries or []:
            for entry_id, _ in items:
                last = entry_id
                buffered += 1
        while buffered >= groups_per_step and trained[0] < target:
            buffered -= groups_per_step
            await asyncio.sleep(train_s)
            trained[0] += groups_per_step
            stream.set_trainer_version(stream.trainer_version() + 1)


async def run_mode(mode: str, args: argparse.Namespace, cloud: LocalCloud, redis_url: str,
                   engine: Engine, tokenizer: HFChatTokenizer) -> dict[str, Any]:
    accounts = load_accounts(DEFAULT_ACCOUNTS_FILE)
    tasks = load_suite(TASKS_DIR)
    stream = ExperienceStream(StreamConfig(url=redis_url, stream=f"bench:{mode}:exp"))
    stream.redis.delete(stream.config.stream, stream.version_key)
    pool = PoolConfig(redis_url=redis_url, key_prefix=f"bench:{mode}", lease_ttl_s=30)
    workers = [LeasedEnvWorker(WorkerConfig(console_url=cloud.url), pool, f"w{i}")
               for i in range(args.workers)]
    server = PolicyServer(PolicyConfig(), engine=engine)
    agent = AgentLoop(PolicyRouter([server]), tokenizer,
                      AgentConfig(max_steps=args.max_steps, max_new_tokens=args.max_new_tokens,
                                  max_prompt_tokens=3072, max_observation_chars=3000))
    reward = RewardService(tasks, accounts, cloud.endpoint,
                           TrailConfig(qps=20, settle_s=15, poll_s=0.25, clock_skew_s=5))
    orch = Orchestrator(OrchestratorConfig(group_size=args.group_size, mode=mode,
                                           max_staleness=args.max_staleness,
                                           groups_per_step=args.groups_per_step,
                                           drop_uniform_groups=False,
                                           task_filter=args.tasks, seed=1),
                        tasks, workers, accounts, cloud.endpoint, agent, reward.score, stream)
    trained = [0]
    busy0 = engine.busy_s
    t0 = time.monotonic()
    trainer = asyncio.create_task(_trainer(stream, args.groups_per_step, args.train_seconds,
                                           args.groups, trained))
    try:
        summary = await orch.run(max_groups=args.groups)
        rollout_s = time.monotonic() - t0
        await trainer
    finally:
        trainer.cancel()
        for w in workers:
            await w.drain()
    wall = time.monotonic() - t0
    episodes = summary["episodes"]
    busy = sum(orch.busy_s.values())
    return {
        "wall_s": round(wall, 1),
        "episodes": episodes,
        "episodes_per_min": round(episodes / wall * 60, 2),
        "env_utilization": round(busy / (rollout_s * args.workers), 4),
        "env_utilization_of_wall": round(busy / (wall * args.workers), 4),
        "policy_utilization": round((engine.busy_s - busy0) / wall, 4),
        "rollout_s": round(rollout_s, 1), "env_busy_s": round(busy, 1), "policy_busy_s": round(engine.busy_s - busy0, 1),
        "groups_pushed": summary["groups_pushed"], "env_errors": summary["env_errors"],
        "leaked_resources": summary["leaked_resources"],
    }


def _backend(choice: str) -> str:
    if choice != "auto":
        return choice
    from rollout_service.vllm_engine import vllm_python
    try:
        vllm_python()
    except ConfigError:
        return "transformers"
    return "vllm"


def _warm_up(engine: Engine, tokenizer: HFChatTokenizer) -> None:
    """First calls pay for allocation and kernel selection; keep them out of both modes."""
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "warm up " * 200}])
    for seed in range(2):
        engine.generate(prompt, SamplingParams(16, 1.0, seed=seed))


def _combine(runs: list[dict[str, Any]], workers: int) -> dict[str, Any]:
    """Sum the rounds of one mode: utilisations are busy time over total wall time."""
    wall = sum(r["wall_s"] for r in runs)
    episodes = sum(r["episodes"] for r in runs)
    return {
        "wall_s": round(wall, 1), "episodes": episodes,
        "episodes_per_min": round(episodes / wall * 60, 2),
        "env_utilization": round(sum(r["env_busy_s"] for r in runs)
                                 / (sum(r["rollout_s"] for r in runs) * workers), 4),
        "env_utilization_of_wall": round(sum(r["env_busy_s"] for r in runs) / (wall * workers),
                                         4),
        "policy_utilization": round(sum(r["policy_busy_s"] for r in runs) / wall, 4),
        "groups_pushed": sum(r["groups_pushed"] for r in runs),
        "env_errors": sum(r["env_errors"] for r in runs),
        "leaked_resources": sum(r["leaked_resources"] for r in runs),
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.rollout")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--model", default="", help="model folder (default: SmolLM2-135M)")
    parser.add_argument("--backend", choices=("auto", "vllm", "transformers"), default="auto",
                        help="auto: vLLM where it is installed, else transformers")
    parser.add_argument("--rounds", type=int, default=1,
                        help="pairs of runs, the order alternating")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--groups", type=int, default=8, help="groups trained per mode")
    parser.add_argument("--group-size", type=int, default=2)
    parser.add_argument("--groups-per-step", type=int, default=1)
    parser.add_argument("--max-staleness", type=int, default=2)
    parser.add_argument("--train-seconds", type=float, default=30.0,
                        help="stand-in optimizer step: the CPU step (top 6 layers, "
                             "generation paused) took 53.9 s for 24 turns, ~27 s for a group "
                             "of 2 episodes of ~6 turns (python -m benchmarks.train_step)")
    parser.add_argument("--max-steps", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--tasks", default="^ram-create-user|^ram-grant-policy|^ecs-add-rule",
                        help="regular expression over train task ids")
    args = parser.parse_args(argv)
    if min(args.groups, args.workers, args.group_size, args.rounds) < 1:
        parser.error("--groups, --workers, --group-size and --rounds must be at least 1")
    # SIGTERM runs the finally below (the cloud, Redis and vLLM are child processes).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    engine = None
    with cloud_and_redis("rollout-bench-", ("--lookup-qps", "0", "--transition", "0.5",
                                             "--network-ready", "0.2")) as (cloud, redis):
        try:
            path = resolve_model(args.model)
            backend = _backend(args.backend)
            _progress(f"policy {path} ({backend}); {args.workers} workers; {args.groups} groups "
                      f"of {args.group_size} per mode; {args.rounds} round(s)")
            engine = make_engine(PolicyConfig(model=str(path), backend=backend, kv_cache_gib=1.0,
                                              max_model_len=4096))
            tokenizer = HFChatTokenizer(path)
            _warm_up(engine, tokenizer)
            rounds: dict[str, list[dict[str, Any]]] = {"async": [], "sync": []}
            for r in range(args.rounds):
                for mode in (("async", "sync") if r % 2 == 0 else ("sync", "async")):
                    _progress(f"round {r + 1}: {mode} mode")
                    result = asyncio.run(run_mode(mode, args, cloud, redis.url, engine, tokenizer))
                    rounds[mode].append(result)
                    _progress(f"{mode}: {result}")
        finally:
            close = getattr(engine, "close", None)
            if close is not None:
                close()
    results = {mode: _combine(runs, args.workers) for mode, runs in rounds.items()}
    a, s = results["async"], results["sync"]
    out = {
        "episodes_per_min": {"async": a["episodes_per_min"], "sync": s["episodes_per_min"]},
        "env_utilization": {"async": a["env_utilization"], "sync": s["env_utilization"]},
        "policy_utilization": {"async": a["policy_utilization"],
                               "sync": s["policy_utilization"]},
        "sync_over_async_wall_time": round(s["wall_s"] / a["wall_s"], 3),
        "async": a, "sync": s,
        "workers": args.workers, "groups": args.groups, "group_size": args.group_size,
        "groups_per_step": args.groups_per_step, "max_staleness": args.max_staleness,
        "train_seconds": args.train_seconds, "model": args.model or "SmolLM2-135M-Instruct",
        "backend": backend, "rounds": args.rounds,
    }
    print(json.dumps(out) if args.json else json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
