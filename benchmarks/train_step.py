"""What one GRPO optimizer step costs on this machine: ``python -m benchmarks.train_step --json``.

The step is the trainer worker's own (:class:`trainer.engine.TrainerWorker.step`, in this
process, both cores) on a batch shaped like the job's: ``--turns`` rows (default 24) whose
prompts are the agent's real prompt (its system prompt, a task and an accessibility tree) cut to
~``--prompt-tokens`` tokens each (±5%), responses of ~10 tokens, rewards mixed within each group
so that every row carries a gradient. Three settings, each on fresh weights:

- ``fp32``: full fine-tuning, fp32;
- ``bf16``: full fine-tuning under bf16 autocast (fp32 master weights);
- ``lora_bf16``: LoRA rank 16 on every linear layer, under bf16 autocast;
- ``top6``: the top 6 decoder layers trained (``engine.train_layers: 6``), bf16 autocast where
  the device has it natively (``autocast: auto``).

Every setting runs the prompt prefix its rows share once (``engine.share_prefix``, on by
default; ``--no-share-prefix`` to measure without). On a CPU without native bf16 (no
AVX512-BF16 or AMX) the bf16 settings are not stepped in full (emulated bf16 is an order of
magnitude slower than fp32; one such step would take most of an hour): their entry says so and
gives the fp32 and bf16 times of the short warm-up batch instead (``--emulated-bf16`` steps
them anyway).

Each is timed ``alone`` and ``with_rollout``: a vLLM policy (``.venv-vllm``; skipped with a note
when absent) generating for ``--rollouts`` concurrent episodes beside the step, with new ~850
token prompts and 12-token replies as env workers send them. ``with_rollout_s`` is the step with
generation paused for it (``trainer.pause_generation``, what the CPU configs do);
``contended_s`` the step with generation running through it (the ``--contend`` settings only:
on 2 cores such a step takes several times longer). ``pause_vs_contend`` says which
finishes the same work sooner: the contended step's time, against the paused step plus the time
the policy then needs, alone, for the tokens it generated during the contended step.

Prints one JSON object: ``{"fp32": {"alone_s", "with_rollout_s"}, "bf16": {...}, "lora_bf16":
{...}, "top6": {..., "contended_s"}, "peak_rss_gib", "native_bf16", "pause_vs_contend", ...}``;
step times are
medians of ``--repeats`` steps after a short warm-up step.
"""
from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import sys
import threading
import time
from dataclasses import replace
from typing import Any

from consolerl.experience import Group, Sample, Turn
from rollout_service.agent import SYSTEM_PROMPT, SamplingParams
from rollout_service.models import HFChatTokenizer, resolve_model
from trainer.algo import AlgoConfig, TrainBatch, build_batch
from trainer.engine import EngineConfig, LoraConfig, TrainerWorker, native_bf16

SETTINGS = {
    "fp32": EngineConfig(autocast="off"),
    "bf16": EngineConfig(autocast="bfloat16"),
    "lora_bf16": EngineConfig(autocast="bfloat16", lora=LoraConfig(
        rank=16, alpha=32, target_modules=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                           "up_proj", "down_proj"))),
    "top6": EngineConfig(autocast="auto", train_layers=6),
}
REPLIES = ('click(12)', 'fill(31, "alice-ops")', 'select(40, "cn-hangzhou")', 'click(7)',
           'press("Enter")', 'stop("done")')


def _progress(msg: str) -> None:
    print(f"[train-step] {msg}", file=sys.stderr, flush=True)


def _page(rng: random.Random, n: int) -> str:
    """An accessibility tree like the console's: rows of links, buttons, fields and text."""
    kinds = ("link", "button", "textbox", "combobox", "cell", "text", "heading")
    words = ("User", "AccessKey", "Policy", "Group", "Role", "Create", "Delete", "Attach",
             "Instance", "Security group", "Rule", "Bucket", "Region", "Status", "Actions",
             "Display name", "Description", "Next", "OK", "Cancel", "Search", "Filter")
    return "\n".join(f"[{i}] {rng.choice(kinds)} '{rng.choice(words)} {rng.choice(words)}'"
                     for i in range(n))


def prompts(tokenizer: HFChatTokenizer, count: int, tokens: int, seed: int) -> list[list[int]]:
    """``count`` agent prompts of ``tokens`` ±5% tokens each (cut at the page's end)."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        target = int(tokens * rng.uniform(0.95, 1.05))
        user = ("Task: create a RAM user named alice-ops with console access.\nProcedure:\n"
                "1. Open RAM > Users.\n2. Click Create User.\n3. Fill the logon name.\n"
                "Recent actions:\n(none)\nPage: https://console.local/ram/users\n"
                + _page(rng, 400))
        ids = tokenizer.apply_chat_template([{"role": "system", "content": SYSTEM_PROMPT},
                                             {"role": "user", "content": user}])
        out.append(list(ids[:target]))
    return out


def batch_of(tokenizer: HFChatTokenizer, turns: int, tokens: int, group_size: int = 4,
             seed: int = 0) -> TrainBatch:
    """``turns`` one-turn samples in groups of ``group_size``, rewards alternating 1, 0 within
    each group (every row has a non-zero advantage)."""
    rng = random.Random(seed)
    groups, samples = [], []
    for i, prompt in enumerate(prompts(tokenizer, turns, tokens, seed)):
        reply = tokenizer.tokenizer.encode(rng.choice(REPLIES), add_special_tokens=False)
        reply = reply + [tokenizer.tokenizer.eos_token_id or 0]
        turn = Turn(tuple(prompt), tuple(reply), tuple(-1.0 for _ in reply),
                    tuple(1 for _ in reply), 0, "", "")
        samples.append(Sample(f"s{i}", (turn,), float(i % 2)))
        if len(samples) == group_size:
            groups.append(Group(f"g{len(groups)}", "bench", tuple(samples)))
            samples = []
    if samples:
        groups.append(Group(f"g{len(groups)}", "bench", tuple(samples)))
    pad = tokenizer.tokenizer.pad_token_id
    return build_batch(groups, pad if pad is not None else 0, AlgoConfig())


class Generator:
    """``concurrency`` episodes asking the policy for replies back to back, each with a fresh
    prompt (a new page, the same system prompt: what the prefix cache sees in a rollout; a
    reused prompt would be served from vLLM's prefix cache and look several times faster)."""

    def __init__(self, engine: Any, tokenizer: HFChatTokenizer, concurrency: int, tokens: int):
        self.engine, self.concurrency = engine, concurrency
        self.tokenizer, self.prompt_tokens = tokenizer, tokens
        self.running = threading.Event()
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.generated = 0
        self.threads = [threading.Thread(target=self._loop, args=(i,), daemon=True)
                        for i in range(concurrency)]

    def _loop(self, i: int) -> None:
        rng = random.Random(i)
        while not self.stop.is_set():
            if not self.running.wait(0.2):
                continue
            prompt = prompts(self.tokenizer, 1, self.prompt_tokens,
                             seed=10**6 * (i + 1) + rng.randrange(10**6))[0]
            gen = self.engine.generate(prompt, SamplingParams(12, 1.0, seed=rng.randrange(10**6)))
            with self.lock:
                self.generated += len(gen.token_ids)

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def tokens(self) -> int:
        with self.lock:
            return self.generated

    def rate(self, seconds: float) -> float:
        """Tokens per second generating alone, measured over ``seconds``."""
        self.running.set()
        time.sleep(2.0)                          # in-flight requests settle
        n0, t0 = self.tokens(), time.perf_counter()
        time.sleep(seconds)
        return (self.tokens() - n0) / (time.perf_counter() - t0)


def _step(worker: TrainerWorker, batch: TrainBatch) -> float:
    t0 = time.perf_counter()
    worker.step(batch, int(batch.num_tokens()), int(batch.num_seqs()))
    return time.perf_counter() - t0


def probe_bf16(model: str, warm: TrainBatch, engine: EngineConfig) -> dict[str, Any]:
    """fp32 against emulated bf16 on two rows of the warm-up batch (after one fp32 step; an
    emulated bf16 step of them takes about a minute, so it is timed once, unwarmed)."""
    times = {}
    probe = warm.rows([0, 1])
    for name, autocast in (("fp32", "off"), ("bf16", "bfloat16")):
        worker = TrainerWorker(0, 1, model, replace(engine, autocast=autocast),
                                   AlgoConfig())
        worker.init_distributed("")
        if name == "fp32":
            _step(worker, probe)
        times[name] = round(_step(worker, probe), 2)
        _progress(f"bf16 probe: {name} {times[name]} s")
    return {"skipped": "no native bf16 on this CPU (no avx512_bf16 or amx_bf16): emulated bf16 "
                       f"took {times['bf16'] / max(times['fp32'], 1e-9):.0f}x the fp32 time on "
                       f"the same two short rows",
            "probe_fp32_s": times["fp32"], "probe_bf16_s": times["bf16"],
            "probe_tokens": int(probe.attention_mask_BT.sum())}


def run_setting(name: str, engine: EngineConfig, model: str, batch: TrainBatch,
                warm: TrainBatch, repeats: int, gen: Generator | None,
                contend: bool = True) -> dict[str, Any]:
    worker = TrainerWorker(0, 1, model, engine, AlgoConfig())
    worker.init_distributed("")
    if gen is not None:
        gen.running.clear()
    _step(worker, warm)
    out: dict[str, Any] = {"autocast": worker.autocast is not None}
    alone = [_step(worker, batch) for _ in range(repeats)]
    out["alone_s"] = round(statistics.median(alone), 2)
    _progress(f"{name}: alone {alone}")
    if gen is not None:
        paused, contended, tokens = [], [], []
        for _ in range(repeats):
            gen.running.set()
            time.sleep(3.0)                      # generation under way, as in a rollout
            gen.running.clear()                  # trainer.pause_generation
            paused.append(_step(worker, batch))
            if not contend:
                continue
            gen.running.set()
            time.sleep(3.0)
            n0 = gen.tokens()
            contended.append(_step(worker, batch))
            tokens.append(gen.tokens() - n0)
        gen.running.clear()
        out["with_rollout_s"] = round(statistics.median(paused), 2)
        if contended:
            out["contended_s"] = round(statistics.median(contended), 2)
            out["tokens_generated_while_contended"] = int(statistics.median(tokens))
        _progress(f"{name}: paused {paused}, contended {contended} ({tokens} tokens)")
    out["steps"] = repeats
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.train_step")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--model", default="", help="model folder (default: SmolLM2-135M)")
    parser.add_argument("--turns", type=int, default=24)
    parser.add_argument("--prompt-tokens", type=int, default=850)
    parser.add_argument("--repeats", type=int, default=1, help="timed steps per setting")
    parser.add_argument("--micro-batch-tokens", type=int, default=4096)
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--rollouts", type=int, default=2,
                        help="concurrent episodes generating beside the step (0: none)")
    parser.add_argument("--contend", default="top6",
                        help="comma-separated settings also stepped with generation running "
                             "through the step (contended_s; slow: the two fight for the cores)")
    parser.add_argument("--no-share-prefix", action="store_true",
                        help="run every row's whole prompt (engine.share_prefix: false)")
    parser.add_argument("--emulated-bf16", action="store_true",
                        help="step the bf16 settings in full on a CPU without native bf16")
    parser.add_argument("--settings", default=",".join(SETTINGS),
                        help="comma-separated subset of " + ", ".join(SETTINGS))
    args = parser.parse_args(argv)
    names = [s for s in args.settings.split(",") if s]
    contend = {s for s in args.contend.split(",") if s}
    if not names or any(s not in SETTINGS for s in names) or min(args.turns, args.repeats) < 1:
        parser.error(f"--settings: names from {', '.join(SETTINGS)}; --turns and --repeats "
                     ">= 1")
    import torch
    torch.set_num_threads(2)
    model = str(resolve_model(args.model))
    tokenizer = HFChatTokenizer(model)
    batch = batch_of(tokenizer, args.turns, args.prompt_tokens)
    warm = batch_of(tokenizer, 4, 200, seed=1)
    _progress(f"{args.turns} turns, {batch.num_tokens()} trained tokens, prompts "
              f"{int(batch.attention_mask_BT.sum())} tokens in all; native bf16: "
              f"{native_bf16('cpu')}")
    gen, engine, notes = None, None, []
    rate = None
    if args.rollouts:
        from rollout_service.policy import PolicyConfig, make_engine
        from rollout_service.vllm_engine import vllm_python
        try:
            vllm_python()
            engine = make_engine(PolicyConfig(model=model, backend="vllm", kv_cache_gib=1.0,
                                              max_model_len=2048, enforce_eager=True))
        except Exception as exc:  # noqa: BLE001 - no vLLM here: the alone figures still stand
            notes.append(f"no rollout beside the step: {exc}")
        if engine is not None:
            gen = Generator(engine, tokenizer, args.rollouts, args.prompt_tokens)
            gen.start()
            rate = gen.rate(30.0)
            gen.running.clear()
            _progress(f"policy alone: {rate:.1f} tokens/s over {args.rollouts} episodes")
    results: dict[str, Any] = {}
    native = native_bf16("cpu")
    probe: dict[str, Any] | None = None
    try:
        for name in names:
            cfg = replace(SETTINGS[name], micro_batch_tokens=args.micro_batch_tokens,
                          gradient_checkpointing=args.gradient_checkpointing,
                          share_prefix=not args.no_share_prefix)
            if cfg.autocast == "bfloat16" and not native and not args.emulated_bf16:
                probe = probe or probe_bf16(model, warm, cfg)
                results[name] = dict(probe)
                continue
            results[name] = run_setting(name, cfg, model, batch, warm, args.repeats, gen,
                                        contend=name in contend)
    finally:
        if gen is not None:
            gen.stop.set()
            gen.running.set()
            for t in gen.threads:
                t.join(timeout=60)
        if engine is not None:
            engine.close()
    out: dict[str, Any] = dict(results)
    out["peak_rss_gib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)
    out["native_bf16"] = native
    if rate:
        out["policy_tokens_per_s_alone"] = round(rate, 2)
        out["pause_vs_contend"] = {
            name: {"paused_s": round(r["with_rollout_s"]
                                     + r["tokens_generated_while_contended"] / rate, 2),
                   "contended_s": r["contended_s"]}
            for name, r in results.items() if "contended_s" in r}
    out.update(turns=args.turns, prompt_tokens=args.prompt_tokens,
               trained_tokens=int(batch.num_tokens()),
               micro_batch_tokens=args.micro_batch_tokens,
               gradient_checkpointing=args.gradient_checkpointing,
               share_prefix=not args.no_share_prefix, repeats=args.repeats,
               rollouts=args.rollouts if gen is not None else 0, threads=2, notes=notes)
    print(json.dumps(out) if args.json else json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
