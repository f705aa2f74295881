"""The procedure-following probe of :mod:`benchmarks.dose`: does a model act on what the
procedure says, or on where things sit on the page?

From each turn of a held-out state file (:mod:`datagen.export` records of the oracle on the
evaluation's tasks) whose recorded action is ``click``, ``fill`` or ``select`` on an element
whose label the PROCEDURE section of the prompt mentions, :func:`turn_variants` builds

- ``original``: the prompt as recorded; followed when the reply's action equals the recorded
  one;
- ``label``: the same prompt (same page, history and title) with that mention in the
  procedure replaced by the label of another control on the page that can be acted on (same
  role preferred, then same region, then the nearest; its label once on the page and not in
  the procedure); followed when the reply's action names that control's bid;
- ``value`` (``fill`` only): the procedure's value replaced by another of the same shape
  (each letter and digit shifted by one); followed when the reply fills the new value into
  the same bid.

A turn with no usable mention (no label, not in the procedure, no other control to swap in)
gives no variant. :func:`probe` replies to every variant with a ``generate(messages,
max_new_tokens) -> text`` and scores it (:func:`follows`); ``procedure_following`` is the
share of swapped (``label`` and ``value``) variants followed, ``procedure_following_original``
the share of the probed turns' recorded prompts whose recorded action came back. Pure: no
model here (``benchmarks.dose`` supplies the greedy generator).
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from consolerl.page import SELECTS, Page, PageNode, compact, parse, render
from env_workers.actions import Action, Click, Fill, Select, parse_action

# The sections of the user message rollout_service.agent.build_messages writes (a unit test
# builds one and splits it back).
PROCEDURE_HEAD = "\n\nPROCEDURE:\n"
AFTER_PROCEDURE = ("\n\nYOUR LAST ACTIONS (oldest first):\n", "\n\nLAST ACTION ERROR: ",
                   "\n\nCURRENT PAGE: ")
PAGE_HEAD = "\n\nCURRENT PAGE: "
PAGE_TAIL = "\n\nYour next action:"
DEFAULT_MAX_NEW_TOKENS = 48
# What a swapped-in control must be to take the recorded action (a click: any control but
# these).
FILLABLE = frozenset({"textbox", "searchbox", "spinbutton"})
ENTRY_ROLES = FILLABLE | SELECTS
ROLES_OF: dict[type, frozenset[str]] = {Fill: FILLABLE, Select: SELECTS}
# A label longer than this is a sentence, not a control's name a procedure would spell out.
MAX_LABEL_CHARS = 60

Generate = Callable[[list[dict[str, str]], int], str]


@dataclass(frozen=True)
class Variant:
    """One prompt to reply to. ``kind``: ``original`` | ``label`` | ``value``; ``state``: the
    turn it comes from (``task_id#turn``); ``recorded``: the recorded action; ``bid`` and
    ``value``: what a follower names (``value`` only for a ``value`` variant); ``mention`` /
    ``replacement``: the procedure's text and what stands there instead; ``recorded_ids``
    (``original`` only): the record's prompt ids, which the messages re-tokenize to."""

    kind: str
    state: str
    messages: tuple[dict[str, str], ...]
    recorded: Action
    bid: str
    value: str | None = None
    mention: str = ""
    replacement: str = ""
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    recorded_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class Prompt:
    """A user message cut at its procedure: ``head`` + ``procedure`` + ``tail``; ``page``: the
    page text inside ``tail``."""

    head: str
    procedure: str
    tail: str
    page: str


def split_prompt(content: str) -> Prompt | None:
    """The procedure and the page of a user message (``None``: not the agent's layout)."""
    start = content.find(PROCEDURE_HEAD)
    if start < 0:
        return None
    start += len(PROCEDURE_HEAD)
    ends = [i for i in (content.find(m, start) for m in AFTER_PROCEDURE) if i >= 0]
    page_at, page_end = content.rfind(PAGE_HEAD), content.rfind(PAGE_TAIL)
    if not ends or page_at < 0 or page_end < page_at:
        return None
    end = min(ends)
    title_line = content.find("\n", content.find("\nTITLE: ", page_at) + 1)
    if title_line < 0 or title_line > page_end:
        return None
    return Prompt(content[:start], content[start:end], content[end:],
                  content[title_line + 1:page_end])


def _spans(text: str, needle: str) -> list[tuple[int, int]]:
    """Where ``needle`` stands as a whole phrase in ``text``: case-sensitive matches, else
    case-insensitive ones; of several, those that are not part of a longer capitalised name
    (``Create`` in ``Click Create to create`` but not in ``Click Create User``) when any."""
    for flags in (0, re.IGNORECASE):
        pattern = re.compile(r"(?<!\w)" + re.escape(needle) + r"(?!\w)", flags)
        found = [m.span() for m in pattern.finditer(text)]
        if found:
            alone = [(a, b) for a, b in found if not _CAPITAL_AFTER.match(text, b)]
            return alone or found
    return []


_CAPITAL_AFTER = re.compile(r" [A-Z]")


def _replace(text: str, spans: Sequence[tuple[int, int]], new: str) -> str:
    for start, end in sorted(spans, reverse=True):
        text = text[:start] + new + text[end:]
    return text


def _mentioned(text: str, label: str) -> bool:
    return label.casefold() in text.casefold()


def swap_candidate(page: Page, target: PageNode, procedure: str,
                   roles: frozenset[str] | None = None) -> PageNode | None:
    """The control whose label replaces ``target``'s in the procedure: it can be acted on
    (a bid, not disabled), takes the same action (``roles``: those allowed; ``None``: any
    but a text field or a select), is in the page's chrome (the top bar and breadcrumb that
    :func:`consolerl.page.compact` takes out) only if the target is, and its label
    (at most :data:`MAX_LABEL_CHARS`) is on no other control of the page, is not in the
    procedure and neither holds nor is held in the target's; the same role first, then the
    same region, then the nearest in the page."""
    kept = {n.bid for n in parse(compact(render(page))).controls()}
    controls = [n for n in page.controls()
                if (n.role in roles if roles is not None else n.role not in ENTRY_ROLES)
                and (n.bid in kept or target.bid not in kept)]
    count: dict[str, int] = {}
    for node in page.controls():
        key = node.label.strip().casefold()
        count[key] = count.get(key, 0) + 1
    where = {id(n): i for i, n in enumerate(page.nodes)}
    at = where[id(target)]
    mine = target.label.strip().casefold()
    usable = [n for n in controls
              if n.bid != target.bid and not n.disabled and n.label.strip()
              and len(n.label.strip()) <= MAX_LABEL_CHARS
              and count[n.label.strip().casefold()] == 1
              and not _mentioned(procedure, n.label.strip())
              and mine not in n.label.strip().casefold()
              and n.label.strip().casefold() not in mine]
    if not usable:
        return None
    return min(usable, key=lambda n: (n.role != target.role, n.inline, n.region != target.region,
                                      abs(where[id(n)] - at)))


def shifted(value: str) -> str:
    """``value`` with each ASCII letter and digit one further (z to a, 9 to 0), the rest kept:
    a different value of the same shape."""
    out = []
    for ch in value:
        for first, size in (("a", 26), ("A", 26), ("0", 10)):
            if first <= ch < chr(ord(first) + size):
                ch = chr(ord(first) + (ord(ch) - ord(first) + 1) % size)
                break
        out.append(ch)
    return "".join(out)


def _with_user(messages: Sequence[Mapping[str, str]], index: int, content: str
               ) -> tuple[dict[str, str], ...]:
    return tuple({**m, "content": content} if i == index else dict(m)
                 for i, m in enumerate(messages))


def turn_variants(turn: Mapping[str, Any], state: str,
                  max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS) -> list[Variant]:
    """The variants of one recorded turn (``messages``, ``completion``, ``action_error``):
    ``original`` first, then ``label`` and (for a fill) ``value``; none when the turn has no
    usable mention (see the module docstring)."""
    if turn.get("action_error"):
        return []
    action = parse_action(str(turn.get("completion", "")))
    if not isinstance(action, (Click, Fill, Select)):
        return []
    messages = list(turn.get("messages") or [])
    user = next((i for i in range(len(messages) - 1, -1, -1)
                 if messages[i].get("role") == "user"), None)
    if user is None:
        return []
    prompt = split_prompt(str(messages[user].get("content", "")))
    if prompt is None:
        return []
    page = parse(prompt.page)
    target = page.by_bid(action.bid)
    if target is None or not target.label.strip():
        return []
    label = target.label.strip()
    spans = _spans(prompt.procedure, label)
    if not spans:
        return []
    variants = []
    other = swap_candidate(page, target, prompt.procedure, ROLES_OF.get(type(action)))
    if other is not None:
        new = other.label.strip()
        content = prompt.head + _replace(prompt.procedure, spans, new) + prompt.tail
        variants.append(Variant("label", state, _with_user(messages, user, content), action,
                                other.bid, None, prompt.procedure[spans[0][0]:spans[0][1]], new,
                                max_new_tokens))
    if isinstance(action, Fill) and action.text and action.text in prompt.procedure:
        new = shifted(action.text)
        if new != action.text and new not in prompt.procedure and new not in prompt.page:
            content = prompt.head + prompt.procedure.replace(action.text, new) + prompt.tail
            variants.append(Variant("value", state, _with_user(messages, user, content),
                                    action, action.bid, new, action.text, new, max_new_tokens))
    if not variants:
        return []
    original = Variant("original", state, tuple(dict(m) for m in messages), action, action.bid,
                       max_new_tokens=max_new_tokens,
                       recorded_ids=tuple(turn.get("prompt_ids") or ()))
    return [original, *variants]


def record_variants(record: Mapping[str, Any]) -> list[Variant]:
    """Every turn's variants of one state-file record (``max_new_tokens`` from its ``agent``
    settings, else :data:`DEFAULT_MAX_NEW_TOKENS`)."""
    agent = record.get("agent") or {}
    limit = agent.get("max_new_tokens") or DEFAULT_MAX_NEW_TOKENS
    task = str(record.get("task_id", "?"))
    return [v for i, turn in enumerate(record.get("turns") or [])
            for v in turn_variants(turn, f"{task}#{i}", int(limit))]


def read_records(path: Path) -> Iterator[dict[str, Any]]:
    with path.open(encoding="utf-8") as handle:
        for n, raw in enumerate(handle, 1):
            if raw.strip():
                try:
                    yield json.loads(raw)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}: line {n}: not valid JSON ({exc.msg})") from None


def follows(variant: Variant, reply: str) -> bool:
    """Whether ``reply``'s action (its last action line) does what ``variant`` asks."""
    action = parse_action(reply)
    if variant.kind == "original":
        return action == variant.recorded
    if getattr(action, "bid", None) != variant.bid:
        return False
    return variant.value is None or (isinstance(action, Fill) and action.text == variant.value)


def probe(variants: Sequence[Variant], generate: Generate,
          progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Reply to every variant and score it: ``procedure_following`` (swapped variants
    followed; ``None`` without any), ``procedure_following_original`` and ``probe_states``
    (probed turns, and variants by kind)."""
    hits: dict[str, list[bool]] = {"original": [], "label": [], "value": []}
    for n, variant in enumerate(variants, 1):
        hits[variant.kind].append(follows(variant, generate(list(variant.messages),
                                                            variant.max_new_tokens)))
        if progress is not None and (n % 20 == 0 or n == len(variants)):
            progress(f"probe: {n}/{len(variants)} prompts")
    swapped = hits["label"] + hits["value"]

    def share(xs: list[bool]) -> float | None:
        return round(sum(xs) / len(xs), 4) if xs else None
    return {"procedure_following": share(swapped),
            "procedure_following_original": share(hits["original"]),
            "procedure_following_by_kind": {k: share(hits[k]) for k in ("label", "value")},
            "probe_states": {"states": len(hits["original"]), "variants": len(swapped),
                             "label": len(hits["label"]), "value": len(hits["value"])}}
