"""Markdown and HTML pages read into one small block model, so that :mod:`.extract` finds
procedures the same way in both.

A page becomes a flat list of blocks: :class:`Heading`, :class:`List` (ordered or not, its
:class:`Item`\\ s holding their own nested blocks), :class:`Table`, :class:`Note`, :class:`Para`
and :class:`Tab` markers (an HTML ``data-tab`` container starts one, and a ``Tab("")`` ends it).
Running text is kept as :class:`Seg` runs: ``t`` plain text, ``b`` a UI name (bold, ``<b>``,
``<strong>``, ``<span class="uicontrol">``), ``c`` a value (code span, ``<code>``, ``<kbd>``,
``<span class="userinput">``), ``l`` a link (``href`` kept, never followed) and ``m`` a menu path
(``<span class="menucascade">``, its parts joined by `` > ``).

Markdown is parsed by markdown-it-py (CommonMark with tables) with its inline rules switched off;
only the text the extractor reads (headings, list items, table cells, notes) is parsed inline,
so the intro prose of a large page costs nothing. HTML is parsed by selectolax (lexbor), which
neither runs scripts nor fetches anything; ``<script>``, ``<style>``, ``<iframe>`` and similar
elements are dropped with their content before anything is read, and attributes other than
``class``, ``id``, ``start``, ``data-tab`` and ``href`` are never looked at.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from markdown_it import MarkdownIt
from markdown_it.tree import SyntaxTreeNode
from selectolax.lexbor import LexborHTMLParser, LexborNode

from consolerl.errors import ConsoleRLError

# Guards: a page within MAX_PAGE_BYTES can still be built to be slow to read. Markdown-it's
# nesting limit drops what is nested deeper than MARKDOWN_NESTING; lexbor's tree building is
# quadratic in the depth of nested block elements, so that depth is measured before parsing;
# MAX_BLOCKS bounds the work of the block parser and of the walk.
MARKDOWN_NESTING = 20
MAX_HTML_DEPTH = 200
MAX_WALK_DEPTH = 48
# The most characters of one paragraph, cell or step read as inline markup. A help-center step
# is a few hundred; a hostile page's 2 MiB of code spans or links in one paragraph would keep
# markdown-it's pure-Python inline rules busy for a minute. The rest is not read.
MAX_INLINE_CHARS = 8000
MAX_INLINE_SEGS = 2000          # pieces (text, bold, code, link) of one HTML block read
MAX_BLOCKS = 5000


class DocError(ConsoleRLError, ValueError):
    """A page that cannot be read: not text, too large, too deeply built, or an unknown type."""


@dataclass
class Seg:
    kind: str           # t | b | c | l | m
    text: str
    href: str = ""


@dataclass
class Heading:
    level: int
    segs: list[Seg]
    anchor: str = ""


@dataclass
class Item:
    segs: list[Seg]
    blocks: list = field(default_factory=list)


@dataclass
class List:
    ordered: bool
    items: list[Item]
    start: int = 1
    style: str = "1"    # how its items are numbered: "1" digits, "a" letters (<ol type="a">)


@dataclass
class Table:
    header: list[list[Seg]]
    rows: list[list[list[Seg]]]


@dataclass
class Note:
    segs: list[Seg]


@dataclass
class Para:
    segs: list[Seg]


@dataclass
class Tab:
    name: str           # "" ends the tab


def plain(segs: list[Seg]) -> str:
    return " ".join("".join(s.text for s in segs).split())


def _push(out: list[Seg], kind: str, text: str, href: str = "") -> None:
    if not text:
        return
    if out and out[-1].kind == kind and kind in "tb" and not href:
        if len(out[-1].text) < MAX_INLINE_CHARS:        # (the rest is not read)
            out[-1].text += text
    else:
        out.append(Seg(kind, text, href))


# ---- Markdown -------------------------------------------------------------------------------
def _budget_rule(state, start_line, end_line, silent):  # noqa: ARG001 (markdown-it's signature)
    """Counts the blocks the parser opens and refuses a page with too many; never matches."""
    if not silent:
        state.env["blocks"] = state.env.get("blocks", 0) + 1
        if state.env["blocks"] > MAX_BLOCKS:
            raise DocError(f"the page has more than {MAX_BLOCKS} blocks (paragraphs, list items,"
                           " headings); a page of documentation has far fewer")
    return False


_MD = MarkdownIt("commonmark", {"html": True, "maxNesting": MARKDOWN_NESTING}).enable("table")
_MD.disable("inline")
_MD.block.ruler.before("table", "budget", _budget_rule)

# Raw HTML inside Markdown: only a tag's name is looked at, to skip a script's text and to read
# <b>/<strong>/<code> as their Markdown equivalents.
_TAG = re.compile(r"<\s*(/?)\s*([a-zA-Z][a-zA-Z0-9-]*)([^>]*)>")
SKIP_TAGS = frozenset({"script", "style", "iframe", "noscript", "template", "object", "embed",
                       "svg", "math", "canvas", "frame", "frameset", "head", "title", "nav",
                       "footer", "pre", "button", "select", "textarea", "input"})


def _md_inline(content: str) -> list[Seg]:
    tokens: list = []
    _MD.inline.parse(content[:MAX_INLINE_CHARS], _MD, {}, tokens)
    out: list[Seg] = []
    bold = 0
    skip = ""
    link: list | None = None     # [href, text] while inside a link
    for tok in tokens:
        if skip:
            if tok.type == "html_inline":
                m = _TAG.match(tok.content)
                if m and m.group(1) and m.group(2).lower() == skip:
                    skip = ""
            continue
        kind = tok.type
        if kind == "html_inline":
            m = _TAG.match(tok.content)
            if not m:
                continue
            name = m.group(2).lower()
            if name in SKIP_TAGS and not m.group(1) and not m.group(3).rstrip().endswith("/"):
                skip = name
            elif name in ("b", "strong") or (name == "span" and "uicontrol" in m.group(3)):
                bold += -1 if m.group(1) else 1
            elif name == "br":
                _push(out, "t", " ")
            continue
        if kind == "strong_open":
            bold += 1
        elif kind == "strong_close":
            bold = max(0, bold - 1)
        elif kind == "link_open":
            link = [tok.attrGet("href") or "", ""]
        elif kind == "link_close" and link is not None:
            out.append(Seg("l", " ".join(link[1].split()), str(link[0])))
            link = None
        elif kind in ("text", "code_inline", "softbreak", "hardbreak"):
            # a soft break stays a line break: "a. ..." lines written under a step are
            # lettered sub-steps in help-center Markdown (CommonMark has no lettered lists)
            text = "\n" if kind.endswith("break") else tok.content
            if link is not None:
                link[1] += text
            elif kind == "code_inline":
                out.append(Seg("c", text))
            else:
                _push(out, "b" if bold else "t", text)
    return out


def _md_node_segs(node: SyntaxTreeNode) -> list[Seg]:
    """The running text of a paragraph, heading or cell (its inline child, parsed now)."""
    segs: list[Seg] = []
    for child in node.children:
        if child.type == "inline":
            if segs:
                _push(segs, "t", " ")
            segs.extend(_md_inline(child.content))
    return segs


def _md_table(node: SyntaxTreeNode) -> Table:
    header: list[list[Seg]] = []
    rows: list[list[list[Seg]]] = []
    for part in node.children:
        for tr in part.children:
            cells = [_md_node_segs(cell) for cell in tr.children]
            if part.type == "thead":
                header = cells
            else:
                rows.append(cells)
    return Table(header, rows)


def _md_blocks(nodes, out: list) -> None:
    for node in nodes:
        kind = node.type
        if kind == "heading":
            out.append(Heading(int(node.tag[1:]), _md_node_segs(node)))
        elif kind == "paragraph":
            out.append(Para(_md_node_segs(node)))
        elif kind in ("ordered_list", "bullet_list"):
            items = []
            for li in node.children:
                segs: list[Seg] = []
                blocks: list = []
                for child in li.children:
                    if child.type == "paragraph":
                        if segs:
                            _push(segs, "t", " ")
                        segs.extend(_md_node_segs(child))
                    else:
                        _md_blocks([child], blocks)
                items.append(Item(segs, blocks))
            start = int(node.attrs.get("start", 1) or 1) if kind == "ordered_list" else 1
            out.append(List(kind == "ordered_list", items, start))
        elif kind == "table":
            out.append(_md_table(node))
        elif kind == "blockquote":
            segs = []
            for child in node.children:
                if child.type == "paragraph":
                    segs.extend(_md_node_segs(child))
            out.append(Note(segs))
        # html_block, fence, code_block, hr: nothing a procedure is made of


def read_markdown(text: str) -> list:
    env: dict = {}
    tokens = _MD.parse(text, env)
    out: list = []
    _md_blocks(SyntaxTreeNode(tokens).children, out)
    return out


# ---- HTML -----------------------------------------------------------------------------------
# Block containers whose nesting lexbor pays for quadratically (measured: 20,000 nested <ol>
# take seconds); tags that close themselves implicitly (li, p, td) do not nest this way.
# (matched in the lower-cased page, case-sensitively: an IGNORECASE alternation tried at each
# of 2 MiB of "<" takes seconds)
_DEPTH_TAG = re.compile(r"<(/?)(?:div|ol|ul|section|article|blockquote|table|dl|aside|main|"
                        r"details|figure|fieldset|form|nav|header|footer|span)\b")
_NOTE_CLASSES = frozenset({"note", "notice", "caution", "warning", "tip", "important",
                           "attention", "danger", "alert"})


def _html_depth_guard(text: str) -> None:
    depth = 0
    for m in _DEPTH_TAG.finditer(text.lower()):
        depth = max(0, depth - 1) if m.group(1) else depth + 1
        if depth > MAX_HTML_DEPTH:
            raise DocError(f"the page nests elements more than {MAX_HTML_DEPTH} levels deep;"
                           " a page of documentation nests a few levels")


def _classes(node: LexborNode) -> set[str]:
    return set((node.attributes.get("class") or "").lower().split())


def _is_note(node: LexborNode) -> bool:
    return node.tag in ("blockquote", "aside") or bool(_classes(node) & _NOTE_CLASSES)


def _html_segs(node: LexborNode, out: list[Seg], depth: int = 0, bold: bool = False) -> None:
    for child in node.iter(include_text=True):
        # a step is a few dozen pieces of a few hundred characters; the rest is not read
        if len(out) >= MAX_INLINE_SEGS or out and len(out[-1].text) >= MAX_INLINE_CHARS:
            return
        tag = child.tag
        if tag == "-text":
            _push(out, "b" if bold else "t", child.text(deep=False))
            continue
        if tag in SKIP_TAGS or tag in ("ol", "ul", "table", "dl", "img") or _is_note(child) \
                or tag.startswith("-") or tag.startswith("_"):
            continue
        classes = _classes(child)
        if depth >= MAX_WALK_DEPTH:
            _push(out, "t", child.text(deep=True))
        elif "menucascade" in classes:
            parts = [p.text(deep=True).strip() for p in child.css(".uicontrol")]
            if not parts:
                parts = [p.strip() for p in child.text(deep=True).split(">")]
            out.append(Seg("m", " > ".join(p for p in parts if p)))
        elif tag in ("code", "kbd", "samp", "var") or classes & {"userinput", "codeph"}:
            out.append(Seg("c", " ".join(child.text(deep=True).split())))
        elif tag == "a":
            out.append(Seg("l", " ".join(child.text(deep=True).split()),
                           child.attributes.get("href") or ""))
        elif tag == "br":
            _push(out, "t", " ")
        else:
            if tag in ("p", "div") and out:
                _push(out, "t", " ")
            is_bold = bold or tag in ("b", "strong") or bool(classes & {"uicontrol", "wintitle"})
            _html_segs(child, out, depth + 1, is_bold)


def _html_table(node: LexborNode) -> Table:
    header: list[list[Seg]] = []
    rows: list[list[list[Seg]]] = []
    for tr in node.css("tr"):
        cells = []
        is_head = True
        for cell in tr.iter():
            if cell.tag in ("td", "th"):
                segs: list[Seg] = []
                _html_segs(cell, segs)
                cells.append(segs)
                is_head = is_head and cell.tag == "th"
        if is_head and not header and not rows:
            header = cells
        elif cells:
            rows.append(cells)
    return Table(header, rows)


def _html_blocks(node: LexborNode, out: list, depth: int, count: list[int]) -> None:
    """Appends ``node``'s blocks to ``out``; ``count``: [elements seen, list items seen]."""
    if depth >= MAX_WALK_DEPTH:
        return
    for child in node.iter(include_text=False):
        count[0] += 1
        if count[0] > MAX_BLOCKS * 20:
            raise DocError(f"the page has more than {MAX_BLOCKS * 20} elements; a page of"
                           " documentation has far fewer")
        tag = child.tag
        if tag in SKIP_TAGS:
            continue
        tab = child.attributes.get("data-tab")
        if tab is not None:
            out.append(Tab(" ".join(tab.split()) or "?"))
            _html_blocks(child, out, depth + 1, count)
            out.append(Tab(""))
        elif len(tag) == 2 and tag[0] == "h" and tag[1] in "123456":
            segs: list[Seg] = []
            _html_segs(child, segs)
            out.append(Heading(int(tag[1]), segs, child.attributes.get("id") or ""))
        elif tag in ("ol", "ul"):
            items = []
            for li in child.iter(include_text=False):
                if li.tag != "li":
                    continue
                count[1] += 1
                if count[1] > MAX_BLOCKS:
                    raise DocError(f"the page has more than {MAX_BLOCKS} list items; a page of"
                                   " documentation has far fewer")
                segs = []
                _html_segs(li, segs)
                blocks: list = []
                _html_blocks(li, blocks, depth + 1, count)
                items.append(Item(segs, blocks))
            try:
                start = int(child.attributes.get("start") or 1)
            except ValueError:
                start = 1
            style = "a" if (child.attributes.get("type") or "1") in ("a", "A") else "1"
            out.append(List(tag == "ol", items, start, style))
        elif tag == "table":
            out.append(_html_table(child))
        elif _is_note(child):
            segs = []
            _html_segs(child, segs)
            out.append(Note(segs))
        elif tag == "p":
            segs = []
            _html_segs(child, segs)
            out.append(Para(segs))
        elif tag in ("li", "td", "th", "tr"):
            continue
        else:
            # containers (div, section, article, main, body...) and inline elements: only the
            # blocks inside them count; an li's own text was read by _html_segs
            _html_blocks(child, out, depth + 1, count)


def read_html(text: str) -> list:
    _html_depth_guard(text)
    tree = LexborHTMLParser(text)
    tree.strip_tags(sorted(SKIP_TAGS - {"pre", "nav", "footer", "button", "select", "input",
                                        "textarea"}))
    root = tree.body or tree.root
    out: list = []
    if root is not None:
        _html_blocks(root, out, 0, [0, 0])
    return out
