"""A fast learning regression: does the GRPO path make the policy better, in minutes on a CPU?
``python -m benchmarks.learning --json``.

One-step decisions replayed from recorded oracle states (``benchmarks/data/oracle-states.jsonl
.gz``: the prompts of real oracle episodes, as :mod:`datagen.export` records them, and
the action the oracle took there; train states from train-split tasks, held-out states from
held-out tasks). The prompts use the compact system prompt and a short page (see ``--record``),
so that a CPU step is seconds, not minutes.

1. Warm start: the default model (SmolLM2-135M-Instruct) gets a short SFT on ``--sft-states``
   train states (one pass), enough that GRPO's groups are mixed rather than all failures.
   The SFT states are fixed by ``--sft-seed``; ``--seed`` varies GRPO's states and samples.
2. Before: on ``--eval-states`` held-out states (taken in turn from each held-out task),
   ``--eval-samples`` samples per state at the training temperature (one shared prefill per
   state), the share whose parsed action equals the oracle's (``accuracy``), plus one greedy
   reply each, and the oracle action's exact log-likelihood under the model. The warm start and
   this measurement are cached (``~/.cache/consolerl/learning-warm-start``; ``cached`` in the
   output says which were).
3. GRPO: ``--steps`` steps, each ``--states-per-step`` train states x ``--group-size`` samples,
   reward 1 when the parsed action equals the oracle's, trained by the unchanged GRPO path
   (:func:`trainer.algo.build_batch`, the rows with signal as :class:`trainer.grpo.GRPOTrainer`
   selects them, :meth:`trainer.engine.TrainerWorker.step`).
4. After: step 2 again, same states, same sampling seeds. The difference's 95% interval is a
   paired bootstrap over held-out states.

Prints one JSON object with ``accuracy_before``, ``accuracy_after``, ``diff``, ``diff_ci95``,
``loglik_before`` / ``loglik_after`` (mean per state) and their ``loglik_diff_ci95``,
``greedy_before`` / ``greedy_after``, ``train_success`` (per step), ``steps``, ``wall_s``.

``--record`` re-records the states (Chromium, the local cloud and the oracle, via
``cluster.export``; a few minutes) and writes the data file.
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from consolerl.experience import Group, Sample, Turn
from consolerl.stats import paired_lists_diff_ci95
from env_workers.actions import Action, ActionError, parse_action
from rollout_service.models import HFChatTokenizer, cache_dir, end_of_turn_id, resolve_model
from trainer.algo import AlgoConfig, build_batch
from trainer.config import TrainerConfig
from trainer.engine import EngineConfig, OptimConfig, TrainerWorker
from trainer.grpo import rows_to_train
from trainer.sft import (
    DataError,
    Example,
    build_sft_example,
    micro_batch_loss,
)

DATA = Path(__file__).resolve().parent / "data" / "oracle-states.jsonl.gz"
# How the states were recorded (--record): the agent's prompt with these settings.
RECORD_AGENT = {"system_prompt": "compact", "history_turns": 2, "max_observation_chars": 1200,
                "max_prompt_tokens": 1024}


def _progress(msg: str) -> None:
    print(f"[learning] {msg}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class State:
    task_id: str
    split: str
    prompt_ids: tuple[int, ...]
    target: str                    # the oracle's action, canonical text
    target_ids: tuple[int, ...]    # its tokens and the end-of-turn token


def load_states(path: Path, tokenizer: HFChatTokenizer) -> dict[str, list[State]]:
    """The recorded states by split (``train``, ``heldout``), prompts tokenized with the
    recorded messages through the chat template."""
    eot = end_of_turn_id(tokenizer)
    out: dict[str, list[State]] = {"train": [], "heldout": []}
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            rec = json.loads(line)
            action = parse_action(rec["completion"])
            if isinstance(action, ActionError):
                raise DataError(f"{path}:{n}: completion {rec['completion']!r} does not "
                                f"parse: {action}")
            ids, labels = build_sft_example(
                {"messages": rec["messages"], "completion": rec["completion"]}, tokenizer, eot)
            cut = sum(1 for x in labels if x == -100)
            out[rec["split"]].append(State(rec["task_id"], rec["split"], tuple(ids[:cut]),
                                           action.to_text(), tuple(ids[cut:])))
    return out


def spread(states: list[State], n: int) -> list[State]:
    """``n`` states (0: all) taken in turn from each task (the file's order within a task):
    an evaluation of a few states still covers every held-out task."""
    if not n or n >= len(states):
        return list(states)
    by_task: dict[str, list[State]] = {}
    for s in states:
        by_task.setdefault(s.task_id, []).append(s)
    out: list[State] = []
    queues = [list(v) for v in by_task.values()]
    while len(out) < n:
        for q in queues:
            if q and len(out) < n:
                out.append(q.pop(0))
    return out


def reward(text: str, target: str) -> float:
    """1 when the reply parses to the oracle's action, else 0."""
    action = parse_action(text)
    return 1.0 if isinstance(action, Action) and action.to_text() == target else 0.0


class Sampler:
    """Samples ``n`` replies per prompt from one shared prefill (the prompt's KV cache copied
    ``n`` times), at ``temperature``, with each sampled token's log-prob under
    ``softmax(logits / temperature)``; an extra greedy reply per prompt on request."""

    def __init__(self, model: Any, tokenizer: HFChatTokenizer, eot: int, max_new_tokens: int):
        import torch
        self.torch, self.model, self.tokenizer = torch, model, tokenizer
        self.stop = {eot}
        if tokenizer.tokenizer.eos_token_id is not None:
            self.stop.add(int(tokenizer.tokenizer.eos_token_id))
        pad = tokenizer.tokenizer.pad_token_id
        self.pad = int(pad) if pad is not None else 0
        self.max_new_tokens = max_new_tokens

    def sample(self, prompts: list[tuple[int, ...]], n: int, temperature: float, seed: int,
               greedy: bool = False, targets: list[tuple[int, ...]] | None = None
               ) -> tuple[list[list[tuple[list[int], list[float]]]], list[float]]:
        """Per prompt, ``n`` sampled replies (then a greedy one when ``greedy``): each
        ``(token ids, log-probs)``, the stop token included; and, with ``targets``, each
        target's log-likelihood after its prompt (at temperature 1), from the same forward as
        the prefill (the target's columns are cut from the cache before sampling)."""
        torch = self.torch
        k = n + int(greedy)
        width = max(len(p) for p in prompts)
        tail = max((len(t) for t in targets), default=0) if targets else 0
        ids = torch.full((len(prompts), width + tail), self.pad, dtype=torch.long)
        mask = torch.zeros((len(prompts), width + tail), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):width] = torch.tensor(p)
            mask[i, width - len(p):width] = 1
            if targets:
                ids[i, width:width + len(targets[i])] = torch.tensor(targets[i])
                mask[i, width:width + len(targets[i])] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        gen = torch.Generator().manual_seed(seed)
        logliks: list[float] = []
        self.model.eval()
        with torch.no_grad():
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                             use_cache=True, logits_to_keep=tail + 1)
            cache = out.past_key_values
            if targets:
                lp = torch.log_softmax(out.logits[:, :-1, :].float(), dim=-1)
                for i, t in enumerate(targets):
                    logliks.append(float(lp[i, torch.arange(len(t)), torch.tensor(t)].sum()))
                cache.crop(width)
            first = out.logits[:, 0, :].float()
            mask = mask[:, :width].repeat_interleave(k, dim=0)
            last = positions[:, width - 1].repeat_interleave(k, dim=0)
            cache.batch_repeat_interleave(k)
            logits = first.repeat_interleave(k, dim=0)
            rows = len(prompts) * k
            is_greedy = torch.tensor([greedy and (r % k == n) for r in range(rows)])
            tokens: list[list[int]] = [[] for _ in range(rows)]
            logps: list[list[float]] = [[] for _ in range(rows)]
            live = list(range(rows))             # rows still generating, in cache order
            for _ in range(self.max_new_tokens):
                logp = torch.log_softmax(logits / temperature, dim=-1)
                drawn = torch.multinomial(logp.exp(), 1, generator=gen).squeeze(-1)
                pick = torch.where(is_greedy[live], logits.argmax(-1), drawn)
                keep = []
                for j, r in enumerate(live):
                    tok = int(pick[j])
                    tokens[r].append(tok)
                    logps[r].append(float(logp[j, tok]))
                    if tok not in self.stop:
                        keep.append(j)
                if not keep:
                    break
                if len(keep) < len(live):        # finished rows leave the cache
                    index = torch.tensor(keep)
                    cache.batch_select_indices(index)
                    pick, mask, last = pick[index], mask[index], last[index]
                    live = [live[j] for j in keep]
                mask = torch.cat([mask, torch.ones((len(live), 1), dtype=torch.long)], dim=-1)
                last = last + 1
                out = self.model(input_ids=pick.unsqueeze(-1), attention_mask=mask,
                                 position_ids=last.unsqueeze(-1), past_key_values=cache,
                                 use_cache=True)
                cache = out.past_key_values
                logits = out.logits[:, -1, :].float()
        return [[(tokens[i * k + j], logps[i * k + j]) for j in range(k)]
                for i in range(len(prompts))], logliks

    def text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def sft_warm_start(model: Any, states: list[State], pad: int, lr: float, batch: int) -> float:
    """One pass of SFT over ``states`` (``batch`` per optimizer step); returns the mean loss
    per token of the pass."""
    import torch
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    total, count = 0.0, 0
    for i in range(0, len(states), batch):
        chunk = [Example(list(s.prompt_ids + s.target_ids),
                         [-100] * len(s.prompt_ids) + list(s.target_ids), 0, 0)
                 for s in states[i:i + batch]]
        opt.zero_grad(set_to_none=True)
        loss, tokens = micro_batch_loss(model, chunk, pad, "cpu")
        (loss / tokens).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        total, count = total + float(loss.detach()), count + tokens
    return total / max(1, count)


CACHE = "learning-warm-start"


def warm_start_key(states: list[State], args: argparse.Namespace, model_path: str) -> str:
    return hashlib.sha256(json.dumps([
        hashlib.sha256(Path(args.data).read_bytes()).hexdigest(), model_path,
        [s.prompt_ids + s.target_ids for s in states], args.sft_lr, args.sft_batch,
        args.sft_seed]).encode()).hexdigest()[:16]


def warm_start(model: Any, states: list[State], pad: int, args: argparse.Namespace,
               key: str) -> float:
    """:func:`sft_warm_start`, or its weights from the cache when this data, model and SFT
    setting (``key``) ran before (``--no-cache``: always train)."""
    import torch
    path = cache_dir().parent / CACHE / f"{key}.pt"
    if not args.no_cache and path.exists():
        saved = torch.load(path, weights_only=True)
        model.load_state_dict(saved["model"])
        _progress(f"SFT warm start from the cache ({path})")
        return float(saved["loss"])
    # The warm start trains the whole model whatever GRPO then trains (--train-layers).
    frozen = [p for p in model.parameters() if not p.requires_grad]
    for p in frozen:
        p.requires_grad_(True)
    try:
        loss = sft_warm_start(model, states, pad, args.sft_lr, args.sft_batch)
    finally:
        for p in frozen:
            p.requires_grad_(False)
            p.grad = None
    if not args.no_cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        torch.save({"model": model.state_dict(), "loss": loss}, tmp)
        tmp.replace(path)
    return loss


def evaluate(sampler: Sampler, states: list[State], samples: int, seed: int,
             temperature: float) -> dict[str, list[float]]:
    """Per held-out state: accuracy of ``samples`` samples, greedy accuracy, the oracle
    action's log-likelihood."""
    acc, greedy, loglik = [], [], []
    for i in range(0, len(states), 8):
        chunk = states[i:i + 8]
        replies, ll = sampler.sample([s.prompt_ids for s in chunk], samples, temperature,
                                     seed + i, greedy=True,
                                     targets=[s.target_ids for s in chunk])
        loglik += ll
        for s, per in zip(chunk, replies):
            scores = [reward(sampler.text(ids), s.target) for ids, _ in per]
            acc.append(sum(scores[:samples]) / samples)
            greedy.append(scores[samples])
    return {"accuracy": acc, "greedy": greedy, "loglik": loglik}


def grpo_step(worker: TrainerWorker, sampler: Sampler, states: list[State], group: int,
              temperature: float, seed: int, step: int, pad: int) -> dict[str, Any]:
    """One GRPO step on ``states``: ``group`` samples each, rewards, the trainer's batch and
    row selection, the worker's optimizer step."""
    replies, _ = sampler.sample([s.prompt_ids for s in states], group, temperature, seed)
    groups, rewards = [], []
    for k, (s, per) in enumerate(zip(states, replies)):
        samples = []
        for j, (ids, lps) in enumerate(per):
            r = reward(sampler.text(ids), s.target)
            rewards.append(r)
            turn = Turn(s.prompt_ids, tuple(ids), tuple(lps), tuple(1 for _ in ids), step,
                        "", "")
            samples.append(Sample(f"{step}-{k}-{j}", (turn,), r))
        groups.append(Group(f"{step}-{k}", s.task_id, tuple(samples)))
    batch = build_batch(groups, pad, AlgoConfig(temperature=temperature))
    trained = rows_to_train(batch, TrainerConfig(algo=AlgoConfig(temperature=temperature)))
    out: dict[str, Any] = {"step": step, "success": sum(rewards) / len(rewards),
                           "rows": batch.num_rows,
                           "rows_trained": trained.num_rows if trained is not None else 0}
    if trained is not None:
        t0 = time.perf_counter()
        m = worker.step(trained, int(batch.num_tokens()), int(batch.num_seqs()))
        out.update(grad_norm=round(m["grad_norm"], 4), step_s=round(time.perf_counter() - t0, 2))
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    t0 = time.monotonic()
    model_path = str(resolve_model(args.model))
    tokenizer = HFChatTokenizer(model_path)
    eot = end_of_turn_id(tokenizer)
    states = load_states(Path(args.data), tokenizer)
    # The warm start's states are fixed (--sft-seed); --seed varies GRPO's states and samples.
    train = list(states["train"])
    random.Random(args.sft_seed).shuffle(train)
    rng = random.Random(args.seed)
    heldout = spread(states["heldout"], args.eval_states)
    sft, rl = train[:args.sft_states], train[args.sft_states:] or train
    _progress(f"{len(states['train'])} train / {len(states['heldout'])} held-out states; "
              f"SFT on {len(sft)}, GRPO on {len(rl)}, evaluation on {len(heldout)} x "
              f"{args.eval_samples} samples")
    worker = TrainerWorker(0, 1, model_path, EngineConfig(
        micro_batch_tokens=args.micro_batch_tokens, optim=OptimConfig(lr=args.lr),
        train_layers=args.train_layers),
        AlgoConfig(temperature=args.temperature))
    worker.init_distributed("")
    pad_id = tokenizer.tokenizer.pad_token_id
    pad = int(pad_id) if pad_id is not None else 0
    sampler = Sampler(worker.model, tokenizer, eot, args.max_new_tokens)
    key = warm_start_key(sft, args, model_path)
    warm_cached = bool(sft) and not args.no_cache and (cache_dir().parent / CACHE
                                                       / f"{key}.pt").exists()
    sft_loss = warm_start(worker.model, sft, pad, args, key) if sft else None
    _progress(f"SFT warm start: loss {sft_loss} ({time.monotonic() - t0:.0f} s)")
    # The evaluation's sampling seeds belong to the warm start, not to --seed: the "before"
    # of every GRPO seed is then the same measurement, computed once and cached.
    eval_seed = 1000 + args.sft_seed
    before_path = cache_dir().parent / CACHE / (key + "-before-" + hashlib.sha256(json.dumps(
        [[s.prompt_ids for s in heldout], args.eval_samples, eval_seed, args.temperature,
         args.max_new_tokens]).encode()).hexdigest()[:16] + ".json")
    before_cached = bool(sft) and not args.no_cache and before_path.exists()
    if before_cached:
        before = json.loads(before_path.read_text())
        _progress(f"before: from the cache ({before_path})")
    else:
        before = evaluate(sampler, heldout, args.eval_samples, eval_seed, args.temperature)
        if sft and not args.no_cache:
            tmp = before_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(before))
            tmp.replace(before_path)
    _progress(f"before: accuracy {statistics.fmean(before['accuracy']):.3f} "
              f"({time.monotonic() - t0:.0f} s)")
    curve = []
    for step in range(1, args.steps + 1):
        chosen = rng.sample(rl, min(args.states_per_step, len(rl)))
        m = grpo_step(worker, sampler, chosen, args.group_size, args.temperature,
                      args.seed + step, step, pad)
        curve.append(m)
        _progress(f"step {step}: {m} ({time.monotonic() - t0:.0f} s)")
    after = evaluate(sampler, heldout, args.eval_samples, eval_seed, args.temperature)
    acc_b, acc_a = statistics.fmean(before["accuracy"]), statistics.fmean(after["accuracy"])
    ll_b, ll_a = statistics.fmean(before["loglik"]), statistics.fmean(after["loglik"])
    return {
        "accuracy_before": round(acc_b, 4), "accuracy_after": round(acc_a, 4),
        "diff": round(acc_a - acc_b, 4),
        "diff_ci95": [round(x, 4) for x in paired_lists_diff_ci95(before["accuracy"],
                                                                  after["accuracy"])],
        "greedy_before": round(statistics.fmean(before["greedy"]), 4),
        "greedy_after": round(statistics.fmean(after["greedy"]), 4),
        "loglik_before": round(ll_b, 3), "loglik_after": round(ll_a, 3),
        "loglik_diff_ci95": [round(x, 3) for x in paired_lists_diff_ci95(before["loglik"],
                                                                         after["loglik"])],
        "train_success": [round(m["success"], 3) for m in curve],
        "rows_trained": [m["rows_trained"] for m in curve],
        "steps": args.steps, "wall_s": round(time.monotonic() - t0, 1),
        "eval_states": len(heldout), "eval_samples": len(heldout) * args.eval_samples,
        "sft_states": len(sft), "sft_loss": round(sft_loss, 4) if sft_loss else None,
        "states_per_step": args.states_per_step, "group_size": args.group_size,
        "lr": args.lr, "temperature": args.temperature, "seed": args.seed,
        "cached": {"warm_start": warm_cached, "before": before_cached},
        "sft_seed": args.sft_seed, "eval_tasks": len({s.task_id for s in heldout}),
        "train_layers": args.train_layers,
    }


def record(out: Path) -> dict[str, Any]:
    """Re-record the states: the oracle's episodes on the train and held-out splits through
    ``cluster.export`` with :data:`RECORD_AGENT`, reduced to (messages, action) per turn."""
    lines: list[str] = []
    counts = {}
    with tempfile.TemporaryDirectory(prefix="learning-record-") as tmp:
        for split in ("train", "heldout"):
            path = Path(tmp) / f"{split}.jsonl"
            cmd = [sys.executable, "-m", "cluster.export", "--out", str(path), "--split", split,
                   "--system-prompt", RECORD_AGENT["system_prompt"],
                   "--history-turns", str(RECORD_AGENT["history_turns"]),
                   "--max-observation-chars", str(RECORD_AGENT["max_observation_chars"]),
                   "--max-prompt-tokens", str(RECORD_AGENT["max_prompt_tokens"])]
            _progress(" ".join(cmd[1:]))
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            n = 0
            for line in path.read_text(encoding="utf-8").splitlines():
                rec = json.loads(line)
                for turn in rec["turns"]:
                    if turn.get("action_error"):
                        continue
                    lines.append(json.dumps({"task_id": rec["task_id"], "split": split,
                                             "messages": turn["messages"],
                                             "completion": turn["completion"]}))
                    n += 1
            counts[split] = n
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = out.with_suffix(".tmp")
    with gzip.open(tmp_out, "wt", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    tmp_out.replace(out)
    return {"recorded": str(out), "states": counts}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.learning")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--record", action="store_true", help="re-record the oracle states")
    parser.add_argument("--data", default=str(DATA))
    parser.add_argument("--model", default="", help="model folder (default: SmolLM2-135M)")
    parser.add_argument("--sft-states", type=int, default=96)
    parser.add_argument("--sft-lr", type=float, default=1e-4)
    parser.add_argument("--sft-batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--states-per-step", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--eval-states", type=int, default=52, help="0: every held-out state")
    parser.add_argument("--eval-samples", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--micro-batch-tokens", type=int, default=4096)
    parser.add_argument("--train-layers", type=int, default=6,
                        help="GRPO trains the top N decoder layers (engine.train_layers; 0: all)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0,
                        help="GRPO's states and sampling seeds")
    parser.add_argument("--sft-seed", type=int, default=0,
                        help="which train states the SFT warm start uses (its weights are "
                             "cached per setting)")
    parser.add_argument("--no-cache", action="store_true",
                        help="always run the SFT warm start and the evaluation before GRPO (by "
                             "default both are cached per data, model and setting)")
    args = parser.parse_args(argv)
    if args.record:
        out = record(Path(args.data))
    else:
        if min(args.steps, args.states_per_step, args.group_size, args.eval_samples) < 1 \
                or args.group_size < 2:
            parser.error("--steps, --states-per-step, --eval-samples must be >= 1 and "
                         "--group-size >= 2")
        if not Path(args.data).exists():
            parser.error(f"--data {args.data}: no such file (python -m benchmarks.learning "
                         "--record writes it)")
        out = run(args)
    print(json.dumps(out) if args.json else json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
