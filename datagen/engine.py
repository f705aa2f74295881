"""The data engine: tasks nobody wrote by hand, from the console's own UI inventory.

1. **Walks** (:func:`walks`). From each page the left navigation lists, every way the crawl
   found to an API call: a toolbar control or a row's control that opens a form (filled and
   submitted), opens a confirmation (confirmed) or posts directly; the same from the page of a
   row's resource (its name link first). Each walk knows the action its last click causes
   (``Service:Action``, recorded by the crawl from the audit log).
2. **Pages** (:func:`write_page`). A walk written as a help-center procedure in Markdown, in
   one of several house styles (:data:`STYLES`: how a page opens the console, reaches a
   menu, names a row, sets a field), with values drawn for its fields (names, CIDR blocks,
   ports, the options a select offers; optional fields sometimes). One style per page, drawn.
3. **Tasks** (:func:`synthesise`). Each page goes through the documentation pipeline exactly
   as a user's page does (:class:`doccheck.DocsService`: the reader, the static check, the
   draft with its success rule from the inventory, its prerequisites, and the replay plan: the
   teacher that knows the plan). A page is kept only when every step checks (``ok`` or
   ``label_differs``) and it drafts into a task with a replay plan; its walk's action must be
   none of the evaluation's (``exclude_actions``: the evaluation's families stay out) and no
   step may repeat a sentence of the evaluation's procedures (``exclude_texts``). Walks are
   drawn round-robin over (drift, product, action) and styles, for diversity, not volume.
4. **Wrong documents** (:func:`wrong_doc`). From a kept task, one control, field or option the
   procedure names is renamed to a label no console profile has (:data:`FOREIGN`); the task
   expects ``infeasible``, its oracle walks the documented steps up to the page that should
   show it and checks that it is absent (``wrongdoc_missing`` / ``wrongdoc_option``), and its
   reason is a short fixed form naming the missing thing (``No "Quick Launch" button on this
   page.``), which the reward's evidence channel checks against the pages the agent saw.
5. **Trajectories.** ``python -m datagen.engine --out DIR`` writes the tasks under
   ``DIR/tasks`` (and ``summary.json``); ``python -m cluster.export --suite DIR/tasks --split
   all --config CONFIG --out DIR/sft-data.jsonl`` runs the teacher on each (a real console,
   real browser, the audit log deciding) and keeps only ``solved`` and
   ``infeasible_reported`` episodes, as SFT records with the config's agent settings.

What it leaves out: walks composed across operations (create, then grant, then delete in one
procedure); the drafted task acts on one operation.
"""
from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from consolerl.errors import ConfigError, ConsoleRLError
from consolerl.tasks import TASKS_DIR, load_suite, parse_task
from consolerl.text import norm
from datagen.augment import heldout_sentences
from datagen.oracle import WALK_VERBS
from doccheck import DocsService, PageIn, labels_by_drift

# ---- walks ------------------------------------------------------------------------------------

_RESOURCE = "{}"


@dataclass(frozen=True)
class Walk:
    """One way to an API call. ``menu``: the navigation path of the page it starts on (the
    product first); ``noun``: the resource a row or detail page belongs to ("security
    group"); ``detail``: the walk opens that resource's page first; ``row``: its first click
    is in the resource's row; ``tab``: the tab the control sits on ("" none); ``control``: the
    label clicked before the form or confirmation (or the one that posts); ``form``: the form filled (fields as the
    inventory has them) with its submit label; ``confirm``: the confirming button."""

    drift: str
    product: str
    menu: tuple[str, ...]
    page_title: str
    noun: str
    action: str
    control: str
    detail: bool = False
    row: bool = False
    tab: str = ""
    form: Any = None
    confirm: str = ""

    @property
    def key(self) -> tuple[str, str, str]:
        return self.drift, self.product, self.action


def singular(title: str) -> str:
    """A list page's resource, as prose names one: "Security Groups" -> "security group",
    "VPCs" -> "VPC", "vSwitches" -> "vSwitch"."""
    words = title.split()
    last = words[-1]
    if re.search(r"(ch|sh|ss|x)es$", last):
        last = last[:-2]
    elif last.endswith("s") and not last.endswith("ss"):
        last = last[:-1]
    words[-1] = last
    return " ".join(w if sum(c.isupper() for c in w) > 1 or w[:1].islower() else w.lower()
                    for w in words)


def _confirm_label(page: Any, dialog: str) -> str:
    for c in page.controls:
        if c.where.kind.value == "dialog" and c.where.name == dialog \
                and c.target.kind.value == "post":
            return c.label
    return ""


def _tab_of(page: Any, control: Any) -> str:
    """The tab a control sits on, when the page has as many same-label controls as tabs (the
    i-th on the i-th tab)."""
    same = [c for c in page.controls if c.label == control.label and c.where == control.where]
    if page.tabs and len(same) == len(page.tabs) > 1:
        return page.tabs[same.index(control)]
    return ""


def _from_page(inv: Any, start: Any, page: Any, noun: str, detail: bool,
               wheres: frozenset[str]) -> Iterable[Walk]:
    for c in page.controls:
        if c.where.kind.value not in wheres or _RESOURCE in c.label:
            continue
        base = Walk(inv.drift, start.product, start.menu_path, start.title, noun, "",
                    c.label, detail=detail, row=c.where.kind.value == "row",
                    tab=_tab_of(page, c))
        kind = c.target.kind.value
        if kind == "page":
            target = inv.page(c.target.name)
            if target is None or target.pattern == page.pattern:
                continue
            for form in target.forms:
                if form.action and form.fields:
                    yield replace(base, action=form.action, form=form)
        elif kind == "dialog" and c.action:
            confirm = _confirm_label(page, c.target.name)
            if confirm:
                yield replace(base, action=c.action, confirm=confirm)
        elif kind == "post" and c.action:
            yield replace(base, action=c.action)


def walks(inv: Any, nouns: Mapping[str, str] | None = None) -> list[Walk]:
    """Every walk of one inventory (:class:`doccheck.model.Inventory`), from each page the
    navigation lists and from the pages of its rows' resources. ``nouns``: list page pattern
    -> the resource its rows are (a drifted console renames the page, "Instance List", not
    the resource); else from the page's title."""
    out: list[Walk] = []
    for start in inv.pages:
        if not start.menu_path:
            continue
        noun = (nouns or {}).get(start.pattern) or singular(start.title)
        out += _from_page(inv, start, start, noun, False, frozenset({"toolbar", "row"}))
        for c in start.controls:
            if c.where.kind.value == "row" and c.label == _RESOURCE \
                    and c.target.kind.value == "page":
                detail = inv.page(c.target.name)
                if detail is not None:
                    out += _from_page(inv, start, detail, noun, True,
                                      frozenset({"toolbar", "page", "section"}))
    return out


# ---- values -------------------------------------------------------------------------------------

_NAME_WORDS = ("web", "app", "db", "build", "data", "ops", "edge", "batch", "audit", "ml",
               "cache", "etl", "api", "log", "stage", "qa", "mail", "report")
_DISPLAY = ("Build Agent", "Release Bot", "Data Team", "Nightly Jobs", "Support Desk",
            "Metrics Reader", "Backup Operator", "Docs Writer")
_NOTES = ("Created for the staging rollout", "Temporary access for an audit",
          "Managed by the platform team", "Used by the nightly export")
_PORTS = ("80/80", "443/443", "8080/8080", "3306/3306", "6379/6379", "5432/5432",
          "8000/8100", "9000/9000")


def field_value(f: Any, rng: random.Random) -> str | None:
    """A value a reader would enter in field ``f`` (an inventory ``FormField``), or None when
    the engine does not know what the field wants."""
    label, name = norm(f.label), f.name.lower()
    if f.kind in ("select", "radio"):
        options = [o for o in f.options if _RESOURCE not in o]
        return rng.choice(options) if options else None
    if f.kind == "number":
        lo = int(f.minimum) if f.minimum is not None else 1
        hi = int(f.maximum) if f.maximum is not None else 100
        return str(rng.randint(lo, min(hi, lo + 99)))
    if "cidr" in name and "block" in name:
        if "vswitch" in f"{label} {name}" or "switch" in label:
            return f"172.16.{rng.randint(1, 250)}.0/24"
        return f"10.{rng.randint(1, 250)}.0.0/16"
    if "cidrip" in name or "authorization object" in label:
        return rng.choice(("10.0.0.0/8", "172.16.0.0/12", f"192.168.{rng.randint(1, 250)}.0/24"))
    if "portrange" in name:
        return rng.choice(_PORTS)
    if "display" in name:
        return rng.choice(_DISPLAY)
    if f.kind == "textarea" or "description" in name or "comment" in name:
        return rng.choice(_NOTES)
    if "name" in name or "name" in label:
        return f"{rng.choice(_NAME_WORDS)}-{rng.choice(_NAME_WORDS)}-{rng.randint(1, 99):02d}"
    return None


# ---- pages -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Style:
    """How one house writes a procedure. Each template is a format string: ``{console}``,
    ``{menu}`` (bold parts joined), ``{noun}``, ``{c}`` (a control), ``{tab}``, ``{f}`` (a
    field), ``{v}`` (a value), ``{o}`` (an option), ``{title}`` (the list page's)."""

    name: str
    open: tuple[str, ...]
    row_action: str
    detail: str
    click: str
    tab: str
    text: str
    choose: str
    submit: str
    confirm: str
    bullets: bool = False


STYLES: tuple[Style, ...] = (
    Style("aliyun",
          ("Log on to the {console} management console.",
           "In the navigation pane on the left, choose {menu}."),
          "Find the {noun} and click **{c}** in the **Actions** column.",
          "Find the {noun} and click its ID.",
          "Click **{c}**.", "Click the **{tab}** tab.",
          "In the **{f}** field, enter `{v}`.", "Set **{f}** to **{o}**.",
          "Click **{c}**.", "In the message that appears, click **{c}**."),
    Style("terse",
          ("Go to {menu}.",),
          "In the row of the {noun}, click **{c}**.",
          "Click the name of the {noun}.",
          "Click **{c}**.", "Open the **{tab}** tab.",
          "Enter `{v}` in **{f}**.", "For **{f}**, select **{o}**.",
          "Click **{c}**.", "Click **{c}** to confirm."),
    Style("guide",
          ("Sign in to the {console} console.",
           "Open the {menu} page from the left navigation."),
          "Locate the {noun}. In its row, click **{c}**.",
          "Click the ID of the {noun} to open its details page.",
          "On the page that opens, click **{c}**.", "Switch to the **{tab}** tab.",
          "Set **{f}** to `{v}`.", "Choose **{o}** for **{f}**.",
          "When you are done, click **{c}**.", "Confirm by clicking **{c}**."),
    Style("table",
          ("Sign in to the {console} management console.",
           "In the left navigation pane, click {menu}."),
          "Find the {noun} that you want to manage and click **{c}** in its row.",
          "Click the name of the {noun}.",
          "Click **{c}**.", "Click the **{tab}** tab.",
          "**{f}**: enter `{v}`.", "**{f}**: select **{o}**.",
          "Click **{c}**.", "In the dialog box, click **{c}**.",
          bullets=True),
)


@dataclass(frozen=True)
class Page:
    """A synthesised page: its Markdown, and the walk and style it came from."""

    text: str
    walk: Walk
    style: str


def _a(noun: str) -> str:
    return f"{'an' if noun[:1].lower() in 'aeio' else 'a'} {noun}"


def _title(walk: Walk) -> str:
    if walk.form is not None and _RESOURCE not in walk.form.title and not walk.row \
            and not walk.detail:
        return walk.form.title
    if walk.form is not None:
        return walk.form.title.replace(_RESOURCE, _a(walk.noun))
    return f"{walk.control} {_a(walk.noun)}"


def write_page(walk: Walk, style: Style, rng: random.Random, console: str) -> Page | None:
    """``walk`` as a help-center page in ``style``; None when a required field has no value
    the engine knows how to write."""
    menu = " > ".join(f"**{m}**" for m in walk.menu[1:])
    fmt = dict(console=console, menu=menu, noun=walk.noun, title=walk.page_title)
    steps = [t.format(**fmt) for t in style.open]
    if walk.detail:
        steps.append(style.detail.format(**fmt))
    if walk.tab:
        steps.append(style.tab.format(tab=walk.tab, **fmt))
    steps.append((style.row_action if walk.row else style.click).format(c=walk.control,
                                                                        **fmt))
    if walk.form is not None:
        lines = []
        for f in walk.form.fields:
            if f.kind == "readonly" or (not f.required and rng.random() < 0.5):
                continue
            v = field_value(f, rng)
            if v is None:
                if f.required and not any(_RESOURCE in o for o in f.options):
                    return None
                continue
            template = style.choose if f.kind in ("select", "radio") else style.text
            lines.append(template.format(f=f.label, v=v, o=v))
        if style.bullets and lines:
            steps.append("Configure the following parameters:\n"
                         + "\n".join(f"   - {line}" for line in lines))
        else:
            steps += lines
        steps.append(style.submit.format(c=walk.form.submit))
    if walk.confirm:
        steps.append(style.confirm.format(c=walk.confirm))
    body = "\n".join(f"{i}. {s}" for i, s in enumerate(steps, 1))
    text = f"# {_title(walk)}\n\n## Procedure\n\n{body}\n"
    return Page(text, walk, style.name)


# ---- tasks -------------------------------------------------------------------------------------

@dataclass
class Synthesis:
    """What :func:`synthesise` made: the kept tasks and their pages, how many walks it read,
    and per reason how many walks or pages it dropped."""

    tasks: list[dict] = field(default_factory=list)
    pages: list[Page] = field(default_factory=list)
    dropped: Counter = field(default_factory=Counter)
    walks: int = 0


_DISTINCT_WORDS = 5


def _sentences(text: str) -> set[str]:
    """A procedure's step sentences that are wording (five words or more: "Click Save." is
    everyone's), normalised, without values and placeholders."""
    out = set()
    for line in text.splitlines():
        line = re.sub(r"^\s*(\d+\.|-)\s*", "", line)
        line = norm(re.sub(r"\{[a-z_]+\}|`[^`]*`", "", line))
        if len(line.split()) >= _DISTINCT_WORDS:
            out.add(line)
    return out


def evaluation_exclusions(suite: Path | str = TASKS_DIR, tasks: str = ""
                          ) -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
    """(actions, sentences, labels) of the evaluation, the tasks matching ``tasks`` (a
    regular expression over ids; "" all): the API actions any of them requires, in either
    split (a family's train and held-out siblings share it), and of the held-out ones the
    procedures' sentences (normalised, values and placeholders out) and the labels their
    wrong documents say are missing. The engine makes nothing with any of them."""
    pattern = re.compile(tasks) if tasks else None
    actions, sentences, labels = set(), set(), set()
    for t in load_suite(suite):
        if pattern and not pattern.search(t.id):
            continue
        for ev in t.success.required_events:
            actions.add(f"{ev.service}:{ev.event}")
        if t.split != "heldout":
            continue
        sentences |= _sentences(t.procedure)
        args = dict(t.oracle_args)
        for name in ("absent", "option"):
            labels |= {norm(a) for a in args.get(name, "").split("|") if a.strip()}
    return frozenset(actions), frozenset(sentences), frozenset(labels)


def synthesise(service: DocsService, count: int, seed: int = 0, *,
               exclude_actions: Iterable[str] = (), exclude_texts: Iterable[str] = (),
               drifts: Sequence[str] | None = None, tries: int = 4) -> Synthesis:
    """Up to ``count`` verified-by-construction tasks, drawn round-robin over (drift,
    product, action) and styles; ids ``eng-<product>-<n>``."""
    rng = random.Random(seed)
    banned_actions, banned_texts = set(exclude_actions), set(exclude_texts)
    out = Synthesis()
    groups: dict[tuple[str, str, str], list[Walk]] = defaultdict(list)
    base = service.inventories.get("")
    nouns = {p.pattern: singular(p.title) for p in base.pages if p.menu_path} if base else {}
    for drift in drifts if drifts is not None else sorted(service.inventories):
        inv = service.inventories[drift]
        for w in walks(inv, nouns):
            out.walks += 1
            if w.action in banned_actions:
                out.dropped["evaluation family"] += 1
                continue
            groups[w.key].append(w)
    if not groups:
        return out
    consoles = {drift: dict(service.inventories[drift].products) for drift in
                service.inventories}
    keys = sorted(groups)
    rng.shuffle(keys)
    attempts, n = 0, 0
    while len(out.tasks) < count and attempts < count * tries:
        key = keys[attempts % len(keys)]
        attempts += 1
        walk = rng.choice(groups[key])
        style = STYLES[rng.randrange(len(STYLES))]
        page = write_page(walk, style, rng, consoles[walk.drift].get(walk.product,
                                                                     walk.product.upper()))
        if page is None:
            out.dropped["a required field the engine cannot fill"] += 1
            continue
        if _sentences(page.text) & banned_texts:
            out.dropped["a sentence of the evaluation"] += 1
            continue
        results = service.read([PageIn(f"engine-{n}.md", page.text)], walk.drift)
        n += 1
        procs = results[0].procedures
        if len(procs) != 1:
            out.dropped["not read as one procedure"] += 1
            continue
        got = procs[0]
        bad = [c.label for c in got.checks if str(c.label) not in ("ok", "label_differs")]
        if bad:
            out.dropped[f"static check: {bad[0]}"] += 1
            continue
        task = got.task
        if task is None or (task.get("oracle") or {}).get("family") != "replay":
            out.dropped["not drafted with a replay plan"] += 1
            continue
        required = (task.get("success") or {}).get("required_events") or [{}]
        if f"{required[0].get('service')}:{required[0].get('event')}" != walk.action:
            out.dropped["drafted as another operation"] += 1
            continue
        task = dict(task, id=f"eng-{walk.product}-{len(out.tasks):04d}", split="train")
        task["engine"] = {"style": style.name, "action": walk.action, "drift": walk.drift,
                          "detail": walk.detail}
        out.tasks.append(task)
        out.pages.append(page)
    return out


# ---- wrong documents ---------------------------------------------------------------------------

FOREIGN = {
    "control": ("Quick Launch", "Clone Settings", "Batch Import", "Apply Template",
                "Export Configuration", "Schedule Task", "Transfer Ownership"),
    "field": ("Deletion Protection", "Billing Cycle", "Tag Key", "Maintenance Window",
              "Auto Renewal", "Encryption Key"),
    "option": ("Premium Tier", "Dedicated Host", "Global Acceleration", "Read-Only Replica",
               "Cold Archive"),
}
_NOUN = {"control": "button", "field": "field", "option": "option"}


def _walk_ops(plan: Sequence[Sequence[str]]) -> str | None:
    """The replay ops as the wrong-doc oracle's ``verb:arg|arg`` steps; None for an op it
    cannot walk."""
    out = []
    for op in plan:
        verb, args = op[1], op[2:]
        verb = "link" if verb == "last_link" else verb
        if verb not in WALK_VERBS or any(c in a for a in args for c in "|;"):
            return None
        out.append(f"{verb}:{'|'.join(args)}")
    return "; ".join(out)


def wrong_doc(task: Mapping[str, Any], rng: random.Random, taken: Iterable[str] = (),
              known_labels: Iterable[str] = ()) -> dict | None:
    """A wrong document made from the drafted ``task``: one control, field or option of one
    of its replay steps renamed to a :data:`FOREIGN` label that no console profile has
    (``known_labels``) and no evaluation task names (``taken``); None when no step of the
    plan can be renamed in the procedure's text."""
    plan = json.loads(task["oracle"]["args"]["plan"])
    lines = task["procedure"].splitlines()
    banned = {norm(x) for x in (*taken, *known_labels)}
    candidates = []
    for i, op in enumerate(plan):
        verb, args = op[1], op[2:]
        if verb in ("press", "submit", "last_link") and args:
            candidates.append((i, "control", args[0]))
        elif verb in ("field", "select") and args:
            candidates.append((i, "field", args[0]))
            # a select's option (a radio's, ``choose``, names no field the oracle could read)
            if verb == "select" and len(args) > 1:
                candidates.append((i, "option", args[1]))
    rng.shuffle(candidates)
    for i, kind, label in candidates:
        if "{" in label:                    # a resource or placeholder, not a label
            continue
        step = plan[i][0]
        at = next((k for k, line in enumerate(lines)
                   if line.startswith(f"{step}.") and label in line), None)
        if at is None:
            continue
        foreign = [x for x in FOREIGN[kind] if norm(x) not in banned]
        if not foreign:
            continue
        new = rng.choice(foreign)
        walk = _walk_ops(plan[:i])
        if walk is None:
            continue
        lines2 = list(lines)
        lines2[at] = lines[at].replace(label, new)
        args: dict[str, str] = {"steps": walk}
        if kind == "option":
            field_name = plan[i][2]
            family, args["field"], args["option"] = "wrongdoc_option", field_name, new
            reason = f'No "{new}" option for {field_name} on this page.'
        else:
            family, args["absent"] = "wrongdoc_missing", new
            reason = f'No "{new}" {_NOUN[kind]} on this page.'
        out = {k: v for k, v in task.items() if k not in ("oracle", "success", "engine",
                                                            "parameters")}
        keep_params = {k: v for k, v in (task.get("parameters") or {}).items()
                       if "{" + k + "}" in "\n".join(lines2)}
        if keep_params:
            out["parameters"] = keep_params
        # What the operation's own events would undo is kept out: it refers to the required
        # event a wrong document no longer has.
        forbidden = [r for r in (task.get("success") or {}).get("forbidden_events", ())
                     if "after" not in r and all(isinstance(v, str) for v in
                                                 (r.get("where") or {}).values())]
        out.update(id=f"{task['id']}-wrongdoc", procedure="\n".join(lines2) + "\n",
                   expected="infeasible", infeasible_reason=reason,
                   success={"forbidden_events": forbidden} if forbidden else {},
                   oracle={"family": family, "args": args},
                   engine=dict(task.get("engine", {}), wrong=kind, renamed=label, to=new))
        try:
            parse_task({k: v for k, v in out.items() if k != "engine"}, out["id"])
        except ConfigError:
            continue
        return out
    return None


# ---- files and the command ---------------------------------------------------------------------

def write_tasks(tasks: Sequence[Mapping[str, Any]], root: Path) -> list[Path]:
    """Each task as ``root/<product>/<id>.yaml`` (the ``engine`` provenance key kept
    beside it in ``root/provenance.jsonl``: task files hold only what the suite reads)."""
    if (root / "provenance.jsonl").is_file():
        shutil.rmtree(root)                 # the engine's own earlier output
    elif root.is_dir() and any(root.iterdir()):
        raise ConsoleRLError(f"{root}: not empty and not written by the engine; "
                             f"give another --out")
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    with open(root / "provenance.jsonl", "w") as prov:
        for t in tasks:
            body = {k: v for k, v in t.items() if k != "engine"}
            path = root / body["product"] / f"{body['id']}.yaml"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(yaml.safe_dump(body, sort_keys=False, width=100))
            prov.write(json.dumps({"id": body["id"], **t.get("engine", {})}) + "\n")
            paths.append(path)
    return paths


def make_tasks(root: Path | str, count: int, wrong: int, seed: int = 0, exclude: str = "",
               drifts: Sequence[str] | None = None, suite: Path | str = TASKS_DIR,
               service: DocsService | None = None) -> dict[str, Any]:
    """The engine's tasks under ``root`` (:func:`write_tasks`): ``count`` that succeed and up
    to ``wrong`` wrong documents made from them, with the evaluation (``exclude``: a regular
    expression over ``suite``'s task ids; "" every task) and the held-out documentation
    corpus kept out (:func:`evaluation_exclusions`). Returns a summary of what was made."""
    t0 = time.monotonic()
    actions, sentences, labels = evaluation_exclusions(suite, exclude)
    # The documentation the docs agent is evaluated on is evaluation wording too.
    sentences |= {s for text in heldout_sentences() for s in _sentences(text)}
    service = service or DocsService.default()
    syn = synthesise(service, count, seed, exclude_actions=actions, exclude_texts=sentences,
                     drifts=drifts)
    rng = random.Random(seed + 1)
    known = set().union(*labels_by_drift().values())
    made = []
    for task in rng.sample(syn.tasks, len(syn.tasks)):
        if len(made) >= wrong:
            break
        w = wrong_doc(task, rng, labels, known)
        if w is not None:
            made.append(w)
    write_tasks(syn.tasks + made, Path(root))
    return {
        "walks": syn.walks, "tasks": len(syn.tasks), "wrong_docs": len(made),
        "dropped": dict(syn.dropped),
        "by_action": dict(Counter(t["engine"]["action"] for t in syn.tasks)),
        "by_drift": dict(Counter(t["engine"]["drift"] or "none" for t in syn.tasks)),
        "by_style": dict(Counter(t["engine"]["style"] for t in syn.tasks)),
        "by_wrong_kind": dict(Counter(t["engine"]["wrong"] for t in made)),
        "excluded_actions": sorted(actions), "synthesis_s": round(time.monotonic() - t0, 2)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m datagen.engine", description=__doc__
                                     .split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder: tasks/ and summary.json")
    parser.add_argument("--count", type=int, default=40, help="tasks that succeed")
    parser.add_argument("--wrong", type=int, default=10, help="wrong documents")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--exclude", required=True,
                        help="regular expression over task ids: the evaluation (e.g. the "
                        "learning check's task filter), whose families and held-out wording "
                        "stay out ('' = every task, which leaves no family to make)")
    parser.add_argument("--drift", action="append", default=None,
                        help="drift profiles to draw from (repeatable; default: all crawled)")
    args = parser.parse_args(argv)
    if args.count < 1 or args.wrong < 0:
        parser.error("--count must be >= 1 and --wrong >= 0")
    out = Path(args.out)
    try:
        summary = make_tasks(out / "tasks", args.count, args.wrong, args.seed, args.exclude,
                             args.drift)
    except (ConsoleRLError, re.error) as exc:
        parser.error(str(exc))
    print(f"[engine] {summary['tasks']} tasks and {summary['wrong_docs']} wrong documents "
          f"from {summary['walks']} walks -> {out / 'tasks'}", file=sys.stderr)
    print(f"[engine] the teacher's trajectories: python -m cluster.export --config "
          f"configs/learning-check.yaml --suite {out / 'tasks'} --split all "
          f"--out {out / 'sft-data.jsonl'}", file=sys.stderr)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
