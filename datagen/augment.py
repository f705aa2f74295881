"""More SFT data from recorded turns, with no browser: each copy of a trajectory is the same
states told differently, so that what stays the same (the procedure's words, the labels of the
page) is what predicts the action.

``python -m datagen.augment --data sft-data.jsonl --out sft-augment.jsonl [--copies 4]
[--kinds ids,values,decoys,wording] [--seed 0] [--model default]`` reads records as
:mod:`datagen.export` writes them and writes ``copies`` variants of each (progress on stderr, a
JSON summary on stdout). A variant applies, to every turn of the trajectory, the ``kinds``:

- ``ids``: one random bijection on the trajectory's bids (every page's, every action's) renumbers
  the pages (own-line ``[N] role "label"`` and inline ``[N]label``), the history's actions and
  the completion; a grounded completion's label line stays as it is.
- ``values``: a value the procedure asks to type or select (a ``fill`` / ``select`` of a
  completion whose string is also in the procedure) becomes a fresh value of the same shape
  (``user3-5cf258aa`` -> another name-hex, a number -> a number of as many digits, a CIDR block
  -> a valid one of the same prefix length, a display name -> another) in the procedure, the
  page (a field holding it; for a name-hex or CIDR also rows and text naming it), the history
  and the completion. A select's option is swapped only when it is a name-hex, number or CIDR
  and the select on the page lists it (the new option takes its place in the list); console
  constants (ACLs, policy names) stay.
- ``decoys``: in a table, one or two rows copied from a row that names a name-hex resource,
  with fresh names, resource ids and bids (above every bid of the trajectory), never the row the
  completion acts in; pages cut to fit the prompt get none.
- ``wording``: the procedure's steps rewritten in the help-center styles of ``docs/corpus``
  (``Click **Create User**.``, ``Enter v in the Logon Name field.``, ``Log on to the RAM
  console. In the left-side navigation pane, choose Identities > Users.``): the same controls
  and values, other words. A rewritten sentence that is a sentence of ``docs/corpus-heldout``
  (the documentation checker's evaluation) is never produced: the step keeps its words.

Each turn's ``prompt_ids`` / ``response_ids`` are recomputed as :func:`datagen.export.build_record`
computes them (the chat template over ``messages``; the completion's tokens and the end-of-turn
token); a turn whose prompt no longer fits the record's ``agent.max_prompt_tokens`` is left out
of the variant. A record: the original's fields, ``source: "augment"``, ``augment_of`` (the
original's ``trajectory_id``), ``augment_kinds`` and a fresh ``trajectory_id``. Lines pass
:func:`datagen.export.check_no_secrets`. The output is a function of the input and the seed.
"""
from __future__ import annotations

import argparse
import ipaddress
import json
import random
import re
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from consolerl.errors import ConfigError
from consolerl.page import PageNode, parse, render_line
from env_workers.actions import Action, Fill, Select, parse_action
from env_workers.observation import PERMUTED_IDS

KINDS = ("ids", "values", "decoys", "wording")
HELDOUT_CORPUS = Path(__file__).resolve().parent.parent / "docs" / "corpus-heldout"

_HISTORY = "YOUR LAST ACTIONS (oldest first):"
_ERROR = "LAST ACTION ERROR: "
_PAGE = "CURRENT PAGE: "
_END = "\n\nYour next action:"
_CUT_HEAD = "\n[... "
_CUT_TAIL = " more characters of the page omitted]"
_ERROR_MARK = "  -> error: "


# ---- the user message, read and written -------------------------------------------------------
@dataclass
class Prompt:
    """The parts of a user message :func:`rollout_service.agent.build_messages` wrote; ``cut``
    is the page's "[... N more characters of the page omitted]" line ("" when whole)."""

    title: str
    procedure: str
    history: list[tuple[str, str]]
    last_error: str | None
    url: str
    page_title: str
    page: str
    cut: str = ""

    def text(self) -> str:
        lines = [f"TASK: {self.title}", "", "PROCEDURE:", self.procedure, ""]
        if self.history:
            lines.append(_HISTORY)
            lines += [f"- {a}" + (f"{_ERROR_MARK}{e}" if e else "") for a, e in self.history]
            lines.append("")
        if self.last_error is not None:
            lines += [f"{_ERROR}{self.last_error}", ""]
        lines += [f"{_PAGE}{self.url}", f"TITLE: {self.page_title}", self.page + self.cut]
        return "\n".join(lines) + _END


def read_prompt(content: str) -> Prompt | None:
    """The parts of a user message, or ``None`` when it is not one build_messages wrote (the
    parts must write back to the same text)."""
    if not content.startswith("TASK: ") or not content.endswith(_END):
        return None
    head, sep, rest = content[len("TASK: "):].partition("\n\nPROCEDURE:\n")
    if not sep:
        return None
    ends = [i for i in (rest.find(f"\n\n{_HISTORY}\n"), rest.find(f"\n\n{_ERROR}"),
                        rest.find(f"\n\n{_PAGE}")) if i >= 0]
    if not ends:
        return None
    procedure, rest = rest[:min(ends)], rest[min(ends) + 2:-len(_END)]
    history: list[tuple[str, str]] = []
    if rest.startswith(_HISTORY + "\n"):
        block, _, rest = rest[len(_HISTORY) + 1:].partition("\n\n")
        for line in block.split("\n"):
            if not line.startswith("- "):
                return None
            action, _, error = line[2:].partition(_ERROR_MARK)
            history.append((action, error))
    last_error = None
    if rest.startswith(_ERROR):
        last_error, _, rest = rest[len(_ERROR):].partition(f"\n\n{_PAGE}")
        rest = _PAGE + rest
    if not rest.startswith(_PAGE):
        return None
    url, _, rest = rest[len(_PAGE):].partition("\nTITLE: ")
    page_title, _, page = rest.partition("\n")
    cut = ""
    if page.endswith(_CUT_TAIL) and (at := page.rfind(_CUT_HEAD)) >= 0:
        page, cut = page[:at], page[at:]
    prompt = Prompt(head, procedure, history, last_error, url, page_title, page, cut)
    return prompt if prompt.text() == content else None


@dataclass
class TurnView:
    """One turn as the transforms see it: its prompt, the completion's label line ("" when
    it has none) and action text."""

    system: str
    prompt: Prompt
    label: str
    action: str
    source: dict[str, Any] = field(repr=False, default_factory=dict)

    @property
    def completion(self) -> str:
        return f"{self.label}\n{self.action}" if self.label else self.action


def read_turn(turn: Mapping[str, Any]) -> TurnView | None:
    messages = turn.get("messages")
    if not isinstance(messages, list) or len(messages) != 2 or not isinstance(
            turn.get("completion"), str):
        return None
    prompt = read_prompt(messages[1].get("content", ""))
    if prompt is None:
        return None
    label, _, action = turn["completion"].rpartition("\n")
    return TurnView(messages[0].get("content", ""), prompt, label, action, dict(turn))


# ---- shared helpers ---------------------------------------------------------------------------
def _action(text: str) -> Action | None:
    parsed = parse_action(text)
    return parsed if isinstance(parsed, Action) else None


def _bid_of(text: str) -> str | None:
    action = _action(text)
    return getattr(action, "bid", None) if action is not None else None


_WORD = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")


def replace_token(text: str, old: str, new: str, joiners: str = "-.") -> str:
    """``text`` with every occurrence of ``old`` that is a whole token (no letter, digit, ``_``
    or one of ``joiners`` right before or after it) replaced by ``new``."""
    if not old:
        return text
    out, start = [], 0
    while (at := text.find(old, start)) >= 0:
        end = at + len(old)
        before = text[at - 1] if at else " "
        after = text[end] if end < len(text) else " "
        # A token may end a sentence: "user-1." is the token "user-1" then a full stop.
        after_ok = after not in _WORD and (after not in joiners or end + 1 >= len(text)
                                           or text[end + 1] in " \n`*")
        if before not in _WORD and before not in joiners and after_ok:
            out.append(text[start:at] + new)
        else:
            out.append(text[start:end])
        start = end
    return "".join(out) + text[start:]


def _map_page(text: str, fn: Callable[[PageNode, list[PageNode]], PageNode | None]) -> str:
    """The page with each line node (and its inline nodes) passed through ``fn`` (``None``:
    the line as it was)."""
    page = parse(text)
    groups: list[tuple[PageNode, list[PageNode]]] = []
    for node in page.nodes:
        if node.inline:
            groups[-1][1].append(node)
        else:
            groups.append((node, []))
    lines = []
    for line, inline in groups:
        new = fn(line, inline)
        lines.append(render_line(new if new is not None else line))
    return "\n".join(lines)


def _rebid_text(text: str, mapping: Mapping[str, str], bids: Sequence[str]) -> str:
    """``text`` (a row cell or a text line) with its inline markers ``[old]``, in order,
    as ``[new]``."""
    out, start = [], 0
    for bid in bids:
        at = text.find(f"[{bid}]", start)
        while at >= 0 and text[at + len(bid) + 2:at + len(bid) + 3] == " ":
            at = text.find(f"[{bid}]", at + 1)      # "[3] " is no inline marker
        if at < 0:
            continue
        out.append(text[start:at] + f"[{mapping.get(bid, bid)}]")
        start = at + len(bid) + 2
    return "".join(out) + text[start:]


def _rebid_line(line: PageNode, inline: Sequence[PageNode], mapping: Mapping[str, str]
                ) -> PageNode:
    if line.bid and not inline:
        return replace(line, bid=mapping.get(line.bid, line.bid))
    bids = [n.bid for n in inline]
    if not bids:
        return line
    label = _rebid_text(line.label, mapping, bids)
    if line.role == "row":
        return replace(line, cells=tuple(label.split(" | ")), label=label)
    return replace(line, label=label)


def page_bids(text: str) -> list[str]:
    return [n.bid for n in parse(text).controls()]


# ---- ids --------------------------------------------------------------------------------------
def renumber(turns: list[TurnView], rng: random.Random) -> bool:
    """Apply one random bijection on the trajectory's bids, new ids drawn from 1..999 as
    :func:`env_workers.observation.bid_number` draws them (numeric ones only; ``False`` and
    nothing changed when a bid is not a number)."""
    bids: set[str] = set()
    for t in turns:
        bids.update(page_bids(t.prompt.page))
        for text in [t.action, *(a for a, _ in t.prompt.history)]:
            if (bid := _bid_of(text)) is not None:
                bids.add(bid)
    if not bids or not all(b.isdigit() for b in bids):
        return False
    ordered = sorted(bids, key=int)
    # Drawn from the range the env worker's random ids use (AgentConfig.random_ids), so a
    # renumbered page looks like one the policy meets.
    top = max(PERMUTED_IDS, 2 * len(ordered), max(int(b) for b in ordered) + 8)
    mapping = dict(zip(ordered, (str(n) for n in rng.sample(range(1, top + 1), len(ordered)))))
    for t in turns:
        t.prompt.page = _map_page(t.prompt.page, lambda line, inline: _rebid_line(
            line, inline, mapping))
        t.prompt.history = [(_rebid_action(a, mapping), e) for a, e in t.prompt.history]
        t.action = _rebid_action(t.action, mapping)
    return True


def _rebid_action(text: str, mapping: Mapping[str, str]) -> str:
    action = _action(text)
    bid = getattr(action, "bid", None)
    if action is None or bid is None or bid not in mapping or action.to_text() != text:
        return text
    return replace(action, bid=mapping[bid]).to_text()


# ---- values -----------------------------------------------------------------------------------
_NAMEHEX = re.compile(r"([a-z][a-z0-9]*(?:[.-][a-z][a-z0-9]*)*)-([0-9a-f]{6,})")
_NUMBER = re.compile(r"[1-9][0-9]{0,5}")
_WORDS = re.compile(r"[A-Z][a-z]+(?: [A-Z][a-z]+)*")
DISPLAY_NAMES = ("Billing", "Support", "Finance", "Reporting", "Analyst", "Reviewer",
                 "Operator", "Builder", "Release Team", "Data Team", "Night Shift", "Web Team",
                 "Build Agent", "Backup Job", "Sync Robot", "Audit Reader")


def value_shape(value: str) -> str | None:
    """``namehex``, ``cidr``, ``number``, ``words`` or ``None`` (not a value to swap)."""
    if _NAMEHEX.fullmatch(value):
        return "namehex"
    if "/" in value:
        try:
            net = ipaddress.IPv4Network(value, strict=True)
        except ValueError:
            return None
        return "cidr" if str(net) == value else None
    if _NUMBER.fullmatch(value):
        return "number"
    if _WORDS.fullmatch(value):
        return "words"
    return None


def fresh_value(value: str, rng: random.Random) -> str:
    """A value of the same shape as ``value`` (:func:`value_shape`), drawn from ``rng``."""
    shape = value_shape(value)
    if shape == "namehex":
        m = _NAMEHEX.fullmatch(value)
        assert m is not None
        head = "".join(rng.choice("0123456789") if c.isdigit() else c for c in m[1])
        return f"{head}-{''.join(rng.choice('0123456789abcdef') for _ in m[2])}"
    if shape == "cidr":
        net = ipaddress.IPv4Network(value)
        blocks = [b for b in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16")
                  if ipaddress.IPv4Network(b).prefixlen <= net.prefixlen]
        block = ipaddress.IPv4Network(rng.choice(blocks) if blocks else "10.0.0.0/8")
        count = 2 ** (net.prefixlen - block.prefixlen) if net.prefixlen >= block.prefixlen else 1
        start = int(block.network_address) + rng.randrange(count) * net.num_addresses
        return f"{ipaddress.IPv4Address(start)}/{net.prefixlen}"
    if shape == "number":
        low = 10 ** (len(value) - 1)
        return str(rng.randrange(max(1, low), 10 * low))
    if shape == "words":
        same = [d for d in DISPLAY_NAMES if d.count(" ") == value.count(" ")] or list(
            DISPLAY_NAMES)
        return rng.choice(same)
    raise ConfigError(f"value {value!r}: not a shape augment can redraw")


def swap_values(turns: list[TurnView], rng: random.Random) -> dict[str, str]:
    """Swap the procedure's typed and chosen values; returns ``{old: new}``."""
    everything = "\n".join(t.prompt.text() + t.completion for t in turns)
    procedure = turns[0].prompt.procedure
    swaps: dict[str, str] = {}
    chosen: set[str] = set()                    # values of a select: its option list changes
    for t in turns:
        action = _action(t.action)
        value = action.text if isinstance(action, Fill) else (
            action.option if isinstance(action, Select) else "")
        shape = value_shape(value) if value else None
        if value in swaps or shape is None or replace_token(procedure, value, "\0") == procedure:
            continue
        if isinstance(action, Select):
            node = parse(t.prompt.page).by_bid(action.bid)
            if shape == "words" or node is None or value not in node.options:
                continue
            chosen.add(value)
        for _ in range(20):
            new = fresh_value(value, rng)
            if new != value and new not in everything and new not in swaps.values():
                swaps[value] = new
                break
    for old, new in swaps.items():
        shape = value_shape(old)
        for t in turns:
            wide = shape in ("namehex", "cidr")
            _swap_in_turn(t, old, new, wide, options=wide or old in chosen)
    return swaps


def _swap_in_turn(t: TurnView, old: str, new: str, wide: bool, options: bool) -> None:
    """``old`` as ``new`` in the turn: the procedure, task title, history and completion; on
    the page a field holding it, a select's options when ``options``, and when ``wide`` (a
    name-hex or CIDR, unique enough) every whole-token mention (rows, text, labels, URL);
    otherwise a table cell that is the value."""
    p = t.prompt
    p.procedure = replace_token(p.procedure, old, new)
    p.title = replace_token(p.title, old, new)
    if wide:
        p.url = replace_token(p.url, old, new)
        p.page_title = replace_token(p.page_title, old, new)
    p.history = [(_swap_action(a, old, new), e) for a, e in p.history]
    t.action = _swap_action(t.action, old, new)
    if t.label:
        t.label = replace_token(t.label, old, new)

    def line(node: PageNode, inline: list[PageNode]) -> PageNode | None:
        if options and old in node.options:
            return replace(node, options=tuple(new if o == old else o for o in node.options),
                           selected=new if node.selected == old else node.selected)
        if node.value == old:
            return replace(node, value=new)
        if node.role == "row":                # a cell that is the value (a row it made)
            cells = tuple(replace_token(c, old, new) if wide else new if c == old else c
                          for c in node.cells)
            return replace(node, cells=cells, label=" | ".join(cells))
        if not wide:
            return None
        if node.role in ("text", "heading") or node.value:
            return replace(node, label=replace_token(node.label, old, new),
                           value=replace_token(node.value, old, new))
        return replace(node, label=replace_token(node.label, old, new))
    p.page = _map_page(p.page, line)


def _swap_action(text: str, old: str, new: str) -> str:
    action = _action(text)
    if action is None or action.to_text() != text:
        return text
    if isinstance(action, Fill) and action.text == old:
        return replace(action, text=new).to_text()
    if isinstance(action, Select) and action.option == old:
        return replace(action, option=new).to_text()
    return text


# ---- decoys -----------------------------------------------------------------------------------
def add_decoys(turns: list[TurnView], rng: random.Random, max_chars: int | None) -> int:
    """Add decoy rows to the tables of the turns' pages; returns how many."""
    used = {int(b) for t in turns for b in page_bids(t.prompt.page) if b.isdigit()}
    used |= {int(b) for t in turns for a in [t.action, *(h for h, _ in t.prompt.history)]
             if (b := _bid_of(a)) and b.isdigit()}
    next_bid = [max(used, default=0) + 1 + rng.randrange(4)]
    names = "\n".join(t.prompt.text() for t in turns)
    added = 0
    for t in turns:
        if t.prompt.cut:
            continue
        target = _bid_of(t.action)
        page = parse(t.prompt.page)
        rows = [n for n in page.lines() if n.role == "row"]
        inline = {n.line: [m.bid for m in page.nodes if m.inline and m.line == n.line]
                  for n in rows}
        sources = [r for r in rows if target not in inline[r.line]
                   and any(_NAMEHEX.fullmatch(tok) for tok in _tokens(r.label))]
        if not sources:
            continue
        lines = t.prompt.page.split("\n")
        extra = []
        for _ in range(rng.choice((1, 2))):
            row = rng.choice(sources)
            cells, mapping = list(row.cells), {}
            for bid in inline[row.line]:
                mapping[bid] = str(next_bid[0])
                next_bid[0] += 1 + rng.randrange(3)
            fresh: dict[str, str] = {}
            for tok in _tokens(row.label):
                if (_NAMEHEX.fullmatch(tok) or _RESOURCE_ID.fullmatch(tok)) and tok not in fresh:
                    while (new := _fresh_token(tok, rng)) in names:
                        pass
                    fresh[tok] = new
            for old, new in fresh.items():
                cells = [replace_token(c, old, new) for c in cells]
            decoy = _rebid_line(replace(row, cells=tuple(cells), label=" | ".join(cells)),
                                [PageNode("control", bid=b) for b in inline[row.line]], mapping)
            extra.append((rng.choice(_table_of(row, rows)), render_line(decoy)))
        grown = sum(len(text) + 1 for _, text in extra)
        if max_chars is not None and len(t.prompt.page) + grown > max_chars:
            continue
        for at, text in sorted(extra, key=lambda e: -e[0]):
            lines.insert(at + 1, text)
        t.prompt.page = "\n".join(lines)
        added += len(extra)
    return added


def _table_of(row: PageNode, rows: Sequence[PageNode]) -> list[int]:
    """The lines of the rows of ``row``'s table (the run of row lines around it)."""
    lines = {r.line for r in rows if r.depth == row.depth}
    first = last = row.line
    while first - 1 in lines:
        first -= 1
    while last + 1 in lines:
        last += 1
    return list(range(first, last + 1))


# A console resource id (i-bp5uo7w6g51i0c, vpc-bp1x9k2m4n5q): a decoy row gets its own.
_RESOURCE_ID = re.compile(r"([a-z]{1,5})-([a-z0-9]{10,})")


def _fresh_token(token: str, rng: random.Random) -> str:
    if _NAMEHEX.fullmatch(token):
        return fresh_value(token, rng)
    head, _, tail = token.partition("-")
    return f"{head}-{''.join(rng.choice('abcdefghijklmnopqrstuvwxyz0123456789') for _ in tail)}"


def _tokens(text: str) -> Iterable[str]:
    for part in text.replace("|", " ").split():
        yield part[part.find("]") + 1:] if part.startswith("[") else part


# ---- wording ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Style:
    """How a rewritten step marks names: labels in bold, values in code spans."""

    bold: bool
    code: bool

    def label(self, text: str) -> str:
        return " > ".join(f"**{p}**" if self.bold else p for p in text.split(" > "))

    def value(self, text: str) -> str:
        return f"`{text}`" if self.code else text


def _field(name: str) -> str:
    """``logon name`` -> ``Logon Name`` (words already capitalised, ``IPv4``, keep theirs)."""
    return " ".join(w[:1].upper() + w[1:] if w[:1].islower() else w for w in name.split(" "))


# (pattern over one sentence of a step, templates). Placeholders: {L...} labels, {V...} values,
# {F...} field names (capitalised), {f...} as written, {svc}, {region}, {kind}, {rest}.
_NO_AND = r"(?:(?! and )[^.])+"
RULES: tuple[tuple[re.Pattern[str], tuple[str, ...]], ...] = tuple(
    (re.compile(p), t) for p, t in (
        (r"Open the (?P<svc>\w+) console(?P<region> in the .+ region)? and choose (?P<L>.+)\.",
         ("Log on to the {svc} console{region}. In the left-side navigation pane, choose {L}.",
          "Log on to the {svc} console{region} and choose {L} in the left-side navigation "
          "pane.",
          "Open the {svc} console{region}. Choose {L}.")),
        (r"Click (?P<L>[^.]+?) in the row of (?P<what>[^.]+?)(?P<confirm> and confirm)?\.",
         ("In the row of {what}, click {L}{confirm}.",
          "Find {what} and click {L} in its row{confirm}.")),
        (r"Find (?P<kind>user|instance) (?P<V>\S+) and click (?P<L>[^.]+?) in its row\.",
         ("In the row of {kind} {V}, click {L}.",
          "Click {L} in the row of {kind} {V}.",
          "Locate {kind} {V} in the list and click {L} in the same row.")),
        (r"Click (?P<L>[^.]+?) next to (?P<what>[^.]+)\.",
         ("Next to {what}, click {L}.",)),
        (r"Click (?P<L>[^.]+?) for (?P<what>[^.]+)\.",
         ("For {what}, click {L}.", "Click {L} for {what}.")),
        (r"Click (?P<L>[^.]+?) to (?P<rest>(?:create|delete|save|submit|confirm)[^.]*)\.",
         ("To {rest}, click {L}.", "Click {L}. This will {rest}.")),
        (rf"Click (?P<L>{_NO_AND}) and confirm\.",
         ("Click {L}, then confirm.", "Click {L} and confirm the operation.")),
        (r"Click (?P<kind>user|bucket) (?P<V>\S+)\.",
         ("Click the name of {kind} {V}.", "In the list, click {kind} {V}.")),
        (rf"Click (?P<L>{_NO_AND})\.",
         ("Click {L}.", "Next, click {L}.", "On the page that is displayed, click {L}.")),
        (r"On the (?P<L2>[^.,]+?) tab,? click (?P<L>[^.]+)\.",
         ("Click {L} on the {L2} tab.", "Open the {L2} tab and click {L}.")),
        (r"Enter (?P<V>\S+) as the (?P<f>[A-Za-z0-9 ]+?) and (?P<V2>\S+) as the "
         r"(?P<f2>[A-Za-z0-9 ]+)\.",
         ("Enter {V} in the {F} field and {V2} in the {F2} field.",
          "Set {F} to {V} and {F2} to {V2}.",
          "In the {F} field, enter {V}; in the {F2} field, enter {V2}.")),
        (r"Enter (?P<V>\S+) as the (?P<f>[A-Za-z0-9 ]+?) and click (?P<L>[^.]+)\.",
         ("Enter {V} in the {F} field and click {L}.",
          "In the {F} field, enter {V}. Then click {L}.")),
        (r"Enter (?P<V>\S+) as the (?P<f>[A-Za-z0-9 ]+?) and choose (?P<rest>[^.]+)\.",
         ("Enter {V} in the {F} field and choose {rest}.",
          "In the {F} field, enter {V}, then choose {rest}.")),
        (r"Enter (?P<V>.+?) as the (?P<f>[A-Za-z0-9 ]+)\.",
         ("Enter {V} in the {F} field.", "In the {F} field, enter {V}.", "Set {F} to {V}.",
          "For {F}, enter {V}.")),
        (r"Select the system policy (?P<V>\S+)\.",
         ("Select the {V} system policy.", "In the system policy list, select {V}.",
          "Select {V} from the system policies.")),
        (rf"Select (?P<L>{_NO_AND})\.",
         ("Select {L}.", "Choose {L}.")),
    ))


def rewrite_sentence(sentence: str, rng: random.Random, style: Style) -> str:
    """One sentence of a step in another wording (the sentence when no rule reads it, or when
    the rewrite is a held-out corpus sentence)."""
    for pattern, templates in RULES:
        m = pattern.fullmatch(sentence)
        if m is None:
            continue
        groups = {k: v for k, v in m.groupdict().items() if v is not None}
        slots = {k: "" for k in m.groupdict()} | groups
        for k, v in groups.items():
            if k.startswith("L"):
                slots[k] = style.label(v)
            elif k.startswith("V"):
                slots[k] = style.value(v)
            elif k.startswith("f"):
                slots["F" + k[1:]] = style.label(_field(v))
        new = rng.choice(templates).format(**slots)
        return sentence if any(s in heldout_sentences() for s in sentences(new)) else new
    return sentence


def sentences(text: str) -> list[str]:
    """``text`` cut after each ``.``, ``:`` or ``;`` that a space or the end follows."""
    out, start = [], 0
    for i, c in enumerate(text):
        if c in ".:;" and (i + 1 == len(text) or text[i + 1] == " "):
            out.append(text[start:i + 1].strip())
            start = i + 1
    if text[start:].strip():
        out.append(text[start:].strip())
    return out


def rewrite_procedure(procedure: str, rng: random.Random, style: Style) -> str:
    """Each numbered step's sentences through :func:`rewrite_sentence`."""
    lines = []
    for line in procedure.split("\n"):
        number, dot, step = line.partition(". ")
        if dot and number.isdigit():
            step = " ".join(rewrite_sentence(s, rng, style) for s in sentences(step))
            line = f"{number}. {step}"
        lines.append(line)
    return "\n".join(lines)


@lru_cache(maxsize=1)
def heldout_sentences() -> frozenset[str]:
    """The sentences of ``docs/corpus-heldout`` (Markdown list markers and HTML tags taken
    out, wrapped lines joined), exactly as written otherwise."""
    found: set[str] = set()
    if not HELDOUT_CORPUS.is_dir():
        raise ConfigError(f"{HELDOUT_CORPUS}: the held-out corpus is missing (augment keeps "
                          "its sentences out of rewritten procedures)")
    for path in sorted(HELDOUT_CORPUS.rglob("*")):
        if path.suffix not in (".md", ".html"):
            continue
        text = re.sub(r"<[^>]+>", " ", path.read_text(encoding="utf-8"))
        for para in re.split(r"\n\s*\n|\n\s*(?:\d+|[a-z])\.\s|\n\s*[-*>]\s", text):
            flat = " ".join(re.sub(r"^\s*(?:\d+|[a-z])\.\s+", "", para).split())
            found.update(sentences(flat))
    return frozenset(found)


# ---- records ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class AugmentConfig:
    """``copies`` variants of each record with the transforms ``kinds`` (:data:`KINDS`)."""

    copies: int = 4
    kinds: tuple[str, ...] = KINDS
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.copies, bool) or not isinstance(self.copies, int) or self.copies < 0:
            raise ConfigError(f"augment copies: a whole number >= 0, got {self.copies!r}")
        bad = [k for k in self.kinds if k not in KINDS]
        if bad or not self.kinds:
            raise ConfigError(f"augment kinds: one or more of {', '.join(KINDS)}, got "
                              f"{', '.join(self.kinds) or 'none'}")


def augment_record(record: Mapping[str, Any], copy: int, config: AugmentConfig,
                   tokenizer: Any, eot: int, stats: dict[str, int]) -> dict[str, Any] | None:
    """Variant ``copy`` of ``record`` (``None`` when no turn of it could be read or fit)."""
    original = str(record.get("trajectory_id", ""))
    rng = random.Random(f"{config.seed}:{original}:{copy}")
    turns = [read_turn(t) for t in record.get("turns", [])]
    if not turns or any(t is None for t in turns):
        stats["records_unreadable"] += 1
        return None
    views: list[TurnView] = [t for t in turns if t is not None]
    agent = record.get("agent") or {}
    if "ids" in config.kinds:
        renumber(views, rng)
    if "values" in config.kinds:
        stats["values_swapped"] += len(swap_values(views, rng))
    if "wording" in config.kinds:
        style = Style(bold=rng.random() < 0.5, code=rng.random() < 0.3)
        procedure = rewrite_procedure(views[0].prompt.procedure, rng, style)
        for t in views:
            t.prompt.procedure = procedure
    if "decoys" in config.kinds:
        stats["decoy_rows"] += add_decoys(views, rng, agent.get("max_observation_chars"))
    limit = agent.get("max_prompt_tokens")
    out_turns = []
    for t in views:
        messages = [{"role": "system", "content": t.system},
                    {"role": "user", "content": t.prompt.text()}]
        ids = list(tokenizer.apply_chat_template(messages, tokenize=True,
                                                 add_generation_prompt=True))
        if isinstance(limit, int) and len(ids) > limit:
            stats["turns_too_long"] += 1
            continue
        out_turns.append({**t.source, "messages": messages, "completion": t.completion,
                          "prompt_ids": ids,
                          "response_ids": list(tokenizer.encode(t.completion)) + [eot]})
    if not out_turns:
        return None
    uid = uuid.UUID(int=rng.getrandbits(128), version=4).hex
    return {**record, "trajectory_id": uid, "source": "augment", "augment_of": original,
            "augment_kinds": list(config.kinds), "turns": out_turns}


def _progress(msg: str) -> None:
    print(f"[augment] {msg}", file=sys.stderr, flush=True)


def augment_file(data: str | Path, out: str | Path, config: AugmentConfig, tokenizer: Any,
                 secrets: Mapping[str, str] | None = None,
                 progress: Callable[[str], None] = _progress) -> dict[str, Any]:
    """Write ``config.copies`` variants of every record of ``data`` to ``out``; the summary."""
    from rollout_service.models import end_of_turn_id

    from .export import check_no_secrets
    started = time.monotonic()
    eot = end_of_turn_id(tokenizer)
    records = [json.loads(line) for line in Path(data).read_text(encoding="utf-8").splitlines()
               if line.strip()]
    stats = {"records_unreadable": 0, "values_swapped": 0, "decoy_rows": 0, "turns_too_long": 0}
    written = turns = 0
    tmp = Path(out).with_name(f".{Path(out).name}.tmp")
    try:
        with tmp.open("w", encoding="utf-8") as sink:
            for n, record in enumerate(records, 1):
                for copy in range(config.copies):
                    new = augment_record(record, copy, config, tokenizer, eot, stats)
                    if new is None:
                        continue
                    line = json.dumps(new, ensure_ascii=False)
                    check_no_secrets(line, secrets or {})
                    sink.write(line + "\n")
                    written += 1
                    turns += len(new["turns"])
                progress(f"{n}/{len(records)} records, {written} variants, {turns} turns "
                         f"({time.monotonic() - started:.1f} s)")
        tmp.replace(out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return {"out": str(out), "records_in": len(records),
            "turns_in": sum(len(r.get("turns", [])) for r in records), "records_out": written,
            "turns_out": turns, **stats, "copies": config.copies, "kinds": list(config.kinds),
            "seed": config.seed, "wall_s": round(time.monotonic() - started, 2)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m datagen.augment",
                                     description="Variants of SFT records with no browser.")
    parser.add_argument("--data", required=True, help="SFT records (datagen.export JSONL)")
    parser.add_argument("--out", required=True, help="the JSONL of variants to write")
    parser.add_argument("--copies", type=int, default=4, help="variants per record")
    parser.add_argument("--kinds", default=",".join(KINDS),
                        help=f"comma-separated transforms, of {', '.join(KINDS)}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default="default", help="whose tokenizer makes the ids")
    args = parser.parse_args(argv)
    from rollout_service.models import HFChatTokenizer, resolve_model
    try:
        config = AugmentConfig(args.copies, tuple(k for k in args.kinds.split(",") if k),
                               args.seed)
        summary = augment_file(args.data, args.out, config,
                               HFChatTokenizer(resolve_model(args.model)))
    except (ConfigError, OSError, json.JSONDecodeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
