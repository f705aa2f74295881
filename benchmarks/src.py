"""Teacher-guided data collection, SRC against step-level review on the same tasks and seeds:
``python -m benchmarks.src --json [--student perturbed|MODEL] [--rate 0.3] [--tasks REGEX]
[--split train] [--attempts 1] [--segment-steps 2] [--max-rollbacks 3] [--workers 2]
[--out DIR]``.

Each mode runs every selected task ``--attempts`` times (seeds 0..n-1) through the one episode
runner, in real Chromium against a local cloud of its own, with the state-aware oracle teacher
(:mod:`datagen.teacher`) reviewing (``src``) or labelling every step (``step``). The
student: ``perturbed`` (default; a calibration student: the oracle's action read from the page,
replaced with probability ``--rate`` by a wrong click, a wrong value, going back or stopping:
reproducible on any machine) or a model folder (the SFT checkpoint, e.g.
``runs/learning-check/sft``: the agent loop's prompt and sampling at ``--temperature``,
transformers on CPU).

Prints one JSON object: ``student``, ``tasks``, and per mode (``src``, ``step``) what
:func:`datagen.src.summarize` returns: ``trajectories`` (verifier-passing attempts),
``corrections``, ``teacher_queries_per_trajectory`` (per attempt), ``recovery_rate`` (attempts
where the student deviated and that still passed, over those where it deviated),
``replay_fidelity`` (replays whose page equals the page before the rollback; SRC only),
``rollbacks``, ``episodes``, ``archived`` (the quality-diversity archive), ``env_s``,
``wall_s``. ``--out DIR`` also writes each mode's SFT records (``DIR/src.jsonl``,
``DIR/step.jsonl``).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from rollout_service.agent import AgentConfig
from rollout_service.models import HFChatTokenizer, resolve_model
from datagen.src import (CollectConfig, ModelStudent, PerturbedOracle, SRCConfig,
                         run_collection)
from datagen.teacher import OracleTeacher

# The learning check's agent settings (configs/learning-check.yaml): what the student sees.
AGENT = AgentConfig(max_steps=6, history_turns=2, max_prompt_tokens=1024, max_new_tokens=48,
                    max_observation_chars=1500, system_prompt="compact", temperature=0.5)
SHORT_TASKS = (r"^(ecs-create-sg|ecs-delete-rule|ecs-delete-sg|ecs-instance-(start|stop|"
               r"restart|delete)|oss-delete-bucket|oss-set-acl|ram-create-user|ram-delete-user|"
               r"ram-grant-policy|ram-revoke-policy|vpc-create-vpc|vpc-delete-vpc|"
               r"vpc-delete-vswitch)-[0-9]+$")


def student_for(name: str, rate: float, agent: AgentConfig):
    if name == "perturbed":
        return PerturbedOracle(rate), None
    from rollout_service.policy import PolicyConfig, PolicyServer  # noqa: PLC0415 - torch
    server = PolicyServer(PolicyConfig(model=name, backend="transformers"))
    return ModelStudent(server, HFChatTokenizer(resolve_model(name)), agent), server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.src")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--student", default="perturbed")
    parser.add_argument("--rate", type=float, default=0.3)
    parser.add_argument("--temperature", type=float, default=AGENT.temperature)
    parser.add_argument("--tasks", default=SHORT_TASKS)
    parser.add_argument("--split", default="train")
    parser.add_argument("--attempts", type=int, default=1)
    parser.add_argument("--segment-steps", type=int, default=2)
    parser.add_argument("--max-rollbacks", type=int, default=3)
    parser.add_argument("--max-steps", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    if not 0.0 <= args.rate <= 1.0:
        parser.error("--rate: must be 0..1")
    agent = AgentConfig(**{**AGENT.__dict__, "temperature": args.temperature})
    tokenizer = HFChatTokenizer(resolve_model("default" if args.student == "perturbed"
                                              else args.student))
    student, server = student_for(args.student, args.rate, agent)
    result: dict = {"student": args.student if args.student != "perturbed"
                    else f"perturbed oracle, rate {args.rate}", "split": args.split}
    try:
        for mode in ("src", "step"):
            config = CollectConfig(
                src=SRCConfig(mode=mode, segment_steps=args.segment_steps,
                              max_rollbacks=args.max_rollbacks, max_steps=args.max_steps),
                split=args.split, tasks=args.tasks, attempts_per_task=args.attempts,
                workers=args.workers,
                out=str(Path(args.out) / f"{mode}.jsonl") if args.out else "")
            print(f"[src] mode {mode}", file=sys.stderr, flush=True)
            result[mode] = asyncio.run(run_collection(config, OracleTeacher(), student, agent,
                                                      tokenizer))
    finally:
        if server is not None:
            asyncio.run(server.shutdown())
    result["tasks"] = result["src"]["attempts"] // max(args.attempts, 1)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
