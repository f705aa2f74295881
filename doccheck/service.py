"""The documentation checker behind one door: pages in, per procedure its steps, the static check
against the console's inventory, a drafted task (or why there is none) and the static-only
verdict. The jobs API (``POST /v1/docs``) and the command line (``console-rl docs check``) use
it; running the drafted tasks is the jobs API's (a job of inline tasks).

The reader, the checker and the drafter are injected (defaults: :func:`.extract.extract`,
:func:`.check.check_procedure`, :func:`.draft.draft_task`), so the service can be built and
tested with any of them replaced.

What a page may be is decided here, before any parser sees it, so every door answers the same:
at most :data:`MAX_PAGE_BYTES` (UTF-8), text (no NUL or other control characters, no lone
surrogates), one of :data:`CONTENT_TYPES`. HTML is parsed, never rendered: scripts and styles
are ignored and nothing is fetched (the extractor's contract).
"""
from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from consolerl.errors import ConfigError, ConsoleRLError

from . import inventory as inventory_files
from .check import check_procedure
from .draft import draft_task
from .extract import extract as extract_procedures
from .model import Inventory, Procedure, StepCheck, Verdict
from .prose import procedure_from_text
from .replay import attach_replay
from .verdict import procedure_verdict

MAX_PAGE_BYTES = 2 * 2 ** 20
MAX_PAGES = 20
# The content types a page may have, and the parser's name for each.
CONTENT_TYPES = {"text/markdown": "text/markdown", "markdown": "text/markdown",
                 "text/x-markdown": "text/markdown", "text/html": "text/html",
                 "html": "text/html"}
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0e-\x1f\x7f]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")

Extractor = Callable[..., list[Procedure]]
Checker = Callable[..., tuple[StepCheck, ...]]
Drafter = Callable[..., Any]


class DocsInputError(ConsoleRLError, ValueError):
    """A page the service will not read. ``page``: its index; ``field``: the page's field at
    fault (``content``, ``content_type``, ``name``) or ``drift``; ``status``: 413 for a page
    too large, 422 otherwise."""

    def __init__(self, message: str, page: int | None = None, field: str = "content",
                 status: int = 422):
        self.page, self.field, self.status = page, field, status
        super().__init__(message)

    def __reduce__(self):
        return (type(self), (str(self), self.page, self.field, self.status))

    @property
    def where(self) -> str:
        return self.field if self.page is None else f"pages[{self.page}].{self.field}"


class DocsUnavailable(ConsoleRLError, RuntimeError):
    """A part the service needs (the reader, an inventory) is not installed in this build."""


@dataclass(frozen=True)
class PageIn:
    """A page of documentation: a ``name`` (a file name or URL, shown in results), its text
    (bytes are decoded as UTF-8, strictly) and its content type."""

    name: str
    content: str | bytes
    content_type: str = "text/markdown"


@dataclass(frozen=True)
class ProcedureResult:
    """One procedure of a page: what the reader extracted, the static check (one per step),
    the drafted task (data :func:`consolerl.tasks.parse_task` accepts, with ``task_id``) or
    ``reason`` why there is none, who drafted it, and the verdict of the static check alone
    (``broken`` with static evidence, or ``inconclusive`` until it runs)."""

    page: str
    procedure: Procedure
    checks: tuple[StepCheck, ...]
    task_id: str
    task: dict | None
    reason: str
    verdict: Verdict
    drafted_by: str = ""

    @property
    def title(self) -> str:
        return self.procedure.title

    @property
    def source(self) -> str:
        return self.procedure.source


@dataclass(frozen=True)
class PageResult:
    """A page's procedures, and a ``message`` when it has none."""

    name: str
    procedures: tuple[ProcedureResult, ...]
    message: str = ""
    elapsed_ms: float = 0.0


def page_text(page: PageIn, index: int) -> tuple[str, str]:
    """(text, content type) of a page, or :class:`DocsInputError` naming the page."""
    name = page.name[:80]
    kind = CONTENT_TYPES.get((page.content_type or "").split(";")[0].strip().lower())
    if kind is None:
        raise DocsInputError(f"page {name!r}: content type {page.content_type[:60]!r} is not "
                             f"one of {', '.join(CONTENT_TYPES)}", page=index,
                             field="content_type")
    data = page.content
    size = len(data) if isinstance(data, bytes) else len(data.encode("utf-8", "surrogatepass"))
    if size > MAX_PAGE_BYTES:
        raise DocsInputError(f"page {name!r} is {size} bytes; a page may have at most "
                             f"{MAX_PAGE_BYTES} ({MAX_PAGE_BYTES // 2 ** 20} MiB)", page=index,
                             status=413)
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DocsInputError(f"page {name!r} is not UTF-8 text (byte {exc.start} is not "
                                 "valid): send the page's text", page=index) from None
    if _SURROGATE.search(data):
        raise DocsInputError(f"page {name!r} is not valid Unicode text (a lone surrogate)",
                             page=index)
    bad = _CONTROL.search(data)
    if bad:
        raise DocsInputError(f"page {name!r} looks binary (control character "
                             f"U+{ord(bad.group()):04X} at character {bad.start()}): send "
                             "the page's text", page=index)
    return data.lstrip("\ufeff"), kind


def task_id_for(page: str, index: int, title: str) -> str:
    """A drafted task's id: ``doc-<title>-<hash of page and position>`` (3-64 of [a-z0-9-])."""
    slug = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")[:40].strip("-") or "procedure"
    digest = hashlib.sha256(f"{page}\n{index}".encode()).hexdigest()[:8]
    return f"doc-{slug}-{digest}"


@dataclass
class DocsService:
    """``inventories``: drift profile -> the console's inventory under it; ``previous``: drift
    profile -> older crawls of the same console (known renames); ``extractor``, ``checker``,
    ``drafter``: see the module docstring (None: the package's own, on first use; a missing
    drafter leaves every procedure without a task, saying so)."""

    inventories: Mapping[str, Inventory]
    previous: Mapping[str, Sequence[Inventory]] = field(default_factory=dict)
    extractor: Extractor | None = None
    checker: Checker | None = None
    drafter: Drafter | None = None

    @classmethod
    def from_files(cls, files: Mapping[str, str | Path], **kw: Any) -> DocsService:
        """Inventories read from files (drift profile -> path) with
        :func:`.inventory.load`."""
        return cls({drift: inventory_files.load(path) for drift, path in files.items()}, **kw)

    @classmethod
    def default(cls) -> DocsService:
        """The committed inventories (:func:`.inventory.default_inventories`), those that
        exist."""
        files = inventory_files.default_inventories()
        service = cls.from_files({d: p for d, p in files.items() if Path(p).is_file()})
        # A drifted console is the undrifted one, changed: the undrifted crawl is its history
        # (the renames it records make a changed label stale text, not a missing control).
        base = service.inventories.get("")
        if base is not None:
            service.previous = {d: (base,) for d in service.inventories if d}
        return service

    def task_checks(self, tasks: Mapping[str, Any]) -> dict[str, tuple[StepCheck, ...]]:
        """The static check of catalogue tasks' procedures (plain prose, read by
        :mod:`.prose`), for those whose drift profile has an inventory: a task on a console
        this server has not crawled gets none rather than a check against another console."""
        check = self.checker or check_procedure
        out = {}
        for tid, task in tasks.items():
            drift = getattr(task, "drift", "") or ""
            if drift not in self.inventories:
                continue
            proc = procedure_from_text(task.title, task.procedure, tid, task.product)
            out[tid] = tuple(check(proc, self.inventories[drift],
                                   tuple(self.previous.get(drift, ()))))
        return out

    def inventory(self, drift: str) -> Inventory:
        if not self.inventories:
            raise DocsUnavailable("no console inventory is installed: crawl one "
                                  "(python -m doccheck.crawl)")
        if drift not in self.inventories:
            known = ", ".join(repr(d) for d in sorted(self.inventories))
            raise DocsInputError(f"no inventory of the console under drift {drift[:40]!r}; "
                                 f"one of {known}", field="drift")
        return self.inventories[drift]

    def read(self, pages: Sequence[PageIn], drift: str = "") -> list[PageResult]:
        """Every page, checked (all pages are validated before any is read: one bad page
        refuses the request, naming it)."""
        if not 1 <= len(pages) <= MAX_PAGES:
            raise DocsInputError(f"give 1 to {MAX_PAGES} pages (got {len(pages)})",
                                 field="pages")
        inventory = self.inventory(drift)
        texts = [page_text(p, i) for i, p in enumerate(pages)]
        extract = self.extractor or extract_procedures
        out = []
        for i, (page, (text, kind)) in enumerate(zip(pages, texts)):
            t0 = time.perf_counter()
            try:
                procedures = list(extract(text, kind, source=page.name))
            except ValueError as exc:          # the reader's DocError (a ValueError)
                raise DocsInputError(f"page {page.name[:80]!r}: {exc}", page=i) from None
            results = tuple(self._one(page.name, i, n, proc, inventory, drift)
                            for n, proc in enumerate(procedures))
            message = "" if results else ("no procedure found (a procedure is a numbered "
                                          "list of steps, usually under a heading)")
            out.append(PageResult(page.name, results, message,
                                  round((time.perf_counter() - t0) * 1000, 1)))
        return out

    def analyse(self, pages: Sequence[PageIn], drift: str = "") -> list[ProcedureResult]:
        """Every procedure of every page, in order (see :meth:`read`)."""
        return [r for page in self.read(pages, drift) for r in page.procedures]

    def _one(self, page: str, page_index: int, index: int, proc: Procedure,
             inventory: Inventory, drift: str) -> ProcedureResult:
        check = self.checker or check_procedure
        checks = tuple(check(proc, inventory, tuple(self.previous.get(drift, ()))))
        task_id = task_id_for(f"{page_index}:{page}", index, proc.title)
        task, reason, by = self._draft(proc, checks, inventory, task_id, drift)
        return ProcedureResult(page, proc, checks, task_id, task, reason,
                               procedure_verdict(checks, (), samples=0), by)

    def _draft(self, proc: Procedure, checks: tuple[StepCheck, ...], inventory: Inventory,
               task_id: str, drift: str) -> tuple[dict | None, str, str]:
        draft = self.drafter or draft_task
        got = draft(proc, checks, inventory, task_id=task_id, drift=drift)
        if got.task is None:
            return None, got.reason or "the drafter gave no reason", got.source
        notes = [got.reason] if got.reason else []
        if "oracle" not in got.task:
            # The replay (model 'replay'): the steps as the static check resolved them.
            why = attach_replay(got.task, proc, inventory, tuple(self.previous.get(drift, ())))
            notes += [why] if why else []
        from consolerl.tasks import parse_task
        try:
            if got.task.get("id") != task_id:
                raise ConfigError(f"id: {got.task.get('id')!r} is not the id asked for")
            parse_task(got.task, f"drafted task {task_id}")
        except ConfigError as exc:     # a drafting error, never a doc defect
            return None, f"the drafted task is not valid (a drafting error): {exc}", \
                got.source
        return got.task, "; ".join(notes), got.source


__all__ = ["CONTENT_TYPES", "MAX_PAGES", "MAX_PAGE_BYTES", "DocsInputError", "DocsService",
           "DocsUnavailable", "PageIn", "PageResult", "ProcedureResult", "page_text",
           "task_id_for"]
