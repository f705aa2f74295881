"""The page as text for a language model: a compact accessibility tree where every enabled
interactive element carries a short id (bid) that the next action may name.

Source: Playwright's ``page.aria_snapshot(mode="ai")`` (the browser's accessibility tree as
YAML, elements tagged ``[ref=f2e17]``). :func:`render_snapshot` turns it into

    # Instances
    [3] link "Create Instance"
    [4] combobox "Search by": Instance name* | Instance ID | IP address
    [5] searchbox "Search text"
    table "Instances": Instance ID/Name | Status | Zone | ...
    - [7]i-bp5uo7w6g51i0cvguwpf web | Running | cn-hangzhou-h | ... | [8]Manage Start(disabled)

and a map bid -> Playwright ref. Rules, chosen for few tokens and stable output:
- bids are decimal numbers, one per enabled control; without an ``id_seed`` they count up
  in document order (1, 2, 3, ...); with one (``EpisodeSpec.id_seed``), the k-th control in
  document order gets the k-th number of a permutation of 1..999 drawn from
  ``random.Random(id_seed)`` (past 999 controls, 1000 + k), so an id says nothing of where
  its element sits and differs between episodes. Either way one page state renders the same
  text for the same seed;
- unnamed wrappers (generic, list, listitem, rowgroup) are flattened; link targets, cursor
  hints and aria-hidden content are dropped;
- a table row is one line, its cells joined by `` | `` with their controls inline;
- a select is one line with its options, the selected one marked ``*``;
- a disabled control is shown as ``Label(disabled)`` without a bid (it cannot be acted on).

The text is what crosses to the model and back; :mod:`consolerl.page` reads it as a typed
page (``parse``) for everything that needs to know what is on it, and its role sets are the
ones this renderer uses.
"""
from __future__ import annotations

import functools
import random
import re
from dataclasses import dataclass
from typing import Any

import yaml

from consolerl.page import INTERACTIVE, LANDMARKS, Page, parse
from consolerl.text import ascii_digits

_KEY = re.compile(r'^(?P<role>[a-z/][\w/-]*)(?: "(?P<name>(?:[^"\\]|\\.)*)")?(?P<attrs>(?: \[[^\]]*\])*)$')
_ATTR = re.compile(r"\[([^\]=]+)(?:=([^\]]*))?\]")
_STATES = ("checked", "disabled", "expanded", "selected", "pressed", "level")
PERMUTED_IDS = 999              # how many bids a seeded numbering draws from its permutation


@functools.lru_cache(maxsize=64)
def _permutation(id_seed: int) -> tuple[int, ...]:
    """1..PERMUTED_IDS in the order ``random.Random(id_seed)`` shuffles them (cached: an
    episode renders many pages with one seed)."""
    numbers = list(range(1, PERMUTED_IDS + 1))
    random.Random(id_seed).shuffle(numbers)
    return tuple(numbers)


def bid_number(k: int, id_seed: int | None) -> int:
    """The bid of the ``k``-th (from 1) enabled control in document order: ``k`` without a
    seed; with one, the k-th number of the seed's permutation, ``1000 + k`` past it."""
    if id_seed is None:
        return k
    return _permutation(id_seed)[k - 1] if k <= PERMUTED_IDS else 1000 + k


@dataclass(frozen=True)
class Rendered:
    text: str
    bids: dict[str, str]          # bid -> Playwright aria ref ("f2e17")
    focused: str                  # bid of the focused element, "" if none has one

    @property
    def page(self) -> Page:
        """The typed page of the text (:func:`consolerl.page.parse`)."""
        return parse(self.text)


@dataclass
class _Node:
    role: str
    name: str
    attrs: dict[str, str]
    text: str                     # the value after "key:" when it is a string
    children: list[Any]


def _node(item: Any) -> _Node | None:
    if isinstance(item, str):
        key, value, children = item, "", []
    elif isinstance(item, dict) and len(item) == 1:
        key, raw = next(iter(item.items()))
        value = raw if isinstance(raw, str) else ("" if raw is None else "")
        children = raw if isinstance(raw, list) else []
        if not isinstance(raw, (str, list)) and raw is not None:
            value = str(raw)
    else:
        return None
    key = str(key)
    if key == "text":
        return _Node("text", "", {}, value, [])
    m = _KEY.match(key)
    if m is None:
        return _Node("text", "", {}, key, [])
    name = (m["name"] or "").replace('\\"', '"').replace("\\\\", "\\")
    attrs = {a: (v if v is not None else "") for a, v in _ATTR.findall(m["attrs"] or "")}
    return _Node(m["role"], name, attrs, str(value), children)


def _typed(node: _Node) -> str:
    """What a text field holds when the snapshot gives it as a child (a field with a
    placeholder: ``- textbox "Port Range":`` then ``- /placeholder: 22/22`` and ``- text:
    443/443``); the placeholder itself is not a value."""
    if node.role not in ("textbox", "searchbox") or not node.name:
        return ""
    for item in node.children:
        if isinstance(item, dict) and len(item) == 1 and "text" in item:
            value = item["text"]
            return value if isinstance(value, str) else ""
    return ""


class _Renderer:
    def __init__(self, id_seed: int | None) -> None:
        self.lines: list[str] = []
        self.bids: dict[str, str] = {}
        self.focused = ""
        self.id_seed = id_seed

    def bid_for(self, node: _Node) -> str:
        ref = node.attrs.get("ref", "")
        if not ref or "disabled" in node.attrs:
            return ""
        bid = str(bid_number(len(self.bids) + 1, self.id_seed))
        self.bids[bid] = ref
        if "active" in node.attrs:
            self.focused = bid
        return bid

    # ---- inline form (cells, rows) ----------------------------------------------------------
    def inline(self, items: list[Any], in_row: bool = False) -> str:
        parts: list[str] = []
        for item in items:
            node = _node(item)
            if node is None or "aria-hidden" in node.attrs or node.role == "/url":
                continue
            if node.role == "text":
                parts.append(node.text)
            elif node.role in INTERACTIVE and node.role != "option":
                label = node.name or node.text or self.inline(node.children)
                if "disabled" in node.attrs:
                    if not in_row:      # a row's status already says why; save the tokens
                        parts.append(f"{label}(disabled)")
                else:
                    parts.append(f"[{self.bid_for(node)}]{label}" + self.state(node, inline=True))
            else:
                inner = (self.inline(node.children, in_row) if node.children
                         else (node.text or node.name))
                if inner:
                    parts.append(inner)
        return " ".join(p for p in parts if p)

    @staticmethod
    def state(node: _Node, inline: bool = False) -> str:
        flags = [k if not v or v == "true" else f"{k}={v}" for k, v in node.attrs.items()
                 if k in _STATES and k not in ("level", "selected")]
        if not flags:
            return ""
        return "(" + ",".join(flags) + ")" if inline else " (" + ", ".join(flags) + ")"

    # ---- block form ----------------------------------------------------------------------------
    def block(self, items: list[Any], depth: int) -> None:
        nodes = [n for n in map(_node, items) if n is not None and "aria-hidden" not in n.attrs
                 and n.role not in ("/url", "caption")]
        for i, node in enumerate(nodes):
            # A visible label right before its control repeats the control's name.
            nxt = nodes[i + 1] if i + 1 < len(nodes) else None
            if nxt is not None and node.role in ("text", "generic") and not node.children \
                    and (node.text or node.name) == nxt.name and nxt.role in INTERACTIVE:
                continue
            self.emit(node, depth)

    def emit(self, node: _Node, depth: int) -> None:
        pad = " " * depth
        role = node.role
        if role == "text" or role == "paragraph" or (role == "generic" and not node.children):
            text = node.text or node.name or self.inline(node.children)
            if text:
                self.lines.append(pad + text)
            return
        if role == "heading":
            level = node.attrs.get("level", "2")
            self.lines.append(f"{pad}{'#' * int(level if ascii_digits(level) else 2)} "
                              f"{node.name or self.inline(node.children)}")
            return
        if role == "row":
            cells = []
            for item in node.children:
                cell = _node(item)
                if cell is None:
                    continue
                if cell.role == "columnheader":
                    cells.append(cell.name)
                else:
                    cells.append(self.inline(cell.children, in_row=True) if cell.children
                                 else (cell.text or cell.name))
            self.lines.append(pad + "- " + " | ".join(cells))
            return
        if role == "combobox" or role == "listbox":
            bid = self.bid_for(node)
            options = []
            for item in node.children:
                opt = _node(item)
                if opt is not None and opt.role == "option":
                    options.append(opt.name + ("*" if "selected" in opt.attrs else ""))
            head = f"[{bid}] " if bid else ""
            tail = "(disabled)" if "disabled" in node.attrs else ""
            self.lines.append(f'{pad}{head}{role} "{node.name}"{tail}: ' + " | ".join(options))
            return
        if role in INTERACTIVE:
            bid = self.bid_for(node)
            head = f"[{bid}] " if bid else ""
            label = node.name or self.inline(node.children)
            text = node.text or _typed(node)
            value = f": {text}" if text and text != label else ""
            self.lines.append(f'{pad}{head}{role} "{label}"{self.state(node)}{value}')
            return
        if role in LANDMARKS and (node.name or role in ("dialog", "alert", "status", "table")):
            label = f' "{node.name}"' if node.name else ""
            if role in ("alert", "status") and not node.children:
                self.lines.append(f"{pad}{role}: {node.text or node.name}")
                return
            self.lines.append(f"{pad}{role}{label}{self.state(node)}:")
            self.block(node.children, depth + 1)
            if node.text:
                self.lines.append(pad + " " + node.text)
            return
        # Wrappers carry nothing of their own: passive content becomes one line, the rest
        # moves up a level.
        if node.children and not _has_controls(node.children):
            text = " ".join(t for t in (node.text, self.inline(node.children)) if t)
            if text:
                self.lines.append(pad + text)
            return
        if node.text:
            self.lines.append(pad + node.text)
        self.block(node.children, depth)


def _has_controls(items: list[Any]) -> bool:
    for item in items:
        node = _node(item)
        if node is None:
            continue
        if node.role in INTERACTIVE or node.role in LANDMARKS or node.role in ("row", "heading"):
            return True
        if node.children and _has_controls(node.children):
            return True
    return False


def render_snapshot(snapshot: str, id_seed: int | None = None) -> Rendered:
    """Render Playwright's ``aria_snapshot(mode="ai")`` YAML as compact text with bids,
    numbered in document order (``id_seed`` None) or from ``id_seed``'s permutation (see the
    module docstring)."""
    try:
        tree = yaml.load(snapshot, Loader=yaml.CSafeLoader) if snapshot.strip() else []
    except yaml.YAMLError:
        # Should not happen with Playwright's output; keep the agent going with raw text.
        return Rendered(snapshot[:20_000], {}, "")
    renderer = _Renderer(id_seed)
    renderer.block(tree if isinstance(tree, list) else [tree], 0)
    return Rendered("\n".join(renderer.lines), renderer.bids, renderer.focused)


def approx_tokens(text: str) -> int:
    """A tokenizer-free estimate (about 4 characters per token for this kind of text)."""
    return (len(text) + 3) // 4
