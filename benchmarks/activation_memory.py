"""What autograd saves for the backward of a Llama-shaped causal LM, per token and decoder layer:
the figures :mod:`cluster.fit` (the dry run) uses for activation memory.

``python -m benchmarks.activation_memory --json`` builds random Llama models (head dim 64) of
several shapes with 2 and 4 layers, runs one forward over 1 x 256 and 1 x 512 tokens under
``torch.autograd.graph.saved_tensors_hooks`` and adds up the storages saved (each counted once,
the parameters left out). Bytes per token and layer are the growth with both layers and tokens,
so the weights' bf16 copies (per layer, not per token) drop out. It fits a.h + b.kv + c.I (h
hidden, kv = KV heads x 64, I intermediate) per precision (``autocast``: bf16 autocast over
fp32 weights; ``bf16``: bf16 weights; ``fp32``) and prints one JSON object: per precision the
coefficients, the largest relative error of the fit and, per shape, the measured bytes; and the
embeddings' bytes per token over h. CPU only; the saved tensors do not depend on the device.
"""
from __future__ import annotations

import argparse
import json
import sys

SHAPES = ((256, 704, 4, 2), (256, 1024, 4, 4), (384, 704, 6, 1), (512, 1376, 8, 2),
          (320, 1600, 5, 5), (640, 1792, 10, 2))


def saved_bytes(model, tokens: int, autocast: bool) -> int:
    """Bytes autograd saves for the backward of one forward over ``tokens`` tokens (storages
    counted once, the parameters themselves left out)."""
    import torch
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in params:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t
    ids = torch.randint(0, model.config.vocab_size, (1, tokens))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            model(input_ids=ids, position_ids=torch.arange(tokens)[None], use_cache=False,
                  logits_to_keep=1)
    return sum(saved.values())


def measure(h: int, inter: int, heads: int, kv_heads: int, mode: str) -> tuple[float, float]:
    """(bytes per token and layer, bytes per token outside the layers)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    s = {}
    for layers in (2, 4):
        config = LlamaConfig(hidden_size=h, intermediate_size=inter, num_attention_heads=heads,
                             num_key_value_heads=kv_heads, head_dim=64,
                             num_hidden_layers=layers, vocab_size=512)
        config._attn_implementation = "sdpa"
        model = LlamaForCausalLM(config).to(
            torch.bfloat16 if mode == "bf16" else torch.float32).train()
        for tokens in (256, 512):
            s[layers, tokens] = saved_bytes(model, tokens, mode == "autocast")
    per_layer = ((s[4, 512] - s[2, 512]) - (s[4, 256] - s[2, 256])) / 2 / 256
    outside = (s[2, 512] - s[2, 256]) / 256 - 2 * per_layer
    return per_layer, outside


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="(the output is always JSON)")
    parser.parse_args(argv)
    import numpy as np
    import torch
    torch.manual_seed(0)
    out: dict[str, object] = {}
    for mode in ("autocast", "bf16", "fp32"):
        rows = []
        for h, inter, heads, kv_heads in SHAPES:
            per_layer, outside = measure(h, inter, heads, kv_heads, mode)
            rows.append({"hidden": h, "intermediate": inter, "kv_dim": kv_heads * 64,
                         "bytes_per_token_layer": per_layer,
                         "outside_bytes_per_token_over_h": round(outside / h, 2)})
            print(f"{mode} {h}/{inter}/{kv_heads}: {per_layer:.0f}", file=sys.stderr)
        x = np.array([[r["hidden"], r["kv_dim"], r["intermediate"]] for r in rows], float)
        y = np.array([r["bytes_per_token_layer"] for r in rows])
        coef = np.linalg.lstsq(x, y, rcond=None)[0]
        out[mode] = {"a_h": round(float(coef[0]), 2), "b_kv": round(float(coef[1]), 2),
                     "c_i": round(float(coef[2]), 2),
                     "max_rel_error": float(np.max(np.abs(x @ coef - y) / y)), "shapes": rows}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
