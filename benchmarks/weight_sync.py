"""Weights into a running policy, the old path against the collective one:
``python -m benchmarks.weight_sync --json``.

A synthetic Llama-shaped model of ~``--target-gb`` (fp32; random weights, the default model's
tokenizer) is written to a temp folder and served by one PolicyServer (a Ray actor; vLLM from
``.venv-vllm`` with ``--kv-cache-gib`` of KV cache, or ``--backend transformers``). This
process plays the trainer's rank 0: it holds a state dict of the model's names and shapes and
delivers it, ``--updates`` times per path, alternating the paths:

- ``old``: exactly what production does with ``trainer.weights.transport: object_store``: the
  state dict into Ray's object store (``ray.put``), ``PolicyServer.update_weights`` takes it
  from there, the engine writes a safetensors file (``/dev/shm``) and vLLM loads it;
- ``collective``: what ``transport: collective`` does: the state dict streamed over a gloo
  group between this process and the engine's workers
  (:mod:`rollout_service.weight_transfer`, chunks of ``--chunk-mib``), loaded chunk by chunk.

Each update is timed end to end, from the call to the replica reporting the new version;
``s_per_update`` is the median, ``gb_per_s`` the state's size over it. The group is formed
once before the first collective update (``open_s``, not in the updates). After each path's
last update a greedy generation checks that both paths left the same weights in use
(``same_generation``). ``--model PATH --train-layers N`` measures a real model's partial
update instead (what ``trainer.engine.train_layers: N`` publishes).

Prints one JSON object: ``state_gb``, ``old`` and ``collective`` (``gb_per_s``,
``s_per_update``, ``runs_s``), ``open_s``, ``receiver``, ``same_generation``, ``chunk_mib``,
``peak_rss_gib`` (this process) and ``estimate_gpu`` (a figure from link speeds, not measured).
"""
from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import ray
import torch

from cluster.replicas import policy_options
from consolerl.tensors import PartialWeights
from rollout_service.agent import SamplingParams
from rollout_service.models import default_model, resolve_model
from rollout_service.policy import PolicyConfig, PolicyServerActor
from rollout_service.weight_transfer import WeightSender

# NVLink 4 (H100 SXM): 450 GB/s per direction per GPU (NVIDIA's H100 datasheet); NCCL's
# broadcast reaches roughly 80% of it in its own benchmarks. InfiniBand NDR: 400 Gb/s = 50 GB/s
# per port. Estimates for a bf16 7B model (15.2 GB), not measurements.
GPU_LINKS = {"nvlink4_h100": 450.0 * 0.8, "infiniband_ndr_400g": 50.0 * 0.8}
GB_7B_BF16 = 15.2


def _progress(msg: str) -> None:
    print(f"[weight-sync] {msg}", file=sys.stderr, flush=True)


def synthetic_model(folder: Path, target_gb: float) -> Path:
    """A Llama-shaped model of about ``target_gb`` in fp32 with random weights (std 0.02) and
    the default model's tokenizer, written to ``folder``."""
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    source = default_model()
    hidden, inter, vocab = 1536, 4096, 49152
    per_layer = 2 * hidden * hidden + 2 * hidden * 512 + 3 * hidden * inter + 2 * hidden
    layers = max(1, round((target_gb * 1e9 / 4 - vocab * hidden) / per_layer))
    config = LlamaConfig(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                         num_attention_heads=12, num_key_value_heads=4, head_dim=128,
                         vocab_size=vocab, max_position_embeddings=2048,
                         tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
                         pad_token_id=2, dtype="float32")
    folder.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(folder)
    for f in source.iterdir():
        if f.name.startswith("tokenizer") or f.name in ("chat_template.jinja",
                                                        "generation_config.json"):
            shutil.copy(f, folder / f.name)
    from transformers import LlamaForCausalLM
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in LlamaForCausalLM(config).state_dict().items()
                  if k != "lm_head.weight"}
    gen = torch.Generator().manual_seed(0)
    state = {k: (torch.ones(s) if k.endswith("norm.weight")
                 else torch.randn(s, generator=gen) * 0.02) for k, s in shapes.items()}
    save_file(state, str(folder / "model.safetensors"))
    return folder


def _state(model: Path, train_layers: int) -> dict[str, Any]:
    """The model's own tensors (what a trainer would publish), or its top ``train_layers``
    decoder layers and final norm as :class:`PartialWeights`."""
    from safetensors.torch import load_file
    state = load_file(str(model / "model.safetensors"))
    if not train_layers:
        return state
    top = max(int(k.split(".")[2]) for k in state if k.startswith("model.layers."))
    keep = tuple(f"model.layers.{i}." for i in range(top - train_layers + 1, top + 1))
    return PartialWeights({k: v for k, v in state.items()
                           if k.startswith(keep) or k == "model.norm.weight"})


def _median(runs: list[float], gb: float) -> dict[str, Any]:
    s = statistics.median(runs)
    return {"gb_per_s": round(gb / s, 3), "s_per_update": round(s, 3),
            "runs_s": [round(r, 3) for r in runs]}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.add_argument("--target-gb", type=float, default=2.0)
    p.add_argument("--model", default="", help="a model folder instead of the synthetic one")
    p.add_argument("--train-layers", type=int, default=0)
    p.add_argument("--backend", choices=("vllm", "transformers"), default="vllm")
    p.add_argument("--updates", type=int, default=3)
    p.add_argument("--chunk-mib", type=int, default=256)
    p.add_argument("--kv-cache-gib", type=float, default=0.25)
    args = p.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="consolerl-weight-sync-"))
    try:
        if args.model:
            model = Path(resolve_model(args.model))
        else:
            _progress(f"writing a synthetic ~{args.target_gb:g} GB model to {tmp}")
            model = synthetic_model(tmp / "model", args.target_gb)
        state = _state(model, args.train_layers)
        gb = sum(t.numel() * t.element_size() for t in state.values()) / 1e9
        _progress(f"state: {len(state)} tensors, {gb:.2f} GB; starting the {args.backend} "
                  "policy")
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
                 object_store_memory=int((gb + 1) * 1e9))
        try:
            return _run(args, model, state, gb)
        finally:
            ray.shutdown()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _run(args: argparse.Namespace, model: Path, state: dict[str, Any],
         gb: float) -> dict[str, Any]:
    config = PolicyConfig(model=str(model), backend=args.backend, dtype="float32",
                          max_model_len=512, kv_cache_gib=args.kv_cache_gib,
                          enforce_eager=True, seed=0)
    options = policy_options(config)
    server = PolicyServerActor.options(**options).remote(config, None, None, "bench")
    t0 = time.perf_counter()
    ray.get(server.version.remote(), timeout=1800)
    _progress(f"policy up in {time.perf_counter() - t0:.0f} s")
    partial = isinstance(state, PartialWeights)
    prompt = [1, 504, 3458, 28, 253, 1345, 30]
    greedy = SamplingParams(8, 0.0)

    sender = WeightSender("127.0.0.1")
    info = ray.get(server.weight_receivers.remote())
    t0 = time.perf_counter()
    spec = sender.open("bench", 1 + info["ranks"], "gloo", 300.0)
    ray.get(server.open_weight_group.remote(spec), timeout=600)
    sender.group("bench")
    open_s = time.perf_counter() - t0

    def old(version: int) -> float:
        t = time.perf_counter()
        ref = ray.put(state)
        ray.get(server.update_weights.remote(version, ref), timeout=1800)
        seconds = time.perf_counter() - t
        del ref
        return seconds

    def collective(version: int) -> float:
        t = time.perf_counter()
        ref = server.receive_weights.remote(version, "bench")
        out = sender.send(state.items(), ["bench"], info["dtype"], args.chunk_mib * 2**20,
                          partial)
        if not out["bench"]["ok"]:
            raise RuntimeError(out["bench"]["error"])
        ray.get(ref, timeout=1800)
        return time.perf_counter() - t

    runs: dict[str, list[float]] = {"old": [], "collective": []}
    generations: dict[str, Any] = {}
    version = 0
    for i in range(args.updates):
        for name, path in (("old", old), ("collective", collective)) if i % 2 == 0 else \
                (("collective", collective), ("old", old)):
            version += 1
            runs[name].append(path(version))
            _progress(f"update {version} by {name}: {runs[name][-1]:.2f} s")
            generations[name] = ray.get(server.generate.remote(prompt, greedy))
    ray.get(server.shutdown.remote(), timeout=120)
    same = generations["old"].token_ids == generations["collective"].token_ids and \
        generations["old"].logprobs == generations["collective"].logprobs
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return {
        "state_gb": round(gb, 3),
        "old": _median(runs["old"], gb),
        "collective": _median(runs["collective"], gb),
        "open_s": round(open_s, 3),
        "receiver": f"{args.backend} PolicyServer (Ray actor), fp32, "
                    f"{'partial: top ' + str(args.train_layers) + ' layers' if partial else 'whole model'}",
        "model": str(model) if args.model else f"synthetic Llama ({len(state)} tensors)",
        "same_generation": same,
        "chunk_mib": args.chunk_mib,
        "peak_rss_gib": round(peak, 2),
        "estimate_gpu": {
            "source": "estimate from link speed, not measured",
            "assumes": "a bf16 7B model (15.2 GB); NCCL broadcast at ~80% of the link",
            "links_gb_per_s": GPU_LINKS,
            "s_per_update_7b_bf16": {k: round(GB_7B_BF16 / v, 3) for k, v in GPU_LINKS.items()},
        },
    }


if __name__ == "__main__":
    result = main()
    print(json.dumps(result, indent=2) if "--json" in sys.argv else result)
