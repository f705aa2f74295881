"""The task suite's procedures read into steps: plain numbered sentences without markup
(``tasks/**/*.yaml``: "2. Click Create User.", "3. Enter {user_name} as the logon name.").

Help-center pages mark what they name (bold, menu cascades, parameter tables) and are read by
:mod:`.extract` with parsers. A task's procedure is one line of prose per step with no markup,
so this module reads each already-isolated sentence with a few clause patterns, in the order the
suite's families phrase them:

- ``Open the RAM console`` -> a product; ``and choose A > B`` -> a menu path
- ``Click X in the row of <kind> <name>`` / ``Find <kind> <name> and click X in its row`` /
  ``Click X for <kind> <name>`` / ``Click X next to ...`` -> the control X
- ``Click <kind> <name>`` / ``click bucket <name>`` -> the resource's link in a list
- ``Click X`` / ``click X`` -> the control X (``and confirm``: the confirmation dialog's button)
- ``Enter V as the F`` / ``enter V`` -> the field F (labels are matched loosely, so "logon
  name" finds "Logon Name") with the value V
- ``Select V`` / ``choose V`` (a value, not a menu) -> an option
- ``On the T tab`` -> the tab T; ``Confirm ...`` -> the open dialog's button

A sentence none of these reads is kept with ``structured=False``.
"""
from __future__ import annotations

import re

from consolerl.text import numbered_step

from .model import DocStep, Mention, Procedure

_RESOURCE = r"(?:instance|user|bucket|security group|VPC|vSwitch|the new user's page)"
_CLAUSES: tuple[tuple[str, re.Pattern[str]], ...] = tuple((kind, re.compile(p, re.I)) for kind, p in (
    ("fields", r"^choose (?P<x>instance type) (?P<v>\S+) and the (?P<v2>.+?) (?P<x2>image)$"),
    ("product", r"^open the (?P<x>\w+) console(?: in the .*? region)?"),
    ("menu", r"^choose (?P<x>[A-Z][\w&/ -]*(?: > [A-Z][\w&/ -]*)+)$"),
    ("find", rf"^find {_RESOURCE} \S+$"),
    ("control", r"^click (?P<x>[A-Z][\w&/ -]*?) in its row$"),
    ("fields", r"^enter (?P<v>\S+) as the (?P<x>[\w ]+?) and (?P<v2>\S+) as the (?P<x2>[\w ]+?)$"),
    ("field", r"^(?:choose )?(?P<x>vpc|vswitch|security group|zone|instance type|protocol|"
              r"port range|authorization object) (?P<v>.+)$"),
    ("field", r"^set the (?P<x>[\w ]+?) to (?P<v>\S+)(?: .*)?$"),
    ("control", rf"^click (?P<x>[A-Z][\w&/ >-]*?) (?:in the row of|for|next to) .*$"),
    ("link", rf"^click {_RESOURCE} \S+$"),
    ("confirm", r"^(?:confirm(?: the \w+)?(?: if asked)?)$"),
    ("tab", r"^on the (?:.*?'s )?(?P<x>[\w ]+) tab,? click (?P<y>[A-Z][\w ]*)$"),
    ("section", r"^in (?P<x>[A-Z]\w+), click (?P<y>[A-Z][\w ]*?) next to .*$"),
    ("tab1", r"^on the (?P<x>[\w ]+) tab$"),
    ("find", r"^in [A-Z]\w+$"),
    ("page_click", r"^on the .*? page,? click (?P<x>[A-Z][\w ]*)$"),
    ("field", r"^enter (?P<v>\S+) as the (?P<x>[\w ]+?)$"),
    ("value", r"^enter (?P<v>\S+)$"),
    ("enter_free", r"^enter a (?P<x>\w+)$"),
    ("control", r"^click (?P<x>[A-Z][\w&/ -]*?)(?: to .*)?$"),
    ("options2", r"^choose the (?P<v>\S+) (?P<x>storage class) and the (?P<v2>.+?) (?P<x2>ACL)$"),
    ("option", r"^(?:select|choose) (?:the system policy )?(?P<x>[A-Z][\w/.()-]*(?: [\w/.()-]+)*)$"),
    ("menu1", r"^choose (?P<x>[A-Z][\w& -]*)$"),
))


def _clauses(sentence: str) -> list[str]:
    """'Enter x as the name, choose VPC y and click Create.' -> its clauses."""
    s = sentence.strip().rstrip(".").strip()
    parts = re.split(r",\s*(?:and\s+)?|\s+and\s+(?=(?:click|choose|enter|select|confirm|set)\b)",
                     s, flags=re.I)
    return [p.strip() for p in parts if p.strip()]


def read_sentence(sentence: str) -> tuple[tuple[Mention, ...], bool]:
    """The mentions of one step's sentence and whether every clause was read."""
    mentions: list[Mention] = []
    read_all = True
    for clause in _clauses(sentence):
        if clause.lower().startswith("open the") and " console and choose " in clause.lower():
            head, _, menu = clause.partition(" and choose ")
            clause_list = [head, "choose " + menu]
        else:
            clause_list = [clause]
        for c in clause_list:
            m = _read_clause(c)
            if m and m[0].kind == "option" and not m[0].field and mentions \
                    and mentions[-1].kind == "product":
                m = [Mention("menu", m[0].text)]     # "Open the X console and choose Y"
            if m is None:
                read_all = False
            else:
                mentions.extend(m)
    return tuple(mentions), read_all


def _read_clause(clause: str) -> list[Mention] | None:
    for kind, pattern in _CLAUSES:
        m = pattern.match(clause)
        if m is None:
            continue
        x = (m.groupdict().get("x") or "").strip()
        if kind == "product":
            return [Mention("product", x)]
        if kind in ("menu", "menu1"):
            return [Mention("menu", x)]
        if kind in ("control", "row", "page_click"):
            if " > " in x:          # Click More > A > B: a More menu, then the entry
                return [Mention("control", part.strip()) for part in x.split(" > ")]
            return [Mention("control", x)]
        if kind == "link":
            return [Mention("control", "", value="row-link")]
        if kind in ("confirm", "find"):
            return []
        if kind == "fields":
            return [Mention("field", x, value=m.group("v")),
                    Mention("field", m.group("x2").strip(), value=m.group("v2"))]
        if kind == "tab1":
            return [Mention("control", x)]
        if kind in ("tab", "section"):
            return [Mention("control", x), Mention("control", m.group("y").strip())]
        if kind == "field":
            return [Mention("field", x, value=m.group("v"))]
        if kind in ("value", "enter_free"):
            return []
        if kind == "option":
            return [Mention("option", x)]
        if kind == "options2":
            return [Mention("option", m.group("v"), field=x),
                    Mention("option", m.group("v2"), field=m.group("x2"))]
    return None


def procedure_from_text(title: str, text: str, source: str, product: str = "") -> Procedure:
    """A task's numbered procedure as a :class:`Procedure` (one step per numbered line)."""
    steps = []
    for line in text.splitlines():
        m = numbered_step(line)
        if not m:
            continue
        number, sentence = m
        mentions, read_all = read_sentence(sentence)
        steps.append(DocStep(str(number), sentence.strip(), mentions, structured=read_all))
    return Procedure(title, source, tuple(steps), product=product)
