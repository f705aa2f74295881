"""One GRPO optimizer step under DDP and under FSDP2 on the same ranks:
``python -m benchmarks.engine_strategy --json``.

``--workers`` trainer workers (Ray actors, gloo on CPU, one thread each) step on ``--model``
(default: the policy's default, SmolLM2-135M-Instruct) with a synthetic batch of ``--rows`` rows of ``--prompt-tokens``
prompt tokens (a 64-token prefix every row shares, then their own) and 10 response tokens,
rewards alternating. Each strategy gets fresh workers, one warm-up step, then ``--repeats``
timed steps. Prints one JSON object: per strategy the median step time seen from the driver
(``step_s``), the slowest rank's forward/backward and optimizer time (``fwd_bwd_s``,
``optim_s``) and the peak RSS of each rank (``rank_peak_rss_gib``).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import ray

from consolerl.experience import Group, Sample, Turn
from rollout_service.models import resolve_model
from trainer.algo import AlgoConfig, TrainBatch, build_batch
from trainer.engine import EngineConfig, start_workers


def batch(rows: int, prompt_tokens: int) -> TrainBatch:
    shared = tuple(200 + k for k in range(64))
    samples = []
    for i in range(rows):
        own = tuple(1000 + (i * 37 + k) % 20000 for k in range(prompt_tokens - 64))
        response = tuple(300 + (i * 11 + k) % 500 for k in range(10))
        turn = Turn(shared + own, response, (-2.0,) * 10, (1,) * 10, 0, "", "")
        samples.append(Sample(f"s{i}", (turn,), float(i % 2)))
    return build_batch([Group("g", "t", tuple(samples))], 0, AlgoConfig())


def _peak_rss_gib(_actor: Any) -> float:
    import resource
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)


def run(strategy: str, args: argparse.Namespace, data: TrainBatch) -> dict[str, Any]:
    engine = EngineConfig(workers=args.workers, strategy=strategy, num_cpus_per_worker=1,
                          threads_per_worker=1, dtype=args.dtype,
                          autocast="off" if args.dtype == "float32" else "auto",
                          micro_batch_tokens=args.micro_batch_tokens)
    workers = start_workers(resolve_model(args.model), engine, AlgoConfig())
    shards = data.split(len(workers))
    tokens, seqs = int(data.num_tokens()), int(data.num_seqs())
    times, per_rank = [], []
    try:
        for i in range(args.repeats + 1):
            t0 = time.perf_counter()
            metrics = ray.get([w.step.remote(s, tokens, seqs) for w, s in zip(workers, shards)])
            if i:                                         # the first step warms up
                times.append(time.perf_counter() - t0)
                per_rank.append(metrics)
        rss = ray.get([w.__ray_call__.remote(_peak_rss_gib) for w in workers])
    finally:
        ray.get([w.shutdown.remote() for w in workers])
        for w in workers:
            ray.kill(w)
        workers.remove_placement()
    return {"step_s": round(statistics.median(times), 3),
            "steps_s": [round(t, 3) for t in times],
            "fwd_bwd_s": round(statistics.median(max(m["fwd_bwd_s"] for m in ms)
                                                 for ms in per_rank), 3),
            "optim_s": round(statistics.median(max(m["optim_s"] for m in ms)
                                               for ms in per_rank), 3),
            "micro_batches_per_rank": per_rank[0][0]["micro_batches"],
            "rank_peak_rss_gib": rss}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default",
                        help="a model folder or name (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--micro-batch-tokens", type=int, default=2048)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="(the output is JSON anyway)")
    args = parser.parse_args()
    ray.init(address="local", num_cpus=args.workers, include_dashboard=False,
             log_to_driver=False)
    try:
        data = batch(args.rows, args.prompt_tokens)
        out: dict[str, Any] = {"workers": args.workers, "rows": args.rows,
                               "prompt_tokens": args.prompt_tokens, "dtype": args.dtype,
                               "repeats": args.repeats}
        for strategy in ("ddp", "fsdp2"):
            out[strategy] = run(strategy, args, data)
    finally:
        ray.shutdown()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
