"""The console's UI inventory on disk: load, save, version, diff, look up.

An inventory file is :func:`doccheck.model.dumps` of one
:class:`~doccheck.model.Inventory` (one console, one drift profile), written by
:mod:`doccheck.crawl`. The committed ones live under ``docs/inventory/``
(:func:`default_inventories`). Its ``version`` is a hash of what the console shows (pages,
controls, forms), not of when it was crawled nor of the concrete resource a page was visited
with: two crawls of an unchanged console have the same version.

:func:`diff` lists what changed between two crawls: pages added or removed, and on a page
present in both, controls, menu entries, form fields, submit labels and titles that were
``renamed`` (same place and target, new label), ``added``, ``removed`` or ``changed`` (same
label, different target, action, kind or requirement). ``console-rl inventory diff A B``
prints it (:func:`diff_main`).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from consolerl.errors import ConsoleRLError
from consolerl.text import norm

from .model import (INVENTORY_SCHEMA, Control, Form, FormField, Inventory, PageEntry, dumps,
                    TargetKind, WhereKind, from_json, to_json)

ROOT = Path(__file__).resolve().parents[1]
INVENTORY_DIR = ROOT / "docs" / "inventory"
# drift profile -> committed crawl of the local console
DEFAULT_FILES = {"": "local.json", "rename": "local-rename.json",
                 "more_menu": "local-more_menu.json", "wizard": "local-wizard.json",
                 "nav": "local-nav.json"}
CHANGE_KINDS = ("added", "removed", "renamed", "changed")
MAX_FILE_BYTES = 64 * 2 ** 20


class InventoryError(ConsoleRLError, ValueError):
    """An inventory file that cannot be read: missing, not JSON, another schema, a field that
    does not fit; the message names the file and what is wrong."""


@dataclass(frozen=True)
class Change:
    """One difference between two crawls. ``kind``: added | removed | renamed | changed;
    ``page``: the page pattern ("" for the console as a whole); ``what``: page | title | menu |
    control | tab | column | form | field | option | submit | next | cancel | step; ``old`` /
    ``new``: the label (or the value that changed) before and after, "" when absent."""

    kind: str
    page: str
    what: str
    old: str = ""
    new: str = ""

    def __str__(self) -> str:
        where = self.page or "(console)"
        if self.kind == "renamed":
            return f"renamed  {where}: {self.what} {self.old!r} -> {self.new!r}"
        if self.kind == "changed":
            return f"changed  {where}: {self.what} {self.old} -> {self.new}"
        return f"{self.kind:<8} {where}: {self.what} {self.new or self.old!r}"


# ---- files -------------------------------------------------------------------------------------
def load(path: str | os.PathLike[str]) -> Inventory:
    """Read an inventory file; :class:`InventoryError` (also a ValueError) names the file and
    what is wrong (missing, too large, not JSON, schema other than
    :data:`~doccheck.model.INVENTORY_SCHEMA`, a malformed field)."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise InventoryError(f"{path}: {size} bytes, larger than the {MAX_FILE_BYTES} an "
                                 "inventory may have")
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InventoryError(f"{path}: cannot read the inventory: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise InventoryError(f"{path}: not UTF-8 text (an inventory is JSON)") from None
    except json.JSONDecodeError as exc:
        raise InventoryError(f"{path}: not JSON (line {exc.lineno}, column {exc.colno}: "
                             f"{exc.msg})") from None
    return parse(data, str(path))


def parse(data: object, source: str = "<inventory>") -> Inventory:
    """An inventory from JSON data (as :func:`load` reads it)."""
    if not isinstance(data, dict):
        raise InventoryError(f"{source}: expected a JSON object, got {type(data).__name__}")
    schema = data.get("schema", INVENTORY_SCHEMA)
    if schema != INVENTORY_SCHEMA:
        raise InventoryError(f"{source}: field 'schema' is {schema!r}; this version reads "
                             f"schema {INVENTORY_SCHEMA} (crawl the console again)")
    missing = [k for k in ("console", "drift", "crawled_at", "version", "pages") if k not in data]
    if missing:
        raise InventoryError(f"{source}: missing field(s) {', '.join(missing)}")
    try:
        inv = from_json(Inventory, data)
    except (ValueError, TypeError, AttributeError) as exc:
        raise InventoryError(f"{source}: malformed inventory: {str(exc)[:300]}") from None
    for i, page in enumerate(inv.pages):
        if not isinstance(page, PageEntry) or not isinstance(page.pattern, str) \
                or not page.pattern.startswith("/"):
            raise InventoryError(f"{source}: pages[{i}].pattern must be a console path")
        for c in page.controls:
            if not isinstance(c, Control) or not isinstance(c.label, str):
                raise InventoryError(f"{source}: pages[{i}] ({page.pattern}): a control is "
                                     "malformed")
    return inv


def save(inv: Inventory, path: str | os.PathLike[str]) -> Path:
    """Write ``inv`` to ``path`` atomically (a temporary file in the same folder, renamed over
    it): a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(dumps(inv) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def version_of(pages: Iterable[PageEntry]) -> str:
    """A stable hash of ``pages`` (order-independent; each page's ``example``, the concrete
    path it was visited at, left out): ``"sha256:<16 hex>"``."""
    canon = sorted((to_json(replace(p, example="")) for p in pages),
                   key=lambda p: p["pattern"])
    text = json.dumps(canon, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def default_inventories() -> dict[str, Path]:
    """drift profile -> the committed crawl of the local console for it (``""``, ``rename``,
    ``more_menu``, ``wizard``, ``nav``; the crawler cannot confirm ``extra_confirm``'s typed
    deletions, so that profile and ``all`` have none); files that are not there are left
    out."""
    return {drift: INVENTORY_DIR / name for drift, name in DEFAULT_FILES.items()
            if (INVENTORY_DIR / name).is_file()}


def console_labels(inv: Inventory) -> frozenset[str]:
    """Every name the console shows a user, normalised as the evidence channel compares them
    (:func:`reward_service.evidence.norm`): page titles, menu entries, controls, tabs, table
    columns, form titles, fields, their options, and submit, next and cancel labels and wizard
    steps; with the products' titles."""
    names: set[str] = {title for _, title in inv.products}
    for page in inv.pages:
        names.update((page.title, *page.menu_path, *page.tabs, *page.columns))
        names.update(c.label for c in page.controls)
        for form in page.forms:
            names.update((form.title, form.submit, form.next_label, form.cancel, *form.steps))
            for f in form.fields:
                names.update((f.label, *f.options))
    return frozenset(n for n in (norm(x) for x in names) if n)


def labels_by_drift(files: dict[str, Path] | None = None) -> dict[str, frozenset[str]]:
    """drift profile -> :func:`console_labels` of its inventory (the committed crawls of the
    local console by default)."""
    return {drift: console_labels(load(path))
            for drift, path in (default_inventories() if files is None else files).items()}


# ---- look-ups ----------------------------------------------------------------------------------
def pages_for_product(inv: Inventory, product: str) -> list[PageEntry]:
    """The pages of ``product`` (its key, ``ram``, or its title as the home page shows it,
    case-insensitive)."""
    wanted = product.strip().lower()
    keys = {k for k, title in inv.products if wanted in (k.lower(), title.lower())}
    keys.add(wanted)
    return [p for p in inv.pages if p.product.lower() in keys]


def page_by_menu(inv: Inventory, parts: Sequence[str]) -> PageEntry | None:
    """The page the left navigation reaches by ``parts``: the full path (``("RAM",
    "Users")``) or its tail (``("Users",)``, ``("Identities", "Users")``), case-insensitive.
    None when no page or more than one matches a tail."""
    wanted = tuple(p.strip().lower() for p in parts if p.strip())
    if not wanted:
        return None
    found = [p for p in inv.pages if p.menu_path
             and tuple(x.lower() for x in p.menu_path[-len(wanted):]) == wanted]
    exact = [p for p in found if tuple(x.lower() for x in p.menu_path) == wanted]
    if exact:
        return exact[0]
    return found[0] if len(found) == 1 else None


def controls_named(page: PageEntry, label: str) -> list[Control]:
    """The controls of ``page`` labelled ``label`` (case- and space-insensitive)."""
    wanted = " ".join(label.split()).lower()
    return [c for c in page.controls if " ".join(c.label.split()).lower() == wanted]


def target_page(inv: Inventory, control: Control) -> PageEntry | None:
    """The page a ``page:`` control leads to (None for dialogs, posts, unknown targets)."""
    if control.target.kind is TargetKind.PAGE:
        return inv.page(control.target.name)
    return None


def form_by_action(inv: Inventory, action: str) -> list[tuple[PageEntry, Form]]:
    """Every (page, form) whose submit causes ``action`` (``Ram:CreateUser``)."""
    return [(p, f) for p in inv.pages for f in p.forms if f.action == action]


# ---- diff --------------------------------------------------------------------------------------
def diff(a: Inventory, b: Inventory) -> list[Change]:
    """What changed from crawl ``a`` to crawl ``b`` (see :class:`Change`); empty when the two
    show the same console. Pages are matched by pattern; on each, controls by where they are
    and where they lead (a new label there is ``renamed``), form fields by name, forms by what
    they post to. A renamed navigation entry is reported once, on the first page that shows
    it."""
    out: list[Change] = []
    pa, pb = {p.pattern: p for p in a.pages}, {p.pattern: p for p in b.pages}
    for pattern in sorted(pa.keys() - pb.keys()):
        out.append(Change("removed", pattern, "page", pa[pattern].title, ""))
    for pattern in sorted(pb.keys() - pa.keys()):
        out.append(Change("added", pattern, "page", "", pb[pattern].title))
    for pattern in sorted(pa.keys() & pb.keys()):
        out += _page_diff(pa[pattern], pb[pattern])
    seen: set[tuple[str, str, str, str]] = set()
    unique = []
    for c in out:
        key = (c.kind, c.what, c.old, c.new)
        if c.what in ("menu", "nav") and key in seen:
            continue
        seen.add(key)
        unique.append(c)
    return unique


def _page_diff(a: PageEntry, b: PageEntry) -> list[Change]:
    out: list[Change] = []
    page = a.pattern
    if a.title != b.title:
        out.append(Change("renamed", page, "title", a.title, b.title))
    if a.menu_path != b.menu_path:
        kind = "renamed" if a.menu_path and b.menu_path else ("added" if b.menu_path
                                                              else "removed")
        out.append(Change(kind, page, "menu", " > ".join(a.menu_path), " > ".join(b.menu_path)))
    out += _labels(page, "tab", a.tabs, b.tabs)
    out += _labels(page, "column", a.columns, b.columns)
    out += _controls(page, a, b)
    out += _forms(page, a.forms, b.forms)
    return out


def _labels(page: str, what: str, a: Sequence[str], b: Sequence[str]) -> list[Change]:
    """Ordered labels (tabs, columns, options): same count and one differs in place ->
    renamed; otherwise added / removed."""
    if list(a) == list(b):
        return []
    if len(a) == len(b):
        return [Change("renamed", page, what, x, y) for x, y in zip(a, b) if x != y]
    return [Change("removed", page, what, x, "") for x in a if x not in b] + \
        [Change("added", page, what, "", y) for y in b if y not in a]


def _resolved(page: PageEntry, c: Control) -> tuple[str, str]:
    """(where, target) with dialogs named by what they post to instead of their title (a
    renamed opener retitles its dialog)."""
    posts = {}
    for d in page.controls:
        if d.where.kind is WhereKind.DIALOG and d.target.kind is TargetKind.POST:
            posts.setdefault(d.where.name, d.target)
    where, target = str(c.where), str(c.target)
    if c.where.kind is WhereKind.DIALOG and c.where.name in posts:
        where = "dialog->" + posts[c.where.name]
    if c.target.kind is TargetKind.DIALOG and c.target.name in posts:
        target = "dialog->" + posts[c.target.name]
    return where, target


def _controls(page: str, a: PageEntry, b: PageEntry) -> list[Change]:
    out: list[Change] = []
    left = [(c, _resolved(a, c)) for c in a.controls]
    right = [(c, _resolved(b, c)) for c in b.controls]
    # 1. the same control (label, place, target): compare what it causes
    for c, r in list(left):
        match = next(((d, s) for d, s in right if d.role == c.role and d.label == c.label
                      and s == r), None)
        if match is not None:
            left.remove((c, r))
            right.remove(match)
            d = match[0]
            if c.action != d.action and c.action and d.action:
                out.append(Change("changed", page, "control", f"{c.label} causes {c.action}",
                                  f"{d.label} causes {d.action}"))
    # 2. same place and target, another label: renamed
    for c, r in list(left):
        if not r[1]:
            continue
        match = next(((d, s) for d, s in right if d.role == c.role and s == r), None)
        if match is not None:
            left.remove((c, r))
            right.remove(match)
            out.append(Change("renamed", page, "nav" if c.where == "nav" else "control",
                              c.label, match[0].label))
    # 2b. same target, in a renamed section or dialog (its title is a label too)
    for c, r in list(left):
        if not r[1]:
            continue
        kind = r[0].split(":")[0]
        match = [(d, s) for d, s in right if d.role == c.role and s[1] == r[1]
                 and s[0].split(":")[0] == kind]
        if len(match) == 1:
            left.remove((c, r))
            right.remove(match[0])
            if c.label != match[0][0].label:
                out.append(Change("renamed", page, "control", c.label, match[0][0].label))
    # 3. same label and place, another target: changed
    for c, r in list(left):
        match = next(((d, s) for d, s in right if d.role == c.role and d.label == c.label
                      and s[0] == r[0]), None)
        if match is not None:
            left.remove((c, r))
            right.remove(match)
            out.append(Change("changed", page, "control", f"{c.label} -> {c.target or '?'}",
                              f"{c.label} -> {match[0].target or '?'}"))
    # 4. what is left in one place, as many on both sides: renamed in order (a wizard's
    # buttons, which lead nowhere a crawl can name)
    for where in dict.fromkeys(r[0] for _, r in left if not r[1]):
        xs = [(c, r) for c, r in left if r[0] == where and not r[1]]
        ys = [(d, s) for d, s in right if s[0] == where and not s[1]]
        if len(xs) == len(ys) and all(c.role == d.role for (c, _), (d, _) in zip(xs, ys)):
            for x, y in zip(xs, ys):
                left.remove(x)
                right.remove(y)
                out.append(Change("renamed", page, "control", x[0].label, y[0].label))
    out += [Change("removed", page, "control", c.label, "") for c, _ in left]
    out += [Change("added", page, "control", "", d.label) for d, _ in right]
    return out


def _forms(page: str, a: Sequence[Form], b: Sequence[Form]) -> list[Change]:
    out: list[Change] = []
    right = list(b)
    for fa in a:
        fb = next((f for f in right if fa.post and f.post == fa.post), None) or \
            next((f for f in right if f.title == fa.title), None) or \
            (right[0] if len(a) == 1 and len(right) == 1 else None)
        if fb is None:
            out.append(Change("removed", page, "form", fa.title, ""))
            continue
        right.remove(fb)
        if fa.title != fb.title:
            out.append(Change("renamed", page, "form", fa.title, fb.title))
        for what in ("submit", "next", "cancel"):
            x = getattr(fa, "next_label" if what == "next" else what)
            y = getattr(fb, "next_label" if what == "next" else what)
            if x != y:
                kind = "renamed" if x and y else ("added" if y else "removed")
                out.append(Change(kind, page, what, x, y))
        if fa.action != fb.action and fa.action and fb.action:
            out.append(Change("changed", page, "form", f"{fa.title} causes {fa.action}",
                              f"{fb.title} causes {fb.action}"))
        out += _labels(page, "step", fa.steps, fb.steps)
        out += _fields(page, fa.fields, fb.fields)
    out += [Change("added", page, "form", "", f.title) for f in right]
    return out


def _fields(page: str, a: Sequence[FormField], b: Sequence[FormField]) -> list[Change]:
    out: list[Change] = []
    by_name = {f.name: f for f in b}
    for fa in a:
        fb = by_name.pop(fa.name, None)
        if fb is None:
            out.append(Change("removed", page, "field", fa.label, ""))
            continue
        if fa.label != fb.label:
            out.append(Change("renamed", page, "field", fa.label, fb.label))
        for attr in ("kind", "required", "minimum", "maximum", "max_length", "pattern"):
            x, y = getattr(fa, attr), getattr(fb, attr)
            if x != y:
                out.append(Change("changed", page, "field", f"{fb.label} {attr}={x}",
                                  f"{fb.label} {attr}={y}"))
        opts = _labels(page, "option", fa.options, fb.options)
        out += [replace(c, what="option") for c in opts]
    out += [Change("added", page, "field", "", f.label) for f in by_name.values()]
    return out


# ---- CLI ---------------------------------------------------------------------------------------
def diff_main(argv: Sequence[str] | None = None) -> int:
    """``console-rl inventory diff A B [--json]``: exit 0 when the two crawls show the same
    console, 1 when they differ, 2 on bad input (like diff(1))."""
    top = argparse.ArgumentParser(prog="console-rl inventory",
                                  description="Compare crawls of the console (local files; "
                                              "no API, no token).")
    sub = top.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("diff", help="what changed from crawl A to crawl B")
    d.add_argument("a", metavar="A", help="an inventory file (the older crawl)")
    d.add_argument("b", metavar="B", help="an inventory file (the newer crawl)")
    d.add_argument("--json", action="store_true", help="print the changes as JSON")
    try:
        args = top.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 2
    try:
        a, b = load(args.a), load(args.b)
    except InventoryError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    changes = diff(a, b)
    if args.json:
        print(json.dumps({"a": {"file": args.a, "version": a.version, "drift": a.drift},
                          "b": {"file": args.b, "version": b.version, "drift": b.drift},
                          "changes": [to_json(c) for c in changes]}, indent=1))
    else:
        print(f"--- {args.a} ({a.console}, drift {a.drift or 'none'}, {a.version})")
        print(f"+++ {args.b} ({b.console}, drift {b.drift or 'none'}, {b.version})")
        for c in changes:
            print(str(c))
        counts = {k: sum(c.kind == k for c in changes) for k in CHANGE_KINDS}
        print(f"{len(changes)} change(s): " + ", ".join(f"{n} {k}" for k, n in counts.items()))
    return 1 if changes else 0


main = diff_main

__all__ = ["Change", "InventoryError", "load", "parse", "save", "version_of",
           "default_inventories", "diff", "diff_main", "pages_for_product", "page_by_menu",
           "controls_named", "target_page", "form_by_action", "INVENTORY_DIR", "console_labels",
           "labels_by_drift"]
