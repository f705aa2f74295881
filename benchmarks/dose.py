"""SFT dose against GRPO temperature, measured offline: how well does each SFT checkpoint fit
its teacher's trajectories, and at which sampling temperature would GRPO's groups be mixed?
``python -m benchmarks.dose --json --data runs/learning-check/sft-data.jsonl
--model oracle-sft=runs/learning-check/sft --model src-sft=runs/learning-check/sft-src``.

One teacher-forced forward pass per turn of the data file (the oracle's trajectories as
:mod:`datagen.export` writes them: each turn's prompt and the action the oracle took),
per model; no browser, no cloud (~1-3 s per turn of ~900 tokens on one
CPU core). From the logits at the response's positions:

- ``greedy_turns``: the share of turns whose whole response is the model's argmax at every
  token (what greedy decoding reproduces), and ``greedy_trajectories``: the share of
  trajectories with every turn reproduced. This is the fit, the dose's effect.
- per temperature ``T``: each turn's probability of sampling the teacher's action under
  ``softmax(logits / T)`` (vLLM's sampling at top_p 1); for ``stop("...")`` and
  ``report_infeasible("...")`` only the tokens up to the opening quote count (the reward
  accepts other wordings of the answer). A trajectory's ``p`` is the product over its turns:
  the probability of sampling the teacher's path, a lower bound on the task's success (other
  paths can succeed too). ``predicted_success`` is the mean ``p``; ``predicted_mixed_groups``
  the mean of ``1 - p^G - (1-p)^G``, the share of GRPO groups of ``--group-size`` samples
  expected to have both outcomes (only those make a step). Compare it with the groups a GRPO
  run recorded (``runs/.../metrics.jsonl``).

Prints one JSON object: ``data``, ``trajectories``, ``group_size``, ``models`` (per model:
``trajectories``, ``turns``, ``greedy_turns``, ``greedy_trajectories``, ``by_temperature``, ``by_source``),
``wall_s``.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from rollout_service.models import HFChatTokenizer, end_of_turn_id, resolve_model
from trainer.sft import IGNORE, DataError, load_examples

ANSWER_VERBS = ("stop(\"", "report_infeasible(\"")


def _progress(msg: str) -> None:
    print(f"[dose] {msg}", file=sys.stderr, flush=True)


def task_of_lines(path: Path) -> dict[int, str]:
    """Line number (1-based, as :func:`trainer.sft.load_examples` counts) -> task id."""
    out: dict[int, str] = {}
    with path.open(encoding="utf-8") as handle:
        for n, raw in enumerate(handle, 1):
            if raw.strip():
                out[n] = str(json.loads(raw).get("task_id", f"line-{n}"))
    return out


def scored_length(response: list[int], tokenizer: HFChatTokenizer) -> int:
    """How many of ``response``'s tokens count: all, or for an answer verb only those up to
    its opening quote when they tokenize as a prefix of the response."""
    text = tokenizer.decode(response, skip_special_tokens=True).lstrip()
    for verb in ANSWER_VERBS:
        if text.startswith(verb):
            for k in range(1, len(response) + 1):
                if tokenizer.decode(response[:k], skip_special_tokens=True).lstrip() \
                        .startswith(verb):
                    return k
    return len(response)


def turn_scores(model: Any, ids: list[int], labels: list[int], scored: int,
                temperatures: list[float]) -> tuple[bool, dict[float, float]]:
    """(greedy reproduces the whole response, {T: log-probability of the scored tokens})."""
    import torch
    start = next(i for i, t in enumerate(labels) if t != IGNORE)
    with torch.no_grad():                # the vocabulary head only where the response is
        logits = model(input_ids=torch.tensor([ids]), logits_to_keep=len(ids) - start + 1
                       ).logits[0, :-1, :].float()
    target = torch.tensor(ids[start:])
    greedy = bool((logits.argmax(-1) == target).all())
    rows = torch.arange(scored)
    logps = {T: float(torch.log_softmax(logits[:scored] / T, dim=-1)[rows, target[:scored]]
                      .sum()) for T in temperatures}
    return greedy, logps


def summarize(scores: dict[int, list[tuple[bool, dict[float, float]]]], lines: list[int],
              temperatures: list[float], group: int) -> dict[str, Any]:
    """Per temperature, over the trajectories ``lines`` of ``scores`` (line -> each turn's
    ``(greedy, {T: log-probability})``): the mean probability of sampling the whole teacher's
    path, the expected share of mixed groups of ``group``, the mean per-turn probability."""
    out: dict[str, Any] = {}
    for T in temperatures:
        ps = [math.exp(sum(lp[T] for _, lp in scores[n])) for n in lines]
        turn_ps = [math.exp(lp[T]) for n in lines for _, lp in scores[n]]
        out[str(T)] = {
            "predicted_success": round(sum(ps) / len(ps), 4),
            "predicted_mixed_groups": round(
                sum(1 - p ** group - (1 - p) ** group for p in ps) / len(ps), 4),
            "turn_p_mean": round(sum(turn_ps) / len(turn_ps), 4)}
    return out


def measure(label: str, path: str, data: Path, temperatures: list[float], group: int,
            max_seq_len: int) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    model_path = str(resolve_model(path))
    tokenizer = HFChatTokenizer(model_path)
    examples, _ = load_examples(data, tokenizer, max_seq_len, end_of_turn_id(tokenizer))
    tasks = task_of_lines(data)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    model.eval()
    by_line: dict[int, list[tuple[bool, dict[float, float]]]] = defaultdict(list)
    t0 = time.monotonic()
    for n, ex in enumerate(examples, 1):
        response = [t for t in ex.labels if t != IGNORE]
        by_line[ex.line].append(turn_scores(model, ex.input_ids, ex.labels,
                                            scored_length(response, tokenizer), temperatures))
        if n % 50 == 0 or n == len(examples):
            _progress(f"{label}: {n}/{len(examples)} turns ({time.monotonic() - t0:.0f} s)")
    turns = [s for line in by_line.values() for s in line]

    lines = sorted(by_line)
    wrongdoc = [n for n in lines if tasks[n].endswith("-wrongdoc")]
    procedure = [n for n in lines if not tasks[n].endswith("-wrongdoc")]
    result = {
        "model": label, "path": path, "trajectories": len(lines), "turns": len(turns),
        "greedy_turns": round(sum(g for g, _ in turns) / len(turns), 4),
        "greedy_trajectories": round(
            sum(all(g for g, _ in by_line[n]) for n in lines) / len(lines), 4),
        "by_temperature": summarize(by_line, lines, temperatures, group),
        "by_source": {name: {"trajectories": len(part),
                              **summarize(by_line, part, temperatures, group)}
                      for name, part in (("procedure", procedure), ("wrong-doc", wrongdoc))
                      if part},
    }
    _progress(f"{label}: {json.dumps(result)}")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.dose", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True,
                        help="the teacher's trajectories (a cluster.export / sft-data JSONL)")
    parser.add_argument("--model", action="append", required=True, metavar="LABEL=PATH",
                        help="a checkpoint folder (or 'default'), repeatable")
    parser.add_argument("--temperatures", type=float, nargs="+",
                        default=[0.3, 0.5, 0.7, 1.0])
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-seq-len", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    import torch
    torch.set_num_threads(args.threads)
    models = []
    for spec in args.model:
        label, sep, path = spec.partition("=")
        if not sep or not label or not path:
            parser.error(f"--model {spec!r}: expected LABEL=PATH")
        models.append((label, path))
    if any(t <= 0 for t in args.temperatures) or args.group_size < 2:
        parser.error("--temperatures must be > 0 and --group-size >= 2")
    data = Path(args.data)
    t0 = time.monotonic()
    try:
        results = [measure(label, path, data, args.temperatures, args.group_size,
                           args.max_seq_len) for label, path in models]
    except (DataError, OSError, json.JSONDecodeError) as exc:
        print(f"benchmarks.dose: {exc}", file=sys.stderr)
        return 2
    out = {"data": str(data), "trajectories": results[0]["trajectories"],
           "group_size": args.group_size,
           "models": results, "wall_s": round(time.monotonic() - t0, 1)}
    print(json.dumps(out, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
