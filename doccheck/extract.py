"""Pages of documentation read into procedures: ``extract(data, content_type, source)``.

The pages it reads are in the style of a cloud help center, as Markdown (CommonMark with
tables) or HTML:

- a title (``#`` / ``<h1>``), intro prose (ignored), a **Prerequisites** section (``##`` or a
  deeper heading; its bullet items and paragraphs become ``Procedure.prerequisites`` of the
  procedures under the same parent heading), and one or more procedures, each an ordered list
  (``1.`` / ``<ol>``) under a heading. A procedure's title is the nearest heading above it that
  is not generic ("Procedure", "Steps") and not a tab name; its anchor is that heading's ``id``
  (HTML) or GitHub-style slug (Markdown). Sections named like "Background", "What to do next",
  "References", "Limits" hold no procedure.
- nested steps are numbered as written: an ordered list inside step 3 gives ``3.1``, ``3.2``
  (``<ol type="a">`` gives ``3.a``, ``3.b``), and lines ``a. ...``, ``b. ...`` written under a
  Markdown step (CommonMark has no lettered lists) are sub-steps ``3.a``, ``3.b``; a bulleted
  list inside a step adds its items' mentions to the step
  ("- **Logon Name**: enter ``x``"); a numbered list interrupted by a note or table continues
  (the next list starting at 6 after step 5 belongs to the same procedure).
- tabs: Markdown headings named ``Console`` / ``API`` / ``CLI`` / ``SDK`` / ``Terraform``... or
  HTML containers with ``data-tab="..."``. Only the console tab's procedure is kept
  (``Procedure.tab == "Console"``); the others describe work without the console.
- notes: ``> **Note** ...`` / ``<blockquote>`` / ``<div class="note">`` inside a step are not part
  of it; a step that is a note or a result ("The user is created.") is ``DocStep(note=True)``.
- a step the phrasings below do not cover is ``DocStep(structured=False)``; a step whose work is
  all in its sub-steps or its parameter table is structured, with the table's mentions.

Mentions (:class:`~doccheck.model.Mention`) a step's text yields, in the order they
appear (bold, ``<b>``, ``<strong>`` and ``<span class="uicontrol">`` mark UI names; plain
capitalised words are read too; code spans, ``<code>``, ``<kbd>``, ``<span class="userinput">``
and quotations are values):

=====================================================  =========================================
"Log on to the [RAM console](https://ram.console...)"  ``product "ram"`` (ecs, vpc, ram, oss; from
                                                        the link's host or "<X> console")
"In the left-side navigation pane, choose **A** > **B**" ``menu "A > B"`` (also ``choose A > B``,
                                                        ``<span class="menucascade">``, and
                                                        "...navigation pane, click **Users**" ->
                                                        ``menu "Users"``)
"On the **Users** page" / "The **X** page appears"     ``page "Users"``
"On the details page of the user" / "instance details  ``page "" value="detail"``
page"
"click **Create User**" / "click Create User" /        ``control "Create User"`` (one per click)
"In the message that appears, click **OK**"
"click **More** > **Stop**"                            ``control "More"``, ``control "Stop"``
"Click the **Permissions** tab" / "On the X tab"       ``control "Permissions" value="tab"``
"Click the ID of the VPC" / "click the name of the     ``control "" value="row-link"`` (the link
user" / "click the instance ID" / "Click the ID of      in the resource's row of a list;
`vpc-prod`" / "Click `bucket-01`"                       ``field`` holds the resource's name when
                                                        the step gives it: ``"vpc-prod"``)
"In the top navigation bar, select **China             ``control "China (Hangzhou)"
(Hangzhou)**"                                           value="region"`` (the region selector)
"Select the instance" (a row, not a named choice)      ``control "" value="row-select"``
"Enter `x` in the **Logon Name** field" / "In the      ``field "Logon Name" value="x"``
**Name** field, enter `x`" / "Set **Bandwidth** to
`5` Mbit/s"                                             (``field "Bandwidth" value="5"``)
"Enter a name for the bucket."                         ``field "Name" value=""`` (left to reader)
"Select **Public Read** from the **ACL** drop-down     ``option "Public Read" field="ACL"`` then
list" / "select **Public Read** for/under **ACL**" /   ``field "ACL" value="Public Read"``
"Set **ACL** to **Public Read**" / "From the **ACL**   (select/choose always gives the option,
drop-down list, select **Public Read**" / "Under       code value or UI name; set/enter gives
**ACL**, select `x`" / "Keep the default ACL,          it only for a UI name (bold), a code
**Private**"                                            span is data: ``field`` alone)
"In the **X** step, select **Y** and click **Next**"   ``option "Y"`` (no field named),
                                                        ``control "Next"``
"Enter `a` in the **A** field and `b` in the **B**     the verb carries over: ``field A=a``,
field" / "enter `env` as **Tag Key**"                   ``field B=b`` / ``field "Tag Key"="env"``
"Select the **Enable** check box" / "Clear the ..."    ``field "Enable" value="on"`` / ``"off"``
"**Zone**: select `x`" (a lettered line or a bullet)   ``option "x" field="Zone"``, ``field Zone=x``
a parameter table (Parameter | Description [| Value])  ``field <parameter> value=<first code span
inside a step, or right after a step that announces   or quotation of the description, or the
it ("...the following parameters:")                     Value column>`` (plus ``option`` when the
                                                        description says "Select **X**" or the
                                                        Value column is a UI name), also in
                                                        ``Procedure.parameters``
=====================================================  =========================================

"Find the instance and ...", "In the **Basic** section, ...", "in the **Actions** column" are
understood and name nothing themselves.

Limits (each refusal is a :class:`DocError` naming the limit): ``MAX_PAGE_BYTES`` (2 MiB) of
UTF-8 text without NUL bytes; at most ``MAX_BLOCKS`` Markdown blocks or HTML list items and
``MAX_STEPS`` steps; HTML
block elements nested at most ``MAX_HTML_DEPTH`` deep; Markdown nested deeper than 20 levels is
dropped. Nothing in a page is executed or fetched: selectolax parses HTML without running
scripts or loading resources, scripts/styles/iframes are removed with their content, event
handler attributes are never read, and links are only read for their text and host.
"""
from __future__ import annotations

import re
import unicodedata

from doccheck import extract_markup as mk
from doccheck.extract_markup import (MAX_BLOCKS, MAX_HTML_DEPTH, DocError, Heading,
                                     Item, List, Note, Para, Seg, Tab, Table)
from doccheck.extract_phrases import cell_value, step_mentions
from doccheck.model import DocStep, Mention, Procedure

MAX_PAGE_BYTES = 2 * 1024 * 1024
MAX_STEPS = 2000
CONTENT_TYPES = {"text/markdown": "markdown", "text/x-markdown": "markdown", "markdown": "markdown",
                 "md": "markdown", "text/html": "html", "html": "html"}

_GENERIC = {"procedure", "procedures", "steps", "step", "operation", "operations",
            "operation procedure", "instructions", "how to", "console", "procedure (console)"}
_TAB_WORDS = ("console", "api", "cli", "sdk", "openapi", "terraform", "ros", "ossutil",
              "ossbrowser", "alibaba cloud cli")
_PREREQ = ("prerequisites", "prerequisite", "before you begin", "requirements")
_NOT_PROCEDURE = ("background", "background information", "what to do next", "what's next",
                  "next steps", "references", "reference", "related", "related operations",
                  "related topics", "related documents", "see also", "limits", "limitations",
                  "usage notes", "faq", "overview", "billing", "introduction", "scenarios")
_PARAM_HEADERS = ("parameter", "field", "item", "setting", "name", "configuration item",
                  "option", "configuration")
_VALUE_HEADERS = ("value", "example", "example value", "value in this example", "setting value")


def _decode(data: str | bytes) -> str:
    if isinstance(data, (bytes, bytearray, memoryview)):
        raw = bytes(data)
        if len(raw) > MAX_PAGE_BYTES:
            raise DocError(f"the page is {len(raw)} bytes, more than the limit of {MAX_PAGE_BYTES}"
                           f" bytes (MAX_PAGE_BYTES, 2 MiB)")
        if b"\x00" in raw:
            raise DocError("the page is not text (binary content): it holds NUL bytes")
        try:
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise DocError(f"the page is not text (binary content): not UTF-8 at byte "
                           f"{exc.start}") from None
    elif isinstance(data, str):
        text = data
        if len(text) > MAX_PAGE_BYTES or \
                len(text.encode("utf-8", "surrogatepass")) > MAX_PAGE_BYTES:
            raise DocError(f"the page is more than the limit of {MAX_PAGE_BYTES} bytes "
                           f"(MAX_PAGE_BYTES, 2 MiB)")
        if "\x00" in text:
            raise DocError("the page is not text (binary content): it holds NUL characters")
        text = text.lstrip("\ufeff")
    else:
        raise DocError(f"data: expected the page as str or bytes, got {type(data).__name__}")
    return unicodedata.normalize("NFC", text)


def _format(content_type: str) -> str:
    if not isinstance(content_type, str):
        raise DocError(f"content_type: expected a string, got {type(content_type).__name__}")
    kind = CONTENT_TYPES.get(content_type.split(";")[0].strip().lower())
    if kind is None:
        raise DocError(f"content_type: {content_type!r} is not supported; use one of "
                       f"'text/markdown' or 'text/html' (also 'text/x-markdown', 'markdown', "
                       f"'md', 'html'; a charset parameter is allowed)")
    return kind


def _slug(text: str) -> str:
    return re.sub(r"[^\w\- ]", "", text.lower()).strip().replace(" ", "-")


def _tab_name(title: str) -> str | None:
    """The tab a heading names ("Console", "API"...), None for an ordinary heading."""
    low = title.lower().strip()
    words = low.replace("use the ", "").replace("use an ", "").replace("use ", "").strip()
    if words in _TAB_WORDS or words.endswith(" sdk") or words in ("in the console",
                                                                  "management console"):
        return "Console" if "console" in words else title.strip()
    return None


class _Builder:
    """Walks the page's blocks in order, keeping the heading path and the tab it is in."""

    def __init__(self, source: str):
        self.source = source
        self.headings: list[tuple[int, str, str, int]] = []    # level, title, anchor, id
        self.tab: tuple[str, int] | None = None                 # name, heading level (0: html)
        self.prereqs: list[tuple[tuple[int, ...], str]] = []    # parent heading ids, text
        self.context: list[tuple[tuple[int, ...], str]] = []    # heading ids, text
        self.procs: list[dict] = []
        self.steps = 0
        self.next_id = 0

    # ---- headings and sections
    def heading(self, block: Heading) -> None:
        title = mk.plain(block.segs)
        if self.tab and self.tab[1] and block.level <= self.tab[1]:
            self.tab = None
        tab = _tab_name(title)
        if tab is not None and block.level > 1:
            self.tab = (tab, block.level)
            return
        while self.headings and self.headings[-1][0] >= block.level:
            self.headings.pop()
        self.next_id += 1
        self.headings.append((block.level, title, block.anchor or _slug(title), self.next_id))

    def _section(self) -> str:
        return self.headings[-1][1].lower().strip(" :") if self.headings else ""

    def _path(self) -> tuple[int, ...]:
        return tuple(h[3] for h in self.headings)

    def _in_prereq(self) -> bool:
        return self._section().startswith(_PREREQ)

    def _skipped(self) -> bool:
        section = self._section()
        return section.startswith(_NOT_PROCEDURE) or (
            self.tab is not None and self.tab[0] != "Console")

    # ---- blocks
    def block(self, block) -> None:
        if isinstance(block, Heading):
            self.heading(block)
        elif isinstance(block, Tab):
            self.tab = (block.name if _tab_name(block.name) != "Console" else "Console", 0) \
                if block.name else None
        elif self._in_prereq():
            if isinstance(block, List):
                for item in block.items:
                    self._prereq(mk.plain(item.segs))
            elif isinstance(block, (Para, Note)):
                self._prereq(mk.plain(block.segs))
        elif self._skipped():
            return
        elif isinstance(block, List) and block.ordered:
            self._list(block)
        elif isinstance(block, (Para, Note)) or isinstance(block, Table) and \
                not self._current():
            self._context(block)
        elif isinstance(block, Table) and self._current():
            # a table written after a step instead of inside it (not indented in Markdown)
            # belongs to that step when the step announces it
            proc = self._current()
            step = proc["steps"][-1]
            if step["text"].endswith(":") or re.search(r"(?i)\b(?:following|parameters?|"
                                                       r"settings)\b", step["text"]):
                step["mentions"].extend(self._table(block, proc))
                if step["kind"] == "prose" and step["mentions"]:
                    step["kind"] = "action"

    def _context(self, block: Para | Note | Table) -> None:
        if isinstance(block, Table):
            texts = [" ".join(mk.plain(c) for c in row) for row in block.rows]
        else:
            texts = [mk.plain(block.segs)]
        self.context += [(self._path(), t) for t in texts if t.strip()]

    def _prereq(self, text: str) -> None:
        if text:
            self.prereqs.append((self._path()[:-1], text))

    def _key(self) -> tuple:
        return (self._path(), self.tab[0] if self.tab else "")

    def _current(self) -> dict | None:
        if self.procs and self.procs[-1]["key"] == self._key() and self.procs[-1]["steps"]:
            return self.procs[-1]
        return None

    def _list(self, block: List) -> None:
        proc = self._current()
        last = proc["steps"][-1]["number"] if proc else ""
        if not (proc and block.start > 1 and last.isdigit() and int(last) < block.start):
            title, anchor = "", ""
            for _level, text, anc, _id in reversed(self.headings):
                if text.lower().strip(" :") not in _GENERIC:
                    title, anchor = text, anc
                    break
            proc = {"key": self._key(), "title": title, "anchor": anchor, "steps": [],
                    "parameters": [], "path": self._path(),
                    "tab": self.tab[0] if self.tab else ""}
            self.procs.append(proc)
        for i, item in enumerate(block.items):
            self._item(item, str(block.start + i), proc, 1)

    def _item(self, item: Item, number: str, proc: dict, depth: int) -> None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise DocError(f"the page has more than {MAX_STEPS} steps (MAX_STEPS); a page of "
                           "documentation has far fewer")
        own, lettered = _lettered(item.segs)
        mentions, kind = step_mentions(own)
        step = {"number": number, "text": mk.plain(own), "mentions": list(mentions),
                "kind": kind}
        proc["steps"].append(step)
        children = len(lettered)
        for letter, segs in lettered:
            self._item(Item(segs), f"{number}.{letter}", proc, depth + 1)
        for block in item.blocks:
            if isinstance(block, Table):
                step["mentions"].extend(self._table(block, proc))
            elif isinstance(block, List) and not block.ordered:
                for sub in block.items:
                    step["mentions"].extend(self._bullet(sub))
            elif isinstance(block, List):
                for j, sub in enumerate(block.items):
                    children += 1
                    self._item(sub, f"{number}.{_sub_number(block.start + j, block.style)}",
                               proc, depth + 1)
        if children and kind == "prose":
            step["kind"] = "container"

    def _bullet(self, item: Item) -> list[Mention]:
        """A bulleted item inside a step: "**Logon Name**: enter `x`" or a plain phrase."""
        segs = item.segs
        if segs and segs[0].kind == "b" and len(segs) > 1 and segs[1].kind == "t" \
                and segs[1].text.lstrip().startswith((":", "-", "–")):
            name = segs[0].text.strip()
            value, choice = cell_value(segs[1:])
            out = [Mention("field", name, value=value)]
            return ([Mention("option", value, field=name)] + out) if choice else out
        return step_mentions(segs)[0]

    def _table(self, table: Table, proc: dict) -> list[Mention]:
        header = [mk.plain(c).lower().strip() for c in table.header]
        if not header or header[0] not in _PARAM_HEADERS or len(header) < 2:
            return []
        value_col = next((i for i, h in enumerate(header) if h in _VALUE_HEADERS), None)
        out: list[Mention] = []
        for row in table.rows:
            if not row or not mk.plain(row[0]):
                continue
            name = mk.plain(row[0]).strip(" *")
            if value_col is not None and value_col < len(row):
                value, choice = cell_value(row[value_col])
                if not value and not choice:
                    value = mk.plain(row[value_col])
            else:
                value, choice = cell_value([s for cell in row[1:] for s in cell])
            if choice:
                out.append(Mention("option", value, field=name))
            out.append(Mention("field", name, value=value))
            proc["parameters"].append((name, value))
        return out

    # ---- result
    def procedures(self) -> list[Procedure]:
        out = []
        done = [(proc, tuple(_doc_step(s) for s in proc["steps"])) for proc in self.procs]
        # a page is about one product: a procedure that does not open a console (it goes on
        # from the previous one) is about the product another procedure of the page opens
        page_product = next((m.text for _p, steps in done for s in steps for m in s.mentions
                             if m.kind == "product"), "")
        for proc, steps in done:
            product = next((m.text for s in steps for m in s.mentions if m.kind == "product"),
                           page_product)
            prereqs = tuple(text for parent, text in self.prereqs
                            if proc["path"][:len(parent)] == parent)
            context = tuple(text for path, text in self.context
                            if proc["path"][:len(path)] == path)
            out.append(Procedure(title=proc["title"], source=self.source, steps=steps,
                                 anchor=proc["anchor"], product=product,
                                 prerequisites=prereqs,
                                 parameters=tuple(proc["parameters"]), tab=proc["tab"],
                                 context=context))
        return out


def _sub_number(n: int, style: str) -> str:
    """A nested step's number as written: digits (3.2), or letters for ``<ol type="a">`` (3.b)."""
    if style != "a":
        return str(n)
    letters = ""
    while n > 0:
        n, r = divmod(n - 1, 26)
        letters = chr(ord("a") + r) + letters
    return letters


def _lettered(segs: list[Seg]) -> tuple[list[Seg], list[tuple[str, list[Seg]]]]:
    """A Markdown step's own text and the lettered sub-steps written as its lines
    ("   a. **Zone**: select `x`", lazy continuation lines CommonMark keeps in the paragraph).
    Letters must run a, b, c...; any other line continues the text before it."""
    lines: list[list[Seg]] = [[]]
    for seg in segs:
        if seg.kind == "t" and "\n" in seg.text:
            for k, part in enumerate(seg.text.split("\n")):
                if k:
                    lines.append([])
                if part:
                    lines[-1].append(Seg("t", part))
        else:
            lines[-1].append(seg)
    own, subs = lines[0], []
    for line in lines[1:]:
        first = line[0].text if line and line[0].kind == "t" else ""
        m = re.match(r"\s*([a-z])[.)]\s+", first)
        if m and ord(m.group(1)) == ord("a") + len(subs):
            subs.append((m.group(1), [Seg("t", first[m.end():])] + line[1:]))
        else:
            target = subs[-1][1] if subs else own
            target.append(Seg("t", " "))
            target.extend(line)
    return own, subs


def _doc_step(step: dict) -> DocStep:
    kind = step["kind"]
    mentions = tuple(step["mentions"])
    if kind == "note" and not mentions:
        return DocStep(step["number"], step["text"], (), structured=True, note=True)
    return DocStep(step["number"], step["text"], mentions,
                   structured=bool(mentions) or kind in ("container", "note"))


def extract(data: str | bytes, content_type: str, source: str = "page") -> list[Procedure]:
    """The procedures of one page of documentation, in page order; ``[]`` when it has none.

    ``data``: the page (bytes must be UTF-8); ``content_type``: ``text/markdown`` or
    ``text/html`` (also ``text/x-markdown``, ``markdown``, ``md``, ``html``; a ``; charset=``
    parameter is ignored); ``source``: the page's name, copied into each procedure.
    Raises :class:`DocError` (a ValueError) for binary content, a page over
    :data:`MAX_PAGE_BYTES`, an unknown content type or a page built past the limits in the module
    docstring. Pure: nothing is executed, fetched or written.
    """
    kind = _format(content_type)
    text = _decode(data)
    blocks = mk.read_markdown(text) if kind == "markdown" else mk.read_html(text)
    builder = _Builder(source)
    for block in blocks:
        builder.block(block)
    return builder.procedures()


__all__ = ["extract", "DocError", "MAX_PAGE_BYTES", "MAX_STEPS", "MAX_BLOCKS", "MAX_HTML_DEPTH",
           "CONTENT_TYPES", "Seg", "Note"]
