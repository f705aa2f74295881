"""Scale benchmark of the control plane: ``python -m benchmarks.scale --workers 1000 --json``.

What cannot run here (a thousand browsers, a policy fleet, the real cloud) is simulated with
latencies measured on this machine; the control plane runs for real:

- the real :class:`~rollout_service.orchestrator.Orchestrator` (groups, async admission, the
  staleness bound, online filtering) and the real :class:`~rollout_service.episode.EpisodeRunner`
  (write-ahead record, provisioning and clean-up calls, the audit-log read, scoring), in this
  process, as they run in the job's rollout actor; the real
  :class:`~rollout_service.agent.AgentLoop` (prompts built and tokenized with the default
  model's tokenizer every turn, the policy called through the real router) where
  ``--turn-loop`` puts it: on the env workers (``act``, one call per episode from here; the job's
  choice from 1,000 workers up) or here (an env worker call and a policy call per turn);
- N real :class:`~env_workers.pool.LeasedEnvWorker` (account leases with heartbeats on the real
  :class:`~env_workers.leases.AccountPool`, N accounts, a real Redis) in one Ray actor, called
  over Ray as the orchestrator calls env worker actors; only their browser is simulated
  (:class:`~benchmarks.scale_sim.SimBrowser`: sign-in and step latencies, the episode's
  length);
- the real experience stream: groups are XADDed by the orchestrator and read with the real
  :class:`~trainer.stream.ExperienceConsumer` by a stand-in trainer (a Ray actor) that spends
  ``--train-seconds`` per step and then publishes the next trainer version, which is what the
  staleness control reads;
- simulated: the policy (a Ray actor called as the PolicyServers are; generation time per
  turn), the cloud's SDK answers and LookupEvents
  (per-call latency; an empty account), the reward service (its scoring time; one LookupEvents
  through the real per-account rate limiter of 2 queries/s).

The latencies are samples measured here by ``--calibrate`` (``benchmarks/data/
scale-latency.json``: the real local cloud, Chromium, vLLM on CPU and the reward service, the
oracle solving short tasks); each simulated call draws one.

Per N it reports: ``episodes_per_s`` and ``steps_per_s`` against ``ideal_episodes_per_s`` (N
workers each running episodes back to back at the model's mean episode time, no overhead);
``throughput_vs_ideal``; ``orchestrator_ms_per_step`` (CPU time of this process, which holds
what the job's rollout actor holds, per agent step, and by thread; ``tokenize_ms_per_step`` of
it when the turns run here); ``env_workers_ms_per_step`` (the env worker host's CPU);
``lease_acquire_p50_ms`` / ``lease_acquire_p99_ms`` in the steady window (and the cold start,
when all N workers ask at once); stream XADD and XREADGROUP rates and latencies with the
headroom measured by a burst; LookupEvents per second needed in all and per account against
the 2/s budget; Redis memory and CPU; the event loop's lag, the thread pool's queueing; and
``first_saturated``, the component closest to its limit.

The parts: :mod:`benchmarks.scale_model` (the workload and the latency model, shared with
:mod:`benchmarks.scale_calibrate`), :mod:`benchmarks.scale_sim` (the simulated parts),
:mod:`benchmarks.scale_measure` (the instruments), :mod:`benchmarks.scale_driver` (one N);
this module is the command line.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import ray

from benchmarks.scale_driver import PRIORITY_NICE, progress, run_n
from benchmarks.scale_measure import sample_group_fields, stream_headroom
from benchmarks.scale_model import LATENCY_FILE, Latency, page_texts
from infra.redis_local import RedisServer
from rollout_service.models import HFChatTokenizer, resolve_model



def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--workers", default="10,100,1000",
                        help="N, or several separated by commas")
    parser.add_argument("--warmup", type=float, default=0.0,
                        help="seconds before the window (default: 10 + N/40)")
    parser.add_argument("--window", type=float, default=0.0,
                        help="seconds measured (default: 60, 90 from N = 500)")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-staleness", type=int, default=2)
    parser.add_argument("--groups-per-step", type=int, default=0,
                        help="the trainer's batch in groups (default: N / group size, one "
                             "episode per worker a step)")
    parser.add_argument("--train-seconds", type=float, default=1.0,
                        help="the stand-in trainer's step (a GPU step; the trainer is not the "
                             "control plane, so it keeps up)")
    parser.add_argument("--turn-loop", default="auto", choices=("auto", "worker", "orchestrator"),
                        help="where episodes' turns run (orchestrator.turn_loop; auto: on the "
                             "env workers from 1,000 workers up, as in the job)")
    parser.add_argument("--latency", default=str(LATENCY_FILE))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--calibrate", action="store_true",
                        help="measure the latency model here and write --latency")
    args = parser.parse_args(argv)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # clean-up on kill
    if args.calibrate:
        from benchmarks.scale_calibrate import calibrate
        calibrate(Path(args.latency))
        return 0
    try:
        ns = [int(x) for x in args.workers.split(",")]
    except ValueError:
        parser.error(f"--workers: integers separated by commas, got {args.workers!r}")
    if any(n < 1 or n > 5000 for n in ns):
        parser.error("--workers: each N in 1..5000")
    if not Path(args.latency).exists():
        parser.error(f"--latency: {args.latency} not found (python -m benchmarks.scale "
                     "--calibrate measures it)")
    latency = Latency.load(Path(args.latency))
    tokenizer = HFChatTokenizer(resolve_model("default"))
    pages = page_texts()
    state = Path(tempfile.mkdtemp(prefix="consolerl-scale-"))
    redis = RedisServer(state / "redis", persistent=False).start()
    # Redis has a core of its own on a cluster; here it shares 2 with the simulated fleet.
    try:
        psutil.Process(redis.proc.pid).nice(PRIORITY_NICE)
    except psutil.AccessDenied:
        progress("cannot raise Redis's CPU priority here (not root): it shares the fleet's")
    results = []
    t_start = time.monotonic()
    try:
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
                 configure_logging=False)
        headroom = stream_headroom(redis.url, sample_group_fields(tokenizer, pages))
        progress(f"stream headroom here: {headroom}")
        for n in ns:
            if not args.warmup:
                args_n = argparse.Namespace(**{**vars(args), "warmup": 10 + n / 40})
            else:
                args_n = args
            if not args.window:
                args_n = argparse.Namespace(**{**vars(args_n),
                                               "window": 90.0 if n >= 500 else 60.0})
            result = asyncio.run(run_n(n, args_n, latency, redis.url, tokenizer, pages))
            result.update(headroom)
            progress(f"N={n}: {result['episodes_per_s']} episodes/s of an ideal "
                      f"{result['ideal_episodes_per_s']} ({result['throughput_vs_ideal']}); "
                      f"{result['orchestrator_ms_per_step']} ms orchestrator CPU per step; "
                      f"lease p99 {result['lease_acquire_p99_ms']} ms; first saturated: "
                      f"{result['first_saturated']}")
            results.append(result)
    finally:
        if ray.is_initialized():
            ray.shutdown()
        redis.stop()
        shutil.rmtree(state, ignore_errors=True)
    out = {"latency_model": {"source": latency.source,
                             "mean_turns": round(statistics.fmean(latency.turns), 2)},
           "runs": results, "wall_s": round(time.monotonic() - t_start, 1)}
    if len(results) == 1:
        out.update(results[0])
    print(json.dumps(out) if args.json else json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
