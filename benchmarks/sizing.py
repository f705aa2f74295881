"""Sizing a cluster for a target rate of episodes: ``python -m benchmarks.sizing --json``.

From the latency model measured here (``benchmarks/data/scale-latency.json``, written by
``python -m benchmarks.scale --calibrate``) and, when given, the scale benchmark's output
(``--scale FILE``: the JSON of ``python -m benchmarks.scale``), for each target of E episodes
per hour it works out what each component must carry and how many of it that takes:

- env workers (browsers) running at once: E/3600 x the episode's time (lease to release,
  scoring included: the worker holds its account until the episode is cleaned up);
- browser CPUs: E/3600 x the CPU seconds an episode costs the env worker, the runner, the
  reward service and Chromium (measured);
- accounts: one leased per worker at once; ActionTrail LookupEvents per second per account
  against its budget of 2;
- the policy: turns and prompt tokens per second; GPUs = those tokens / the per-GPU prefill
  rate, which only the target hardware can measure (``--policy-tokens-per-gpu-s``; nothing
  is assumed when it is not given);
- the trainer: sample tokens per second to train on; GPUs likewise
  (``--trainer-tokens-per-gpu-s``);
- the orchestrator: CPU cores = steps/s x its CPU time per step (from ``--scale``), so how
  many orchestrator shards at one core each;
- Redis: lease and stream commands per second (from ``--scale``: per episode, as measured).

``limits_first``: of the components with a known per-unit capacity here, the one that needs
the most units per unit of its kind, i.e. the one to grow first; where a GPU rate is not
given, that component is listed as unknown rather than guessed.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

from benchmarks.scale_model import LATENCY_FILE, TRAIL_QPS, Latency

PROMPT_TOKENS = 705          # mean prompt of a turn (the compact prompt, as measured)
RESPONSE_TOKENS = 12


def size(e_per_hour: float, latency: Latency, scale: dict[str, Any] | None, *,
         generate_s: float | None, policy_rate: float | None, trainer_rate: float | None,
         prompt_tokens: int = PROMPT_TOKENS) -> dict[str, Any]:
    mean = statistics.fmean
    lookups = mean(latency.lookups)
    gen = mean(latency.generate_s) if generate_s is None else generate_s
    episode_s = (mean(latency.reset_s) + mean(latency.turns) * (gen + mean(latency.step_s))
                 + mean(latency.score_s) + lookups * mean(latency.lookup_s))
    eps = e_per_hour / 3600
    turns_s = eps * mean(latency.turns)
    workers = math.ceil(eps * episode_s)
    out: dict[str, Any] = {
        "episodes_per_hour": e_per_hour, "episode_s": round(episode_s, 1),
        "env_workers": workers,
        "browser_cpus": round(eps * mean(latency.episode_cpu_s), 1),
        "accounts": workers,
        "actiontrail_qps_per_account": round(lookups / episode_s, 3),
        "actiontrail_budget_per_account": TRAIL_QPS,
        "policy_turns_per_s": round(turns_s, 2),
        "policy_prompt_tokens_per_s": round(turns_s * prompt_tokens),
        "policy_gpus": None if not policy_rate else math.ceil(turns_s * prompt_tokens
                                                              / policy_rate),
        "trainer_tokens_per_s": round(turns_s * (prompt_tokens + RESPONSE_TOKENS)),
        "trainer_gpus": None if not trainer_rate else math.ceil(
            turns_s * (prompt_tokens + RESPONSE_TOKENS) / trainer_rate),
    }
    load = {"actiontrail_per_account": lookups / episode_s / TRAIL_QPS}
    if scale is not None:
        ms = scale["orchestrator_ms_per_step"]
        cores = turns_s * ms / 1000
        out["orchestrator_cores"] = round(cores, 2)
        out["orchestrator_shards"] = max(1, math.ceil(cores / 0.8))    # 80% of a core each
        per_episode = scale.get("redis_commands_per_episode", {})
        if per_episode:
            out["redis_commands_per_s"] = math.ceil(eps * sum(per_episode.values()))
        load["orchestrator_core"] = cores / 0.8
        if scale.get("env_workers_ms_per_step"):
            # The env workers' own control-plane CPU (leases, heartbeats; with the turns on
            # the workers, prompts and policy calls too), spread over their processes.
            out["env_worker_control_cpus"] = round(turns_s * scale["env_workers_ms_per_step"]
                                                   / 1000, 2)
        if scale.get("redis_cpu") is not None and scale.get("episodes_per_s"):
            redis = scale["redis_cpu"] / scale["episodes_per_s"] * eps
            out["redis_cpu"] = round(redis, 3)
            load["redis"] = redis / 0.8
    out["unknown"] = [k for k, rate in (("policy_gpus", policy_rate),
                                        ("trainer_gpus", trainer_rate)) if not rate]
    out["load"] = {k: round(v, 3) for k, v in load.items()}
    out["limits_first"] = max(load, key=lambda k: load[k])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sizing")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--episodes-per-hour", default="1000,10000,100000")
    parser.add_argument("--latency", default=str(LATENCY_FILE))
    parser.add_argument("--scale", default="", help="the scale benchmark's JSON output")
    parser.add_argument("--generate-s", type=float, default=None,
                        help="seconds per turn's generation on the target policy (default: "
                             "the calibrated CPU figure)")
    parser.add_argument("--policy-tokens-per-gpu-s", type=float, default=None)
    parser.add_argument("--trainer-tokens-per-gpu-s", type=float, default=None)
    args = parser.parse_args(argv)
    try:
        targets = [float(x) for x in args.episodes_per_hour.split(",")]
    except ValueError:
        parser.error(f"--episodes-per-hour: numbers separated by commas, "
                     f"got {args.episodes_per_hour!r}")
    if any(t <= 0 for t in targets):
        parser.error("--episodes-per-hour: each target must be > 0")
    if not Path(args.latency).exists():
        parser.error(f"--latency: {args.latency} not found (python -m benchmarks.scale "
                     "--calibrate measures it)")
    latency = Latency.load(Path(args.latency))
    scale = None
    if args.scale:
        try:
            data = json.loads(Path(args.scale).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            parser.error(f"--scale: {exc}")
        runs = data.get("runs") or [data]
        scale = max(runs, key=lambda r: r.get("workers", 0))     # the largest N measured
    rows = [size(t, latency, scale, generate_s=args.generate_s,
                 policy_rate=args.policy_tokens_per_gpu_s,
                 trainer_rate=args.trainer_tokens_per_gpu_s) for t in targets]
    out = {"latency_model": latency.source, "scale_workers": scale and scale.get("workers"),
           "rows": rows}
    print(json.dumps(out) if args.json else json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
