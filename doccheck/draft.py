"""From a procedure to a task: :func:`draft_task` turns one documented procedure, its static
check and the console's inventory into task data that :func:`consolerl.tasks.parse_task`
accepts, or says why it cannot (:class:`Draft`).

- **Where it starts.** The product and start page: the first console page the procedure
  reaches that the left navigation lists (the static check's ``StepCheck.page`` of each step,
  or, without a check, the menu paths, page titles and links the steps name resolved in the
  inventory).
- **What it does.** The operation is the API action (``Service:Action``) of the form the
  procedure submits, or of the control whose click causes one (a row's **Stop**, a dialog's
  **OK**; a click that opens a confirmation acts on what that dialog posts to): the inventory
  recorded it from the audit log when the crawl made that request.
- **The success rule.** The required event is that action; its ``where`` names the request
  parameters the doc gives values for (a form field's ``name`` is its API parameter: the doc's
  field label -> ``FormField.name`` -> ``requestParameters.<name>``; an option's label -> the
  value the form sends). What the request carries that the doc does not name comes from the
  crawl (``Form.sends`` / ``Control.sends``, read from the crawl's own audit event): a
  constant the console adds is required as it is (``PolicyType=System``), a parameter naming
  a resource (``VpcId`` of a vSwitch form the row's **Create vSwitch** filled) is bound to a
  prerequisite of that type, a required name the reader types is generated; the region is the
  rule's own. Events that undo the operation are forbidden; the effect is read back through
  the SDK where a read action exists (:mod:`.operations`).
- **Values.** A required name the doc gives (the user or bucket the operation makes) becomes
  unique per episode (``deploy-bot-{episode}``: bucket names are global, and runs must not
  collide), in the rule and in the step text; a name the doc leaves to the reader is generated
  within the field's limits, and the step says which to use.
- **Prerequisites.** What the procedure acts on without creating it (the security group whose
  rules it edits, the instance it stops, the VPC it picks) is declared as Resource META
  (:mod:`consolerl.resources`) with what that needs in turn, and named by a placeholder in the
  rule and in the step text. Prerequisites agree with the doc's values: a vSwitch block the
  operation sends lies inside the prerequisite VPC's block (the one the doc's prerequisites
  give, else the /16 around it); an instance is in the state the operation needs; buckets are
  declared empty. Prerequisites the doc lists in prose that no declaration covers
  go to the ResourceCoder when one is given (an LLM endpoint is configured); otherwise the
  draft says they were left out.

**A procedure the static check is sure is defective is not drafted** (a step labelled
missing, unreachable or ambiguous that is not only a suspicion, ``StepCheck.suspect``):
``Draft(None, "not drafted: the static check found defects at step(s) ...")``. Its rule would
be built from a control, field or value the console does not have (an option it refuses, a
step that is not there), so it would be unsatisfiable by construction, and an agent run could
add nothing: the verdict is ``broken`` on the static evidence. A step whose label merely
differs (stale text) is no defect, and such a procedure is drafted with the console's label;
so is one whose defects are suspicions (the closest control standing for the named one), so
that a run can show whether the step can be done. A drafted task always expects success (it is
what the doc claims), is ``heldout`` and has no oracle.
"""
from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from consolerl.text import norm

from .model import (DEFECT_LABELS, Control, DocStep, Form, FormField, Inventory, PageEntry,
                    Procedure, StepCheck, TargetKind, WhereKind)
from .operations import (CONTRARY, CREATED_ID, DECLARATIONS, ID_PARAMS, NEEDS, READBACK,
                         RESOURCE_FIELDS, RESOURCE_NOUN, RESOURCE_PAGES, RESOURCE_WORDS,
                         title_misfit)

DEFAULT_REGION = "cn-hangzhou"
SERVICES = {"Ecs": "ecs", "Vpc": "vpc", "Ram": "ram", "Oss": "oss"}
_PLACEHOLDER = re.compile(r"\{([a-z][a-z0-9_]{0,31})\}")


@dataclass(frozen=True)
class Draft:
    """A drafted task (``task``: data :func:`consolerl.tasks.parse_task` accepts) or ``None``
    with ``reason`` saying why there is none. With a task, ``reason`` notes what the draft
    could not cover (prose prerequisites left out, several actions caused).
    ``source``: ``rules`` (this module) or ``llm`` (:mod:`.llm_draft`)."""

    task: dict | None
    reason: str = ""
    source: str = "rules"


# ---- labels ---------------------------------------------------------------------------------
def _same(a: str, b: str) -> bool:
    return bool(a) and norm(a) == norm(b)


def _near(a: str, b: str) -> bool:
    """Equal, or one label inside the other as whole words ("ACL" / "Bucket ACL")."""
    x, y = norm(a), norm(b)
    if not x or not y:
        return False
    return x == y or re.search(rf"\b{re.escape(x)}\b", y) is not None or \
        re.search(rf"\b{re.escape(y)}\b", x) is not None


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.casefold()).strip("-")


def snake(name: str) -> str:
    """``UserName`` -> ``user_name`` (a parameter's name in the task)."""
    s = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name)
    return re.sub(r"[^a-z0-9_]+", "_", s.lower()).strip("_")[:32] or "value"


def pattern_of(path: str) -> str:
    """A page pattern as the checker writes it: query dropped."""
    return path.split("?", 1)[0].rstrip("/") or "/"


def _labels(step: DocStep, check: StepCheck | None, kind: str) -> list[str]:
    """The labels a step names of ``kind``, with the console's own label where the static
    check found the doc's differs (the drifted console's name is what the agent will see)."""
    out = [m.text for m in step.mentions if m.kind == kind]
    if check is not None and (check.label == "label_differs" or check.suspect) \
            and check.closest:
        if any(_same(check.mention, t) for t in out) or not check.mention:
            out.append(check.closest)
    return out


# ---- where the steps are --------------------------------------------------------------------
def _page_by_menu(inventory: Inventory, text: str) -> PageEntry | None:
    parts = [norm(p) for p in re.split(r"\s*>\s*", text) if p.strip()]
    if not parts:
        return None
    best = None
    for page in inventory.pages:
        path = [norm(p) for p in page.menu_path]
        if path and len(parts) <= len(path) and path[-len(parts):] == parts:
            return page
        if path and path[-1] == parts[-1]:
            best = best or page
    return best


def _page_by_title(inventory: Inventory, text: str) -> PageEntry | None:
    nav = [p for p in inventory.pages if _same(p.title, text)]
    return next((p for p in nav if p.menu_path), nav[0] if nav else None)


def _target_page(control: Control) -> str:
    return pattern_of(control.target.name) if control.target.kind is TargetKind.PAGE else ""


def _walk(proc: Procedure, checks: Mapping[str, StepCheck], inventory: Inventory
          ) -> list[tuple[str, str]]:
    """(page before, page after) of each step: the static check's page where it has one,
    else the menu path, page title or link the step names, else where the previous one was."""
    here = ""
    out = []
    for step in proc.steps:
        before = here
        check = checks.get(step.number)
        after = check.page if check is not None and check.page else ""
        # "On the Users page, click ..." says where the step starts.
        on = next((m for m in step.mentions if m.kind == "page"), None)
        if on is not None and (page := _page_by_title(inventory, on.text)) is not None:
            before = here = page.pattern
        if not after:
            for m in step.mentions:
                if m.kind == "menu" and (page := _page_by_menu(inventory, m.text)) is not None:
                    after = page.pattern
            if not after:
                entry = inventory.page(here)
                for label in _labels(step, check, "control"):
                    hit = next((c for c in (entry.controls if entry else ())
                                if _same(c.label, label) and _target_page(c)), None)
                    if hit is not None:
                        after = _target_page(hit)
        here = after or here
        out.append((before, here))
    return out


# ---- the operation --------------------------------------------------------------------------
@dataclass(frozen=True)
class _Operation:
    action: str                 # Service:Action
    step: int                   # index of the step that causes it
    page: str                   # the page it is caused from
    post: str                   # the pattern it posts to
    form: Form | None = None
    label: str = ""
    sends: tuple[tuple[str, str], ...] = ()     # what the request carries (Form.sends)


def _forms(entry: PageEntry | None) -> tuple[Form, ...]:
    return entry.forms if entry is not None else ()


def _find_operations(proc: Procedure, checks: Mapping[str, StepCheck], inventory: Inventory,
                     walk: list[tuple[str, str]]) -> list[_Operation]:
    ops: list[_Operation] = []
    dialog = ""             # the dialog the previous step's click opened
    for i, step in enumerate(proc.steps):
        check = checks.get(step.number)
        pages = dict.fromkeys(p for p in (walk[i][0], walk[i][1]) if p)
        opened = ""
        for label in _labels(step, check, "control"):
            found = None
            for pattern in pages:
                entry = inventory.page(pattern)
                # In an open dialog its own buttons come first: the OK of the Restart
                # confirmation, not of another dialog on the page.
                controls = sorted(entry.controls if entry else (), key=lambda c: not (
                    dialog and c.where.kind is WhereKind.DIALOG and c.where.name == dialog))
                # A search form's button sends nothing (no post, no action): not an operation.
                form = next((f for f in _forms(entry) if _same(f.submit, label)
                             and (f.post or f.action)), None)
                if form is not None:
                    found = _Operation(form.action, i, pattern, form.post or pattern, form, label,
                                       form.sends)
                    break
                # Of several controls of this label, the one that does what the title says
                # (the rule's Delete, not the security group's).
                control = next((c for c in sorted(
                    (c for c in controls if _same(c.label, label) and c.action),
                    key=lambda c: bool(title_misfit(proc.title, c.action)))), None)
                if control is not None:
                    if control.target.kind is TargetKind.DIALOG:
                        opened = control.target.name
                    # A click that opens a confirmation: the request is the dialog's (it
                    # posts to the resource's path, which says what the operation acts on).
                    confirm = next((c for c in entry.controls if control.opens(c.where)
                                    and c.action == control.action
                                    and c.target.kind is TargetKind.POST), control)
                    post = confirm.target.name if confirm.target.kind is TargetKind.POST \
                        else pattern
                    found = _Operation(control.action, i, pattern, pattern_of(post), None, label,
                                       confirm.sends or control.sends)
                    break
                # A control that opens a dialog whose confirming control causes the action.
                opener = next((c for c in controls if _same(c.label, label)
                               and c.target.kind is TargetKind.DIALOG), None)
                if opener is not None:
                    opened = opener.target.name
                    confirm = next((c for c in entry.controls
                                    if opener.opens(c.where) and c.action), None)
                    if confirm is not None:
                        post = confirm.target.name if confirm.target.kind is TargetKind.POST \
                            else pattern
                        found = _Operation(confirm.action, i, pattern, pattern_of(post), None,
                                           label, confirm.sends)
                        break
            # A dialog's OK after the click that opened it is the same operation.
            if found is not None and (not ops or ops[-1].action != found.action):
                ops.append(found)
        dialog = opened
    if ops:
        return ops
    # No step says "click <submit>" (a missing step): the form whose fields the doc fills.
    named = [m.text for s in proc.steps for m in s.mentions if m.kind == "field"]
    named += [label for label, _ in proc.parameters]
    best: tuple[int, _Operation] | None = None
    for i, (before, after) in enumerate(walk):
        for pattern in dict.fromkeys(p for p in (before, after) if p):
            for form in _forms(inventory.page(pattern)):
                score = sum(any(_near(n, f.label) for f in form.fields) for n in named)
                if score and (best is None or score > best[0]):
                    best = (score, _Operation(form.action, i, pattern, form.post or pattern,
                                              form, form.submit, form.sends))
    return [best[1]] if best else []


# ---- values ---------------------------------------------------------------------------------
def _option_value(f: FormField, text: str) -> tuple[str, ...]:
    """The value(s) the form may send for the option labelled ``text``: the recorded value,
    else the label itself and its slug (the twin tries them in order)."""
    for i, label in enumerate(f.options):
        if _same(label, text):
            if i < len(f.values) and f.values[i]:
                return (f.values[i],)
            return tuple(dict.fromkeys((label, slug(label))))
    if any(_same(v, text) for v in f.values):
        return (next(v for v in f.values if _same(v, text)),)
    return (text,)


def _is_name(f: FormField) -> bool:
    return f.kind == "text" and f.name.endswith("Name") and f.name not in RESOURCE_FIELDS


def _generated(f: FormField) -> str:
    """A value for a name the doc leaves to the reader: unique per episode, starting with a
    letter, lowercase (bucket rules are the strictest), within the field's length."""
    room = (f.max_length or 64) - len("-{episode}") - 6   # an episode id is up to 16 chars
    prefix = slug(f.label).split("-")[0] or "doc"
    prefix = re.sub(r"^[^a-z]+", "", prefix) or "doc"
    return f"{prefix[:max(3, room)]}-{{episode}}"


def _unique(value: str, f: FormField) -> str:
    room = (f.max_length or 64) - 17
    return f"{value[:max(1, room)]}-{{episode}}"


def _field_for(form: Form, label: str, option: str = "") -> FormField | None:
    exact = [f for f in form.fields if _same(f.label, label)]
    if exact:
        return exact[0]
    near = [f for f in form.fields if _near(f.label, label)]
    if len(near) == 1:
        return near[0]
    if option:
        owners = [f for f in form.fields if any(_same(o, option) for o in f.options)]
        if len(owners) == 1:
            return owners[0]
    return None


def _filled(proc: Procedure, form: Form, checks: Mapping[str, StepCheck] | None = None
            ) -> list[tuple[FormField, str | None, int]]:
    """The form's fields the doc names: (field, its value or None when the doc leaves it,
    index of the step that names it; -1 for the parameter table). A field label the static
    check found differs from the console's is looked up under the console's label."""
    out: dict[str, tuple[FormField, str | None, int]] = {}
    for label, value in proc.parameters:
        f = _field_for(form, label, value)
        if f is not None:
            out[f.name] = (f, value or None, -1)
    for i, step in enumerate(proc.steps):
        check = (checks or {}).get(step.number)
        for m in step.mentions:
            if m.kind == "field":
                f = _field_for(form, m.text, m.value)
                if f is None and check is not None and (
                        check.label == "label_differs" or check.suspect) \
                        and check.closest and _same(check.mention, m.text):
                    f = _field_for(form, check.closest, m.value)
                if f is not None and (m.value or f.name not in out):
                    out[f.name] = (f, m.value or None, i)
            elif m.kind == "option":
                f = _field_for(form, m.field, m.text) if m.field else None
                if f is None:
                    owners = [x for x in form.fields if any(_same(o, m.text) for o in x.options)]
                    f = owners[0] if len(owners) == 1 else None
                if f is not None:
                    out[f.name] = (f, m.text, i)
    return list(out.values())


# ---- the task -------------------------------------------------------------------------------
class _Builder:
    """Accumulates a task's parameters, prerequisites and step hints."""

    def __init__(self) -> None:
        self.parameters: dict[str, str] = {}
        self.prereqs: dict[str, dict[str, Any]] = {}     # type -> declaration
        self.hints: dict[int, list[str]] = {}
        self.notes: list[str] = []

    def parameter(self, name: str, value: str) -> str:
        key, n = name, 2
        while key in self.parameters and self.parameters[key] != value:
            key, n = f"{name}_{n}", n + 1
        self.parameters[key] = value
        return key

    def require(self, rtype: str, **properties: object) -> str:
        """Declare a resource of ``rtype`` (and what it refers to); returns its id."""
        if rtype in self.prereqs:
            self.prereqs[rtype]["properties"].update(properties)
            return self.prereqs[rtype]["id"]
        decl = DECLARATIONS[rtype]
        props: dict[str, Any] = dict(decl.properties)
        for prop, target in decl.refs:
            props[prop] = "${" + self.require(target) + "}"
        props.update(properties)
        self.prereqs[rtype] = {"id": decl.id, "type": rtype, "properties": props}
        return decl.id

    def hint(self, step: int, text: str) -> None:
        self.hints.setdefault(max(step, 0), []).append(text)

    def ordered_prereqs(self) -> list[dict[str, Any]]:
        # Declarations after what they refer to (require() adds referents first).
        return list(self.prereqs.values())


def _resource_of(post: str) -> tuple[str, str] | None:
    for prefix, found in RESOURCE_PAGES.items():
        if post == prefix or post.startswith(prefix + "/"):
            return found
    return None


def _procedure_text(proc: Procedure, hints: Mapping[int, list[str]],
                    rename: Mapping[str, str]) -> str:
    lines = []
    for i, step in enumerate(proc.steps):
        text = " ".join(step.text.split())
        for literal, placeholder in rename.items():
            # whole names only: "vpc-old" is not replaced inside "vpc-old-2"
            text = re.sub(rf"(?<![\w-]){re.escape(literal)}(?![\w-])",
                          lambda _m, p=placeholder: p, text)
        # A brace pair in the doc that looks like a placeholder would be filled (and fail).
        text = _PLACEHOLDER.sub(lambda m: m[0] if any(m[0] in v for v in rename.values())
                                or any(m[0] in h for h in hints.get(i, ())) else
                                f"{{ {m[1]} }}", text)
        extra = " ".join(hints.get(i, ()))
        text = f"{text} {extra}".strip()
        parts = step.number.split(".")
        indent = "   " * (len(parts) - 1)
        lines.append(f"{indent}{parts[-1]}. {text}")
    return "\n".join(lines) + "\n"


def _start(proc: Procedure, walk: list[tuple[str, str]], inventory: Inventory,
           before: int) -> PageEntry | None:
    """The first page the steps reach that the navigation lists (before the operation)."""
    seen = [p for _, p in walk[:before + 1] if p]
    for pattern in seen:
        entry = inventory.page(pattern)
        if entry is not None and entry.menu_path:
            return entry
    for pattern in seen:
        if (entry := inventory.page(pattern)) is not None:
            return entry
    return None


def _product_of(proc: Procedure, inventory: Inventory, action: str) -> str:
    service = action.split(":", 1)[0]
    return SERVICES.get(service, proc.product if proc.product in SERVICES.values() else "")


def _uncovered(proc: Procedure, declared: set[str]) -> list[str]:
    """Prerequisite lines that speak of a resource type the draft does not declare."""
    out = []
    for line in proc.prerequisites:
        low = line.casefold()
        kinds = {t for t, words in RESOURCE_WORDS.items()
                 if any(re.search(rf"\b{re.escape(w)}s?\b", low) for w in words)}
        # "RAM user" also matches "user"; an account-level line ("You have an account") none.
        if kinds and not kinds & declared and "account" not in low:
            out.append(line)
    return out


def draft_task(proc: Procedure, checks: Sequence[StepCheck], inventory: Inventory, *,
               task_id: str, drift: str = "", coder: Any = None,
               region: str = DEFAULT_REGION) -> Draft:
    """Draft a task from ``proc`` (see the module docstring). ``checks``: the static check of
    its steps (one per step, matched by number; may be empty). ``task_id``: the drafted
    task's id (3-64 of [a-z0-9-]). ``drift``: the console profile the procedure was checked
    against (the task's ``drift``). ``coder``: a ResourceCoder
    (:mod:`infra.provisioning.resource_coder`) for prerequisites no declaration covers
    (``None``: none is configured). Never raises for a procedure it cannot draft: the
    :class:`Draft` says why."""
    if not proc.steps:
        return Draft(None, "the procedure has no steps")
    defects = [c.number for c in checks if c.label in DEFECT_LABELS and not c.suspect]
    if defects:
        return Draft(None, f"not drafted: the static check found defects at step(s) "
                           f"{', '.join(defects)}; the verdict rests on that evidence")
    by_number = {c.number: c for c in checks}
    walk = _walk(proc, by_number, inventory)
    ops = _find_operations(proc, by_number, inventory, walk)
    if not ops:
        visited = ", ".join(dict.fromkeys(p for pair in walk for p in pair if p)) or "none"
        return Draft(None, "no operation: no step submits a form or clicks a control whose "
                           f"API action the inventory knows (pages reached: {visited})")
    fitting = [o for o in ops if not title_misfit(proc.title, o.action or "")]
    if not fitting:
        return Draft(None, f"no operation: {title_misfit(proc.title, ops[-1].action or '')} "
                           f"(the steps cause {', '.join(o.action or '?' for o in ops)})")
    ops = fitting
    op = ops[-1]
    if not re.fullmatch(r"[A-Z][A-Za-z]+:[A-Z][A-Za-z]+", op.action or ""):
        what = f"form {op.form.title!r}" if op.form else f"control {op.label!r}"
        return Draft(None, f"no operation: the {what} on {op.page} has no recorded API action "
                           "(the crawl did not submit it)")
    service, action = op.action.split(":", 1)
    product = _product_of(proc, inventory, op.action)
    if not product:
        return Draft(None, f"no operation: {op.action} is not an action of ECS, VPC, RAM or OSS")
    start = _start(proc, walk, inventory, op.step)
    if start is None:
        return Draft(None, "no start page: no step reaches a console page the inventory knows")
    b = _Builder()
    notes = []
    if len({o.action for o in ops}) > 1:
        notes.append(f"the procedure causes {', '.join(o.action for o in ops)}; the rule "
                     f"requires the last one ({op.action})")
    where: dict[str, Any] = {}
    rename: dict[str, str] = {}
    known: dict[str, str] = {}           # API parameter -> its value (placeholders allowed)

    # What the operation acts on: the resource in the page's path.
    bound = _resource_of(op.post) or _resource_of(op.page)
    if bound is not None:
        rtype, id_param = bound
        rid = b.require(rtype, **NEEDS.get(op.action, {}))
        where[f"requestParameters.{id_param}"] = "{" + rid + "}"
        known[id_param] = "{" + rid + "}"
        first = next((i for i, (_, after) in enumerate(walk)
                      if _resource_of(after) == bound), op.step)
        b.hint(min(first, op.step), f"(The {RESOURCE_NOUN[rtype]} is `{{{rid}}}`.)")
    elif "{}" in op.post:
        why = f"the operation acts on {op.post}, a kind of resource no declaration covers"
        if coder is None:
            return Draft(None, f"{why}, and no LLM endpoint is configured for the ResourceCoder")
        notes.append(why + "; the ResourceCoder was asked")

    # The form's fields the doc fills.
    if op.form is not None:
        # Values of the parameter table go with the first step taken on the form's page.
        on_form = next((i for i, (before, _) in enumerate(walk) if before == op.page), op.step)
        for f, value, step in _filled(proc, op.form, by_number):
            step = step if step >= 0 else on_form
            if f.kind == "readonly":
                continue
            # A value only the page's parameter table gives (the extractor keeps tables out
            # of the step text) must still reach the agent, which reads only the steps.
            unseen = value is not None and not any(value in s.text for s in proc.steps)
            if unseen and not (_is_name(f) and (f.required or value is None)) \
                    and f.name not in RESOURCE_FIELDS:
                b.hint(step, f"(Set {f.label} to `{value}`.)")
            if f.name in RESOURCE_FIELDS:
                rtype = RESOURCE_FIELDS[f.name]
                if op.sends and f.name not in dict(op.sends):
                    continue            # the crawl saw the form not send it (a filter)
                if not op.sends and f.name == "VpcId" and any(
                        x.name == "VSwitchId" for x in op.form.fields):
                    continue            # a filter of the vSwitch select, not sent
                rid = b.require(rtype)
                where[f"requestParameters.{f.name}"] = "{" + rid + "}"
                known[f.name] = "{" + rid + "}"
                b.hint(step, f"(The {RESOURCE_NOUN[rtype]} is `{{{rid}}}`.)")
                continue
            if f.kind in ("select", "radio") and value is not None:
                values = _option_value(f, value)
                if len(values) == 1:
                    where[f"requestParameters.{f.name}"] = values[0]
                    known[f.name] = values[0]
                else:           # the form's value is not recorded: the label or its slug
                    where[f"requestParameters.{f.name}"] = {"in": list(values)}
                continue
            # A required name identifies what the operation makes (a user, a bucket): it must
            # be unique per episode. An optional one the doc gives (a display name) stays.
            if _is_name(f) and (f.required or value is None):
                param = b.parameter(snake(f.name), _unique(value, f) if value else _generated(f))
                placeholder = "{" + param + "}"
                where[f"requestParameters.{f.name}"] = placeholder
                known[f.name] = placeholder
                if value and len(value) >= 3 and any(value in s.text for s in proc.steps):
                    rename[value] = placeholder
                elif value:
                    b.hint(step, f"(Use `{placeholder}` as the {f.label}.)")
                else:
                    b.hint(step, f"(Use `{placeholder}` as the {f.label}.)")
                continue
            if value is not None:
                where[f"requestParameters.{f.name}"] = value
                known[f.name] = value
        if not any(k.startswith("requestParameters.") for k in where) and op.form.fields:
            notes.append("the doc names none of the form's fields: the rule only requires "
                         "the action")
    acted_on = [bound[0]] if bound is not None else []
    acted_on += _bind_sends(b, op, walk, where, known)
    if acted_on:
        _name_as_the_doc(b, proc, op.step, acted_on[0], rename)
    _fit_networks(b, proc, where)
    _fit_zone(b, where)

    uncovered = _uncovered(proc, set(b.prereqs))
    if uncovered:
        if coder is not None:
            plan = coder.plan(proc.title, "\n".join(proc.prerequisites))
            specs = getattr(plan, "specs", None)
            if specs is None:
                return Draft(None, f"the ResourceCoder could not plan the prerequisites "
                                   f"{uncovered!r}: {plan}")
            for spec in specs:
                if spec.type not in b.prereqs and spec.id not in {
                        d["id"] for d in b.prereqs.values()}:
                    b.prereqs[spec.type] = {"id": spec.id, "type": spec.type, "properties": {
                        k: list(v) if isinstance(v, tuple) else v
                        for k, v in spec.properties.items()}}
        else:
            notes.append("prerequisites no declaration covers were left out (no LLM endpoint "
                         f"is configured for the ResourceCoder): {'; '.join(uncovered)}")
    if action == "DetachPolicyFromUser" and "PolicyName" not in known:
        # The policy a revoke acts on is a row of the user's page, named in the text only
        # ("find AdministratorAccess and click Remove"): one of the grant form's policies.
        hit = _policy_named(proc, inventory)
        if not hit:     # "find the policy": the user gets one, and the step says which
            hit = _policy_named(proc, inventory, first=True)
            if hit:
                b.hint(op.step, f"(The policy is `{hit}`.)")
        if hit:
            where["requestParameters.PolicyName"] = known["PolicyName"] = hit
    if action == "DetachPolicyFromUser" and "PolicyName" in known and "ram_user" in b.prereqs:
        b.prereqs["ram_user"]["properties"]["policies"] = [known["PolicyName"]]
    if action.startswith("Revoke") and "security_group" in b.prereqs:
        # The rule the procedure deletes, with the port range it names (the replay finds
        # its row by it; the request itself names the rule by id).
        b.require("security_group_rule", direction="egress" if action.endswith("Egress")
                  else "ingress", port_range=_port_range(proc))

    success: dict[str, Any] = {"required_events": [
        {"id": "op", "event": action, "service": service, "where": where}]}
    forbidden = _forbidden(op.action, where, known)
    if forbidden:
        success["forbidden_events"] = forbidden
    end_state = _read_back(op.action, known, region)
    if end_state:
        success["end_state"] = end_state

    start_page = start.pattern
    if "{}" in start_page:
        st = _resource_of(start_page)
        if st is None:
            return Draft(None, f"no start page: {start_page} names a resource no declaration "
                               "covers")
        start_page = start_page.replace("{}", "{" + b.require(st[0]) + "}", 1)
    steps = [s for s in proc.steps if not s.note]
    task: dict[str, Any] = {
        "schema": 1, "id": task_id, "product": product, "title": proc.title[:200] or task_id,
        "procedure": _procedure_text(proc, b.hints, rename), "start_page": start_page,
        "split": "heldout", "difficulty": max(1, min(5, math.ceil(len(steps) / 2))),
        "drift": drift, "expected": "success", "success": success, "cleanup": "destroy"}
    if b.parameters:
        task["parameters"] = dict(b.parameters)
    if b.prereqs:
        task["prerequisites"] = b.ordered_prereqs()
    return Draft(task, "; ".join(notes))


_PORTS = re.compile(r"(?<![\d./])(\d{1,5})/(\d{1,5})(?![\d./])")


def _port_range(proc: Procedure) -> str:
    """The first port range (``22/22``) the procedure's steps name; the provisioned rule's
    default otherwise."""
    for step in proc.steps:
        for m in _PORTS.finditer(step.text):
            lo, hi = int(m.group(1)), int(m.group(2))
            if 1 <= lo <= hi <= 65535:
                return f"{lo}/{hi}"
    return "22/22"


def _policy_named(proc: Procedure, inventory: Inventory, first: bool = False) -> str:
    """The longest policy of the console's grant form the procedure names ("" if none);
    ``first``: the form's first policy whatever the procedure says."""
    names = [o for p in inventory.pages for f in p.forms for x in f.fields
             if x.name == "PolicyName" for o in x.options if "{" not in o]
    if first:
        return names[0] if names else ""
    text = " ".join([proc.title, *(s.text for s in proc.steps)])
    return next((n for n in sorted(names, key=len, reverse=True)
                 if re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])", text)), "")


def _bind_sends(b: _Builder, op: _Operation, walk: list[tuple[str, str]],
                where: dict[str, Any], known: dict[str, str]) -> list[str]:
    """Add what the console's request carries that the doc does not name (``op.sends``, learnt
    by the crawl): a constant as the console sends it (``PolicyType=System``); a parameter
    that names a resource (the VPC a vSwitch form posts for) bound to a prerequisite of that
    type; a required name the reader types, generated. The region is the twin's and the
    rule's own; anything else the reader enters or chooses is left to the doc's values.
    Returns the resource types it bound."""
    fields = {f.name: f for f in (op.form.fields if op.form is not None else ())}
    bound: list[str] = []
    reach = next((i for i, (_, after) in enumerate(walk) if after == op.page), op.step)
    for name, value in op.sends:
        key = f"requestParameters.{name}"
        if name == "RegionId" or key in where:
            continue
        if value != "{}":
            where[key] = known[name] = value
            continue
        f = fields.get(name)
        if f is not None and name not in RESOURCE_FIELDS:
            if _is_name(f) and f.required:
                param = b.parameter(snake(name), _generated(f))
                where[key] = known[name] = "{" + param + "}"
                b.hint(reach, f"(Use `{{{param}}}` as the {f.label}.)")
            continue
        rtype = ID_PARAMS.get(name)
        if rtype is None:
            continue
        rid = b.require(rtype)
        where[key] = known[name] = "{" + rid + "}"
        b.hint(min(reach, op.step), f"(The {RESOURCE_NOUN[rtype]} is `{{{rid}}}`.)")
        bound.append(rtype)
    return bound


_DOC_NAME = re.compile(r"[a-z][a-z0-9-]{1,38}[a-z0-9]")


def _name_as_the_doc(b: _Builder, proc: Procedure, upto: int, rtype: str,
                     rename: dict[str, str]) -> None:
    """The resource the operation acts on, when the doc finds it by a name before acting
    ("enter tmp-export-01 in the search box", "click vpc-old in the list"), is provisioned
    under that name made unique per episode (``tmp-export-01-{episode}``), and the steps say
    that name: the doc's own way of finding it then works."""
    decl = b.prereqs.get(rtype)
    if decl is None or "name" not in decl["properties"]:
        return
    names = [m.value if m.kind == "field" else m.field
             for step in proc.steps[:upto + 1] for m in step.mentions
             if (m.kind == "field" and not m.text and m.value) or
             (m.kind == "control" and m.value == "row-link" and m.field)]
    name = next((n for n in names if _DOC_NAME.fullmatch(n)), None)
    if name is None or name in rename:
        return
    decl["properties"]["name"] = rename[name] = f"{name}-{{episode}}"


def _fit_networks(b: _Builder, proc: Procedure, where: Mapping[str, Any]) -> None:
    """A CIDR block the operation sends for a prerequisite VPC (a vSwitch's) must lie inside
    that VPC's block: the VPC is declared with the block the doc's prerequisites give for it
    when one contains it, else the private /16 (or larger range) around it; a prerequisite
    vSwitch in that VPC moves inside too, clear of the operation's block."""
    vpc = b.prereqs.get("vpc")
    block = where.get("requestParameters.CidrBlock")
    if vpc is None or where.get("requestParameters.VpcId") != "{" + vpc["id"] + "}" \
            or not isinstance(block, str):
        return
    try:
        inner = ipaddress.ip_network(block, strict=False)
    except ValueError:
        return
    said = [ipaddress.ip_network(m, strict=False) for line in proc.prerequisites
            for m in re.findall(r"\b\d{1,3}(?:\.\d{1,3}){3}/\d{1,2}\b", line)
            if re.search(r"\bvpc\b", line, re.I) and _network_ok(m)]
    outer = next((n for n in said if n.version == inner.version and inner.subnet_of(n)
                  and n != inner), None)
    if outer is None:
        private = next((n for n in _PRIVATE if inner.version == 4 and inner.subnet_of(n)), None)
        if private is None:
            return
        outer = inner.supernet(new_prefix=16) if inner.prefixlen >= 16 and \
            private.prefixlen <= 16 else private
    vpc["properties"]["cidr_block"] = str(outer)
    sw = b.prereqs.get("vswitch")
    if sw is not None:
        free = next((n for n in outer.subnets(new_prefix=max(24, outer.prefixlen))
                     if not n.overlaps(inner)), None)
        if free is not None:
            sw["properties"]["cidr_block"] = str(free)


def _fit_zone(b: _Builder, where: Mapping[str, Any]) -> None:
    """A zone the operation sends beside a prerequisite vSwitch (an instance's) is the
    vSwitch's zone: the vSwitch is declared in it."""
    sw = b.prereqs.get("vswitch")
    zone = where.get("requestParameters.ZoneId")
    if sw is not None and isinstance(zone, str) and "{" not in zone and \
            where.get("requestParameters.VSwitchId") == "{" + sw["id"] + "}":
        sw["properties"]["zone"] = zone


def _network_ok(text: str) -> bool:
    try:
        ipaddress.ip_network(text, strict=False)
    except ValueError:
        return False
    return True


_PRIVATE = [ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16")]


def _forbidden(op: str, where: Mapping[str, Any], known: Mapping[str, str]) -> list[dict]:
    service = op.split(":", 1)[0]
    out = []
    for contrary in CONTRARY.get(op, ()):
        rule: dict[str, Any] = {"event": contrary, "service": service}
        if op in CREATED_ID:
            key = CREATED_ID[op]
            rule["where"] = {f"requestParameters.{key}": {"ref": f"op.responseElements.{key}"}}
        else:
            # The contrary event on the same resource: the request's identifying parameters.
            ids = {p: v for p, v in known.items()
                   if p.endswith(("Id", "UserName", "BucketName")) and "{" in v}
            if contrary.startswith("Delete"):
                # Deleting the resource itself: only its own identifier scopes the event.
                noun = contrary[len("Delete"):]
                ids = {p: v for p, v in ids.items() if p.startswith(noun)} or ids
            if not ids:
                continue          # an unscoped contrary would forbid other resources' events
            rule["where"] = {f"requestParameters.{p}": v for p, v in ids.items()}
        out.append(rule)
    return out


def _read_back(op: str, known: Mapping[str, str], region: str) -> list[dict]:
    rb = READBACK.get(op)
    if rb is None:
        return []

    def value(source: str) -> str | None:
        if source.startswith("="):
            return source[1:]
        if "{" in source:          # a template over the operation's parameters
            names = re.findall(r"\{([A-Za-z]+)\}", source)
            if any(n not in known for n in names):
                return None
            for n in names:
                source = source.replace("{" + n + "}", known[n])
            return source
        return known.get(source)

    params = {}
    for name, source in rb.params:
        v = value(source)
        if v is None:
            return []
        params[name] = v
    if rb.region:
        params["RegionId"] = region
    check: dict[str, Any] = {"service": op.split(":", 1)[0], "action": rb.action,
                             "params": params}
    if rb.expect_error:
        check["expect_error"] = rb.expect_error
    else:
        expect = {path: v for path, source in rb.expect if (v := value(source)) is not None}
        if not expect:
            return []
        check["expect"] = expect
    return [check]
