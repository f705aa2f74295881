"""The replay: a procedure carried out literally, as the static check resolved it, so that a
run backed by the audit log can show a procedure works even while the learned agent is weak
(Doc Detective's method, grounded by the inventory and judged by the backend).

:func:`replay_plan` turns the static check's resolution of each step (:meth:`.check.Checker.walk`:
the console's control, field, option and page each mention stands for) and the drafted task
(its start page, the values its rule requires, the prerequisites it provisions) into a plan
of the scripted oracle's verbs (:mod:`datagen.plan`), in the console's own labels, each op
tagged with the step it carries out. :func:`attach_replay` puts that plan into the drafted
task as ``oracle: {family: replay, args: {plan: <JSON>}}``; the jobs API runs it with the
model ``replay`` (the oracle's driver, ``datagen.oracle``'s ``replay`` family), and the reward
service judges the episode by the audit log like any other. A replay that cannot do an op
stops there, and says which step (``step 3: no button 'Create' on ...``).

What the plan does per mention:

- a menu path or a page one menu click away: the navigation entry of that page, unless the
  replay is already there; a product, a section or the region: nothing (the task starts in
  the product, in its region);
- a control: a row's action (``row``, keyed by the prerequisite the row shows), a row's name
  link (``link``), a tab, a dialog's confirming button (``confirm``: it types the id when the
  dialog asks for it), a form's submit (``submit``: first the fields the task's rule needs that
  no step set, as the draft's hints tell the agent), a wizard's Next: nothing (each value op
  and the submit go through Next to the step that shows them; an early Next would leave a
  field behind), else the button or link by its label (the last of several of that label
  when the open tab's is, ``last_link``); a control the check found on another page (``unreachable``) is reached by that page's
  navigation entry first;
- a field: the value the task's rule requires of it (a generated name, a prerequisite's id),
  else the doc's value; a select's value by its option label, a radio by its option, a
  resource select by the prerequisite's name;
- an option: the radio option, or the select's option.

At the end, a click that opened a confirmation nobody confirmed is confirmed, and a form that
was filled and never sent is submitted (a doc may leave the obvious last click out).
Values with ``|`` or ``;`` are fine (the plan is JSON, not the wrong-documentation tasks'
``verb:args`` text).
"""
from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from consolerl.resources import placeholders
from consolerl.text import norm

from .check import GENERIC_SUBMIT, Checker, Resolved
from .model import (Control, Form, FormField, Inventory, PageEntry, Procedure, StepCheck,
                    TargetKind, WhereKind)
from .operations import ID_PARAMS, RESOURCE_FIELDS, RESOURCE_PAGES

REPLAY_FAMILY = "replay"
# A step number ending in this is a step of a conditional or optional part of the procedure:
# the replay's driver (datagen.oracle.run_replay) skips what of it cannot be done.
CONDITIONAL = "?"

Op = tuple[str, ...]            # (step number, verb, *args)
_REPEAT = re.compile(r"^\W*repeat\b", re.IGNORECASE)
_CONDITIONAL_STEP = re.compile(r"^\W*(?:if\b|optional\b|\(optional\))", re.IGNORECASE)
# The request parameters that name a row on a resource's own page, most telling first.
_PART_KEYS = ("PolicyName", "PortRange", "SourceCidrIp", "DestCidrIp")


class _Plan:
    def __init__(self, task: Mapping[str, Any], inventory: Inventory):
        self.task = task
        self.inventory = inventory
        self.ops: list[Op] = []
        self.here = str(task.get("start_page", "")).split("?", 1)[0]
        self.here = re.sub(r"\{[a-z0-9_]+\}", "{}", self.here)
        rules = task.get("success", {}).get("required_events", [])
        self.where: dict[str, Any] = dict(rules[-1].get("where", {})) if rules else {}
        self.prereqs = {p["type"]: p["id"] for p in task.get("prerequisites", ())}
        self.set_fields: set[str] = set()
        self.form: Form | None = None           # filled, not yet sent
        self.opened_at = 0                      # where the open form's ops start
        self.dialog_key: str | None = None      # a confirmation opened, not yet confirmed

    # ---- helpers -----------------------------------------------------------------------------
    def add(self, step: str, verb: str, *args: str) -> None:
        op = (step, verb, *args)
        if not self.ops or self.ops[-1] != op:
            self.ops.append(op)

    def key(self, page_pattern: str) -> str:
        """What identifies the row a step acts on: on a resource's own page (its policies,
        its rules) the value the task's rule names for the part (the policy name, the port
        range); on a list, the placeholder of the resource its rows show."""
        rtype = None
        if page_pattern in RESOURCE_PAGES:
            literal = {k.removeprefix("requestParameters."): v for k, v in self.where.items()
                       if isinstance(v, str) and v and "{" not in v}
            for name in (*_PART_KEYS, *literal):
                if name in literal:
                    return literal[name]
            for p in self.task.get("prerequisites", ()):
                if p.get("type") == "security_group_rule" and \
                        p.get("properties", {}).get("port_range"):
                    return str(p["properties"]["port_range"])   # the rule's row shows it
            own = RESOURCE_PAGES[page_pattern][0]        # the page's own resource
            for k, v in self.where.items():
                # a resource of another type the operation names (a vSwitch's row on its
                # VPC's page)
                other = ID_PARAMS.get(k.removeprefix("requestParameters."))
                if other and other != own and isinstance(v, str) and \
                        v.strip("{}") in self.prereqs.values():
                    return v
            rtype = own
        rtype = rtype or RESOURCE_PAGES.get(page_pattern.rstrip("/") + "/{}", (None,))[0]
        rid = self.prereqs.get(rtype) if rtype else None
        if rid is None and self.prereqs:
            rid = next(iter(self.prereqs.values()))
        return "{" + rid + "}" if rid else ""

    def navigate(self, step: str, pattern: str) -> None:
        """To the page ``pattern`` through its navigation entry (nothing when already there or
        the navigation does not list it)."""
        if not pattern or pattern == self.here:
            return
        page = self.inventory.page(pattern)
        if page is not None and page.menu_path and "{" not in page.menu_path[-1]:
            self.add(step, "press", page.menu_path[-1])
            self.here = pattern

    def rule_value(self, f: FormField) -> Any:
        return self.where.get(f"requestParameters.{f.name}")

    # ---- one mention -------------------------------------------------------------------------
    def field(self, step: str, f: FormField, doc_value: str, option: str = "") -> None:
        if f.kind == "readonly":
            return
        wanted = self.rule_value(f)
        if f.name in RESOURCE_FIELDS:
            rid = self.prereqs.get(RESOURCE_FIELDS[f.name])
            if rid:
                self.add(step, "pick", f.label, "{" + rid + "}", "reveal")
                self.set_fields.add(f.name)
            return
        if f.options:
            label = option or self._option_label(f, doc_value, wanted)
            if not label and not doc_value and wanted is None and f.required:
                # "select an instance type": the doc leaves the choice to the reader
                label = next((o for o in f.options if "{" not in o), "")
            if not label:
                return
            if f.kind == "radio":
                self.add(step, "choose", label)
            else:
                self.add(step, "select", f.label, label)
            self.set_fields.add(f.name)
            return
        value = wanted if isinstance(wanted, str) else doc_value
        if value:
            self.add(step, "field", f.label, value)
            self.set_fields.add(f.name)

    @staticmethod
    def _option_label(f: FormField, doc_value: str, wanted: Any) -> str:
        for o in f.options:
            if doc_value and norm(o) == norm(doc_value):
                return o
        sent = wanted if isinstance(wanted, str) else ""
        for o, v in zip(f.options, f.values):
            if sent and v == sent:
                return o
        for o in f.options:
            if doc_value and norm(doc_value) in norm(o).split():
                return o
        return ""

    def in_wizard_order(self, form: Form) -> None:
        """The ops since the wizard opened, in the order of its steps (a doc may name a field
        of an earlier step late, or the rule need one no step set: the wizard cannot go
        back); ops that set no field keep their place after the one before them."""
        if not form.steps:
            return
        order = {norm(s): i for i, s in enumerate(form.steps)}
        by_label = {norm(f.label): f for f in form.fields}
        by_option = {norm(o): f for f in form.fields for o in f.options}

        def at(op: Op) -> int | None:
            verb, args = op[1], op[2:]
            f = by_option.get(norm(args[0])) if verb == "choose" and args else \
                by_label.get(norm(args[0])) if verb in ("field", "select", "pick") and args \
                else None
            return order.get(norm(f.step)) if f is not None else None
        tail, keyed, last = self.ops[self.opened_at:], [], 0
        for n, op in enumerate(tail):
            i = at(op)
            last = last if i is None else i
            keyed.append((last, n, op))
        self.ops[self.opened_at:] = [op for _, _, op in sorted(keyed)]

    def fill_rest(self, step: str, form: Form) -> None:
        """The fields of ``form`` the rule needs that no step set (in the form's order)."""
        for f in form.fields:
            if f.name not in self.set_fields and self.rule_value(f) is not None:
                self.field(step, f, "")

    def control(self, step: str, r: Resolved) -> None:
        form = r.form or (self.form if self.form is not None and r.found
                          and norm(r.found) == norm(self.form.submit) else None)
        wizard = r.form or self.form
        if wizard is not None and wizard.next_label and r.found \
                and norm(r.found) == norm(wizard.next_label):
            return      # the wizard's Next: each value op goes to the step that shows it
        if form is not None:
            if norm(r.found) == norm(form.submit):
                self.fill_rest(step, form)
                self.in_wizard_order(form)
                self.add(step, "submit", r.found)
                self.form, self.set_fields = None, set()
            else:
                self.add(step, "press", r.found)
            return
        c: Control | None = r.control
        if c is None:
            if r.found:
                self.add(step, "press", r.found)
            return
        page = r.page.pattern if r.page is not None else ""
        if r.label == "unreachable" and page:
            self.navigate(step, page)
        where = c.where.kind
        if where is WhereKind.ROW:
            key = self.key(page)
            if c.role == "link" and (r.mention.value == "row-link" or not r.mention.text):
                self.add(step, "link", key) if key else self.add(step, "press", c.label)
            elif key:
                self.add(step, "row", key, c.label)
            else:
                self.add(step, "press", c.label)
        elif where is WhereKind.DIALOG and norm(c.label) in GENERIC_SUBMIT | {"delete",
                                                                             "release"}:
            self.add(step, "confirm", self.dialog_key or self.key(page), c.label)
            self.dialog_key = None
        elif c.role == "tab":
            self.add(step, "tab", c.label)
        elif r.page is not None and c.role == "link" and _last_of_several(r.page, c):
            self.add(step, "last_link", c.label)     # the open tab's (its Add Rule)
        else:
            self.add(step, "press", c.label)
        if c.target.kind is TargetKind.DIALOG:
            self.dialog_key = self.key(page) if where is WhereKind.ROW else (
                self.key(page) or "")
        elif c.target.kind is TargetKind.PAGE:
            self.here = c.target.name
            page = self.inventory.page(self.here)
            forms = [f for f in page.forms if f.post] if page is not None else []
            self.form = forms[0] if len(forms) == 1 else None
            self.set_fields, self.opened_at = set(), len(self.ops)

    def mention(self, step: str, r: Resolved) -> None:
        kind = r.mention.kind
        if kind in ("menu", "page") and r.page is not None:
            self.navigate(step, r.page.pattern)
        elif kind == "control" and r.mention.value != "region":    # the task's region holds
            self.control(step, r)
        elif kind == "field" and r.field is not None:
            self.field(step, r.field, r.mention.value)
        elif kind == "option" and r.field is not None:
            # (an option whose field the step names otherwise resolves as that field)
            self.field(step, r.field, r.mention.text,
                       option=r.found if r.found in r.field.options else "")

    def finish(self, step: str) -> None:
        if self.dialog_key is not None:
            self.add(step, "confirm", self.dialog_key, "")
        elif self.form is not None and self.set_fields:
            self.fill_rest(step, self.form)
            self.in_wizard_order(self.form)
            self.add(step, "submit", self.form.submit)


def _last_sentence(text: str) -> str:
    return re.split(r"(?<=[.!?])\s+", text.strip())[-1]


def _last_of_several(page: PageEntry, c: Control) -> bool:
    """``c`` is the last of several links of its label on ``page`` (one per tab)."""
    same = [x for x in page.controls if x.role == c.role and x.label == c.label]
    return len(same) > 1 and same[-1] == c


def replay_plan(proc: Procedure, walked: Sequence[tuple[StepCheck, Sequence[Resolved]]],
                task: Mapping[str, Any], inventory: Inventory) -> list[Op]:
    """The replay of ``proc`` (see the module docstring): ``(step, verb, *args)`` ops,
    placeholders of ``task`` (its parameters and prerequisites) in the args. ``walked``:
    :meth:`.check.Checker.walk` of ``proc``. A step the check found nothing for (missing with
    no close control) or marked not applicable adds nothing."""
    plan = _Plan(task, inventory)
    texts = {s.number: s.text for s in proc.steps}
    last = ""
    for check, resolved in walked:
        last = check.number
        parts = check.number.split(".")
        # A step of a conditional or optional part ("If the instance is running, stop it
        # first:" and its sub-steps): the replay skips what of it cannot be done.
        # ("Find the instance. If it is running, stop it first:": the parent's last sentence)
        # (and the steps of a loop: "Remove a policy. ... Repeat until none is left." may run
        # no time at all)
        parent = check.number.rsplit(".", 1)[0] if len(parts) > 1 else None
        siblings = [t for n, t in texts.items() if "." in n and n.rsplit(".", 1)[0] == parent]
        conditional = _CONDITIONAL_STEP.search(texts.get(check.number, "")) or any(
            _REPEAT.match(t) for t in siblings) or any(
            _CONDITIONAL_STEP.search(t) or _CONDITIONAL_STEP.search(_last_sentence(t))
            for t in (texts.get(".".join(parts[:i]), "") for i in range(1, len(parts))))
        step = check.number + (CONDITIONAL if conditional else "")
        for r in resolved:
            if r.label == "missing" and not r.found:
                continue
            plan.mention(step, r)
    plan.finish(last)
    return plan.ops


def attach_replay(task: dict[str, Any], proc: Procedure, inventory: Inventory,
                  previous: Sequence[Inventory] = ()) -> str:
    """Put the replay of ``proc`` into its drafted ``task`` (``oracle: {family: replay,
    args: {plan}}``) when there is one; returns "" or why there is none. Placeholders the plan
    names that the task does not define make no replay."""
    walked = Checker(inventory, previous).walk(proc)
    ops = replay_plan(proc, walked, task, inventory)
    if not ops:
        return "no replay: the steps name nothing the replay can do"
    known = set(task.get("parameters", {})) | {p["id"] for p in task.get("prerequisites", ())}
    named = {n for op in ops for a in op[2:] for n in placeholders(a)}
    if named - known - {"episode"}:
        return f"no replay: the plan names {sorted(named - known)} the task does not define"
    task["oracle"] = {"family": REPLAY_FAMILY,
                      "args": {"plan": json.dumps([list(op) for op in ops])}}
    return ""


__all__ = ["CONDITIONAL", "REPLAY_FAMILY", "attach_replay", "replay_plan"]
