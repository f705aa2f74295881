"""The documentation checker's data: what a crawl of the console found (:class:`Inventory`),
what a page of documentation says to do (:class:`Procedure`), the static check of one against
the other (:class:`StepCheck`) and a procedure's verdict (:class:`Verdict`).

Everything here is a frozen dataclass of strings, numbers and tuples, so it pickles across Ray
and round-trips through JSON (:func:`to_json` / the ``from_json`` class methods).

Page patterns are console paths with the parts that name a resource replaced by ``{}``:
``/console/ram/users/{}`` is any user's detail page, ``/console/ecs/instances/{}/rename`` any
instance's rename form. A control's ``target`` is where it leads:

- ``page:<pattern>``    a link or a navigation (menu entry, tab, row link, a button that is a link)
- ``dialog:<title>``    it opens a dialog on the same page (a confirmation, a More menu)
- ``post:<pattern>``    it sends a form (a direct action or a confirmed one)
- ``""``                unknown (the crawl did not follow it)

``action`` is the API action the control or form causes, as ``Service:Action``
(``Ram:CreateUser``), read from the audit log after the crawl made that request in a throwaway
account; empty when the crawl did not make it.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

INVENTORY_SCHEMA = 1


class StepLabel(StrEnum):
    """The static check's label of one step (its JSON is the value)."""
    OK = "ok"
    LABEL_DIFFERS = "label_differs"
    MISSING = "missing"
    UNREACHABLE = "unreachable"
    AMBIGUOUS = "ambiguous"
    NOT_APPLICABLE = "not_applicable"


class VerdictKind(StrEnum):
    """A procedure's verdict (its JSON is the value)."""
    WORKS = "works"
    WORKS_TEXT_STALE = "works_text_stale"
    BROKEN = "broken"
    INCONCLUSIVE = "inconclusive"


class EvidenceKind(StrEnum):
    """Where a piece of a verdict's evidence comes from: the static check, the audit log, an
    infeasibility claim the evidence channel confirmed, or the agent's runs."""
    STATIC = "static"
    AUDIT = "audit"
    INFEASIBILITY = "infeasibility"
    AGENT = "agent"


class MentionKind(StrEnum):
    """What a step names (see :class:`Mention`)."""
    MENU = "menu"
    PAGE = "page"
    CONTROL = "control"
    FIELD = "field"
    OPTION = "option"
    PRODUCT = "product"
    SECTION = "section"


STEP_LABELS = tuple(StepLabel)
# A step labelled one of these is a defect the static check found (label_differs is text that is
# stale, not a defect: the control is there under another name).
# not_applicable (an optional step the console has nothing for) is no defect.
DEFECT_LABELS = frozenset({StepLabel.MISSING, StepLabel.UNREACHABLE, StepLabel.AMBIGUOUS})
VERDICTS = tuple(VerdictKind)


# ---- the inventory --------------------------------------------------------------------------
class TargetKind(StrEnum):
    NONE = ""                   # unknown: the crawl did not follow it
    PAGE = "page"
    DIALOG = "dialog"
    POST = "post"


class WhereKind(StrEnum):
    NONE = ""
    NAV = "nav"
    TOOLBAR = "toolbar"
    ROW = "row"
    PAGE = "page"
    FORM = "form"
    SECTION = "section"
    DIALOG = "dialog"


class _Tagged(str):
    """A ``kind:name`` (or bare ``kind``) string read once into a typed ``kind`` and its
    ``name``. It is still the string the inventory files hold (it compares, hashes and
    serialises as that string), so files and dictionary keys are unchanged; code reads
    ``.kind`` and ``.name`` instead of cutting prefixes off."""

    __slots__ = ()
    KINDS: type[StrEnum]
    NAMED: frozenset[str]       # the kinds that carry a name after the colon

    def __new__(cls, text: str = "") -> _Tagged:
        kind, sep, _ = str(text).partition(":")
        if kind not in cls.KINDS.__members__.values() or bool(sep) != (kind in cls.NAMED):
            raise ValueError(f"{cls.__name__}: {text!r} is not one of "
                             + ", ".join(k + (":<name>" if k in cls.NAMED else "")
                                         for k in cls.KINDS if k))
        return super().__new__(cls, text)

    @classmethod
    def of(cls, kind: str, name: str = "") -> _Tagged:
        return cls(f"{kind}:{name}" if kind in cls.NAMED else kind)

    @property
    def kind(self) -> Any:
        return self.KINDS(self.partition(":")[0])

    @property
    def name(self) -> str:
        return self.partition(":")[2]


class Target(_Tagged):
    """Where a control leads: ``page:<pattern>``, ``dialog:<title>``, ``post:<pattern>`` or
    ``""`` (unknown); see the module docstring."""

    __slots__ = ()
    KINDS = TargetKind
    NAMED = frozenset({"page", "dialog", "post"})


class Where(_Tagged):
    """Where a control sits: ``nav``, ``toolbar``, ``row``, ``page``, ``form``,
    ``section:<title>`` or ``dialog:<title>`` (inside that dialog)."""

    __slots__ = ()
    KINDS = WhereKind
    NAMED = frozenset({"section", "dialog"})


@dataclass(frozen=True)
class Control:
    """Something a user can click: ``role`` button | link | tab | menuitem | navitem.
    ``target`` and ``where`` are typed on construction (a plain string is read into them)."""

    role: str
    label: str
    target: Target = Target()
    action: str = ""            # Service:Action it causes (post targets), from the audit log
    where: Where = Where()
    danger: bool = False
    sends: tuple[tuple[str, str], ...] = ()     # see Form.sends

    def __post_init__(self) -> None:
        if type(self.target) is not Target:
            object.__setattr__(self, "target", Target(self.target))
        if type(self.where) is not Where:
            object.__setattr__(self, "where", Where(self.where))

    def opens(self, dialog: Where) -> bool:
        """Whether this control opens the dialog a control sits in (``dialog``: its where)."""
        return (self.target.kind is TargetKind.DIALOG and dialog.kind is WhereKind.DIALOG
                and self.target.name == dialog.name)


@dataclass(frozen=True)
class FormField:
    """A form field: ``kind`` text | textarea | select | radio | checkbox | number | readonly.
    ``options`` are the visible labels of a select's or radio group's choices; ``values`` the
    values the form sends for them (same order; empty when the crawl did not record them): the
    API parameter values a drafted rule names (``Public Read`` is sent as ``public-read``)."""

    name: str
    label: str
    kind: str = "text"
    required: bool = False
    options: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    max_length: int | None = None
    pattern: str = ""
    step: str = ""              # the wizard step (its title) the field is on, "" when one page
    values: tuple[str, ...] = ()
    section: str = ""           # the titled group (fieldset legend) the field is in, if any
    help: str = ""              # the text the console shows under it ("3 to 63 characters: ...")


@dataclass(frozen=True)
class Form:
    """A form on a page: its title, fields, submit label (the last step's, for a wizard),
    the wizard's step titles and next-button label, and the API action its submit causes.
    ``sends``: the request parameters that submit carried (from the audit event's
    ``requestParameters``, sorted by name): a value the console always sends is kept as it was
    (``("PolicyType", "System")``); one that depends on the resource acted on, the region, or
    what the user enters or chooses is ``"{}"`` (``("UserName", "{}")``). Empty when the crawl
    did not make the request."""

    title: str
    fields: tuple[FormField, ...]
    submit: str
    action: str = ""            # Service:Action, from the audit log
    post: str = ""              # the pattern it posts to
    steps: tuple[str, ...] = ()
    next_label: str = ""
    cancel: str = ""
    sends: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class PageEntry:
    """One kind of console page. ``menu_path``: how the left navigation reaches it, from the
    product (``("RAM", "Users")``; with the drifted navigation ``("RAM", "Identities",
    "Users")``); empty for pages the navigation does not list (detail pages, forms)."""

    pattern: str
    title: str
    product: str = ""           # ecs | vpc | ram | oss | "" (home)
    menu_path: tuple[str, ...] = ()
    controls: tuple[Control, ...] = ()
    forms: tuple[Form, ...] = ()
    tabs: tuple[str, ...] = ()
    columns: tuple[str, ...] = ()        # table headers of a list page
    example: str = ""                    # one concrete path the crawl visited


@dataclass(frozen=True)
class Inventory:
    """One crawl of one console under one drift profile. ``version``: a hash of the pages
    (two crawls of an unchanged console have the same version)."""

    console: str                # a name for the console ("local", "aliyun-cn-hangzhou", ...)
    drift: str                  # the drift profile signed in with ("" = none)
    crawled_at: str             # ISO 8601, UTC
    version: str
    pages: tuple[PageEntry, ...]
    products: tuple[tuple[str, str], ...] = ()   # (key, title shown on the home page)
    schema: int = INVENTORY_SCHEMA
    crawl_s: float = 0.0        # how long the crawl took (not part of the version)

    def page(self, pattern: str) -> PageEntry | None:
        return next((p for p in self.pages if p.pattern == pattern), None)


# ---- documentation --------------------------------------------------------------------------
@dataclass(frozen=True)
class Mention:
    """A thing a step names. ``kind``:

    - ``menu``    a navigation path; ``text`` is its parts joined by `` > ``
    - ``page``    the page the step says it is on ("On the **Users** page")
    - ``control`` a button, link, tab or menu entry to click
    - ``field``   a form field; ``value`` is what to enter or choose ("" when the doc leaves it)
    - ``option``  a choice of a select or radio field ``field``; ``text`` the option
    - ``product`` the console the step opens ("Open the **RAM console**")
    - ``section`` the part of the page the step is in ("In the **Permissions** section")
    """

    kind: MentionKind
    text: str
    value: str = ""
    field: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", MentionKind(self.kind))


@dataclass(frozen=True)
class DocStep:
    """One step of a procedure: ``number`` like ``3`` or ``3.b`` for nested steps, the plain
    text, and the things it names. ``structured`` is False when the extractor could not find
    what the step asks for (prose it cannot read)."""

    number: str
    text: str
    mentions: tuple[Mention, ...] = ()
    structured: bool = True
    note: bool = False          # an informational step (a note, a result): nothing to do


@dataclass(frozen=True)
class Procedure:
    """One procedure of a page. ``source``: the page it came from; ``anchor``: the heading id;
    ``parameters``: field label -> value from the page's parameter tables; ``context``: the
    page's prose and table rows outside any procedure's steps, in the procedure's section or
    above it (what the page says of its example resources: "a VPC with the block ...")."""

    title: str
    source: str
    steps: tuple[DocStep, ...]
    anchor: str = ""
    product: str = ""
    prerequisites: tuple[str, ...] = ()
    parameters: tuple[tuple[str, str], ...] = ()
    tab: str = ""               # "Console" when it came from a Console/API tab group
    context: tuple[str, ...] = ()

    @property
    def extracted(self) -> bool:
        return bool(self.steps) and all(s.structured for s in self.steps)


# ---- results --------------------------------------------------------------------------------
@dataclass(frozen=True)
class StepCheck:
    """The static check of one step. ``label`` is one of :data:`STEP_LABELS`; ``mention`` the
    text that decided it; ``closest`` the console's control when the label differs (or the best
    near miss when missing) and ``score`` how close (0..1); ``page`` the pattern the step is on
    after it; ``detail`` one sentence a doc writer can act on. ``suspect``: a defect label the
    check is not sure of (the control is elsewhere, several match, or something close to it is
    here: a reworded label may be the same control), which a run that gets past the step
    clears; a defect label without it is sure (nothing near the named thing anywhere the steps
    reach, a value the console refuses, a product it lacks)."""

    number: str
    label: StepLabel
    mention: str = ""
    closest: str = ""
    score: float = 0.0
    page: str = ""
    detail: str = ""
    suspect: bool = False

    @property
    def defect(self) -> bool:
        """A defect label (:data:`DEFECT_LABELS`), sure or suspected."""
        return self.label in DEFECT_LABELS

    @property
    def sure_defect(self) -> bool:
        return self.label in DEFECT_LABELS and not self.suspect

    def __post_init__(self) -> None:
        object.__setattr__(self, "label", StepLabel(self.label))


@dataclass(frozen=True)
class Evidence:
    """Why a verdict is what it is: ``kind`` (:class:`EvidenceKind`) where it comes from;
    ``detail`` in words; ``ref`` a step number, an audit event name or a rollout id."""

    kind: EvidenceKind
    detail: str
    ref: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", EvidenceKind(self.kind))


@dataclass(frozen=True)
class Verdict:
    """A procedure's verdict (one of :data:`VERDICTS`) with its evidence."""

    verdict: VerdictKind
    evidence: tuple[Evidence, ...] = ()
    passes: int = 0
    samples: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "verdict", VerdictKind(self.verdict))


# ---- JSON -----------------------------------------------------------------------------------
def to_json(value: Any) -> Any:
    """A dataclass (nested) as plain JSON data: dataclasses to dicts, tuples to lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    if isinstance(value, StrEnum):
        return value.value
    if isinstance(value, _Tagged):
        return str.__str__(value)
    return value


def _build(cls: type, data: Any) -> Any:
    """The inverse of :func:`to_json` for this module's dataclasses (unknown keys refused)."""
    import typing
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown field(s) {', '.join(unknown)}")
    kwargs = {}
    for name, value in data.items():
        kwargs[name] = _coerce(hints[name], value)
    return cls(**kwargs)


def _coerce(hint: Any, value: Any) -> Any:
    import typing
    origin = typing.get_origin(hint)
    if dataclasses.is_dataclass(hint):
        return _build(hint, value)
    if origin is tuple:
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(args[0], v) for v in value)
        return tuple(_coerce(a, v) for a, v in zip(args, value))
    return value


def from_json(cls: type, data: Any) -> Any:
    """``from_json(Inventory, json.load(f))``; a ValueError names what did not fit."""
    if not isinstance(data, dict):
        raise ValueError(f"{cls.__name__}: expected an object, got {type(data).__name__}")
    return _build(cls, data)


def dumps(value: Any) -> str:
    return json.dumps(to_json(value), indent=1, sort_keys=False, ensure_ascii=False)


__all__ = ["INVENTORY_SCHEMA", "STEP_LABELS", "DEFECT_LABELS", "VERDICTS", "StepLabel",
           "VerdictKind", "EvidenceKind", "MentionKind", "Target", "TargetKind", "Where",
           "WhereKind", "Control",
           "FormField", "Form", "PageEntry", "Inventory", "Mention", "DocStep", "Procedure",
           "StepCheck", "Evidence", "Verdict", "to_json", "from_json", "dumps", "field"]
