"""Tokens per turn of the agent's prompt and reply, page views and reply forms side by side,
on recorded turns (an SFT data file as :mod:`datagen.export` writes it):
``python -m benchmarks.prompt_tokens --json --data runs/learning-check/sft-data.jsonl``.

Each recorded turn's page (the text between the ``TITLE:`` line and ``Your next action:`` of
its user message) is shown again as ``full`` (as rendered) and ``compact``
(:func:`consolerl.page.compact`), with each system prompt asked for (``--system``), and its
action as the reply alone (``action``) and grounded (:func:`rollout_service.agent.
grounded_response`). Tokens are counted with the policy model's chat template, as the agent
loop counts them; no page is cut (the recorded page may already be). Prints one JSON object:
``data``, ``turns``, ``prompt_tokens`` ({view: {system: mean}}), ``page_tokens`` ({view: mean}),
``reply_tokens`` ({form: mean}), ``page_share_removed`` (1 - compact / full page tokens) and
``wall_s``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from statistics import mean
from typing import Any

from consolerl.page import compact
from rollout_service.agent import SYSTEM_PROMPTS, grounded_response
from rollout_service.models import HFChatTokenizer, resolve_model

VIEWS = ("full", "compact")


def split_user(content: str) -> tuple[str, str, str]:
    """(the message up to and including its ``TITLE:`` line, the page, the rest)."""
    at = content.index("\nTITLE: ")
    head_end = content.index("\n", at + 1) + 1
    tail_at = content.rindex("\n\nYour next action:")
    return content[:head_end], content[head_end:tail_at], content[tail_at:]


def turns_of(path: Path) -> list[dict[str, Any]]:
    out = []
    with path.open(encoding="utf-8") as handle:
        for raw in handle:
            if raw.strip():
                out.extend(json.loads(raw)["turns"])
    return out


def measure(turns: list[dict[str, Any]], tokenizer: HFChatTokenizer,
            systems: list[str]) -> dict[str, Any]:
    prompt: dict[str, dict[str, list[int]]] = {v: {s: [] for s in systems} for v in VIEWS}
    page: dict[str, list[int]] = {v: [] for v in VIEWS}
    reply: dict[str, list[int]] = {"action": [], "grounded": []}
    for n, turn in enumerate(turns, 1):
        head, text, tail = split_user(turn["messages"][1]["content"])
        action = turn["completion"].split("\n")[-1]
        for view in VIEWS:
            shown = compact(text) if view == "compact" else text
            page[view].append(len(tokenizer.encode(shown)))
            for system in systems:
                messages = [{"role": "system", "content": SYSTEM_PROMPTS[system]},
                            {"role": "user", "content": head + shown + tail}]
                prompt[view][system].append(len(tokenizer.apply_chat_template(messages)))
        reply["action"].append(len(tokenizer.encode(action)))
        reply["grounded"].append(len(tokenizer.encode(grounded_response(action, text))))
        if n % 50 == 0:
            print(f"[prompt_tokens] {n}/{len(turns)} turns", file=sys.stderr, flush=True)
    full, small = mean(page["full"]), mean(page["compact"])
    return {"turns": len(turns),
            "prompt_tokens": {v: {s: round(mean(x), 1) for s, x in by.items()}
                              for v, by in prompt.items()},
            "page_tokens": {v: round(mean(x), 1) for v, x in page.items()},
            "reply_tokens": {f: round(mean(x), 2) for f, x in reply.items()},
            "page_share_removed": round(1 - small / full, 4) if full else 0.0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.prompt_tokens",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="runs/learning-check/sft-data.jsonl",
                        help="an SFT data file (datagen.export's JSON lines)")
    parser.add_argument("--model", default="default", help="whose tokenizer counts")
    parser.add_argument("--system", action="append", choices=sorted(SYSTEM_PROMPTS),
                        help="system prompts to count (default: compact and grounded)")
    parser.add_argument("--json", action="store_true", help="print the JSON object only")
    args = parser.parse_args(argv)
    data = Path(args.data)
    if not data.is_file():
        parser.error(f"--data {data}: no such file (write one with python -m cluster.export)")
    started = time.time()
    turns = turns_of(data)
    if not turns:
        parser.error(f"--data {data}: no turns")
    tokenizer = HFChatTokenizer(resolve_model(args.model))
    result = {"data": str(data), **measure(turns, tokenizer,
                                           args.system or ["compact", "grounded"]),
              "wall_s": round(time.time() - started, 1)}
    print(json.dumps(result, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
