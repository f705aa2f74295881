"""The static check: each step of a procedure resolved against the console's UI inventory, in
order, with no agent and no browser (milliseconds a page).

The check walks the procedure as a reader would. It keeps where the reader is (the page
patterns the previous steps lead to, the form that is open) and resolves each thing a step names
(:class:`~.model.Mention`) there:

- a product ("Log on to the **RAM console**") must be one of the console's products;
- a menu path ("choose **Identities** > **Users**") must end at a page whose left navigation
  path holds every part (the navigation is on every page of the product, so it is reachable
  from anywhere);
- a page ("On the **Users** page") must be where the reader is, or one menu click away;
- a control ("click **Create User**") must be on the current page (its toolbar, rows, sections
  or an open dialog); following it moves the reader to its target;
- a field must be in the open form, an option among the field's options, and a value within
  what the field takes (its range, length and pattern).

Each step gets the worst label of its mentions, from best to worst: ``ok``, ``label_differs``
(the control is there under another name: a close spelling, or a rename that an older crawl
of the same console records, see ``previous``), ``ambiguous`` (several controls of that name
lead to different places and the step does not say which), ``unreachable`` (it exists, but not
where the previous steps lead: a missing step or steps out of order), ``missing`` (nothing of
that name, nor close to it, in the console, or a value the field does not take, or a product
the console does not have), ``not_applicable`` (an optional or conditional step, "(Optional)
Add tags", "If you want to ...", that this console has nothing for: no defect, the reader
skips it).

A generic submit or confirm word ("click **OK**", "click **Confirm**",
:data:`GENERIC_SUBMIT`) names the open dialog's confirming button or the open form's submit
whatever it reads: ``label_differs``, not ``missing``.

A step that names nothing (a note, a result, prose the extractor could not structure) is ``ok``
with a detail saying so: the check has nothing to contradict, and the agent's runs decide.
"""
from __future__ import annotations

import copy
import dataclasses
import ipaddress
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from rapidfuzz import fuzz

from consolerl.text import norm

from .operations import RESOURCE_WORDS, title_misfit
from .model import (Control, DocStep, Form, FormField, Inventory, Mention, PageEntry,
                    Procedure, StepCheck, TargetKind, WhereKind)

CLOSE = 0.85            # a label this similar (0..1) to the console's is the same control, reworded
NEAR_MISS = 0.5         # below this the closest label is not worth naming
_RANK = {"ok": 0, "label_differs": 1, "ambiguous": 2, "unreachable": 3, "missing": 4,
         "not_applicable": 5}
_PRODUCT_WORDS = re.compile(r"\b(console|service|management)\b")
# What help-center pages call the button that submits a form or confirms a dialog, whatever
# the button reads: "click OK" on a form whose button is Create is the same click, reworded.
# A step a reader may skip: "(Optional) Add tags.", "If you want to ..., click ...".
_OPTIONAL = re.compile(r"^\W*(?:optional\b|if (?:you (?:want|need|would like|prefer)|needed|"
                       r"required|necessary|applicable)\b)|\(optional\)", re.IGNORECASE)
GENERIC_SUBMIT = frozenset({"ok", "confirm", "submit", "save", "create", "done", "apply",
                            "yes", "finish", "complete", "continue"})


# Console verbs that help centers and consoles use for one another ("New User" for Create
# User, "Release" for Delete, "Reboot" for Restart): a label that differs only by them is the
# same control reworded (0.9, label_differs), never preferred over the exact label. Spelling
# similarity (rapidfuzz) cannot see these; no package ships UI verb synonyms, and the nine
# groups below are the console's own vocabulary.
_SYNONYMS = {w: group[0] for group in (
    ("create", "add", "new"), ("delete", "release", "remove"), ("ok", "confirm"),
    ("modify", "edit", "change"), ("restart", "reboot"), ("stop", "shut down"),
    ("permissions", "policies", "policy"), ("username", "user name", "logon name"),
    ("search", "filter")) for w in group}
_SYNONYM_RE = re.compile(r"\b(" + "|".join(sorted(map(re.escape, _SYNONYMS), key=len,
                                                  reverse=True)) + r")\b")


def _canonical(text: str) -> str:
    return _SYNONYM_RE.sub(lambda m: _SYNONYMS[m[1]], text).rstrip("s")


def similarity(a: str, b: str) -> float:
    a, b = norm(a), norm(b)
    if a == b:
        return 1.0
    if a.rstrip("s") == b.rstrip("s"):          # User / Users
        return 0.97
    if _canonical(a) == _canonical(b):          # New User / Create User
        return 0.9
    return fuzz.ratio(a, b) / 100.0


@dataclass
class _Match:
    label: str                   # ok | label_differs | ...
    found: str = ""              # the console's label
    score: float = 0.0
    detail: str = ""
    control: Control | None = None
    page: PageEntry | None = None
    field: FormField | None = None
    form: Form | None = None     # the form whose submit or next button the step clicks


@dataclass(frozen=True)
class Resolved:
    """What one mention of a step resolved to: its label (as :class:`StepCheck` labels),
    the console's label (``found``), the control, page or form field it is (when one is), and
    the page pattern the reader is on after the step (``here``)."""

    mention: Mention
    label: str
    found: str = ""
    control: Control | None = None
    page: PageEntry | None = None
    field: FormField | None = None
    here: str = ""
    form: Form | None = None


@dataclass
class _Where:
    """Where the reader is: candidate pages, the product, the open form and dialog."""

    pages: list[PageEntry] = field(default_factory=list)
    product: str = ""
    form: Form | None = None
    dialog: str = ""
    lost: bool = False           # a control of an earlier step was not found
    step_text: str = ""          # the step being resolved, lower case
    tab: str = ""                # the tab of the page the reader opened ("" = the first)
    title: str = ""              # the procedure's title
    networks: tuple = ()         # the CIDR blocks the page gives its VPCs (page_networks)
    step: str = ""               # the wizard step the doc says the reader is on ("" unknown)
    before: str = ""             # the page a submit was made on (the console often returns)


class Checker:
    """The check of procedures against one inventory (and the renames older crawls record)."""

    def __init__(self, inventory: Inventory, previous: Sequence[Inventory] = ()):
        self.inv = inventory
        self.by_pattern = {p.pattern: p for p in inventory.pages}
        self.renames = known_renames(previous, inventory)

    # ---- labels -------------------------------------------------------------------------------
    def _compare(self, wanted: str, have: Iterable[str], fuzzy: bool = True
                 ) -> tuple[str, str, float]:
        """(label, the console's label, score) of the best of ``have`` for ``wanted``.
        ``fuzzy=False`` for names that are codes (policy names, option values): a close
        spelling of one is another thing, not the same one reworded."""
        best, score = "", 0.0
        for h in have:
            s = similarity(wanted, h)
            if s > score:
                best, score = h, s
        if score >= 0.97:               # the same words (or singular for plural)
            return "ok", best, score
        renamed = self.renames.get(norm(wanted))
        if renamed is not None:
            for h in have:
                if norm(h) == renamed:
                    return "label_differs", h, similarity(wanted, h)
        if score >= CLOSE and fuzzy and re.findall(r"\d+", norm(wanted)) == re.findall(
                r"\d+", norm(best)):       # IPv6 is not IPv4 reworded
            return "label_differs", best, score
        return "missing", best if score >= NEAR_MISS else "", score

    # ---- resolution ---------------------------------------------------------------------------
    def _product(self, m: Mention, where: _Where) -> _Match:
        text = _PRODUCT_WORDS.sub(" ", norm(m.text)).strip()
        names = {}
        for key, title in self.inv.products:
            names[norm(key)] = key
            names[norm(title)] = key
        for p in self.inv.pages:
            if p.product and p.menu_path:
                names.setdefault(norm(p.menu_path[0]), p.product)
        key = names.get(text)
        if key is None:
            label, found, score = self._compare(text, names)
            if label != "missing":
                key = names[norm(found)]
        if key is None:
            return _Match("missing", detail=f"the console has no product {m.text!r}")
        where.product = key
        where.pages = [p for p in self.inv.pages if p.product == key and p.menu_path][:1]
        where.form, where.dialog, where.lost = None, "", False
        return _Match("ok", key, 1.0, page=where.pages[0] if where.pages else None)

    def _menu(self, m: Mention, where: _Where) -> _Match:
        parts = [p.strip() for p in m.text.split(">") if p.strip()]
        if not parts:
            return _Match("ok")
        menus = [p for p in self.inv.pages if p.menu_path
                 and (not where.product or p.product == where.product)]
        if not menus:
            menus = [p for p in self.inv.pages if p.menu_path]
        best: _Match | None = None
        for page in menus:
            label, found, score = self._compare(parts[-1], [page.menu_path[-1]])
            if label == "missing":
                continue
            worst = label
            for part in parts[:-1]:          # the groups and the product name
                l2, _, _ = self._compare(part, page.menu_path[:-1] or [page.menu_path[-1]])
                worst = max(worst, l2 if l2 != "missing" else "label_differs", key=_RANK.get)
            cand = _Match(worst, " > ".join(page.menu_path), score, page=page)
            if best is None or _RANK[cand.label] < _RANK[best.label] or (
                    cand.label == best.label and cand.score > best.score):
                best = cand
        if best is None:
            everywhere = [p for p in self.inv.pages if p.menu_path]
            label, found, score = self._compare(parts[-1], [p.menu_path[-1] for p in everywhere])
            if label != "missing" and where.product:
                other = next(p for p in everywhere if p.menu_path[-1] == found)
                return _Match("unreachable", " > ".join(other.menu_path), score, page=other,
                              detail=f"{m.text!r} is in the {other.product} console, not "
                                     f"{where.product}")
            return _Match("missing", found, score,
                          detail=f"no navigation entry {m.text!r}"
                                 + (f"; closest: {found!r}" if found else ""))
        where.pages = [best.page] if best.page else where.pages
        where.form, where.dialog, where.lost = None, "", False
        if best.label == "label_differs":
            best.detail = f"the navigation reads {best.found!r}"
        return best

    def _page(self, m: Mention, where: _Where) -> _Match:
        if m.value == "detail" and not m.text:
            return self._detail(m, where)
        here = where.pages
        label, found, score = self._compare(m.text, [p.title for p in here])
        if label != "missing":
            return _Match(label, found, score, detail="" if label == "ok" else
                          f"the page is titled {found!r}")
        steps = [s for form in self._forms(where) for s in form.steps]
        label, found, score = self._compare(m.text, steps)
        if label != "missing":      # "On the Instance Type page": a step of the open wizard
            where.step = found
            return _Match(label, found, score, detail="" if label == "ok" else
                          f"the wizard's step is titled {found!r}")
        # One menu click away: "On the Users page" right after opening the console.
        scope = [p for p in self.inv.pages if p.menu_path
                 and (not where.product or p.product == where.product)]
        label, found, score = self._compare(m.text, [p.title for p in scope])
        if label != "missing":
            page = next(p for p in scope if p.title == found)
            where.pages, where.form, where.dialog, where.lost = [page], None, "", False
            return _Match(label, found, score, page=page, detail="" if label == "ok" else
                          f"the page is titled {found!r}")
        everywhere = [p for p in self.inv.pages if p.title]
        label, found, score = self._compare(m.text, [p.title for p in everywhere])
        if label != "missing":
            page = next(p for p in everywhere if p.title == found)
            return _Match("unreachable", found, score, page=page,
                          detail=f"the {found!r} page is not reachable from where the previous "
                                 "steps lead")
        return _Match("missing", found, score, detail=f"no page titled {m.text!r}")

    def _sections(self, page: PageEntry) -> set[str]:
        """The titled parts of a page the inventory knows of: where its controls sit and the
        groups of its forms' fields."""
        out = {c.where.split(":", 1)[1] for c in page.controls if c.where.startswith("section:")}
        return out | {f.section for form in page.forms for f in form.fields if f.section}

    def _section(self, m: Mention, where: _Where) -> _Match:
        here = {s for p in where.pages for s in self._sections(p)}
        label, found, score = self._compare(m.text, here)
        if label != "missing":
            return _Match(label, found, score, detail="" if label == "ok" else
                          f"the section is titled {found!r}")
        scope = [p for p in self.inv.pages if not where.product or p.product == where.product]
        on_details = bool(where.pages) and all(p.pattern.endswith("{}") for p in where.pages)
        for page in scope:
            label, found, score = self._compare(m.text, self._sections(page))
            if label == "ok" and on_details and page.pattern.endswith("{}"):
                # details pages share their layout ("Basic Information"), and the inventory
                # records a section only where a control or field sits in it
                return _Match("ok")
            if label == "ok" and not where.lost:
                return _Match("unreachable", found, score, page=page,
                              detail=f"the {found!r} section is on the {page.title!r} page "
                                     f"({page.pattern}), which the previous steps do not reach")
        # Sections without controls or fields are not in the inventory: nothing to say.
        return _Match("ok")

    def _detail(self, m: Mention, where: _Where) -> _Match:
        """"On the details page": a resource's page, or one a row link of this page opens."""
        if any(p.pattern.endswith("{}") for p in where.pages):
            return _Match("ok")
        return self._row_link(where)

    def _visible(self, page: PageEntry, dialog: str) -> list[Control]:
        """The controls a reader sees on ``page``: all but those inside a closed dialog."""
        return [c for c in page.controls
                if c.where.kind is not WhereKind.DIALOG or c.where.name == dialog or not dialog]

    def _control(self, m: Mention, where: _Where) -> _Match:
        if m.value == "region":
            return self._region(m)
        if m.value == "row-link" or not m.text:
            return self._row_link(where)
        here = [(p, c) for p in where.pages for c in self._visible(p, where.dialog)]
        if where.form is not None:       # a form's own buttons
            extra = [where.form.submit, where.form.next_label, where.form.cancel]
            label, found, score = self._compare(m.text, [x for x in extra if x])
            if label != "missing" and (label == "ok" or not here):
                form = where.form
                if norm(found) == norm(where.form.submit):
                    self._submitted(where)
                elif norm(found) == norm(form.next_label or "") and where.step in form.steps:
                    at = form.steps.index(where.step)
                    where.step = form.steps[min(at + 1, len(form.steps) - 1)]
                return _Match(label, found, score, form=form, detail="" if label == "ok" else
                              f"the form's button reads {found!r}")
        label, found, score = self._compare(m.text, [c.label for _, c in here])
        if label == "missing":
            # "Delete Bucket" for the bucket page's Delete: the console's label with the
            # resource it acts on named too
            words = _words(m.text)
            longer = {c.label for _, c in here
                      if _words(c.label) < words and words - _words(c.label) <= _RESOURCE_WORDS}
            if len(longer) == 1:
                found = longer.pop()
                label, score = "label_differs", similarity(m.text, found)
        if where.form is not None:
            submit_label, submit, s2 = self._compare(m.text, [where.form.submit])
            if _RANK[submit_label] < _RANK[label]:
                form = where.form
                self._submitted(where)
                return _Match(submit_label, submit, s2, form=form,
                              detail=f"the form's button reads {submit!r}")
        if label != "missing":
            hits = [(p, c) for p, c in here if c.label == found]
            hits = _in_tab(hits, where.tab)
            # Of several, the ones that do what the procedure's title says (a rule's Delete
            # in "Delete an inbound rule", not the security group's).
            fits = [(p, c) for p, c in hits if c.action and not title_misfit(where.title,
                                                                             c.action)]
            if fits and len(fits) < len(hits) and all(
                    c.action for _, c in hits):
                hits = fits
            # After a submit, of several: the one on the page it was made on (a policy's
            # removal returns to the user's page, whose Delete is the next step's)
            hits.sort(key=lambda h: h[0].pattern != where.before)
            targets = {c.target for _, c in hits if c.target}
            match = _Match(label, found, score, control=hits[0][1], page=hits[0][0],
                           detail="" if label == "ok" else f"the console's control reads "
                                                            f"{found!r}")
            if len(targets) > 1 and not where.lost \
                    and len({t.split(":", 1)[0] for t in targets}) > 1:
                match.label = "ambiguous" if label == "ok" else label
                match.detail = (f"{len(targets)} controls named {found!r} lead to different "
                                "places; the step does not say which")
            self._follow(hits[0][1], where)
            if hits[0][1].role == "tab":
                where.tab = hits[0][1].label
            return match
        if m.value == "tab":
            # "Click the Permissions tab" where the page shows a Permissions section
            slabel, sfound, sscore = self._compare(m.text, {s for p in where.pages
                                                            for s in self._sections(p)})
            if slabel != "missing":
                return _Match("label_differs", sfound, sscore,
                              detail=f"{sfound!r} is a section of the page, not a tab")
        generic = self._generic_submit(m, where, here)
        if generic is not None:
            return generic
        if where.form is not None:
            # On an open form a button the form lacks is missing here, whatever other page
            # has a button of that name (OK, Create and Cancel are everywhere).
            return _Match("missing", where.form.submit, similarity(m.text, where.form.submit),
                          detail=f"the {where.form.title!r} form has no {m.text!r} button; "
                                 f"it is submitted with {where.form.submit!r}")
        # Elsewhere in the console: a missing step, steps out of order, another product.
        everywhere = [(p, c) for p in self.inv.pages for c in p.controls]
        elabel, efound, escore = self._compare(m.text, [c.label for _, c in everywhere])
        if elabel == "ok" or (elabel == "label_differs" and escore > score):
            page, control = next((p, c) for p, c in everywhere if c.label == efound)
            where.pages = [page]
            self._follow(control, where)
            return _Match("unreachable", efound, escore, control=control, page=page,
                          detail=f"{efound!r} is on the {page.title!r} page "
                                 f"({page.pattern}), which the previous steps do not reach")
        return _Match("missing", found or (efound if escore >= NEAR_MISS else ""),
                      max(score, escore if escore >= NEAR_MISS else 0.0),
                      detail=f"no control named {m.text!r} where the step is"
                             + (f"; closest: {found!r}" if found else ""))

    def _generic_submit(self, m: Mention, where: _Where,
                        here: list[tuple[PageEntry, Control]]) -> _Match | None:
        """A generic submit or confirm word (:data:`GENERIC_SUBMIT`) for the button that does
        it under another name: the open dialog's confirming button, else the open form's
        submit. ``None`` when the word is not generic or nothing here submits."""
        if norm(m.text) not in GENERIC_SUBMIT:
            return None
        confirming = [(p, c) for p, c in here if c.where.kind is WhereKind.DIALOG
                      and norm(c.label) in GENERIC_SUBMIT
                      and (not where.dialog or c.where.name == where.dialog)]
        if confirming and (where.dialog or where.form is None):
            page, control = confirming[0]
            self._follow(control, where)
            return _Match("label_differs", control.label, similarity(m.text, control.label),
                          control=control, page=page,
                          detail=f"the dialog's button reads {control.label!r}")
        if where.form is not None and where.form.submit:
            submit, form = where.form.submit, where.form
            self._submitted(where)
            return _Match("label_differs", submit, similarity(m.text, submit), form=form,
                          detail=f"the form's button reads {submit!r}")
        return None

    def _region(self, m: Mention) -> _Match:
        """The top bar's region selector is the same on every page; the regions it offers are
        those of the console's Region fields."""
        if not m.text.strip():          # "select the region": whichever the reader needs
            return _Match("ok")
        regions = sorted({o for p in self.inv.pages for form in p.forms for f in form.fields
                          if norm(f.label) == "region" for o in f.options})
        if not regions:
            return _Match("ok", detail="the inventory records no region list")
        label, found, score = self._compare(m.text, regions, fuzzy=False)
        if label == "missing":
            return _Match("missing", found, score,
                          detail=f"the console offers no region {m.text!r}")
        return _Match(label, found, score)

    def _row_link(self, where: _Where) -> _Match:
        for page in where.pages:
            for c in page.controls:
                if c.where.kind is WhereKind.ROW and c.role == "link" \
                        and c.target.kind is TargetKind.PAGE:
                    self._follow(c, where)
                    return _Match("ok", c.label, 1.0, control=c, page=page)
        return _Match("unreachable", detail="the step opens a resource from a list, but the "
                      "previous steps do not lead to a list with links")

    def _follow(self, control: Control, where: _Where) -> None:
        kind, target = control.target.kind, control.target.name
        if kind is TargetKind.PAGE and target in self.by_pattern:
            where.pages, where.lost, where.tab = [self.by_pattern[target]], False, ""
            forms = [f for f in where.pages[0].forms if f.post]    # not a search form
            where.form = forms[0] if len(forms) == 1 else None
            where.dialog = ""
        elif kind is TargetKind.DIALOG:
            where.dialog = target
        elif kind is TargetKind.POST:
            self._submitted(where)

    def _submitted(self, where: _Where) -> None:
        """After a submit the console shows a page the inventory does not record (the new
        resource's, the list's): the next step is looked for anywhere in the product."""
        if len(where.pages) == 1:
            where.before = where.pages[0].pattern
        where.pages = [p for p in self.inv.pages
                       if not where.product or p.product == where.product]
        where.form, where.dialog, where.lost, where.step = None, "", True, ""

    def _forms(self, where: _Where) -> list[Form]:
        if where.form is not None:
            return [where.form]
        return [f for p in where.pages for f in p.forms]

    def _field(self, m: Mention, where: _Where) -> _Match:
        if not m.text.strip():          # "enter x in the search box": no field is named
            return _Match("ok")
        forms = self._forms(where)
        fields = [f for form in forms for f in form.fields]
        label, found, score = self._compare(m.text, [f.label for f in fields])
        if label == "missing":
            # "the name" for the form's only name field ("VPC Name"), "a new name": a generic
            # reference
            words = _words(m.text)
            generic = words - {"new"}
            holders = [f for f in fields if generic and generic <= _words(f.label)]
            # "User Logon Name" on the Create User form: the console's label with the form's
            # resource named in it too
            titled = set().union(*(_words(form.title) for form in forms))
            longer = [f for f in fields
                      if _words(f.label) < words and words - _words(f.label) <= titled]
            if len(holders) == 1:
                label, found = "ok", holders[0].label
                score = similarity(m.text, found)
            elif len(holders) > 1 and where.lost:
                # Where the reader is is unknown (an earlier step flagged): several forms of
                # the product have such a field, so nothing says this one is missing.
                return _Match("ok")
            elif len(longer) == 1:
                return self._field_found(m, longer[0], "label_differs",
                                         similarity(m.text, longer[0].label), where, forms)
            elif "search" in where.step_text and any(
                    words and words <= _words(o) for form in forms if not form.post
                     for f in form.fields for o in f.options):
                # "enter the ID of the instance" in a search box that searches by Instance ID
                return _Match("ok")
        if label == "missing":
            elsewhere = [(p, form, f) for p in self.inv.pages for form in p.forms
                         for f in form.fields
                         if not where.product or p.product == where.product]
            elabel, efound, escore = self._compare(m.text, [f.label for _, _, f in elsewhere])
            if elabel == "ok" and not any(form.post for form in forms):
                page, form, _ = next(x for x in elsewhere if x[2].label == efound)
                where.pages, where.form = [page], form
                return _Match("unreachable", efound, escore, page=page,
                              detail=f"the field {efound!r} is in the {form.title!r} form, "
                                     "which the previous steps do not open")
            return _Match("missing", found, score,
                          detail=f"the form has no field {m.text!r}"
                                 + (f"; closest: {found!r}" if found else ""))
        return self._field_found(m, next(x for x in fields if x.label == found), label, score,
                                 where, forms)

    def _field_found(self, m: Mention, f: FormField, label: str, score: float, where: _Where,
                     forms: list[Form]) -> _Match:
        """``m`` names the field ``f`` (``label``: ok or label_differs): the form it is in is
        open now, and the documented value must be one ``f`` takes."""
        if where.form is None and len(forms) >= 1:
            where.form = next(form for form in forms if f in form.fields)
        if m.value:
            bad = _value_problem(f, m.value, where.networks)
            if bad:
                return _Match("missing", f.label, score, field=f, detail=bad)
        return _Match(label, f.label, score, field=f, detail="" if label == "ok" else
                      f"the field is labelled {f.label!r}")

    def _option(self, m: Mention, where: _Where) -> _Match:
        if not m.text.strip():          # "select a zone": whichever the reader needs
            return _Match("ok")
        forms = self._forms(where)
        fields = [f for form in forms for f in form.fields if f.options]
        if where.step and any(f.step == where.step for f in fields):
            # "On the Image page, select ...": a choice of that wizard step
            fields = [f for f in fields if f.step == where.step]
        if m.field:
            named = self._compare(m.field, [f.label for f in fields])
            if named[0] == "missing":      # the field itself is not here: say that
                return self._field(Mention("field", m.field, m.text), where)
            fields = [f for f in fields if f.label == named[1]]
        options = [o for f in fields for o in f.options]
        if not options:
            return _Match("unreachable" if not forms else "missing",
                          detail=f"no choice list with option {m.text!r} where the step is")
        named = [f for f in fields if norm(f.label) == norm(m.text)]
        if len(named) == 1:         # "select a Security Group": whichever the field offers
            return _Match("ok", named[0].label, 1.0, field=named[0])
        literal = [o for o in options if "{}" not in o]
        label_like = re.fullmatch(r"[A-Z][a-z]*(?:-[A-Z][a-z]*)+", m.text.strip())
        if len(literal) < len(options) and re.fullmatch(r"[\w.:/-]+", m.text.strip()) and \
                not label_like and \
                self._compare(m.text, literal, fuzzy=False)[0] == "missing":
            # a resource picker: any resource's name or id (not a label: "Pay-As-You-Go")
            return _Match("ok")
        options = literal or options
        label, found, score = self._compare(m.text, options, fuzzy=False)
        if label == "missing":
            return _Match("missing", found, score,
                          detail=f"no option {m.text!r}; the field offers "
                                 + ", ".join(repr(o) for o in options[:8]))
        holder = next((f for f in fields if found in f.options), None)
        return _Match(label, found, score, field=holder, detail="" if label == "ok" else
                      f"the option reads {found!r}")

    # ---- a procedure --------------------------------------------------------------------------
    def _resolve(self, step: DocStep, where: _Where) -> list[tuple[Mention, _Match]]:
        results: list[tuple[Mention, _Match]] = []
        where.step_text = step.text.lower()
        previous: Mention | None = None
        for m in step.mentions:
            if m.kind == "control" and m.value == "row-select" and m.field \
                    and where.form is not None:
                # "select a VPC" where a form with a VPC field is open: that field's choice
                as_field = Mention("field", m.field)
                match = self._field(as_field, where)
                if match.label in ("ok", "label_differs") and match.field is not None:
                    results.append((as_field, match))
                    previous = as_field
                    continue
            if m.kind == "menu" and ">" not in m.text:
                match = self._menu(m, where)
                if match.label == "missing":
                    # "In the navigation pane, click Buckets, and then click Create Bucket":
                    # the later click is the reached page's own control, no navigation entry
                    as_control = Mention("control", m.text)
                    trial = dataclasses.replace(where, pages=list(where.pages))
                    alt = self._control(as_control, trial)
                    if alt.label in ("ok", "label_differs"):
                        vars(where).update(vars(trial))     # where the click led
                        m, match = as_control, alt
                results.append((m, match))
                previous = m
                continue
            row_link = m.kind == "control" and m.value != "region" and (
                m.value == "row-link" or not m.text)
            if row_link and previous is not None and previous.kind == "control" and \
                    previous.value != "region" and (previous.value == "row-link"
                                                    or not previous.text):
                continue        # "Click the name of the bucket, b1": one click, said twice
            previous = m
            resolve = {"product": self._product, "menu": self._menu, "page": self._page,
                       "control": self._control, "field": self._field,
                       "option": self._option, "section": self._section}.get(m.kind)
            if resolve is not None:
                results.append((m, resolve(m, where)))
        return results

    def check(self, proc: Procedure) -> tuple[StepCheck, ...]:
        return tuple(c for c, _ in self.walk(proc))

    def walk(self, proc: Procedure) -> list[tuple[StepCheck, list[Resolved]]]:
        """The check of each step with what each of its mentions resolved to, in order (the
        replay, :mod:`.replay`, carries these out in a browser)."""
        where = _Where(product=proc.product, title=proc.title, networks=page_networks(proc))
        out: list[tuple[StepCheck, list[Resolved]]] = []
        pending: list[DocStep] = []     # steps flagged unreachable: perhaps only too early
        adrift = ""                     # an earlier step that lost the reader (its number)
        for step in proc.steps:
            results = self._resolve(step, where)
            if pending and results and _worst(results)[1].label in ("missing", "unreachable"):
                # Steps out of order: a reader who could not do an earlier step does it once
                # its place is reached. If that makes this step work, only the early step is
                # at fault.
                retry = copy.deepcopy(where)
                for early in pending:
                    self._resolve(early, retry)
                again = self._resolve(step, retry)
                if _RANK[_worst(again)[1].label] < _RANK[_worst(results)[1].label]:
                    where, results, pending = retry, again, []
            here = where.pages[0].pattern if where.pages else ""
            resolved = [Resolved(m, r.label, r.found, r.control, r.page, r.field, here, r.form)
                        for m, r in results]
            if not results:
                why = ("a note" if step.note else "names no control, field or page"
                       if step.structured else "could not be read into actions")
                out.append((StepCheck(step.number, "ok", page=here,
                                      detail=f"nothing to check: the step {why}"), []))
                continue
            mention, worst = _worst(results)
            if _OPTIONAL.search(step.text) and worst.label in ("missing", "unreachable"):
                # An optional or conditional step whose control this console does not have:
                # the reader skips it and goes on from where they are.
                out.append((StepCheck(step.number, "not_applicable",
                                      mention.text or mention.value, worst.found,
                                      round(worst.score, 3), here,
                                      "an optional step this console has nothing for: "
                                      + worst.detail), []))
                continue
            if adrift and worst.label == "unreachable" and worst.page is not None and \
                    where.product and worst.page.product != where.product:
                # Lost since an earlier step: a control only another product has says nothing
                # of this step's own text (the earlier step's fault is shown; a control or a
                # field nowhere in the product still is)
                out.append((StepCheck(step.number, "ok", mention.text or mention.value, "",
                                      0.0, here, f"not checked: the reader is lost since "
                                      f"step {adrift}"), []))
                continue
            if worst.label == "ok" and any(m.kind in ("menu", "page") for m, _ in results):
                adrift = ""             # back on a page the console has
            if any(r.label == "unreachable" for _, r in results):
                pending.append(step)
            lost = any(r.label == "unreachable" or r.label == "missing" and m.kind in
                       ("control", "menu", "page") for m, r in results)
            if lost:
                # Where the reader is now is unknown: the next steps are resolved anywhere in
                # the product rather than flagged for what this step already flagged.
                where.pages = [p for p in self.inv.pages
                               if not where.product or p.product == where.product]
                where.form, where.dialog, where.lost = None, "", True
                adrift = adrift or step.number
            out.append((StepCheck(step.number, worst.label, mention.text or mention.value,
                                  worst.found if worst.label != "ok" else "",
                                  round(worst.score, 3), here,
                                  "" if worst.label == "ok" else worst.detail,
                                  _suspect(mention, worst, where.product)), resolved))
        return out


_RESOURCE_NAME = re.compile(r"(?=[^A-Z ]*[-_.\d])[a-z0-9][a-z0-9._-]*")


def _suspect(mention: Mention, worst: _Match, product: str) -> bool:
    """Whether a defect label is only a suspicion (:attr:`StepCheck.suspect`): the control is
    elsewhere in the product the steps are in (``unreachable``: a step left out, steps out of
    order) or several match (``ambiguous``), or a control, navigation entry, page or field near
    it in name is where the step is (a near miss that is not the same words). A value the field
    refuses, an option it does not offer, a product or region the console lacks, a control only
    another product has, and a name with nothing near it are sure, except a "control" that reads
    like a resource's name (``web-01``: perhaps its link in a list)."""
    if worst.label == "ambiguous":
        return True
    if worst.label == "missing" and mention.kind == "control" and \
            _RESOURCE_NAME.fullmatch(mention.text):
        return True
    if worst.label == "unreachable":        # unless only another product has it
        return worst.page is None or not product or worst.page.product in ("", product)
    return (worst.label == "missing" and mention.kind in ("control", "menu", "page", "field")
            and bool(worst.found) and NEAR_MISS <= worst.score < 0.97
            and worst.field is None and mention.value != "region")


def _in_tab(hits: list[tuple[PageEntry, Control]], tab: str
            ) -> list[tuple[PageEntry, Control]]:
    """Of several controls of one name on a page with tabs, one per tab in the tabs' order
    (each tab's Add Rule), the one in the tab the reader opened."""
    if len(hits) < 2 or len({p.pattern for p, _ in hits}) != 1:
        return hits
    tabs = hits[0][0].tabs
    if len(hits) != len(tabs) or len({c.target for _, c in hits}) != len(hits):
        return hits
    at = tabs.index(tab) if tab in tabs else 0
    return [hits[at]] + hits[:at] + hits[at + 1:]


# The words documentation names the console's resources by ("bucket", "security group").
_RESOURCE_WORDS = frozenset(w for names in RESOURCE_WORDS.values() for n in names
                            for w in n.split())


def _words(text: str) -> set[str]:
    return set(norm(text).replace("(", " ").replace(")", " ").split())


def _worst(results: list[tuple[Mention, _Match]]) -> tuple[Mention, _Match]:
    return max(results, key=lambda r: _RANK[r[1].label])


def _value_problem(f: FormField, value: str, networks: Sequence = ()) -> str:
    """Why ``f`` does not take ``value`` ("" when it does). ``networks``: the VPC blocks the
    page gives (:func:`page_networks`)."""
    if f.options:
        if any("{}" in o for o in f.options) or "{" in value or value in ("on", "off"):
            return ""           # a switch turned on or off: whichever option that is
        if any(norm(value) == norm(o) or norm(value) in norm(o).split() for o in f.options):
            return ""
        return (f"{f.label!r} offers {', '.join(repr(o) for o in f.options[:8])}, "
                f"not {value!r}")
    if f.kind == "number" or f.minimum is not None or f.maximum is not None:
        number = re.match(r"^\s*(-?\d+(?:\.\d+)?)", value)
        if number:
            x = float(number.group(1))
            if f.minimum is not None and x < f.minimum or f.maximum is not None and x > f.maximum:
                lo = "" if f.minimum is None else f"{f.minimum:g}"
                hi = "" if f.maximum is None else f"{f.maximum:g}"
                return f"{f.label!r} takes {lo}..{hi}, not {value!r}"
    if f.max_length is not None and len(value) > f.max_length and "{" not in value:
        return f"{f.label!r} takes at most {f.max_length} characters"
    if f.help and "{" not in value and f.kind in ("text", "textarea"):
        return help_problem(f.label, f.help, value, networks)
    return ""


# The rules a console states under a text field ("3 to 63 characters: lowercase letters,
# digits and hyphens (-); starts and ends with a letter or digit."), read clause by clause.
_LENGTH = re.compile(r"\b(\d+) to (\d+) characters\b", re.IGNORECASE)
_AT_MOST = re.compile(r"\bat most (\d+) characters\b", re.IGNORECASE)
_CLASSES = {"lowercase letters": "a-z", "uppercase letters": "A-Z", "letters": "A-Za-z",
            "digits": "0-9", "spaces": " "}
_LISTED_CHAR = re.compile(r"\((\S)\)")
_STARTS = re.compile(r"\bstarts?(?: and ends?)? with an? (lowercase )?letter( or (?:a )?digit)?",
                     re.IGNORECASE)
_NOT_START = re.compile(r"cannot start with ((?:\S+(?: or )?)+)", re.IGNORECASE)
# ... and under a CIDR block field ("Inside the VPC's CIDR block, mask /16 to /29"; "10.0.0.0/8,
# 172.16.0.0/12, 192.168.0.0/16 or a subnet of them").
_CIDR = re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}/\d{1,2}\b")
_MASK = re.compile(r"\bmask (?:from )?/(\d+) to /(\d+)", re.IGNORECASE)
_SUBNET_OF = re.compile(r"\bor a subnet of (?:them|these|those)\b", re.IGNORECASE)
_INSIDE_VPC = re.compile(r"\binside the VPC's CIDR block\b", re.IGNORECASE)


def _network(text: str) -> ipaddress.IPv4Network | None:
    if not _CIDR.fullmatch(text.strip()):
        return None
    try:
        return ipaddress.IPv4Network(text.strip(), strict=False)
    except ValueError:
        return None


def page_networks(proc: Procedure) -> tuple[ipaddress.IPv4Network, ...]:
    """The CIDR blocks the page gives the VPCs it works with: a sentence of the
    prerequisites, the page's prose or tables (``Procedure.context``) or the steps that names
    a VPC and a block, and no vSwitch or subnet ("A VPC with the CIDR block 10.0.0.0/16 has
    been created", "select the VPC whose CIDR block is ...", a table row "VPC | vpc-a |
    10.0.0.0/16")."""
    out: list[ipaddress.IPv4Network] = []
    for text in (*proc.prerequisites, *proc.context, *(s.text for s in proc.steps)):
        for sentence in re.split(r"(?<=[.;!?])\s+", text):
            if re.search(r"\bVPCs?\b", sentence, re.IGNORECASE) and \
                    not re.search(r"vswitch|subnet", sentence, re.IGNORECASE):
                out += [n for m in _CIDR.findall(sentence) if (n := _network(m)) is not None]
    return tuple(dict.fromkeys(out))


def help_problem(label: str, help_text: str, value: str, networks: Sequence = ()) -> str:
    """Why ``value`` breaks a rule the field's help text states ("" when none does, or the
    help states none this reader knows): a length, the characters allowed, how it starts (and
    ends), a prefix it cannot have; for a CIDR block its mask, the ranges it must lie in and,
    for a block inside its VPC's, the VPC blocks the page gives (``networks``, when it gives
    any)."""
    net = _network(value)
    for clause in re.split(r"[.;](?:\s|$)", help_text):
        clause = clause.strip()
        low = clause.lower()
        if net is not None:
            if (m := _MASK.search(clause)) and \
                    not int(m.group(1)) <= net.prefixlen <= int(m.group(2)):
                return (f"{label!r} takes a mask from /{m.group(1)} to /{m.group(2)}, not "
                        f"{value!r} (the console says: {clause})")
            ranges = [n for c in _CIDR.findall(clause) if (n := _network(c)) is not None]
            if _SUBNET_OF.search(clause) and ranges and \
                    not any(net.subnet_of(r) for r in ranges):
                return f"{label!r}: {value!r} breaks the console's rule: {clause}"
            if _INSIDE_VPC.search(clause) and networks and \
                    not any(net.subnet_of(n) for n in networks):
                return (f"{label!r}: {value!r} is not inside the VPC's block the page gives "
                        f"({', '.join(str(n) for n in networks)}); the console says: {clause}")
            continue
        if m := _LENGTH.search(clause):
            lo, hi = int(m.group(1)), int(m.group(2))
            if not lo <= len(value) <= hi:
                return f"{label!r} takes {lo} to {hi} characters (the console says: {clause})"
        elif m := _AT_MOST.search(clause):
            if len(value) > int(m.group(1)):
                return f"{label!r} takes at most {m.group(1)} characters"
        listing = re.split(r":\s", low, maxsplit=1)[-1]
        if "digits" in listing and "letters" in listing:
            allowed = "".join(r for name, r in _CLASSES.items()
                              if re.search(rf"(?<!lowercase )(?<!uppercase ){name}", listing))
            allowed += "".join(re.escape(c) for c in _LISTED_CHAR.findall(clause))
            bad = sorted(set(re.sub(f"[{allowed}]", "", value)))
            if bad:
                return (f"{label!r} does not take {''.join(bad)!r} (the console says: "
                        f"{clause})")
        if m := _STARTS.search(clause):
            first = r"[a-z]" if m.group(1) else r"[A-Za-z]"
            pattern = first[:-1] + "0-9]" if m.group(2) else first
            ends = "end" in m.group(0).lower()
            if not re.match(pattern, value) or ends and not re.match(pattern, value[-1:]):
                return f"{label!r}: {value!r} breaks the console's rule: {clause}"
        if m := _NOT_START.search(clause):
            prefixes = [p for p in re.split(r"\s+or\s+", m.group(1)) if p]
            if any(value.lower().startswith(p.lower()) for p in prefixes):
                return f"{label!r}: {value!r} breaks the console's rule: {clause}"
    return ""


def _aligned_controls(old: Sequence[Control], new: Sequence[Control]) -> list[tuple[str, str]]:
    """Label pairs of the controls at the same place of a page in two crawls: the same role and
    region (a dialog's title may be renamed with its button), the same action when both record
    one, in the same order."""
    def place(c: Control) -> tuple[str, str]:
        return c.role, "dialog" if c.where.kind is WhereKind.DIALOG else c.where
    groups_old: dict[tuple[str, str], list[Control]] = {}
    groups_new: dict[tuple[str, str], list[Control]] = {}
    for c in old:
        groups_old.setdefault(place(c), []).append(c)
    for c in new:
        groups_new.setdefault(place(c), []).append(c)
    pairs = []
    for key, olds in groups_old.items():
        news = groups_new.get(key, [])
        if len(olds) != len(news):
            continue
        for a, b in zip(olds, news):
            if a.action and b.action and a.action != b.action:
                continue
            pairs.append((a.label, b.label))
    return pairs


def known_renames(previous: Sequence[Inventory], current: Inventory) -> dict[str, str]:
    """Old label -> current label (normalised), for controls, navigation entries, fields and
    page titles that older crawls show under another name at the same place: the same page,
    where and target for a control, the same page for a navigation entry or title, the same
    name for a field."""
    out: dict[str, str] = {}
    now = {p.pattern: p for p in current.pages}
    for old in previous:
        for page in old.pages:
            cur = now.get(page.pattern)
            if cur is None:
                continue
            pairs = [(page.title, cur.title)]
            if page.menu_path and cur.menu_path:
                pairs.append((page.menu_path[-1], cur.menu_path[-1]))
            pairs += _aligned_controls(page.controls, cur.controls)
            for form, cur_form in zip(page.forms, cur.forms):
                names = {f.name: f for f in cur_form.fields}
                pairs += [(f.label, names[f.name].label) for f in form.fields if f.name in names]
                pairs.append((form.submit, cur_form.submit))
                if form.next_label and cur_form.next_label:
                    pairs.append((form.next_label, cur_form.next_label))
                for f in form.fields:
                    g = names.get(f.name)
                    if g is not None and len(f.options) == len(g.options):
                        pairs += list(zip(f.options, g.options))
            for a, b in pairs:
                if a and b and norm(a) != norm(b):
                    out.setdefault(norm(a), norm(b))
    return out


def check_procedure(proc: Procedure, inventory: Inventory,
                    previous: Sequence[Inventory] = ()) -> tuple[StepCheck, ...]:
    """One :class:`StepCheck` per step of ``proc``, in order (see the module docstring)."""
    return Checker(inventory, previous).check(proc)
