"""Pages of documentation in, checked procedures out (``POST /v1/docs``), and with ``run`` a
job that runs the drafted tasks, whose report merges the static check with the runs.

Answers: 200 with, per page, its procedures (steps with what each names, the static label,
the console's closest control and a detail; the drafted task or why there is none; the
static-only verdict) and a message for a page with none (a page without a procedure is not an
error, also when no page has one: the answer says so); 413 for a request over 16 MiB or a page
over 2 MiB; 422 naming the page for text that is binary or not UTF-8, a content type not
allowed (the message lists the allowed ones) or a drift profile with no inventory; 503 when
this server has no documentation reader or no inventory installed. ``run`` needs the
``jobs:write`` scope as well; the job is created as ``POST /v1/jobs`` creates one (quotas,
``Idempotency-Key``, the same store and scheduler), its spec keeping each procedure and its
static check for the report.
"""
# No "from __future__ import annotations": FastAPI reads the routes' annotations.

import functools
import threading
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, HTTPException
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field, field_validator

from doccheck import (CONTENT_TYPES, MAX_PAGES, DocsInputError, DocsUnavailable, PageIn,
                      PageResult, to_json)
from ..auth import Principal
from ..schema import ORACLE_MODEL, REPLAY_MODEL, Job, JobCreate, Sampling, TaskSelection, _Strict
from .context import ERRORS, Context, Detail, auth, unprocessable
from .jobs import ORACLE_INLINE, enqueue

router = APIRouter(prefix="/v1", responses=ERRORS)
MAX_SAMPLES = 16


def once(make: Callable[[], Any] | None) -> Callable[[], Any]:
    """``make`` called on the first use only (default: the committed inventories); a failure
    (:class:`DocsUnavailable`) is raised again on each use, not cached."""
    if make is None:
        from doccheck import DocsService
        make = DocsService.default
    lock, made = threading.Lock(), []

    @functools.wraps(make)
    def get() -> Any:
        with lock:
            if not made:
                made.append(make())
            return made[0]
    return get


class DocPage(_Strict):
    name: str = Field(min_length=1, max_length=200, description="a file name or URL, shown "
                                                                  "in the results")
    content: str = Field(description="the page's text (at most 2 MiB as UTF-8)")
    content_type: str = Field(default="text/markdown", max_length=100,
                              description=f"one of {', '.join(CONTENT_TYPES)}")

    @field_validator("content_type")
    @classmethod
    def _known(cls, value: str) -> str:
        if value.split(";")[0].strip().lower() not in CONTENT_TYPES:
            raise ValueError(f"{value[:60]!r} is not one of {', '.join(CONTENT_TYPES)}")
        return value


class DocsCheck(_Strict):
    pages: list[DocPage] = Field(min_length=1, max_length=MAX_PAGES)
    drift: str = Field(default="", max_length=64, description="the console profile to check "
                                                               "against ('' = as deployed)")
    run: bool = Field(default=False, description="also run the drafted tasks with the agent "
                                                 "(a job; needs jobs:write)")
    samples: int = Field(default=1, ge=1, le=MAX_SAMPLES, description="samples per procedure "
                                                                      "(K) when run")
    model: str = Field(default="live", min_length=1, max_length=100,
                       description="who runs the drafted tasks: 'live' or a registered model, "
                                   "or 'replay' (the steps as the static check resolved them, "
                                   "carried out literally; only procedures with a replay "
                                   "plan run); not 'oracle', which runs only catalogue tasks")
    sampling: Sampling = Field(default_factory=Sampling)


class MentionOut(BaseModel):
    kind: str
    text: str
    value: str = ""
    field: str = ""


class StepOut(BaseModel):
    number: str
    text: str
    mentions: list[MentionOut]
    label: str | None = None
    closest: str = ""
    score: float = 0.0
    detail: str = ""


class EvidenceOut(BaseModel):
    kind: str
    detail: str
    ref: str = ""


class VerdictOut(BaseModel):
    verdict: str
    evidence: list[EvidenceOut]
    passes: int = 0
    samples: int = 0


class ProcedureOut(BaseModel):
    title: str
    source: str
    anchor: str = ""
    extracted: bool
    steps: list[StepOut]
    verdict: VerdictOut
    task_id: str
    task: dict[str, Any] | None = None
    reason: str = ""
    drafted_by: str = ""


class PageOut(BaseModel):
    name: str
    procedures: list[ProcedureOut]
    message: str = ""
    elapsed_ms: float = 0.0


class DocsResult(BaseModel):
    object: str = "docs"
    drift: str
    pages: list[PageOut]
    message: str = ""
    job: Job | None = None


def page_out(page: PageResult) -> PageOut:
    procs = []
    for r in page.procedures:
        checks = {c.number: c for c in r.checks}
        steps = []
        for s in r.procedure.steps:
            c = checks.get(s.number)
            steps.append(StepOut(number=s.number, text=s.text,
                                 mentions=[MentionOut(**to_json(m)) for m in s.mentions],
                                 label=c.label if c else None, closest=c.closest if c else "",
                                 score=c.score if c else 0.0, detail=c.detail if c else ""))
        procs.append(ProcedureOut(
            title=r.title, source=r.source, anchor=r.procedure.anchor,
            extracted=r.procedure.extracted, steps=steps,
            verdict=VerdictOut(**to_json(r.verdict)), task_id=r.task_id, task=r.task,
            reason=r.reason, drafted_by=r.drafted_by))
    return PageOut(name=page.name, procedures=procs, message=page.message,
                   elapsed_ms=page.elapsed_ms)


@router.post("/docs", response_model=DocsResult, tags=["docs"], operation_id="check_docs",
             responses={413: {"model": Detail, "description": "a page over 2 MiB or a "
                                                              "request over 16 MiB"},
                        429: {"model": Detail, "description": "run: a quota is spent"},
                        503: {"model": Detail, "description": "no documentation reader or "
                                                              "inventory on this server"}})
async def check_docs(body: DocsCheck, ctx: Context,
                     who: Annotated[Principal, Depends(auth("jobs:read"))],
                     idempotency_key: Annotated[str | None, Header(max_length=255)] = None
                     ) -> DocsResult:
    """Check pages of documentation: per procedure its steps (what each names), the static
    check against the console's inventory (``ok``, ``label_differs``, ``missing``,
    ``unreachable``, ``ambiguous``, ``not_applicable``), the drafted task or why there is
    none, and the static-only verdict. With ``run``: a job of the drafted tasks, K samples
    each, whose report (``GET /v1/jobs/{id}/report``) merges the runs with the static check."""
    if body.run and not who.may("jobs:write"):
        raise HTTPException(403, "run: this token lacks the 'jobs:write' scope")
    if body.run and body.model not in ctx.models:
        raise unprocessable("model", f"{body.model!r} is not served; one of "
                                     f"{', '.join(ctx.models)}")
    if body.run and body.model == ORACLE_MODEL:          # the drafted tasks are inline
        raise unprocessable("model", ORACLE_INLINE)
    pages = [PageIn(p.name, p.content, p.content_type) for p in body.pages]
    try:
        service = await run_in_threadpool(ctx.docs)
        read = await run_in_threadpool(service.read, pages, body.drift)
    except DocsInputError as exc:
        if exc.status == 413:
            raise HTTPException(413, str(exc)) from None
        raise unprocessable(exc.where, str(exc)) from None
    except DocsUnavailable as exc:
        raise HTTPException(503, f"documentation checking is not available on this server: "
                                 f"{exc}") from None
    result = DocsResult(drift=body.drift, pages=[page_out(p) for p in read])
    found = [r for p in read for r in p.procedures]
    if not found:
        result.message = "no procedure found in any page"
    if body.run:
        runnable = [r for r in found if r.task is not None and (
            body.model != REPLAY_MODEL or (r.task.get("oracle") or {}).get("family") == "replay")]
        if not runnable:
            result.message = (result.message + "; " if result.message else "") + \
                "nothing to run: no procedure has a valid drafted task"
            return result
        request = JobCreate(tasks=TaskSelection(inline=[r.task for r in runnable]),
                            model=body.model, samples_per_task=body.samples,
                            sampling=body.sampling, metadata={"source": "docs"})
        spec = {"tasks": [{"inline": r.task} for r in runnable],
                "docs": {r.task["id"]: {"procedure": to_json(r.procedure),
                                     "checks": to_json(r.checks)} for r in runnable}}
        result.job = await enqueue(ctx, who, request, [r.task["id"] for r in runnable], spec,
                                   idempotency_key, hashed=body.model_dump(mode="json"))
    return result
