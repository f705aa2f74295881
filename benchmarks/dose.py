"""SFT dose against GRPO temperature, measured offline: how well does each SFT checkpoint fit
its teacher's trajectories, at which sampling temperature would GRPO's groups be mixed, and
does it follow the procedure on held-out states?
``python -m benchmarks.dose --json --model final=runs/learning-check/final`` (the learning
check's own ``sft-data.jsonl`` and ``heldout-states.jsonl``; ``--data`` and ``--states``
name others), or several models: ``--model oracle-sft=runs/learning-check/sft --model
src-sft=runs/learning-check/sft-src``.

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

The procedure probe (:mod:`benchmarks.dose_probe`), on the held-out states (``--states``,
default the ``heldout-states.jsonl`` beside ``--data``: the oracle's trajectories on the
evaluation's tasks, which no training stage reads): each turn that clicks, fills or selects
an element the procedure names is asked again with that name in the procedure swapped for
another control's label on the same page (and, for a fill, the value swapped for another);
the model's greedy reply (``max_new_tokens`` from the record's agent settings, else 48) is
scored on its last action line. ``procedure_following``: the share of swapped prompts whose
reply acts on what the procedure now names (the other control's bid; the new value into
the same field); ``procedure_following_original``: the share of those turns' recorded
prompts whose reply is the recorded action; ``procedure_following_by_kind``: the share per
kind of swap (``label``, ``value``); ``probe_states``: the turns probed and the swapped
prompts (``label``, ``value``), and ``original_ids_match`` (recorded prompts that
re-tokenize to their recorded ids with the model's chat template). A model that picks ids
from the layout repeats the recorded action whatever the procedure says.

Prints one JSON object: ``data``, ``states``, ``trajectories``, ``group_size``, ``turn_fit``
(the first model's ``greedy_turns``), ``procedure_following``,
``procedure_following_original`` and ``probe_states`` (the first model's; ``null`` when no
state file is there), ``models`` (per model: ``trajectories``, ``turns``, ``greedy_turns``,
``greedy_trajectories``, ``by_temperature``, ``by_source``, and the probe's keys),
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

from benchmarks.dose_probe import Generate, Variant, probe, read_records, record_variants
from cluster.job import HELDOUT_STATES, SFT_DATA
from rollout_service.models import HFChatTokenizer, end_of_turn_id, resolve_model
from trainer.sft import IGNORE, DataError, load_examples

LEARNING_CHECK_DIR = Path("runs/learning-check")
PROBE_KEYS = ("procedure_following", "procedure_following_original", "probe_states")

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


def greedy_generator(model: Any, tokenizer: HFChatTokenizer) -> Generate:
    """``generate(messages, max_new_tokens)``: the prompt tokenized with the model's chat
    template as the agent's are (:class:`HFChatTokenizer`), decoded greedily to the chat's
    end-of-turn token, returned as text."""
    import torch
    eot = end_of_turn_id(tokenizer)
    pad = tokenizer.tokenizer.pad_token_id

    def generate(messages: list[dict[str, str]], max_new_tokens: int) -> str:
        ids = list(tokenizer.apply_chat_template(messages, tokenize=True,
                                                 add_generation_prompt=True))
        with torch.no_grad():
            out = model.generate(input_ids=torch.tensor([ids]),
                                 attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 max_new_tokens=max_new_tokens, do_sample=False,
                                 eos_token_id=eot, pad_token_id=eot if pad is None else pad)
        return tokenizer.decode(out[0, len(ids):].tolist(), skip_special_tokens=True)
    return generate


def probe_model(label: str, model: Any, tokenizer: HFChatTokenizer,
                variants: list[Variant]) -> dict[str, Any]:
    """:func:`benchmarks.dose_probe.probe` with the model's greedy replies, and how many
    recorded prompts re-tokenize to their recorded ids."""
    t0 = time.monotonic()
    same = sum(list(tokenizer.apply_chat_template(list(v.messages), tokenize=True,
                                                  add_generation_prompt=True))
               == list(v.recorded_ids) for v in variants if v.kind == "original")
    out = probe(variants, greedy_generator(model, tokenizer),
                lambda msg: _progress(f"{label}: {msg} ({time.monotonic() - t0:.0f} s)"))
    out["probe_states"]["original_ids_match"] = same
    return out


def measure(label: str, path: str, data: Path, temperatures: list[float], group: int,
            max_seq_len: int, variants: list[Variant] | None = None) -> dict[str, Any]:
    """The teacher-forced figures of one model on ``data``, and the procedure probe's on
    ``variants`` (none: not probed)."""
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
    if variants is not None:
        result.update(probe_model(label, model, tokenizer, variants))
    _progress(f"{label}: {json.dumps(result)}")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.dose", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(LEARNING_CHECK_DIR / SFT_DATA),
                        help="the teacher's trajectories (a cluster.export / sft-data JSONL; "
                        "default: %(default)s)")
    parser.add_argument("--states", default=None,
                        help="held-out states for the procedure probe (a JSONL of the same "
                        f"format; default: {HELDOUT_STATES} beside --data, the probe left "
                        "out when it is not there)")
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
    states = Path(args.states) if args.states else data.parent / HELDOUT_STATES
    t0 = time.monotonic()
    try:
        variants = None
        if args.states or states.exists():
            variants = [v for r in read_records(states) for v in record_variants(r)]
            _progress(f"probe: {len(variants)} prompts from {states}")
        else:
            _progress(f"probe: no {states}; procedure_following left out")
        results = [measure(label, path, data, args.temperatures, args.group_size,
                           args.max_seq_len, variants) for label, path in models]
    except (DataError, OSError, ValueError) as exc:
        print(f"benchmarks.dose: {exc}", file=sys.stderr)
        return 2
    out = {"data": str(data), "states": str(states) if variants is not None else None,
           "trajectories": results[0]["trajectories"], "group_size": args.group_size,
           "turn_fit": results[0]["greedy_turns"],
           **{k: results[0].get(k) for k in PROBE_KEYS},
           "models": results, "wall_s": round(time.monotonic() - t0, 1)}
    print(json.dumps(out, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
