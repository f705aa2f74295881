"""The page an agent sees, typed: :class:`Page` (nodes in document order) with
:func:`render` to the text the model reads and :func:`parse`, the one reader of that text.

The text (``env_workers.observation`` renders it from the browser's accessibility tree) is one
line per node, indented one space per level of container:

    # Users                                       heading (level 1)
    [3] link "Create User"                         a control, bid 3
    [4] combobox "Region": China* | Singapore      a select; * marks the selected option
    [6] textbox "Logon Name": typed value          a field and what it holds
    button "Save" (disabled)                       a control without a bid (it cannot act)
    table "Users":                                 a container; its lines follow, indented
     - [7]ops Ops Team | [8]Delete                 a table row, cells joined by " | ", its
                                                   controls inline as [bid]label
    alert: Saved                                   an alert or status with text only
    plain text                                     anything else

``render(parse(text)) == text`` for every text: a line whose typed reading does not render
back to the same characters is kept as a ``text`` node. Controls inline in a line (a row's
cells, a paragraph's link) are nodes of their own, marked ``inline``, after their line; the
line draws them.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass, replace
from enum import StrEnum

# Roles of what an agent can act on.
INTERACTIVE = frozenset({
    "button", "link", "textbox", "searchbox", "combobox", "checkbox", "radio", "menuitem",
    "menuitemcheckbox", "menuitemradio", "tab", "switch", "spinbutton", "slider", "option",
})
# Containers whose role and name carry information worth a line of their own.
LANDMARKS = frozenset({
    "banner", "navigation", "main", "form", "dialog", "alertdialog", "alert", "status",
    "tablist", "tabpanel", "group", "radiogroup", "region", "search", "menu", "complementary",
    "contentinfo", "table",
})
SELECTS = frozenset({"combobox", "listbox"})


class Region(StrEnum):
    """Where a node sits: the innermost container line above it that is a place of its own
    (a group, radio group, region or tab panel is part of where it sits)."""

    PAGE = "page"
    HEADER = "header"
    NAV = "nav"
    MAIN = "main"
    FORM = "form"
    DIALOG = "dialog"
    ALERT = "alert"
    SEARCH = "search"
    MENU = "menu"
    TABS = "tabs"
    ASIDE = "aside"
    FOOTER = "footer"
    TABLE = "table"
    ROW = "row"


_REGION_OF = {
    "banner": Region.HEADER, "navigation": Region.NAV, "main": Region.MAIN,
    "form": Region.FORM, "dialog": Region.DIALOG, "alertdialog": Region.DIALOG,
    "alert": Region.ALERT, "status": Region.ALERT, "search": Region.SEARCH,
    "menu": Region.MENU, "tablist": Region.TABS, "complementary": Region.ASIDE,
    "contentinfo": Region.FOOTER, "table": Region.TABLE,
}


@dataclass(frozen=True)
class PageNode:
    """One thing on the page.

    ``role``: ``text``, ``heading``, ``row``, a container role (:data:`LANDMARKS`) or a
    control role (:data:`INTERACTIVE`, ``listbox``); an inline control's role is ``control``
    (the text does not say which). ``label``: a control's or container's name, a heading's or
    text line's text, a row's text (its cells joined). ``bid``: the id an action names (""
    when it cannot be acted on). ``value``: what a field holds. ``options`` and ``selected``:
    a select's options and the one chosen. ``flags``: states as rendered (``checked``,
    ``expanded``, ``checked=mixed``, ``disabled``); ``disabled`` and ``checked`` read them.
    ``region``: where it sits; ``row``: the row's text for a control inside a table row.
    ``line``: the index of the line that draws it; ``depth``: that line's indent; ``level``:
    a heading's level; ``cells``: a row's cells; ``inline``: drawn inside another node's line;
    ``opens``: a container line whose lines follow, indented."""

    role: str
    label: str = ""
    bid: str = ""
    value: str = ""
    options: tuple[str, ...] = ()
    selected: str = ""
    flags: tuple[str, ...] = ()
    region: Region = Region.PAGE
    row: str = ""
    line: int = 0
    depth: int = 0
    level: int = 0
    cells: tuple[str, ...] = ()
    inline: bool = False
    opens: bool = False

    @property
    def disabled(self) -> bool:
        return "disabled" in self.flags

    @property
    def checked(self) -> bool:
        return "checked" in self.flags


LabelQuery = str | re.Pattern[str]


def _label_is(node: PageNode, label: LabelQuery | None, contains: str | None) -> bool:
    if label is not None:
        if isinstance(label, re.Pattern):
            if label.match(node.label) is None:
                return False
        elif node.label != label:
            return False
    return contains is None or contains in node.label


@dataclass(frozen=True)
class Page:
    """A page: its nodes in document order (each line, then the controls inline in it)."""

    nodes: tuple[PageNode, ...] = ()
    url: str = ""
    title: str = ""

    # ---- queries -------------------------------------------------------------------------
    def find(self, role: str | None = None, label: LabelQuery | None = None, *,
             contains: str | None = None, region: Region | None = None,
             actionable: bool | None = None, inline: bool | None = None) -> list[PageNode]:
        """The nodes that fit every filter given: ``role``; ``label`` equal (a compiled
        pattern: matching at the label's start); ``contains`` in the label; ``region``;
        ``actionable`` (has a bid); ``inline``."""
        return [n for n in self.nodes
                if (role is None or n.role == role)
                and (region is None or n.region == region)
                and (actionable is None or bool(n.bid) == actionable)
                and (inline is None or n.inline == inline)
                and _label_is(n, label, contains)]

    def control(self, role: str, label: LabelQuery) -> PageNode | None:
        """The first control of its own line (``[N] role "label"``) with a bid."""
        return next(iter(self.find(role, label, actionable=True, inline=False)), None)

    def bid(self, role: str, label: LabelQuery) -> str | None:
        """The bid of :meth:`control` (``None`` when there is none)."""
        node = self.control(role, label)
        return None if node is None else node.bid

    def has(self, role: str, label: LabelQuery) -> bool:
        """Whether a control ``role "label"`` that can be acted on is on the page."""
        return self.control(role, label) is not None

    def by_bid(self, bid: str) -> PageNode | None:
        """The first node with that bid."""
        return next((n for n in self.nodes if n.bid and n.bid == str(bid)), None)

    def controls(self) -> list[PageNode]:
        """Every node an action can name (has a bid), in document order."""
        return [n for n in self.nodes if n.bid]

    def lines(self) -> list[PageNode]:
        """The nodes that are lines of the text (not inline)."""
        return [n for n in self.nodes if not n.inline]

    def rows(self) -> list[PageNode]:
        return [n for n in self.nodes if n.role == "row"]

    def headings(self) -> list[PageNode]:
        return [n for n in self.nodes if n.role == "heading"]

    def in_row(self, row_text: str, label: str) -> PageNode | None:
        """The control ``label`` inside the first table row whose text has ``row_text`` and
        such a control. An inline control's label runs to the next control or the cell's end,
        so it matches ``label`` followed by a space (``[4]ops Ops Team`` is ``ops``)."""
        for n in self.nodes:
            if n.inline and n.row and row_text in n.row and n.bid and (
                    n.label == label or n.label.startswith(label + " ")
                    or n.label.startswith(label + "(")):
                return n
        return None

    def text_after(self, bid: str) -> str:
        """What follows ``[bid]`` on the line that has it ("" when no node has that bid)."""
        node = self.by_bid(bid)
        if node is None:
            return ""
        line = render_line(next(n for n in self.nodes if n.line == node.line and not n.inline))
        i = line.find(f"[{node.bid}]")
        return line[i + len(node.bid) + 2:] if i >= 0 else ""


# ---- rendering -----------------------------------------------------------------------------
def _flags(flags: tuple[str, ...]) -> str:
    return " (" + ", ".join(flags) + ")" if flags else ""


def render_line(node: PageNode) -> str:
    """The line of a node that is not inline."""
    pad = " " * node.depth
    role = node.role
    if role == "text":
        return pad + node.label
    if role == "heading":
        return f"{pad}{'#' * node.level} {node.label}"
    if role == "row":
        return pad + "- " + " | ".join(node.cells)
    head = f"[{node.bid}] " if node.bid else ""
    if role in SELECTS:
        tail = "(disabled)" if node.disabled else ""
        options = " | ".join(o + ("*" if o == node.selected else "") for o in node.options)
        return f'{pad}{head}{role} "{node.label}"{tail}: {options}'
    if role in INTERACTIVE:
        value = f": {node.value}" if node.value else ""
        return f'{pad}{head}{role} "{node.label}"{_flags(node.flags)}{value}'
    if role in LANDMARKS:
        if not node.opens:
            return f"{pad}{role}: {node.label}"
        label = f' "{node.label}"' if node.label else ""
        return f"{pad}{role}{label}{_flags(node.flags)}:"
    return pad + node.label


def render(page: Page) -> str:
    """The text of a page, as the model reads it."""
    return "\n".join(render_line(n) for n in page.nodes if not n.inline)


# ---- parsing -------------------------------------------------------------------------------
_ROLES = "|".join(sorted(INTERACTIVE | SELECTS, key=len, reverse=True))
_CONTROL = re.compile(rf'(?:\[(\d+)\] )?({_ROLES}) "(.*?)"(?: \(([^()]*)\))?(?:: (.*))?',
                      re.S)
_SELECT = re.compile(r'(?:\[(\d+)\] )?(combobox|listbox) "(.*?)"(\(disabled\))?: (.*)', re.S)
_CONTAINER = re.compile(rf'({"|".join(sorted(LANDMARKS))})(?: "(.*)")?(?: \(([^()]*)\))?:',
                        re.S)
_LEAF = re.compile(r"(alert|status): (.*)", re.S)
_HEADING = re.compile(r"(#+) (.*)", re.S)
_INLINE_BID = re.compile(r"\[(\d+)\](?! )")       # "[3] " starts a control's own line
_INLINE_STATE = re.compile(r"\(((?:checked|expanded|pressed|disabled)(?:=[^,()]*)?"
                           r"(?:,(?:checked|expanded|pressed|disabled)(?:=[^,()]*)?)*)\)$")


def _read_line(body: str, depth: int, index: int) -> PageNode:
    """The typed reading of one line without its indent."""
    if m := _HEADING.fullmatch(body):
        return PageNode("heading", m[2], line=index, depth=depth, level=len(m[1]))
    if body.startswith("- "):
        cells = tuple(body[2:].split(" | "))
        return PageNode("row", " | ".join(cells), cells=cells, line=index, depth=depth)
    if m := _SELECT.fullmatch(body):
        options = tuple(m[5].split(" | ")) if m[5] else ()
        selected = next((o[:-1] for o in options if o.endswith("*")), "")
        return PageNode(m[2], m[3], bid=m[1] or "", options=tuple(o.removesuffix("*")
                        for o in options), selected=selected,
                        flags=("disabled",) if m[4] else (), line=index, depth=depth)
    if m := _CONTROL.fullmatch(body):
        flags = tuple(m[4].split(", ")) if m[4] else ()
        return PageNode(m[2], m[3], bid=m[1] or "", value=m[5] or "", flags=flags,
                        line=index, depth=depth)
    if m := _LEAF.fullmatch(body):
        return PageNode(m[1], m[2], line=index, depth=depth)
    if m := _CONTAINER.fullmatch(body):
        flags = tuple(m[3].split(", ")) if m[3] else ()
        return PageNode(m[1], m[2] or "", flags=flags, line=index, depth=depth, opens=True)
    return PageNode("text", body, line=index, depth=depth)


def _inline(segment: str, line: PageNode, region: Region, row: str) -> list[PageNode]:
    """The controls written ``[bid]label`` inside a piece of a line."""
    marks = list(_INLINE_BID.finditer(segment))
    out = []
    for k, m in enumerate(marks):
        end = marks[k + 1].start() if k + 1 < len(marks) else len(segment)
        label = segment[m.end():end].rstrip(" ")
        flags: tuple[str, ...] = ()
        if s := _INLINE_STATE.search(label):
            label, flags = label[:s.start()], tuple(s[1].split(","))
        out.append(PageNode("control", label, bid=m[1], flags=flags, region=region, row=row,
                            line=line.line, depth=line.depth, inline=True))
    return out


_IDS = re.compile(r"\b[a-z]{1,5}-[a-z0-9]{10,}\b")
_TIMES = re.compile(r"\d{4}-\d\d-\d\d[T ][\d:.]+(?:Z|[+-]\d\d:\d\d)?")
_ACCOUNT = re.compile(r"^\S+\nID \d+$", re.M)
_NUMBERS = re.compile(r"\d{5,}")


def comparable(text: str) -> str:
    """A rendered page with what differs between two visits of the same state taken out:
    timestamps, the account shown in the header, resource ids (``i-bp5uo7w6g51i0c``) and long
    numbers become ``{time}``, ``{account}``, ``{id}`` and ``{n}``. Two episodes that reached
    the same state render equal ``comparable`` texts (SRC's replay check)."""
    text = _TIMES.sub("{time}", text)
    text = _ACCOUNT.sub("{account}", text)
    text = _IDS.sub("{id}", text)
    return _NUMBERS.sub("{n}", text)


# The console's top bar before its first landmark: the skip link, the products menu, the logo,
# the account's name and id and Sign Out. Only a select there (the region) is kept.
def compact(text: str) -> str:
    """The page as an agent's prompt shows it (``AgentConfig.page_view`` ``compact``): the
    same lines and bids with the chrome an action never needs taken out.

    - the lines at the top of the page before its first container or heading, other than a
      select (the console's region), i.e. the skip link, products menu, logo, account name
      and id and Sign Out of the top bar;
    - the breadcrumb navigation (its links repeat the product navigation and the page's
      heading);
    - a heading that repeats the label of the container it opens (``navigation "RAM":`` then
      ``## RAM``), and a text line that repeats the label of the control just above it (a
      radio button's caption).

    Every line kept is the page's own line, so every bid shown is the page's bid; what an
    action needs (forms, tables, dialogs, alerts, the product navigation) stays."""
    page = parse(text)
    lines = page.lines()
    keep: list[str] = []
    top = True
    skip_depth: int | None = None
    previous: PageNode | None = None
    for node in lines:
        if skip_depth is not None:
            if node.depth > skip_depth:
                continue
            skip_depth = None
        if top and node.depth == 0 and not node.opens and node.role != "heading" \
                and node.role not in SELECTS:
            continue
        if node.depth == 0 and (node.opens or node.role == "heading"):
            top = False
        if node.role == "navigation" and node.opens and node.label == "Breadcrumb":
            skip_depth = node.depth
            continue
        if node.role == "heading" and previous is not None and previous.opens and \
                previous.label == node.label and node.depth == previous.depth + 1:
            previous = node
            continue
        if node.role == "text" and previous is not None and previous.bid and \
                node.label == previous.label and node.depth == previous.depth:
            continue                     # a radio's or checkbox's label drawn again beside it
        keep.append(render_line(node))
        previous = node
    return "\n".join(keep)


@functools.lru_cache(maxsize=32)
def parse(text: str, url: str = "", title: str = "") -> Page:
    """The page of a rendered text (``render(parse(text)) == text``). Cached: a page is
    immutable, and the same text is read many times on one step."""
    nodes: list[PageNode] = []
    places: list[tuple[int, Region]] = []          # open containers: (depth, region)
    for index, raw in enumerate(text.split("\n") if text else ()):
        body = raw.lstrip(" ")
        depth = len(raw) - len(body)
        node = _read_line(body, depth, index)
        if render_line(node) != raw:
            node = PageNode("text", body, line=index, depth=depth)
        while places and places[-1][0] >= depth:
            places.pop()
        region = Region.ROW if node.role == "row" else places[-1][1] if places else Region.PAGE
        node = replace(node, region=region)
        nodes.append(node)
        if node.opens and node.role in _REGION_OF:
            places.append((depth, _REGION_OF[node.role]))
        if node.role == "row":
            for cell in node.cells:
                nodes.extend(_inline(cell, node, region, node.label))
        elif node.role in ("text", "heading"):
            nodes.extend(_inline(node.label, node, region, ""))
    return Page(tuple(nodes), url, title)


__all__ = ["INTERACTIVE", "LANDMARKS", "Page", "PageNode", "Region", "comparable", "compact",
           "parse", "render", "render_line"]
