"""Plans and the one reading of a plan op against a page.

A plan is a list of :class:`Op` (a verb and its operands, data). :func:`resolve` reads one op
against an observation and says whether the op's control is on the page, whether the page
already shows what the op sets, and which action (canonical action text) carries the op out
there, or prepares it, or leads towards it. The oracle (:mod:`datagen.oracle`) runs a plan op
after op through it; the state-aware teacher (:mod:`datagen.teacher`) reads a whole plan
against whatever page a student reached through it.

Verbs (labels are the documentation's; :func:`resolve` follows the session's drift):
  press LABEL          click a button or link (through a More menu when the drift hid it)
  row ROW|ACTION       click an action in the table row that contains ROW
  link NAME            click a link, or the name link of a table row
  field LABEL|VALUE    fill a textbox (going to the next wizard step when it is not shown yet)
  select LABEL|OPTION  choose an option of a select (ditto)
  pick LABEL|NEEDLE|M  choose the select's option that contains NEEDLE; M "reveal": go to the
                       wizard step that shows the select, "" : only when this page shows it
  choose OPTION        pick a radio option (ditto for wizards)
  reveal ROLE|NAME     go to the next wizard step until that control shows
  tab WORD             open the tab whose name contains WORD (when there is one)
  last_link LABEL      click the last link of that label (a page with one per tab)
  submit LABEL         click the form's submit button (ditto for wizards)
  confirm ID|BUTTON    finish a confirmation dialog (typing ID when the drift asks for it) with
                       BUTTON (default: OK, as the drift renames it)
  absent NAMES         (wrong documentation) none of the '|'-separated names is on the page
  offered FIELD|OPTION (wrong documentation) FIELD is a select or radio group without OPTION
  refused CODE         (wrong documentation) the page shows the console's error CODE
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from consolerl.drift import Drift
from consolerl.page import PageNode, parse
from consolerl.types import Observation
from env_workers.actions import Click, Fill, Select
from env_workers.driver import DriverError, find_bid, find_in_row


@dataclass(frozen=True)
class Op:
    verb: str
    args: tuple[str, ...] = ()

    def __str__(self) -> str:
        return f"{self.verb}:{'|'.join(self.args)}"


def op(verb: str, *args: str) -> Op:
    return Op(verb, tuple(args))


Plan = list[Op]

# Ops that set a value on a form (done when the page shows the value), ops that only check the
# page, and the rest: actions (a click that changes the page or the cloud).
VALUE_VERBS = frozenset({"field", "select", "pick", "choose", "reveal", "tab"})
CHECK_VERBS = frozenset({"absent", "offered", "refused"})
VERBS = VALUE_VERBS | CHECK_VERBS | {"press", "row", "link", "last_link", "submit", "confirm"}


# ---- reading the page ------------------------------------------------------------------------
# Small readers of the typed page (consolerl.page), one per thing a verb needs to know.
_CONFIRM = re.compile("To confirm, type")     # the label of a dialog's "type the id" field


def _line(text: str, role: str, label: str) -> PageNode | None:
    return parse(text).control(role, label)


def _textbox_value(text: str, role: str, label: str) -> str | None:
    node = _line(text, role, label)
    return None if node is None else node.value.strip()


def _selected(text: str, label: str) -> str | None:
    node = _line(text, "combobox", label)
    return None if node is None else node.selected


def _options(text: str, label: str) -> list[str]:
    node = _line(text, "combobox", label)
    return list(node.options) if node is not None else []


def _has(text: str, role: str, name: str) -> bool:
    return find_bid(text, role, name) is not None


def _tab(text: str, word: str) -> PageNode | None:
    """The first tab whose name contains ``word``."""
    return next(iter(parse(text).find("tab", contains=word, actionable=True, inline=False)),
                None)


def _confirm_box(text: str) -> PageNode | None:
    """The confirmation dialog's "type the id" textbox."""
    return parse(text).control("textbox", _CONFIRM)


def _click(bid: str | None) -> str | None:
    return None if bid is None else Click(bid).to_text()


# ---- one op on one page ----------------------------------------------------------------------
@dataclass(frozen=True)
class Resolution:
    """What a page offers for one op.

    ``present``: the op's control (or the dialog, or the row's More menu holding it) is on the
    page. ``satisfied``: the page already shows what the op sets (value ops; a click is never
    satisfied by looking). ``action``: the action that does the op here. ``prepare``: an action
    the op needs first on this page (opening the row's More menu, typing the id the dialog asks
    for), ``why`` it is needed. ``route``: a step towards the op from a page that does not show
    it (the wizard's Next, the drift's More menu), ``towards`` in words. ``missing``: what the
    page lacks, in words, when nothing here carries the op out."""

    present: bool = False
    satisfied: bool = False
    action: str | None = None
    prepare: str | None = None
    why: str = ""
    route: str | None = None
    towards: str = ""
    missing: str = ""


def resolve(o: Op, observation: Observation, drift: Drift) -> Resolution:
    """Read op ``o`` against ``observation`` under the session's ``drift`` (see
    :class:`Resolution`). Raises :class:`DriverError` for a verb that is not a plan verb."""
    text, v, a, t = observation.text, o.verb, o.args, drift.label
    where = observation.url
    # The wizard's next step shows a form's control; the drift's More menu hides buttons.
    route = _click(find_bid(text, "button", t("Next"))) if v in VALUE_VERBS | {"submit"} \
        else None
    towards = f"the wizard's next step has {o}"
    if v == "press":
        label = t(a[0])
        bid = next((b for b in (find_bid(text, r, label) for r in ("button", "link", "menuitem"))
                    if b is not None), None)
        more = find_bid(text, "button", "More") if "more_menu" in drift else None
        return Resolution(present=bid is not None, action=_click(bid), route=_click(more),
                          towards=f"{o} is in the More menu",
                          missing=f"no button or link {label!r} on {where}")
    if v == "row":
        label = t(a[1])
        bid = find_in_row(text, a[0], label)
        more = find_in_row(text, a[0], "More") if bid is None and "more_menu" in drift else None
        return Resolution(present=bid is not None or more is not None, action=_click(bid),
                          prepare=_click(more), why=f"{o} is in the row's More menu",
                          missing=f"no {label!r} in the row of {a[0]!r}")
    if v == "link":
        bid = find_bid(text, "link", a[0]) or find_in_row(text, a[0], a[0])
        return Resolution(present=bid is not None, action=_click(bid),
                          missing=f"no {a[0]!r} in a row with {a[0]!r} on {where}")
    if v in ("field", "select"):
        role, label = ("combobox" if v == "select" else "textbox"), t(a[0])
        bid = find_bid(text, role, label)
        shown = (_selected(text, label) if v == "select"
                 else _textbox_value(text, "textbox", label))
        act = None if bid is None else (Select(bid, a[1]) if v == "select"
                                        else Fill(bid, a[1])).to_text()
        return Resolution(present=bid is not None, satisfied=shown == a[1], action=act,
                          route=route, towards=towards,
                          missing=f"no field {label!r} on {where}")
    if v == "pick":
        label = t(a[0])
        bid = find_bid(text, "combobox", label)
        option = next((x for x in _options(text, label) if a[1] in x), None)
        chosen = _selected(text, label)
        return Resolution(present=bid is not None, satisfied=bool(chosen) and a[1] in chosen,
                          action=None if bid is None or option is None
                          else Select(bid, option).to_text(), route=route, towards=towards,
                          missing=f"no select {label!r} on {where}" if bid is None else
                          f"no option with {a[1]!r} in {label!r}")
    if v == "choose":
        m = _line(text, "radio", a[0])
        bid = find_bid(text, "radio", a[0])
        return Resolution(present=bid is not None,
                          satisfied=m is not None and m.checked,
                          action=_click(bid), route=route, towards=towards,
                          missing=f"no option {a[0]!r} on {where}")
    if v == "reveal":
        return Resolution(present=_has(text, a[0], a[1]), satisfied=True, route=route,
                          towards=towards,
                          missing=f"no {a[0]} {a[1]!r} on {where}")
    if v == "tab":
        m = _tab(text, a[0])
        return Resolution(present=m is not None,
                          satisfied=m is not None and "selected" in m.flags,
                          action=None if m is None else Click(m.bid).to_text(),
                          route=route, towards=towards,
                          missing=f"no tab with {a[0]!r} on {where}")
    if v == "last_link":
        label = t(a[0])
        bids = [n.bid for n in parse(text).find("link", label, actionable=True, inline=False)]
        return Resolution(present=_has(text, "link", label),
                          action=Click(bids[-1]).to_text() if bids else None,
                          missing=f"no link {label!r} on {where}")
    if v == "submit":
        label = t(a[0])
        bid = find_bid(text, "button", label)
        return Resolution(present=bid is not None, action=_click(bid), route=route,
                          towards=towards,
                          missing=f"no submit button {label!r} on {where}")
    if v == "confirm":
        box = _confirm_box(text)
        typed = box.value.strip() if box else ""
        button = a[1] if len(a) > 1 and a[1] else t("OK")
        ok = find_bid(text, "button", button)
        return Resolution(present=bool(parse(text).find("dialog")),
                          action=_click(ok),
                          prepare=Fill(box.bid, a[0]).to_text() if box and a[0] and
                          typed != a[0] else None, why="the dialog asks for the id",
                          missing=f"no button {button!r} on {where}")
    if v in CHECK_VERBS:
        return Resolution()             # nothing to do on a page: see check_failure
    raise DriverError(f"unknown plan op {o}")


# ---- checks (wrong documentation) ------------------------------------------------------------
def _shown(observation: Observation, name: str) -> bool:
    text = f"{observation.text}\n{observation.last_action_error}".lower()
    return name.lower() in text


def check_failure(o: Op, observation: Observation, drift: Drift) -> str:
    """Why the page contradicts the check op ``o`` ("" when it holds)."""
    obs = observation
    if o.verb == "absent":
        shown = [n for n in (n.strip() for n in o.args[0].split("|")) if n and _shown(obs, n)]
        return (f"{', '.join(map(repr, shown))} is on {obs.url}: the documentation is not "
                "wrong there") if shown else ""
    if o.verb == "offered":
        field_, option = drift.label(o.args[0]), o.args[1]
        if find_bid(obs.text, "combobox", field_) is None and \
                not obs.page.find("radio", actionable=True):
            return f"no {field_!r} select or radio group on {obs.url}"
        if _has(obs.text, "radio", option) or _shown(obs, option):
            return f"{option!r} is offered on {obs.url}"
        return ""
    if o.verb == "refused":
        return "" if _shown(obs, o.args[0]) else (
            f"the console did not answer {o.args[0]} on {obs.url}:\n{obs.text[:2000]}")
    raise ValueError(f"not a check op: {o}")
