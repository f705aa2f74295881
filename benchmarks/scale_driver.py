"""One N of the scale benchmark (:func:`run_n`): the real orchestrator, episode runner, agent
loop, lease pool and experience stream run in this process and in Ray actors against the
simulated parts (:mod:`benchmarks.scale_sim`) for a warm-up and a measured window, and the
window's figures come back as one dict (the keys :mod:`benchmarks.scale` prints).
"""
from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import threading
import time
from collections import defaultdict
from typing import Any

import psutil
import ray

from benchmarks.scale_measure import (TimedExecutor, TimedTokenizer, cpu_by_thread, loop_lag,
                                      per_second, redis_info, synthetic_accounts, thread_cpu)
from benchmarks.scale_model import ACTION, TASKS, TRAIL_QPS, Latency
from benchmarks.scale_sim import (LeaseProbe, SimCloud, SimEnvHost, SimPolicyFleet, SimScorer,
                                  SimTrainer, WorkerProxy)
from consolerl.experience import Group
from consolerl.stats import percentile
from consolerl.tasks import TASKS_DIR, load_suite
from env_workers.pool import EnvPoolConfig
from rollout_service.agent import AgentConfig, AgentLoop
from rollout_service.experience import ExperienceStream, StreamConfig
from rollout_service.models import HFChatTokenizer
from rollout_service.orchestrator import Orchestrator, OrchestratorConfig
from rollout_service.policy import PolicyRouter


# The CPU priority of what has cores of its own on a cluster (Redis, one env worker process
# probing the lease pool) but shares this machine's with the simulated fleet.
PRIORITY_NICE = -10
# What each env worker process is given of a core.
ENV_CPUS_PER_WORKER = EnvPoolConfig.num_cpus_per_worker


def progress(msg: str) -> None:
    print(f"[scale] {msg}", file=sys.stderr, flush=True)



async def run_n(n: int, args: argparse.Namespace, latency: Latency, redis_url: str,
                tokenizer: HFChatTokenizer, pages: list[str]) -> dict[str, Any]:
    import redis as redis_lib
    executor = TimedExecutor(n + 4)           # OrchestratorConfig.io_threads' default
    rng = random.Random(args.seed + n)
    # A tenth more accounts than workers (and one for each lease probe): the probes then time
    # the pool's own cost, not a wait for an account every worker holds.
    accounts = synthetic_accounts(n + n // 10 + 2)
    prefix = f"scale:{n}"
    client = redis_lib.Redis.from_url(redis_url, decode_responses=True)
    for key in client.scan_iter(f"{prefix}:*"):
        client.delete(key)
    stream_name = f"{prefix}:experience"
    tally: dict[str, float] = defaultdict(float)
    lookups: dict[str, list[float]] = defaultdict(list)
    clouds = {a.account_id: SimCloud(a.account_id, latency, random.Random(rng.random()),
                                     lookups, tally) for a in accounts}
    group_size = args.group_size
    # One episode per worker a step by default: the batch the fleet fills in about one
    # episode's time, which max_staleness then covers (orchestrator.admission_short).
    groups_per_step = args.groups_per_step or max(1, n // group_size)
    host = ray.remote(SimEnvHost).options(num_cpus=0, max_concurrency=max(1000, 4 * n)).remote(
        n, accounts, redis_url, f"{prefix}:pool", latency, pages, args.seed + n)
    trainer = ray.remote(SimTrainer).options(num_cpus=0, max_concurrency=8).remote(
        redis_url, stream_name, groups_per_step, args.train_seconds)
    trainer_run = trainer.run.remote()
    # Two probes: one ahead of the simulated fleet for the CPU (a worker process on its own
    # node: what the pool itself costs), one at the fleet's priority (this machine's 2 cores
    # shared by everything: what it costs here).
    probe = ray.remote(LeaseProbe).options(num_cpus=0).remote(
        accounts, redis_url, f"{prefix}:pool", nice=PRIORITY_NICE)
    probe_shared = ray.remote(LeaseProbe).options(num_cpus=0).remote(
        accounts, redis_url, f"{prefix}:pool", holder="lease-probe-shared")
    timed_tok = TimedTokenizer(tokenizer)
    fleet = ray.remote(SimPolicyFleet).options(num_cpus=0, max_concurrency=max(1000, 4 * n)
                                               ).remote(latency, list(tokenizer.tokenizer.encode(
                                                   ACTION)), args.seed + n + 1)
    agent = AgentLoop(PolicyRouter([fleet]), timed_tok, AgentConfig(
        max_steps=max(latency.turns) + 1, system_prompt="compact", history_turns=2,
        max_new_tokens=32, max_prompt_tokens=1024, max_observation_chars=1500))
    stream = ExperienceStream(StreamConfig(url=redis_url, stream=stream_name, max_len=100_000))
    pushes: list[tuple[float, float]] = []
    real_push = stream.push

    def push(group: Group) -> str:
        t0 = time.perf_counter()
        try:
            return real_push(group)
        finally:
            pushes.append((time.monotonic(), time.perf_counter() - t0))
    stream.push = push                                           # type: ignore[method-assign]
    await host.stats.remote(0.0)                                 # the host is up
    tasks = load_suite(TASKS_DIR)
    orch = Orchestrator(
        OrchestratorConfig(group_size=group_size, mode="async", max_staleness=args.max_staleness,
                           groups_per_step=groups_per_step, drop_uniform_groups=False,
                           task_filter=TASKS, acquire_timeout_s=120, seed=args.seed,
                           turn_loop=args.turn_loop),
        tasks, [WorkerProxy(host, f"w{i}") for i in range(n)], accounts, "sim.cloud", agent,
        SimScorer(clouds, latency, random.Random(rng.random()), tally), stream,
        client_factory=lambda a: clouds[a.account_id], executor=executor)

    async def versions() -> None:                   # the policy serves the newest weights
        while True:
            await fleet.set_version.remote(await asyncio.to_thread(stream.trainer_version))
            await asyncio.sleep(0.5)
    lag: list[tuple[float, float]] = []
    side = [asyncio.create_task(loop_lag(lag)), asyncio.create_task(versions())]
    run = asyncio.create_task(orch.run(None))
    proc = psutil.Process()
    progress(f"N={n}: warming up {args.warmup:g} s ({n} workers lease, sign in, start)")
    await asyncio.sleep(args.warmup)
    t0 = time.monotonic()
    cpu0 = sum(proc.cpu_times()[:2])
    loop0 = time.thread_time()                 # this thread: the event loop's CPU
    threads0 = thread_cpu()
    host0 = await host.stats.remote(t0)
    fleet0 = await fleet.stats.remote()
    redis0 = redis_info(client)
    steps0, eps0, busy0 = host0["steps"], len(orch.episodes), executor.busy_s
    tok0, tokc0 = timed_tok.seconds, timed_tok.calls
    for k in range(int(args.window // 10)):
        await asyncio.sleep(10)
        progress(f"N={n}: {10 * (k + 1)}/{args.window:g} s of the window, "
                  f"{len(orch.episodes) - eps0} episodes")
    await asyncio.sleep(args.window % 10)
    wall = time.monotonic() - t0
    cpu = sum(proc.cpu_times()[:2]) - cpu0
    loop_busy = (time.thread_time() - loop0) / (time.monotonic() - t0)
    threads1 = thread_cpu()
    host1 = await host.stats.remote(t0)
    fleet1 = await fleet.stats.remote()
    trainer1 = await trainer.stats.remote(t0)
    probed = await probe.results.remote(t0)
    probed_shared = await probe_shared.results.remote(t0)
    ray.kill(probe)
    ray.kill(probe_shared)
    redis1 = redis_info(client)
    episodes = [e for e in orch.episodes[eps0:]]
    steps = host1["steps"] - steps0
    orch.stop()
    for t in side:
        t.cancel()
    try:
        await asyncio.wait_for(run, timeout=120)
    except asyncio.TimeoutError:
        run.cancel()
    await trainer.halt.remote()
    await asyncio.wait_for(trainer_run, timeout=30)
    await asyncio.wait_for(host.drain.remote(), timeout=120)
    ray.kill(host)
    ray.kill(trainer)
    ray.kill(fleet)

    # the figures
    sdk_per_ep = tally["sdk_calls"] / max(1, len(orch.episodes))
    lookups_per_ep = sum(len(v) for v in lookups.values()) / max(1, len(orch.episodes))
    ideal_ep_s = latency.mean_episode_s(sdk_per_ep, lookups_per_ep)
    ideal = n / ideal_ep_s
    achieved = len(episodes) / wall
    window_lookups = [t for ts in lookups.values() for t in ts if t >= t0]
    per_account_peak = max((max(per_second(ts, t0)) for ts in lookups.values() if ts),
                           default=0)
    acquires = host1["acquires"]
    waits = [w for t, w in executor.waits if t >= t0]
    lags = [x for t, x in lag if t >= t0]
    push_s = [s for t, s in pushes if t >= t0]
    threads = executor._max_workers
    host_cpu = host1["cpu_s"] - host0["cpu_s"]
    util = {
        "orchestrator_cpu": cpu / wall,
        # The N env workers' control-plane CPU (leases, heartbeats, and with the turns on
        # the workers their prompts and policy calls; the browser is simulated), as a share
        # of what they are given: one process each, num_cpus_per_worker of a core.
        "env_worker_cpu": host_cpu / wall / n / ENV_CPUS_PER_WORKER,
        "redis_cpu": (redis1["cpu_s"] - redis0["cpu_s"]) / wall,
        "orchestrator_thread_pool": (executor.busy_s - busy0) / wall / threads,
        # The event loop's thread (one core at most, the GIL's holder): the rollout actor's
        # ceiling; orchestrator_cpu adds its threads (blocking calls).
        "orchestrator_loop": loop_busy,
        # Sustained LookupEvents per account against the budget (a 2/s bucket lets 3 land
        # in one calendar second: the peak is reported, not used for this).
        "actiontrail_per_account": len(window_lookups) / wall / n / TRAIL_QPS,
    }
    # Commands in the window (the server counts since it started), per episode.
    cmds = {k: {"calls": v["calls"] - redis0["commands"].get(k, {}).get("calls", 0),
                "usec_per_call": v["usec_per_call"]}
            for k, v in redis1["commands"].items()}
    cmds = {k: v for k, v in sorted(cmds.items(), key=lambda kv: -kv[1]["calls"])
            if v["calls"] > 0}
    tok_calls = timed_tok.calls - tokc0
    out = {
        "workers": n, "accounts": len(accounts), "window_s": round(wall, 1),
        "turn_loop": orch.turn_loop_used,
        "episodes": len(episodes), "steps": steps,
        "episodes_per_s": round(achieved, 3), "steps_per_s": round(steps / wall, 2),
        "ideal_episodes_per_s": round(ideal, 3),
        "ideal_steps_per_s": round(ideal * statistics.fmean(latency.turns), 2),
        "model_episode_s": round(ideal_ep_s, 2),
        "throughput_vs_ideal": round(achieved / ideal, 4),
        "env_errors": sum(1 for e in episodes if e.env_error is not None),
        "orchestrator_ms_per_step": round(1000 * cpu / max(1, steps), 3),
        "orchestrator_ms_per_step_by_thread": cpu_by_thread(
            threads0, threads1, threading.get_native_id(), executor.native_ids, steps),
        # The tokenizer's share of it (None: the prompts were built on the env workers).
        "tokenize_ms_per_step": round(1000 * (timed_tok.seconds - tok0) / tok_calls, 3)
        if tok_calls else None,
        # Where the turns ran, the env workers' CPU per step (all N of them, this machine's
        # one packed host process) and the simulated fleet's (Ray calls only).
        "env_workers_ms_per_step": round(1000 * host_cpu / max(1, steps), 3),
        "policy_calls_per_s": round((fleet1["calls"] - fleet0["calls"]) / wall, 1),
        "policy_fleet_ms_per_call": round(1000 * (fleet1["cpu_s"] - fleet0["cpu_s"])
                                          / max(1, fleet1["calls"] - fleet0["calls"]), 3),
        # One worker process's view (the probe), and the packed host's (its queueing too).
        "lease_acquire_p50_ms": round(1000 * percentile(probed, 0.5), 2) if probed else None,
        "lease_acquire_p99_ms": round(1000 * percentile(probed, 0.99), 2) if probed else None,
        "lease_probes": len(probed),
        "lease_acquire_shared_cpu_p50_ms": round(1000 * percentile(probed_shared, 0.5), 2)
        if probed_shared else None,
        "lease_acquire_shared_cpu_p99_ms": round(1000 * percentile(probed_shared, 0.99), 2)
        if probed_shared else None,
        "lease_acquire_in_host_p50_ms": round(1000 * percentile(acquires, 0.5), 2)
        if acquires else None,
        "lease_acquire_in_host_p99_ms": round(1000 * percentile(acquires, 0.99), 2)
        if acquires else None,
        "lease_acquires": len(acquires),
        "cold_start_acquire_p99_ms": round(1000 * percentile(host1["cold_acquires"], 0.99), 1)
        if host1["cold_acquires"] else None,
        "stream_xadd_per_s": round(len(push_s) / wall, 2),
        "stream_xadd_p50_ms": round(1000 * percentile(push_s, 0.5), 2) if push_s else None,
        "stream_xreadgroup_per_s": round(trainer1["reads"] / wall, 2),
        "stream_xreadgroup_p50_ms": round(trainer1["read_p50_ms"], 2),
        "trainer_steps": trainer1["steps"], "groups_per_step": groups_per_step,
        "max_staleness": args.max_staleness,
        "admission_short": orch.admission_short(),
        "stream_dead_letters": trainer1["dead_letters"],
        "actiontrail_qps_total": round(len(window_lookups) / wall, 2),
        "actiontrail_qps_per_account_mean": round(len(window_lookups) / wall / n, 4),
        "actiontrail_qps_per_account_peak": per_account_peak,
        "actiontrail_budget_per_account": TRAIL_QPS,
        "redis_used_memory_mb": round(redis1["used_memory"] / 2**20, 1),
        "redis_cpu": round(util["redis_cpu"], 3),
        "redis_commands_per_s": round(sum(v["calls"] for v in cmds.values()) / wall, 1),
        "redis_commands_per_episode": {k: round(v["calls"] / max(1, len(episodes)), 2)
                                       for k, v in cmds.items()},
        "redis_usec_per_call": {k: v["usec_per_call"] for k, v in cmds.items()},
        "event_loop_lag_p99_ms": round(1000 * percentile(lags, 0.99), 1) if lags else None,
        "thread_pool_wait_p99_ms": round(1000 * percentile(waits, 0.99), 1) if waits else None,
        "utilization": {k: round(v, 3) for k, v in util.items()},
    }
    out["first_saturated"] = max(util, key=lambda k: util[k])
    return out

