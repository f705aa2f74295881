"""What one step names: the menu path, page, controls, fields, values and options in the text of a
single step (already isolated by the Markdown or HTML parser).

The step's runs (see :mod:`.extract_markup`) become a template in which every UI name, value,
link and menu path is a placeholder (``⟨b0⟩``, ``⟨c1⟩``, ``⟨l0⟩``, ``⟨m0⟩``); the template is
split into sentences and clauses (", ", " and ", "; ") and each clause is matched against the
help-center phrasings listed in :mod:`.extract`. Small patterns over one clause of one step, so
a name can be bold or plain ("click **Create User**" and "click Create User" both work; plain
names are runs of capitalised words).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace

from consolerl.text import norm
from doccheck.extract_markup import Seg
from doccheck.model import Mention

PRODUCTS = {"ecs": "ecs", "elastic compute service": "ecs", "vpc": "vpc",
            "virtual private cloud": "vpc", "ram": "ram", "resource access management": "ram",
            "oss": "oss", "object storage service": "oss"}

_PH = r"⟨[blm]\d+⟩"
_Q = r'"[^"]+"|“[^”]+”'
_WORD = r"\(?[A-Z0-9][^\s,;:⟨⟩]*"
_TITLE = rf"{_WORD}(?:\s+(?:(?:of|and|or|to|for|the|a|an|in|on|by|with|&|-)\s+)?{_WORD})*"
NAME = rf"(?:{_PH}|{_Q}|{_TITLE})"
_I = "(?i:{})".format


def _c(pattern: str) -> re.Pattern:
    return re.compile(pattern)


TOP_BAR = _c(_I(r"(?:^|\s)(?:in|on|from) the top (?:navigation|menu) bar"))
NAV = _c(_I(r"in the (?:left-side |left |side )?navigation (?:pane|bar|menu|tree)"
            r"(?: on the left)?|in the left-side menu|in the left navigation"))
GOTO = _c(rf"^{_I('(?:navigate to|go to|open)')}\s+(?:{_I('the')}\s+)?({NAME})"
          rf"(?:\s+{_I('page')})?$")
# "Specify the VPC settings.", "Fill in the fields as follows:": an introduction to the
# sub-steps or the table that follow, not a field of its own
INTRO = _c(_I(r"\b(?:settings|parameters|fields|following|as follows|configuration|"
              r"information|details|properties|rule|options)\s*$"))
DIALOG = _c(_I(r"^in the (?:message|dialog box|dialog|confirmation message|pop-up window|"
               r"panel|window|message box)\b") + rf"|^{_I('in the')} {NAME} "
            + _I(r"(?:dialog box|dialog|panel|message|window)\b"))
SECTION = _c(rf"^{_I('in the')} ({NAME}) {_I('(?:section|area|column|list|table|step)')}\b")
# "In **Logon Name**, enter ...": a field named bare before the clause that fills it
FIELD_IN = _c(rf"^{_I('in')} ({NAME})$")
# "..., for example `web-01`": the value of the field just named
FOR_EXAMPLE = _c(_I(r"^(?:for example|for instance|such as|e\.g\.)") + r"\s*,?\s*(.+)$")
FIELD_CTX = _c(rf"^{_I('(?:in|from|for) the')} ({NAME}) "
               + _I(r"(?:field|text box|box|drop-down list|drop-down menu|list|parameter)\b")
               + rf"|^{_I('under')} (?:{_I('the')} )?({NAME})$")
DETAIL_PAGE = _c(_I(r"(?:on|go to|open|in) the (?:[\w-]+ )?details? page"
                    r"|(?:on|go to|open) the [\w-]+'s details page"))
PAGE = _c(rf"{_I('(?:on|go to|navigate to|open|in) the')} ({NAME}) {_I('page')}"
          rf"|{_I('the')} ({NAME}) {_I('page (?:appears|opens|is displayed|is shown)')}")
TAB = _c(rf"{_I('(?:on|click|go to|open|select|choose|in) the')} ({NAME}) {_I('tab')}\b")
CHECKBOX = _c(rf"({_I('select|clear|deselect|turn on|turn off|enable|disable')})\s+"
              rf"(?:{_I('the')}\s+)?({NAME})\s*{_I('(?:check ?box|switch)')}")
# "Turn on **IPv6 CIDR Block**": a switch named by its marked-up label alone
TOGGLE = _c(rf"({_I('turn on|turn off|switch on|switch off|enable|disable')})\s+"
            rf"(?:{_I('the')}\s+)?({_PH})")
PATH = rf"{NAME}(?:\s*>\s*{NAME})+"
MENU = _c(rf"{_I('(?:choose|select|click|go to|navigate to|open)')}\s+(?:{_I('the')}\s+)?({PATH})")
BARE_PATH = _c(rf"^({PATH})$")
ROW_LINK = _c(_I(r"click (?:the )?(?:(?:ID|name|hostname) of (?:the |a |an )?(?:[\w-]+(?: [\w-]+)?|"
                 r"⟨c\d+⟩)|[\w-]+(?: [\w-]+)? (?:ID|name)\b(?: (⟨c\d+⟩))?)"))
ENTER_IN = _c(rf"{_I('(?:enter|type|input|specify|provide|fill in)')}\s+(.+?)\s+"
              rf"{_I('(?:in|into)')}\s+(?:{_I('the')}\s+)?({NAME})"
              rf"(?:\s+{_I('(?:field|text box|box)')})?\s*$")
SET = _c(rf"{_I('(?:set|change|modify|configure)')}\s+(?:{_I('the value of')}\s+)?"
         rf"(?:{_I('the')}\s+)?({NAME})(?:\s+{_I('(?:field|parameter|option)')})?\s+"
         rf"{_I('to')}\s+(.+)$")
_WHERE = r"(?:drop-down list|drop-down menu|list|field|section|menu|parameter)"
SELECT_FROM = _c(rf"{_I('(?:select|choose)')}\s+(.+?)\s+{_I('(?:from|in|for|under)')}\s+"
                 rf"(?:{_I('the')}\s+)?({NAME})(?:\s+{_I(_WHERE)})?\s*$")
# ("... as the vSwitch name": a field written in lower case, by the noun a field's label ends in)
_FIELD_PHRASE = (r"[\w-]+(?: [\w-]+){0,2} (?i:name|description|block|range|zone|type|"
                 r"class|policy)")
ENTER_AS = _c(rf"^(?:{_I('(?:enter|type|input|specify|use)')}\s+)?(⟨c\d+⟩|{_Q})\s+"
                 rf"{_I('as')}\s+(?:{_I('the')}\s+)?({NAME}|{_FIELD_PHRASE})$")
KEEP = _c(rf"^{_I('(?:keep|retain|leave|use) the default')}\s+"
          rf"(?:{_I('(?:value|setting) (?:of|for)')}\s+)?"
          rf"(?:{_I('the')}\s+)?(.+?)(?:\s+{_I('unchanged')})?(?:,\s*(⟨[bc]\d+⟩|{_Q}))?$")
CLICK_VALUE = _c(rf"^{_I('click')}\s+(?:{_I('the')}\s+)?(⟨c\d+⟩)")
# "Click **media-01** in the **Bucket Name** column": a resource's link in its row (a click
# in the Actions column is a row action)
CLICK_IN_COLUMN = _c(rf"^{_I('click')}\s+(?:{_I('the')}\s+)?({NAME})\s+{_I('in the')}\s+"
                     rf"({NAME})\s+{_I('column')}\b")
VERBS = ("enter", "type", "set", "select", "choose", "click", "change")
LABELLED = _c(r"^(⟨b\d+⟩)\s*[:：]\s*(.+)$")
ENTER = _c(rf"{_I('(?:enter|type|input|specify|provide|fill in)')}\s+(.+)$")
SELECT = _c(rf"(?<!\b{_I('you')} ){_I('(?:select|choose)')}\s+(.+)$")   # not "that you select"
CLICK = _c(rf"{_I('(?:click|double-click|tap|press)')}\s+(?:{_I('the')}\s+)?({NAME})"
           rf"(?:\s+{_I('(?:button|link|icon)')})?")
PRODUCT = _c(_I(r"\b(ECS|VPC|RAM|OSS|Elastic Compute Service|Virtual Private Cloud|"
                r"Resource Access Management|Object Storage Service)\b(?: \(\w+\))? console\b"))
LOGON = _c(_I(r"^(?:log on to|log in to|sign in to|go to|open|navigate to|access)\b"))
FIND = _c(_I(r"^(?:find|locate|search for|look for|filter)\b"))
ROW_SELECT = _c(_I(r"^select (?:the|one or more|an?) ([\w-]+(?: (?!that\b|you\b|whose\b)[\w-]+)?)"
                   r"(?: that| you| whose|,|$)"))
# "enter the bucket name in the search box": a list's search box, which names no field
IN_SEARCH_BOX = _c(_I(r"\s+(?:in|into)\s+(?:the\s+)?(?:search|filter)\s+(?:box|bar|field)$"))
# "**Storage Class** (Standard)": a field named with its value in parentheses
_NAMED_VALUE = re.compile(r"^(.+?)\s*\(([^()]+)\)$")
RESULT = _c(_I(r"\b(?:appears?|is displayed|are displayed|is shown|are shown|opens|is opened|"
               r"is created|are created|is deleted|are deleted|is added|are added|is updated|"
               r"is modified|is changed|is stopped|is started|is released|takes effect|"
               r"is complete|is completed|is removed|are removed|is granted|is revoked|"
               r"changes? to|becomes?|is in the \S+ state)\b"
               r"|^you can (?:view|see|find|check)\b|^the system\b|^wait\b|^after\b.*\bis\b"))
NOTE_WORDS = ("note", "notice", "important", "warning", "tip", "caution")
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z⟨\"“(])")
_CLAUSE = re.compile(r",\s+(?:and\s+|then\s+)?|;\s+|\s+and then\s+|\s+and\s+|\s+then\s+")
_LEAD = re.compile(_I(r"^(?:optional[:.]?\s*|\(optional\)\s*|then\s+|next\s+|finally\s+|"
                      r"if needed\s+|also\s+)+"))
_PLACE = re.compile(r"⟨([blmc])(\d+)⟩")
_PURPOSE = re.compile(_I(r"(?<=\S)\s+to (?:view|see|check|display|verify|confirm|show) .*$"))
_ALTERNATIVE = re.compile(_I(r",?\s+or\s+(?=(?:click|choose|select|go to)\b)"))
_ASIDE = re.compile(r"\s*\((?!optional\))[^()⟨⟩]*\)", re.IGNORECASE)
_NOT_PLACEHOLDERS = str.maketrans({"⟨": "〈", "⟩": "〉"})
_VAGUE = re.compile(_I(r"^(?:a|an|the|your|any|one|some)\s+(.+?)(?:\s+(?:for|of)\b.*)?$"))


@dataclass
class _Ctx:
    nav: bool = False
    top: bool = False
    field: str = ""
    soft: bool = False      # ``field`` comes from a bare "In **Logon Name**," (no "field")
    intro: bool = False     # the sentence ends with a colon: it introduces what follows
    verb: str = ""          # the last clause's verb, for a clause that goes on without one


class Template:
    """A step's runs as text with placeholders, and the runs behind them."""

    def __init__(self, segs: list[Seg]):
        parts: list[str] = []
        self.values: dict[str, Seg] = {}
        for i, seg in enumerate(segs):
            if seg.kind == "t":
                # The page's own text never reads as a placeholder (here or once a value is
                # expanded): its angle brackets become look-alikes that _PLACE does not match.
                parts.append(seg.text.translate(_NOT_PLACEHOLDERS))
            elif seg.kind == "b" and " > " in seg.text:
                # **Identities > Users**: a path written as one bold run
                parts.append(" > ".join(self._add(Seg("b", p.strip()), f"{i}_{j}")
                                        for j, p in enumerate(seg.text.split(">"))))
            else:
                parts.append(self._add(seg, str(i)))
        self.text = " ".join("".join(parts).split())

    def _add(self, seg: Seg, key: str) -> str:
        ph = f"⟨{seg.kind}{len(self.values)}⟩"
        self.values[ph] = Seg(seg.kind, " ".join(seg.text.translate(_NOT_PLACEHOLDERS).split()),
                              seg.href)
        return ph

    def name(self, raw: str) -> str:
        """A NAME as shown: the placeholder's text, a quotation's inside, or the words."""
        raw = raw.strip()
        if raw in self.values:
            return self.values[raw].text
        if raw[:1] in "\"“" and len(raw) > 1:
            return raw[1:-1].strip()
        return self.expand(raw)

    def expand(self, text: str) -> str:
        return _PLACE.sub(lambda m: self.values[m.group(0)].text, text).strip()

    def value(self, raw: str) -> tuple[str, bool, str]:
        """(value, is_a_choice, noun) for what a clause says to enter or choose: a code span or
        quotation is the value; a UI name is a choice; "a name for the bucket" leaves the value
        to the reader ("", noun "name"); otherwise the first word ("5" of "5 Mbit/s")."""
        raw = raw.strip().rstrip(".")
        for ph in _PLACE.findall(raw):
            seg = self.values[f"⟨{ph[0]}{ph[1]}⟩"]
            if seg.kind == "c":
                return seg.text, False, ""
            if seg.kind in "bm":
                return seg.text, True, ""
        q = re.match(_Q, raw)
        if q:
            return q.group(0)[1:-1].strip(), False, ""
        vague = _VAGUE.match(raw)
        if vague:
            return "", False, vague.group(1).strip()
        return (raw.split()[0] if raw.split() else ""), False, ""


def _product(tpl: Template, clause: str) -> str:
    for ph in re.findall(r"⟨l\d+⟩", clause):
        link = tpl.values[ph]
        host = re.sub(r"^[a-z]+://", "", link.href.lower()).split("/")[0]
        for key in ("ecs", "vpc", "ram", "oss"):
            if host.startswith(key + ".") or host.startswith(key + "-"):
                return key
        m = PRODUCT.search(link.text)
        if m:
            return PRODUCTS[m.group(1).lower()]
    m = PRODUCT.search(tpl.expand(clause))
    return PRODUCTS[m.group(1).lower()] if m else ""


def _menu(tpl: Template, path: str) -> list[Mention]:
    parts = [tpl.name(p) for p in re.split(r"\s*>\s*", tpl.expand(path) if "⟨m" in path
                                                 else path)]
    parts = [tpl.name(p) for p in parts if p]
    if parts and parts[0].lower() in ("more", "...", "⋯", "more actions"):
        return [Mention("control", p) for p in parts]
    return [Mention("menu", " > ".join(parts))]


def _field(name: str, raw: str | None, tpl: Template) -> list[Mention]:
    value, choice, _noun = tpl.value(raw) if raw is not None else ("", False, "")
    out = [Mention("field", name, value=value)]
    if choice:
        out.insert(0, Mention("option", value, field=name))
    return out


def _keep(tpl: Template, what: str, value: str | None, ctx: _Ctx) -> list[Mention]:
    """"Keep the default ..." (no change, but the fields it names are the form's):
    "**ACL**: keep the default value Private" (the field from the list item's label), "keep
    the default Storage Class (Standard) and ACL (Private)" (several, each with its value)."""
    if ctx.field:
        name, ctx.field = ctx.field, ""
        rest = re.sub(_I(r"^(?:value|setting|option)\s+(?:of\s+)?"), "", what.strip())
        return _field(name, value or rest, tpl)
    out: list[Mention] = []
    for part in re.split(_I(r"\s*,\s*(?:and\s+)?|\s+and\s+"), what):
        named = _NAMED_VALUE.match(part.strip())
        if named:
            out += _field(tpl.expand(named.group(1)), named.group(2), tpl)
        elif part.strip():
            out += _field(tpl.expand(part), value, tpl)
    return out


def _clause(tpl: Template, clause: str, ctx: _Ctx, retry: bool = False
            ) -> tuple[list[Mention], bool]:
    """Mentions of one clause, and whether the clause was understood at all."""
    clause = _LEAD.sub("", clause).strip().rstrip(".:")
    if not clause:
        return [], True
    first = clause.split(" ", 1)[0].lower()
    if first in VERBS:
        ctx.verb = first
    if clause.lower().startswith(("optional", "(optional)")):
        clause = clause.split(" ", 1)[-1]
    if TOP_BAR.search(clause):
        ctx.top = True
        rest = TOP_BAR.sub("", clause).strip(" ,")
        return _clause(tpl, rest, ctx) if rest else ([], True)
    if ctx.top and (m := SELECT.search(clause)):
        # "In the top navigation bar, select **China (Hangzhou)**": the region selector
        choice = re.sub(_I(r"\s+as the region$"), "", m.group(1))
        return [Mention("control", tpl.value(choice)[0], value="region")], True
    if m := LABELLED.match(clause):
        # "**Zone**: select `cn-hangzhou-i`" (a parameter written as a list item)
        name = tpl.name(m.group(1))
        ctx.field = name
        found, ok = _clause(tpl, m.group(2), ctx)
        ctx.field = ""
        if not any(f.kind in ("field", "option") for f in found):
            value, choice = cell_value([tpl.values[p] if p in tpl.values else Seg("t", p)
                                        for p in re.split(r"(⟨[a-z]\d+⟩)", m.group(2)) if p])
            found = ([Mention("option", value, field=name)] if choice else []) + [
                Mention("field", name, value=value)]
        return found, True
    if NAV.search(clause):
        ctx.nav = True
        rest = NAV.sub("", clause).strip(" ,")
        return _clause(tpl, rest, ctx) if rest else ([], True)
    product = _product(tpl, clause)
    if product and (LOGON.search(clause) or "console" in tpl.expand(clause).lower()):
        return [Mention("product", product)], True
    if "⟨m" in clause:
        return [m for ph in re.findall(r"⟨m\d+⟩", clause) for m in _menu(tpl, ph)], True
    if (m := MENU.search(clause)) or (m := BARE_PATH.search(clause)):
        return _menu(tpl, m.group(1)), True
    if m := GOTO.search(clause):
        # "Navigate to **Security Groups**": a left navigation entry
        return _menu(tpl, m.group(1)), True
    if m := TAB.search(clause):
        return [Mention("control", tpl.name(m.group(1)), value="tab")], True
    if m := PAGE.search(clause):
        return [Mention("page", tpl.name(m.group(1) or m.group(2)))], True
    if m := ROW_LINK.search(clause):
        named = re.search(r"⟨c\d+⟩", m.group(0))
        return [Mention("control", "", value="row-link",
                        field=tpl.values[named.group(0)].text if named else "")], True
    if DETAIL_PAGE.search(clause):
        return [Mention("page", "", value="detail")], True
    if m := ENTER_IN.search(clause):
        return _field(tpl.name(m.group(2)), m.group(1), tpl), True
    if m := SET.search(clause):
        return _field(tpl.name(m.group(1)), m.group(2), tpl), True
    if m := ENTER_AS.search(clause):
        return _field(tpl.name(m.group(2)), m.group(1), tpl), True
    if m := KEEP.search(clause):
        return _keep(tpl, m.group(1), m.group(2), ctx), True
    if m := CHECKBOX.search(clause) or TOGGLE.search(clause):
        on = m.group(1).lower() in ("select", "turn on", "switch on", "enable")
        return [Mention("field", tpl.name(m.group(2)), value="on" if on else "off")], True
    if m := SELECT_FROM.search(clause):
        if a := re.fullmatch(r"(?i:an?)\s+(⟨[bm]\d+⟩)", m.group(1).strip()):
            # "Select a **Resource Group** for the VPC": that field, for the resource
            return [Mention("field", tpl.name(a.group(1)))], True
        name = tpl.name(m.group(2))
        value = tpl.value(m.group(1))[0]
        return [Mention("option", value, field=name), Mention("field", name, value=value)], True
    if m := DIALOG.search(clause):
        rest = clause[m.end():].strip(" ,")
        return _clause(tpl, rest, ctx) if rest else ([], True)
    if m := FIELD_CTX.search(clause):
        ctx.field = tpl.name(m.group(1) or m.group(2))
        rest = clause[m.end():].strip(" ,")
        if rest:
            return _clause(tpl, rest, ctx)
        return [], True
    if (m := FIELD_IN.match(clause)) and not ctx.field:
        ctx.field, ctx.soft = tpl.name(m.group(1)), True
        return [], True
    if m := SECTION.search(clause):
        rest = clause[m.end():].strip(" ,")
        kind = re.search(_I(r"(section|area|column|list|table|step)\b"),
                         clause[m.start(1) + len(m.group(1)):]).group(1).lower()
        here = [Mention("section", tpl.name(m.group(1)))] if kind in ("section", "area") else []
        found, ok = _clause(tpl, rest, ctx) if rest else ([], True)
        return here + found, ok
    if m := ENTER.search(clause):
        if (INTRO.search(clause) or ctx.intro) and not ctx.field and "⟨c" not in clause:
            return [], True     # "enter the details of the developer:" introduces sub-steps
        if IN_SEARCH_BOX.search(m.group(1)) and not ctx.field:
            return [Mention("field", "", value=tpl.value(
                IN_SEARCH_BOX.sub("", m.group(1)))[0])], True
        if not ctx.field and (a := re.match(r"(?i:an?|the)\s+(⟨[bm]\d+⟩)", m.group(1).strip())):
            # "Enter an **IPv4 CIDR Block** inside the VPC's block": that field, its value to
            # come (or left to the reader)
            return [Mention("field", tpl.name(a.group(1)))], True
        value, _choice, noun = tpl.value(m.group(1))
        name, ctx.field = ctx.field or (noun[:1].upper() + noun[1:] if noun else ""), ""
        return [Mention("field", name, value=value)], True
    if m := CLICK_VALUE.search(clause):
        # "Click `contracts-01`": the resource's link in its row
        return [Mention("control", "", value="row-link",
                        field=tpl.values[m.group(1)].text)], True
    if (m := CLICK_IN_COLUMN.search(clause)) and norm(tpl.name(m.group(2))) not in (
            "actions", "action", "operation", "operations", "actions column"):
        return [Mention("control", "", value="row-link", field=tpl.name(m.group(1)))], True
    if m := ROW_SELECT.search(clause):
        # "select the VPC whose block is ...": a row of a list, or where a form is open (the
        # check knows), the choice of that field ("From the VPC drop-down list, select ...")
        noun, ctx.field = ctx.field or m.group(1), ""
        return [Mention("control", "", value="row-select", field=noun)], True
    if m := SELECT.search(clause):
        value, _choice, noun = tpl.value(m.group(1))
        if ctx.field:
            name, ctx.field = ctx.field, ""
            return [Mention("option", value, field=name), Mention("field", name, value)], True
        if not value and ctx.intro:
            return [], True     # "Choose the storage class and the ACL:" introduces sub-steps
        if value and ctx.nav:
            return [Mention("menu", value)], True       # "In the pane on the left, choose X"
        if value:
            return [Mention("option", value)], True
    clicks = []
    for m in CLICK.finditer(clause):
        name = tpl.name(m.group(1))
        clicks.append(Mention("menu" if ctx.nav else "control", name))
    if clicks:
        return clicks, True
    if FIND.search(clause):
        return [], True
    if product:
        return [Mention("product", product)], True
    if ctx.verb and not retry:
        # "... and `b` in the **B** field": the clause goes on with the previous clause's verb
        return _clause(tpl, f"{ctx.verb} {clause}", ctx, retry=True)
    return [], False


# The most characters of a step's text read for mentions (a step is a few hundred; more is
# prose no procedure is made of, and reading all of a hostile page's 2 MiB step would take long).
MAX_STEP_CHARS = 8000


def _capped(segs: list[Seg]) -> list[Seg]:
    out, left = [], MAX_STEP_CHARS
    for seg in segs:
        if left <= 0:
            break
        if len(seg.text) > left:
            seg = replace(seg, text=seg.text[:left])
        out.append(seg)
        left -= len(seg.text)
    return out


def step_mentions(segs: list[Seg]) -> tuple[list[Mention], str]:
    """The mentions of a step's own text and what the text is: ``action`` (something was
    recognised), ``note`` (a note or a result: nothing to do) or ``prose`` (not understood)."""
    if segs and segs[0].kind in "bt" and segs[0].text.strip().lower().rstrip(":").startswith(
            NOTE_WORDS) and (segs[0].kind == "b" or segs[0].text.strip().lower().split()[0]
                             .rstrip(":") in NOTE_WORDS):
        return [], "note"
    tpl = Template(_capped(segs))
    mentions: list[Mention] = []
    ctx = _Ctx()
    results = 0
    sentences = [s for s in _SENTENCE.split(tpl.text) if s.strip()]
    for sentence in sentences:
        sentence = sentence.strip().rstrip(".")
        # (a sentence that goes on to an instruction is none: "Find the instance whose Status
        # is Stopped, and click Start"; "After the instance is stopped, click Start")
        if RESULT.search(tpl.expand(sentence)) and not re.search(
                _I(r"^(?:click|choose|select|enter|set|on the|in the)\b"
                   r"|(?:[,;]\s*|\s(?=and\s|then\s))(?:and\s+|then\s+)?"
                   r"(?:click|choose|select|enter|type)\s"), sentence):
            results += 1
            m = PAGE.search(sentence)
            if m and m.group(2):
                mentions.append(Mention("page", tpl.name(m.group(2))))
            continue
        # Each sentence starts afresh: "In the left-side navigation pane, click Instances.
        # Then, click Create Instance." (the second click is no navigation entry)
        ctx.field, ctx.verb, ctx.soft, ctx.nav, ctx.top = "", "", False, False, False
        ctx.intro = sentence.rstrip().endswith(":")
        # "Click the ID to view its details, such as its Route Table": what the click is for
        sentence = _PURPOSE.sub("", sentence)
        keep = KEEP.search(_LEAD.sub("", sentence))
        if keep:        # "Keep the default **ACL**, **Private**" (its comma is not a clause)
            mentions.extend(_keep(tpl, keep.group(1), keep.group(2), ctx))
            continue
        # "Click the name of the bucket, or click Manage": the first way is the one read
        sentence = _ALTERNATIVE.split(sentence, maxsplit=1)[0]
        # an aside in parentheses that marks nothing up ("`ecs.g7.large` (2 vCPU, 8 GiB)") is
        # no clause of its own
        for clause in _CLAUSE.split(_ASIDE.sub("", sentence)):
            example = FOR_EXAMPLE.match(clause.strip().rstrip("."))
            if example and mentions and mentions[-1].kind == "field" \
                    and not mentions[-1].value:
                # "enter the employee's address, for example `w@example.com`"
                mentions[-1] = replace(mentions[-1], value=tpl.value(example.group(1))[0])
                continue
            found, _understood = _clause(tpl, clause, ctx)
            mentions.extend(found)
        if ctx.field and not ctx.soft:      # "In the **Name** field" with nothing after it
            mentions.append(Mention("field", ctx.field))
        ctx.field = ""
    if mentions:
        return _valued(mentions), "action"
    if sentences and results == len(sentences):
        return [], "note"
    return [], "prose"


def _valued(mentions: list[Mention]) -> list[Mention]:
    """A value entered in a later sentence of the step with no field named ("Enter an **IPv4
    CIDR Block**. For a VPC that uses ..., enter `10.0.1.0/24`.") is the value of the field the
    step named just before it."""
    out: list[Mention] = []
    for m in mentions:
        if m.kind == "field" and not m.text and m.value and out and out[-1].kind == "field" \
                and out[-1].text and not out[-1].value:
            out[-1] = replace(out[-1], value=m.value)
        else:
            out.append(m)
    return out


def cell_value(tpl_segs: list[Seg]) -> tuple[str, bool]:
    """The value a parameter table's description cell gives: its first code span or quotation,
    or the option it says to select ("Select **Private**."); "" when it leaves it to the reader.
    Returns (value, is_a_choice)."""
    for seg in tpl_segs:
        if seg.kind == "c":
            return " ".join(seg.text.split()), False
    named = [s for s in tpl_segs if s.text.strip()]
    if len(named) == 1 and named[0].kind in "bm":      # a Value column: **Allow**
        return " ".join(named[0].text.split()), True
    tpl = Template(tpl_segs)
    q = re.search(_Q, tpl.text)
    if q:
        return q.group(0)[1:-1].strip(), False
    m = re.search(rf"{_I('(?:select|choose|set it to|set to)')}\s+"
                  rf"(?:{_I('the')}\s+)?(⟨[bm]\d+⟩)", tpl.text)
    if m:
        return tpl.values[m.group(1)].text, True
    return "", False
