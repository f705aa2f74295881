"""What a job produced: its rollouts, the documentation-verification report (JSON and HTML)
and the artifacts (screenshots) its steps kept."""
# No "from __future__ import annotations": FastAPI reads the routes' annotations.

from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, JSONResponse

from consolerl.errors import ConfigError

from doccheck import DocsUnavailable
from ..auth import Principal
from ..blobs import BlobUnavailable
from ..report import build_report, render_html, screenshot_ids
from ..schema import Job, ResultPage, Rollout, RolloutSummary, spec_docs, spec_tasks
from .context import (ERRORS, NOT_FOUND, ApiContext, Context, Cursor, Detail, KeyPart, auth,
                      own_job)

router = APIRouter(prefix="/v1", responses=ERRORS)


@router.get("/jobs/{job_id}/results", response_model=ResultPage, tags=["results"],
            operation_id="job_results", responses=NOT_FOUND)
async def results(job_id: KeyPart, ctx: Context,
                  who: Annotated[Principal, Depends(auth("jobs:read"))],
                  verdict: Annotated[str | None, Query(
                      pattern="^(success|failure|infeasible|undetermined)$")] = None,
                  task_id: Annotated[str | None, Query(max_length=64)] = None,
                  after: Annotated[Cursor | None, Query()] = None,
                  limit: Annotated[int, Query(ge=1, le=500)] = 100) -> ResultPage:
    """The job's rollouts in task order, filtered by ``verdict`` and ``task_id``; ``after``:
    the ``last_id`` of the previous page."""
    await own_job(ctx, job_id, who)
    rows = [r for r in await ctx.store.rollouts(job_id)
            if (verdict is None or r.verdict == verdict)
            and (task_id is None or r.task_id == task_id)
            and (not after or r.id > after)]
    page = rows[:limit]
    return ResultPage(data=[RolloutSummary(
        id=r.id, task_id=r.task_id, sample=r.sample, state=r.state, verdict=r.verdict,
        reward=r.reward, end_reason=r.end_reason, attempts=len(r.attempts)) for r in page],
        has_more=len(rows) > limit, last_id=page[-1].id if page else None)


@router.get("/jobs/{job_id}/rollouts/{rollout_id}", response_model=Rollout, tags=["results"],
            operation_id="get_rollout", responses=NOT_FOUND)
async def rollout(job_id: KeyPart, rollout_id: KeyPart, ctx: Context,
                  who: Annotated[Principal, Depends(auth("jobs:read"))]) -> Rollout:
    """One rollout: its attempts, steps (action, element, page, error, screenshot
    artifact), verdict and deciding audit events."""
    await own_job(ctx, job_id, who)
    found = await ctx.store.get_rollout(job_id, rollout_id)
    if found is None:
        raise HTTPException(404, f"no rollout {rollout_id!r} in job {job_id}")
    return found


async def report_of(ctx: ApiContext, job_id: str, who: Principal) -> dict[str, Any]:
    return await _report(ctx, await own_job(ctx, job_id, who))


async def _report(ctx: ApiContext, job: Job) -> dict[str, Any]:
    spec = await ctx.store.job_spec(job.id)
    try:
        tasks = spec_tasks(spec, ctx.catalog)
    except (KeyError, ConfigError):      # a catalog task removed since: report by id
        tasks = {}
    static, procedures = spec_docs(spec)
    catalogue = {tid: t for tid, t in tasks.items() if tid not in static}
    if catalogue and ctx.docs is not None:
        try:
            service = await run_in_threadpool(ctx.docs)
            static = {**await run_in_threadpool(service.task_checks, catalogue), **static}
        except DocsUnavailable:
            pass                         # no inventory here: the runs alone decide
    return build_report(job, tasks, await ctx.store.rollouts(job.id), static, procedures)


async def report_page(ctx: ApiContext, job_id: str, who: Principal) -> str:
    """The HTML report with its screenshots embedded (read from the store as the job's team's
    artifacts: the page needs no credential to show them)."""
    job = await own_job(ctx, job_id, who)
    data = await _report(ctx, job)
    images: dict[str, tuple[str, bytes] | None] = {}
    for aid in screenshot_ids(data):
        try:
            images[aid] = await ctx.store.get_artifact(job.team, aid)   # None: expired
        except BlobUnavailable:
            pass                         # the page without it, rather than no page
    return render_html(data, images)


@router.get("/jobs/{job_id}/report", tags=["results"], operation_id="job_report", responses={
    **NOT_FOUND, 200: {"content": {"application/json": {"schema": {"type": "object"}},
                                   "text/html": {"schema": {"type": "string"}}},
                       "description": "the report (JSON; HTML with Accept: text/html)"}})
async def report(job_id: KeyPart, request: Request, ctx: Context,
                 who: Annotated[Principal, Depends(auth("jobs:read"))]) -> Response:
    """The documentation-verification report: per procedure its pass rate over K, a
    verdict (works, works_text_stale, broken, inconclusive) with its evidence, the steps
    with their static labels, and where a procedure that did not work stopped."""
    accept = request.headers.get("accept", "")
    if "text/html" in accept and "application/json" not in accept.split(",")[0]:
        return HTMLResponse(await report_page(ctx, job_id, who))
    return JSONResponse(await report_of(ctx, job_id, who))


@router.get("/jobs/{job_id}/report.html", tags=["results"], operation_id="job_report_html",
            responses={**NOT_FOUND, 200: {"content": {"text/html": {"schema": {
                "type": "string"}}}, "description": "the report as a page"}})
async def report_html(job_id: KeyPart, ctx: Context,
                      who: Annotated[Principal, Depends(auth("jobs:read"))]) -> HTMLResponse:
    """The report as one page, screenshots embedded."""
    return HTMLResponse(await report_page(ctx, job_id, who))


@router.get("/artifacts/{artifact_id}", tags=["results"], operation_id="get_artifact",
            responses={404: {"model": Detail}, 200: {
                "content": {"image/jpeg": {}, "image/png": {}},
                "description": "the artifact's bytes"}})
async def artifact(artifact_id: KeyPart, ctx: Context,
                   who: Annotated[Principal, Depends(auth("artifacts:read"))]) -> Response:
    found = await ctx.store.get_artifact(who.team, artifact_id)
    if found is None:
        raise HTTPException(404, f"no artifact {artifact_id!r}")
    return Response(found[1], media_type=found[0],
                    headers={"Cache-Control": "private, max-age=86400"})
