"""What the product pages hand to the templates: columns, buttons, form fields, steps. The
templates turn them into accessible markup (labels, roles, names) and apply the session's drift
(renamed labels, More menus, typed confirmations, wizards)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

TRANSITIONAL = frozenset({"Pending", "Starting", "Stopping", "Creating", "Deleting"})
STATUS_TONE = {"Running": "ok", "Available": "ok", "Active": "ok", "Stopped": "off",
               "Pending": "busy", "Starting": "busy", "Stopping": "busy", "Creating": "busy"}


@dataclass(frozen=True)
class Column:
    key: str
    label: str
    kind: str = "text"          # text | status | link (row["_href"]) | id | mono
    sub: str = ""               # a second line under the value (row[sub]), e.g. the name


@dataclass(frozen=True)
class Button:
    """An action. ``href``: a link; ``post``: a form POST; a ``confirm`` message makes it open
    the confirmation dialog first. ``params`` go with the POST (a direct POST, one without a
    confirmation, carries at most one: it is the button's own name and value)."""

    label: str
    href: str = ""
    post: str = ""
    params: tuple[tuple[str, str], ...] = ()
    confirm: str = ""
    confirm_id: str = ""        # what the extra_confirm drift asks to be typed
    danger: bool = False
    primary: bool = False
    disabled: bool = False
    why_disabled: str = ""

    def __post_init__(self) -> None:
        if self.post and not self.confirm and len(self.params) > 1:
            raise ValueError(f"button {self.label!r}: a direct POST carries at most one param")


@dataclass(frozen=True)
class Option:
    value: str
    label: str
    data: tuple[tuple[str, str], ...] = ()     # data-* attributes (dependent selects filter on them)
    hint: str = ""


@dataclass(frozen=True)
class Field:
    """A form field named like the API parameter it becomes (errors map back by that name).
    ``api=False``: a console-only field (it filters other fields, it is not sent)."""

    name: str
    label: str
    kind: str = "text"          # text | textarea | select | radio | number | readonly
    required: bool = False
    help: str = ""
    placeholder: str = ""
    options: tuple[Option, ...] = ()
    default: str = ""
    api: bool = True
    filter_by: tuple[str, ...] = ()    # select options hide unless data-<f> matches field <f>
    columns: tuple[str, ...] = ()      # radio shown as a table: option hint columns


@dataclass(frozen=True)
class Step:
    title: str
    fields: tuple[Field, ...]


@dataclass
class FormSpec:
    title: str
    steps: list[Step]
    submit: str = "Create"
    cancel: str = ""
    intro: str = ""

    @property
    def fields(self) -> list[Field]:
        return [f for step in self.steps for f in step.fields]


@dataclass
class Section:
    """A block of a detail page: ``fields`` (label, value) pairs, or a table."""

    title: str
    fields: list[tuple[str, Any]] = field(default_factory=list)
    columns: list[Column] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    actions: list[Button] = field(default_factory=list)     # buttons above the table
    row_actions: Any = None                                  # row -> list[Button]
    empty: str = "No data"
    tab: str = ""                                            # sections sharing a tab group
