"""Supervised fine-tuning on teacher trajectories, with the loss on the action tokens only.

``python -m trainer.sft --data PATH.jsonl [--model default|FOLDER] --out FOLDER [--epochs 2]
[--lr 5e-5] [--max-tokens-per-batch 8192] [--micro-batch-tokens 4096] [--seed 0]
[--max-seq-len 4096] [--device auto|cpu|cuda] [--gradient-checkpointing] [--overwrite]``

Data: JSON lines as :mod:`datagen.export` writes them, one trajectory each with ``turns``. A
turn is trained as ``input = prompt + response``, ``labels = -100`` on every prompt token and
the ids on the response tokens, where

- a turn with ``prompt_ids`` and ``response_ids`` (token-faithful: the policy's own ids) is used
  as it is;
- a turn with only ``messages`` and ``completion`` (another OpenAI-compatible teacher) is
  tokenized here: ``messages`` through the chat template with the generation prompt, then the
  completion's tokens (both as plain text: a control string in them is ordinary tokens, as
  :class:`rollout_service.models.HFChatTokenizer` encodes it) and the template's end-of-turn
  token (SmolLM2: ``<|im_end|>``, what the policy samples to stop;
  :func:`rollout_service.models.end_of_turn_id` finds it).

Turns whose recorded ``action_error`` is not empty (the teacher's own mistakes) and turns longer
than ``max_seq_len`` are skipped and counted. A malformed line is a :class:`DataError` naming
the file, the line number and the field, raised before anything is written.

Training: AdamW, linear warm-up then cosine decay to a tenth of ``lr``, gradient clipping. One
optimizer step takes examples (shuffled per epoch, ``seed``) up to ``max_tokens_per_batch``
tokens; they run as micro-batches of at most ``micro_batch_tokens`` padded tokens with gradient
accumulation, the loss being the mean over every response token of the step (so the micro-batch
split does not change the gradient). Logits are computed only where a response token is
predicted (``logits_to_keep``): with 49k-token vocabularies and prompts of thousands of tokens
that is most of the memory.

Output: ``--out`` becomes a normal Hugging Face folder (model, tokenizer, chat template;
``generation_config`` also stops on the end-of-turn token) that
``AutoModelForCausalLM.from_pretrained`` and vLLM load, plus ``metrics.jsonl`` (one line per
step: loss, tokens, response_tokens, lr, grad_norm), ``sft_summary.json`` and, when the
training job gives the agent settings (:func:`train_sft`'s ``agent``), ``agent.json``.
Everything is written in a temporary folder beside ``--out`` and renamed at the end; a failed
run leaves no output folder.

In code: :func:`build_sft_example` and :func:`train_sft` (``SftConfig -> summary``); the training
job's SFT stage (export when needed, train, log the steps) is in :mod:`cluster.job`.
"""
from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import math
import os
import random
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from consolerl.config import AtLeast, Between, Checked
from consolerl.errors import ConfigError
from rollout_service.agent import AgentConfig
from rollout_service.models import (HFChatTokenizer, end_of_turn_id, resolve_model,
                                    write_agent_settings)

from .engine import freeze_below, top_layers

IGNORE = -100
ROLES = ("system", "user", "assistant", "tool")


class DataError(ConfigError):
    """A training data file is malformed; the message names the file, line and field."""


@dataclass(frozen=True)
class SftConfig(Checked):
    """``max_tokens_per_batch``: tokens per optimizer step; ``micro_batch_tokens``: padded
    tokens per forward/backward; ``device``: auto | cpu | cuda; ``gradient_checkpointing``:
    recompute activations in the backward pass (half the memory, twice the time on CPU);
    ``train_layers``: 0 trains every weight, N > 0 only the top N decoder layers (see
    :class:`trainer.engine.EngineConfig`); ``overwrite``: replace an existing ``out`` folder."""

    data: str = ""                 # required to train; "" only inside a root config
    out: str = ""
    model: str = "default"
    epochs: Annotated[int, AtLeast(1)] = 2
    lr: Annotated[float, Between(0, 1, low_open=True)] = 5e-5
    max_tokens_per_batch: Annotated[int, AtLeast(16)] = 8192
    micro_batch_tokens: Annotated[int, AtLeast(16)] = 4096
    max_seq_len: Annotated[int, AtLeast(8)] = 4096
    seed: int = 0
    weight_decay: Annotated[float, Between(0, 1)] = 0.0
    max_grad_norm: Annotated[float, AtLeast(0, open=True)] = 1.0
    warmup_ratio: Annotated[float, Between(0, 0.5)] = 0.05
    device: Literal["auto", "cpu", "cuda"] = "auto"
    gradient_checkpointing: bool = False
    train_layers: Annotated[int, AtLeast(0)] = 0
    overwrite: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("data", "out"):
            if not isinstance(getattr(self, name), str):
                raise ConfigError(f"SftConfig.{name}: must be a string")


# ---- examples ---------------------------------------------------------------------------------
def _token_ids(turn: Mapping[str, Any], name: str) -> list[int]:
    value = turn.get(name)
    if (not isinstance(value, list) or not value
            or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value)):
        raise DataError(f"field '{name}': must be a non-empty list of token ids "
                        f"(non-negative integers)")
    return value


def _messages(turn: Mapping[str, Any]) -> list[dict[str, str]]:
    messages = turn.get("messages")
    if not isinstance(messages, list) or not messages:
        raise DataError("field 'messages': must be a non-empty list of {role, content} "
                        "(or give 'prompt_ids' and 'response_ids')")
    for i, m in enumerate(messages):
        if (not isinstance(m, dict) or m.get("role") not in ROLES
                or not isinstance(m.get("content"), str)):
            raise DataError(f"field 'messages[{i}]': must be {{\"role\": one of "
                            f"{', '.join(ROLES)}, \"content\": a string}}")
    if messages[-1]["role"] == "assistant":
        raise DataError("field 'messages': the last message is the assistant's; the answer "
                        "to train on goes in 'completion'")
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def build_sft_example(record_turn: Mapping[str, Any], tokenizer,
                      end_of_turn: int | None = None) -> tuple[list[int], list[int]]:
    """``(input_ids, labels)`` of one turn: labels are ``-100`` on the prompt and the ids on
    the response. ``tokenizer``: a chat tokenizer with ``encode``
    (:class:`rollout_service.models.HFChatTokenizer`), used only for turns without ids;
    ``end_of_turn``: its end-of-turn id (found from the chat template when ``None``).
    Raises :class:`DataError` naming the bad field."""
    if not isinstance(record_turn, Mapping):
        raise DataError("must be an object with 'prompt_ids' and 'response_ids', or "
                        "'messages' and 'completion'")
    if "prompt_ids" in record_turn or "response_ids" in record_turn:
        prompt = _token_ids(record_turn, "prompt_ids")
        response = _token_ids(record_turn, "response_ids")
    else:
        messages = _messages(record_turn)
        completion = record_turn.get("completion")
        if not isinstance(completion, str) or not completion.strip():
            raise DataError("field 'completion': must be a non-empty string")
        eot = end_of_turn if end_of_turn is not None else end_of_turn_id(tokenizer)
        prompt = list(tokenizer.apply_chat_template(messages, tokenize=True,
                                                    add_generation_prompt=True))
        response = list(tokenizer.encode(completion)) + [eot]
    return prompt + response, [IGNORE] * len(prompt) + response


@dataclass
class Example:
    input_ids: list[int]
    labels: list[int]
    line: int
    turn: int

    @property
    def response_tokens(self) -> int:
        return sum(1 for t in self.labels if t != IGNORE)


def load_examples(path: str | Path, tokenizer, max_seq_len: int,
                  end_of_turn: int | None = None) -> tuple[list[Example], dict[str, int]]:
    """Every trainable turn of the JSONL file, and counts (records, turns, skipped)."""
    path = Path(path)
    stats = {"records": 0, "turns": 0, "skipped_action_error": 0, "skipped_too_long": 0}
    examples: list[Example] = []
    try:
        handle = path.open(encoding="utf-8")
    except OSError as exc:
        raise DataError(f"{path}: cannot read: {exc.strerror}") from None
    with handle:
        for n, raw in enumerate(handle, 1):
            if not raw.strip():
                continue
            where = f"{path}: line {n}"
            try:
                record = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise DataError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})"
                                ) from None
            if not isinstance(record, dict):
                raise DataError(f"{where}: must be a JSON object with field 'turns'")
            turns = record.get("turns")
            if not isinstance(turns, list) or not turns:
                raise DataError(f"{where}: field 'turns': must be a non-empty list")
            reward = record.get("reward", 1.0)
            if isinstance(reward, bool) or not isinstance(reward, (int, float)):
                raise DataError(f"{where}: field 'reward': must be a number, got {reward!r}")
            for key in ("trajectory_id", "task_id"):
                if key in record and not isinstance(record[key], str):
                    raise DataError(f"{where}: field '{key}': must be a string")
            stats["records"] += 1
            for i, turn in enumerate(turns):
                stats["turns"] += 1
                try:
                    ids, labels = build_sft_example(turn, tokenizer, end_of_turn)
                except DataError as exc:
                    raise DataError(f"{where}: turns[{i}]: {exc}") from None
                error = turn.get("action_error", "")
                if not isinstance(error, str):
                    raise DataError(f"{where}: turns[{i}]: field 'action_error': must be a "
                                    "string")
                if error:
                    stats["skipped_action_error"] += 1
                elif len(ids) > max_seq_len:
                    stats["skipped_too_long"] += 1
                else:
                    examples.append(Example(ids, labels, n, i))
    if not examples:
        raise DataError(f"{path}: no trainable turn ({stats['records']} records, "
                        f"{stats['turns']} turns, {stats['skipped_action_error']} with an "
                        f"action error, {stats['skipped_too_long']} over max_seq_len)")
    return examples, stats


# ---- batches ----------------------------------------------------------------------------------
def plan_steps(lengths: Sequence[int], max_tokens_per_batch: int, micro_batch_tokens: int,
               epochs: int, seed: int) -> list[tuple[int, list[list[int]]]]:
    """``[(epoch, micro-batches of example indices)]`` per optimizer step: each epoch a new
    shuffle, steps of at most ``max_tokens_per_batch`` tokens (an example longer than that
    alone), micro-batches of similar lengths within at most ``micro_batch_tokens`` padded."""
    rng = random.Random(seed)
    steps: list[tuple[int, list[list[int]]]] = []
    for epoch in range(epochs):
        order = list(range(len(lengths)))
        rng.shuffle(order)
        batch: list[int] = []
        used = 0
        for i in order:
            if batch and used + lengths[i] > max_tokens_per_batch:
                steps.append((epoch, _micro_batches(batch, lengths, micro_batch_tokens)))
                batch, used = [], 0
            batch.append(i)
            used += lengths[i]
        if batch:
            steps.append((epoch, _micro_batches(batch, lengths, micro_batch_tokens)))
    return steps


def _micro_batches(batch: list[int], lengths: Sequence[int], budget: int) -> list[list[int]]:
    micro: list[list[int]] = []
    for i in sorted(batch, key=lambda j: -lengths[j]):
        # Sorted longest first, so the group's first item sets its padded length.
        if micro and (len(micro[-1]) + 1) * lengths[micro[-1][0]] <= budget:
            micro[-1].append(i)
        else:
            micro.append([i])
    return micro


def lr_factor(step: int, total: int, warmup: int, floor: float = 0.1) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine from 1 down to ``floor``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def micro_batch_loss(model, examples: Sequence[Example], pad_id: int, device: str,
                     keep_logits: bool = True):
    """Summed cross-entropy over the response tokens of ``examples`` (right-padded), and
    their count. Logits are computed only at the positions that predict a response token."""
    import torch
    import torch.nn.functional as F

    width = max(len(e.input_ids) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE, dtype=torch.long)
    for row, e in enumerate(examples):
        ids[row, :len(e.input_ids)] = torch.tensor(e.input_ids)
        mask[row, :len(e.input_ids)] = 1
        labels[row, :len(e.labels)] = torch.tensor(e.labels)
    # Position p - 1 predicts the token at p.
    keep = torch.nonzero((labels[:, 1:] != IGNORE).any(dim=0)).flatten()
    targets = labels[:, keep + 1].to(device)
    ids, mask = ids.to(device), mask.to(device)
    if keep_logits:
        logits = model(input_ids=ids, attention_mask=mask, use_cache=False,
                       logits_to_keep=keep.to(device)).logits
    else:
        logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits[:, keep.to(
            device)]
    loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1),
                           ignore_index=IGNORE, reduction="sum")
    return loss, int((targets != IGNORE).sum())


# ---- training ---------------------------------------------------------------------------------
def _progress(msg: str) -> None:
    print(f"[sft] {msg}", file=sys.stderr, flush=True)


def _peak_memory_mb(device: str) -> dict[str, float]:
    import torch
    peak = {"peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}
    if device == "cuda":
        peak["peak_gpu_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return peak


def train_sft(config: SftConfig, agent: AgentConfig | None = None) -> dict[str, Any]:
    """Train, save the folder atomically, return the summary (also in ``sft_summary.json``).
    ``agent``: the agent settings the data's prompts were built with, kept in the folder's
    ``agent.json`` (:func:`rollout_service.models.write_agent_settings`); None writes none."""
    import torch
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM

    t0 = time.monotonic()
    for name in ("data", "out"):
        if not getattr(config, name):
            raise ConfigError(f"SftConfig.{name}: required")
    out = Path(config.out)
    if out.exists() and not config.overwrite:
        raise ConfigError(f"SftConfig.out: {out} exists (choose another folder or overwrite)")
    source = resolve_model(config.model)
    tokenizer = HFChatTokenizer(source)
    eot = end_of_turn_id(tokenizer)
    examples, stats = load_examples(config.data, tokenizer, config.max_seq_len, eot)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if config.device == "auto" \
        else config.device
    torch.manual_seed(config.seed)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).to(device)
    if config.gradient_checkpointing:
        model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": False})
    trained = top_layers(model, config.train_layers)
    if trained is not None:
        freeze_below(model, trained)
    vocab = model.get_input_embeddings().num_embeddings
    for e in examples:
        if max(e.input_ids) >= vocab:
            raise DataError(f"{config.data}: line {e.line}: turns[{e.turn}]: a token id "
                            f"{max(e.input_ids)} is outside the model's vocabulary ({vocab})")
    keep_logits = "logits_to_keep" in inspect.signature(model.forward).parameters
    pad_id = tokenizer.tokenizer.pad_token_id if tokenizer.tokenizer.pad_token_id is not None \
        else eot
    steps = plan_steps([len(e.input_ids) for e in examples], config.max_tokens_per_batch,
                       config.micro_batch_tokens, config.epochs, config.seed)
    warmup = math.ceil(config.warmup_ratio * len(steps))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                                  lr=config.lr, weight_decay=config.weight_decay,
                                  betas=(0.9, 0.95))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.sft-"))
    _progress(f"{len(examples)} turns of {stats['records']} records, {len(steps)} steps on "
              f"{device}; writing {tmp} (renamed to {out} at the end)")
    losses: list[float] = []
    tokens = trained = 0
    try:
        model.train()
        bar = tqdm(total=len(steps), desc="sft", unit="step", file=sys.stderr, mininterval=1.0)
        with (tmp / "metrics.jsonl").open("a", encoding="utf-8") as metrics:
            for index, (epoch, micro) in enumerate(steps):
                batch = [examples[i] for group in micro for i in group]
                step_tokens = sum(e.response_tokens for e in batch)
                lr = config.lr * lr_factor(index, len(steps), warmup)
                step_loss, grad_norm = _optimizer_step(
                    model, optimizer, lr, [[examples[i] for i in g] for g in micro],
                    step_tokens, config.max_grad_norm, pad_id, device, keep_logits)
                losses.append(step_loss)
                seen = sum(len(e.input_ids) for e in batch)
                tokens += seen
                trained += step_tokens
                metrics.write(json.dumps({
                    "step": index + 1, "epoch": epoch + 1, "loss": round(step_loss, 6),
                    "tokens": seen, "response_tokens": step_tokens, "lr": lr,
                    "grad_norm": round(grad_norm, 6),
                    "elapsed_s": round(time.monotonic() - t0, 2)}) + "\n")
                metrics.flush()
                bar.update(1)
                bar.set_postfix(loss=f"{step_loss:.4f}", epoch=epoch + 1)
        bar.close()
        model.eval()
        _stop_on(model, eot)
        model.save_pretrained(tmp)
        tokenizer.tokenizer.save_pretrained(tmp)
        if agent is not None:
            write_agent_settings(tmp, agent)
        summary = {
            "records": stats["records"], "turns": stats["turns"],
            "turns_trained": len(examples),
            "turns_skipped": {"action_error": stats["skipped_action_error"],
                              "too_long": stats["skipped_too_long"]},
            "epochs": config.epochs, "steps": len(steps), "tokens_processed": tokens,
            "tokens_trained": trained, "first_loss": round(losses[0], 6),
            "last_loss": round(losses[-1], 6), "wall_s": round(time.monotonic() - t0, 1),
            **_peak_memory_mb(device), "device": device, "model": source, "out": str(out),
            "end_of_turn_id": eot,
            "end_of_turn_token": tokenizer.decode([eot], skip_special_tokens=False),
            "config": asdict(config)}
        (tmp / "sft_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        _normal_modes(tmp)
        if out.exists():
            old = out.with_name(f".{out.name}.old-{tmp.name.rsplit('-', 1)[-1]}")
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _progress(f"done: loss {summary['first_loss']:.4f} -> {summary['last_loss']:.4f}, "
              f"{summary['wall_s']} s, saved {out}")
    return summary


def _optimizer_step(model, optimizer, lr: float, micro: list[list[Example]], step_tokens: int,
                    max_grad_norm: float, pad_id: int, device: str, keep_logits: bool
                    ) -> tuple[float, float]:
    """One step over micro-batches (gradients accumulated, each micro-batch's summed loss
    divided by the step's response tokens); returns the step's mean loss and gradient norm."""
    import torch
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.zero_grad(set_to_none=True)
    # bf16 autocast on GPUs that have it (float32 master weights); plain float32 on CPU.
    bf16 = device == "cuda" and torch.cuda.is_bf16_supported()
    total = 0.0
    for examples in micro:
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            loss, _ = micro_batch_loss(model, examples, pad_id, device, keep_logits)
        (loss / step_tokens).backward()
        total += float(loss.detach())
    params = [p for group in optimizer.param_groups for p in group["params"]]
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_grad_norm))
    optimizer.step()
    return total / step_tokens, grad_norm


def _normal_modes(folder: Path) -> None:
    """mkdtemp (and the safetensors writer) make owner-only files; a model folder is shared
    with serving processes, so give it the modes a plain mkdir/open would have."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for item in folder.iterdir():
        item.chmod(0o666 & ~umask)


def _stop_on(model, eot: int) -> None:
    """The saved model's generation stops on the end-of-turn token it was trained to emit."""
    current = model.generation_config.eos_token_id
    ids = list(current) if isinstance(current, (list, tuple)) else (
        [] if current is None else [current])
    if eot not in ids:
        model.generation_config.eos_token_id = ids + [eot] if ids else eot


def parse_args(argv: Sequence[str] | None = None) -> SftConfig:
    default = {f.name: f.default for f in dataclasses.fields(SftConfig)}
    parser = argparse.ArgumentParser(prog="python -m trainer.sft",
                                     description="Supervised fine-tuning on action tokens.")
    parser.add_argument("--data", required=True, help="JSONL of trajectories")
    parser.add_argument("--model", default=default["model"],
                        help="default (SmolLM2) or a folder")
    parser.add_argument("--out", required=True, help="the model folder to write")
    for name, kind, text in (
            ("epochs", int, None), ("lr", float, None),
            ("max_tokens_per_batch", int, "tokens per optimizer step"),
            ("micro_batch_tokens", int,
             "padded tokens per forward/backward (gradient accumulation)"),
            ("max_seq_len", int, None), ("seed", int, None), ("weight_decay", float, None),
            ("max_grad_norm", float, None), ("warmup_ratio", float, None),
            ("train_layers", int, "train only the top N decoder layers (0: every weight)")):
        parser.add_argument("--" + name.replace("_", "-"), type=kind, default=default[name],
                            help=text)
    parser.add_argument("--device", default=default["device"], choices=("auto", "cpu", "cuda"))
    parser.add_argument("--gradient-checkpointing", action="store_true",
                        help="recompute activations in the backward pass (less memory)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    args = parser.parse_args(argv)
    try:
        return SftConfig(**{k.replace("-", "_"): v for k, v in vars(args).items()})
    except ConfigError as exc:
        parser.error(str(exc))
        raise


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(argv)
    try:
        summary = train_sft(config)
    except ConfigError as exc:                   # bad data or settings: no traceback needed
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({k: v for k, v in summary.items() if k != "config"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
