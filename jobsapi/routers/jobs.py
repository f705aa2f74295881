"""Submitting, listing, reading and cancelling jobs (``/v1/jobs``)."""
# No "from __future__ import annotations": FastAPI reads the routes' annotations.

import json
import re
import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, HTTPException, Query, Response
from fastapi.concurrency import run_in_threadpool

from consolerl.errors import ConfigError
from consolerl.patterns import PatternError, compile_pattern, search
from consolerl.tasks import parse_task

from datagen.oracle import why_no_oracle
from ..auth import Principal
from ..schema import (ORACLE_MODEL, REPLAY_MODEL, TERMINAL, Job, JobCompletedEvent, JobCreate, JobList,
                      JobStatusEvent)
from ..store import QueueFull, StoreConflict, body_hash
from .context import (ERRORS, NOT_FOUND, ApiContext, Context, Cursor, Detail, KeyPart, auth,
                      own_job, unprocessable)

router = APIRouter(prefix="/v1", responses=ERRORS)

_JOB_LINK = {"job_id": "$response.body#/id"}
_LINKS = {name: {"operationId": op, "parameters": _JOB_LINK} for name, op in (
    ("GetJob", "get_job"), ("CancelJob", "cancel_job"), ("JobResults", "job_results"),
    ("JobReport", "job_report"), ("JobEvents", "job_events"))}


# Why an inline task cannot run with the oracle (the 422's message, at ``model``).
ORACLE_INLINE = ("'oracle' runs only catalogue tasks: it follows a fixed script per catalogue "
                 "task, not a procedure's text, so it cannot check an inline task; use 'live' "
                 "or a registered model")


def _midnight_s() -> int:
    now = time.time()
    return int(86400 - now % 86400) + 1


def resolve(ctx: ApiContext, request: JobCreate) -> tuple[list[str], list[dict[str, Any]]]:
    """The job's task ids and their spec entries; ConfigError naming the field. (It parses
    task definitions and runs a user's pattern over the catalog: called off the event loop.)"""
    sel, catalog = request.tasks, ctx.catalog
    if sel.inline is not None:
        entries, ids = [], []
        for i, data in enumerate(sel.inline):
            task = parse_task(data, f"tasks.inline[{i}]")
            if task.id in ids:
                raise ConfigError(f"tasks.inline[{i}]: id {task.id!r} is given twice")
            ids.append(task.id)
            entries.append({"inline": data})
        return ids, entries
    if sel.ids is not None:
        for i, tid in enumerate(sel.ids):
            if tid not in catalog:
                raise ConfigError(f"tasks.ids[{i}]: no task {tid[:80]!r} in the catalog "
                                  "(GET /v1/tasks)")
        ids = list(dict.fromkeys(sel.ids))
    elif sel.split is not None:
        ids = [t for t in catalog if catalog[t].split == sel.split]
    else:
        pattern = compile_pattern(sel.id_regex or "", "tasks.id_regex")     # RE2: linear time
        ids = [t for t in catalog if search(pattern, t)]
        if not ids:
            raise ConfigError(f"tasks.id_regex: {sel.id_regex!r} matches no task id")
    return ids, [{"id": t} for t in ids]


@router.post("/jobs", status_code=202, response_model=Job, tags=["jobs"],
             operation_id="submit_job", responses={
                 202: {"description": "accepted", "links": _LINKS},
                 429: {"model": Detail, "description": "a quota is spent; see Retry-After"}})
async def submit(request: JobCreate, response: Response, ctx: Context,
                 who: Annotated[Principal, Depends(auth("jobs:write"))],
                 idempotency_key: Annotated[str | None, Header(max_length=255)] = None
                 ) -> Job:
    """Submit a job (202). The same ``Idempotency-Key`` with the same body returns the
    same job; with another body, 422."""
    if request.model not in ctx.models:
        raise unprocessable("model", f"{request.model!r} is not served; one of "
                                     f"{', '.join(ctx.models)}")
    if request.model == ORACLE_MODEL and request.tasks.inline is not None:
        raise unprocessable("model", ORACLE_INLINE)
    try:
        ids, entries = await run_in_threadpool(resolve, ctx, request)
    except (ConfigError, PatternError) as exc:
        where, _, what = str(exc).partition(": ")
        if not where.startswith("tasks"):
            where, what = "tasks", str(exc)
        # An inline task's "field 'start_page' ...": the loc ends with the field.
        named = re.match(r"field '([A-Za-z_][A-Za-z0-9_.]*)'", what)
        if named:
            where = f"{where}.{named.group(1)}"
        raise unprocessable(where, what) from None
    if request.model == REPLAY_MODEL:
        families = ([str((e["inline"].get("oracle") or {}).get("family", "")) for e in entries]
                    if request.tasks.inline is not None
                    else [ctx.catalog[t].oracle_family for t in ids])
        lacking = [t for t, f in zip(ids, families) if f != "replay"]
        if lacking:
            raise unprocessable("model", "'replay' runs only tasks that carry a replay plan "
                                "(oracle.family 'replay', as POST /v1/docs drafts them); "
                                f"none in {', '.join(lacking[:5])}")
    if request.model == ORACLE_MODEL:
        refused = [why for why in (why_no_oracle(ctx.catalog[t]) for t in ids) if why]
        if refused:
            raise unprocessable("model", "'oracle' has no script for every task: " +
                                "; ".join(refused[:5]))
    job = await enqueue(ctx, who, request, ids, {"tasks": entries}, idempotency_key)
    response.headers["Location"] = f"/v1/jobs/{job.id}"
    return job


async def enqueue(ctx: ApiContext, who: Principal, request: JobCreate, ids: list[str],
                  spec: dict[str, Any], idempotency_key: str | None,
                  hashed: dict[str, Any] | None = None) -> Job:
    """Create the job (quotas, idempotency, the ``queued`` event, the scheduler woken) from a
    resolved request: its task ids and stored ``spec`` (``tasks`` entries, and what else the
    report needs). ``hashed``: the body an ``Idempotency-Key`` is bound to (the request's
    own by default). HTTPException 429 for a spent quota, 422 for a reused key."""
    store, metrics = ctx.store, ctx.metrics
    quota = ctx.tokens.quota(who.team)
    samples = len(ids) * request.samples_per_task
    if samples > quota.samples_per_job:
        metrics.rejected.labels("samples_per_job").inc()
        raise HTTPException(429, f"the job has {samples} samples; your team may ask for "
                                 f"at most {quota.samples_per_job} per job",
                            headers={"Retry-After": "3600"})
    if await store.usage_today(who.team) >= quota.env_minutes_per_day * 60:
        metrics.rejected.labels("env_minutes_per_day").inc()
        raise HTTPException(429, f"your team used its {quota.env_minutes_per_day:g} "
                                 "env-minutes today (UTC)",
                            headers={"Retry-After": str(_midnight_s())})
    body = hashed if hashed is not None else request.model_dump(mode="json")
    idem = (idempotency_key, body_hash(body)) if idempotency_key else None
    now = time.time()
    job = Job(id=await store.new_job_id(), team=who.team, state="queued", created_at=now,
              expires_at=None if request.deadline_s is None else now + request.deadline_s,
              model=request.model, samples_per_task=request.samples_per_task,
              sampling=request.sampling, priority=request.priority, task_ids=ids,
              metadata=request.metadata)
    try:
        # The team's queued jobs are counted from its index, in the transaction that
        # creates the job (a known Idempotency-Key returns its job whatever the count).
        job, created = await store.create_job(job, spec, idem, max_queued=quota.queued_jobs)
    except StoreConflict as exc:
        raise HTTPException(422, [{"loc": ["header", "Idempotency-Key"], "msg": str(exc),
                                   "type": "value_error"}]) from None
    except QueueFull as exc:
        metrics.rejected.labels("queued_jobs").inc()
        raise HTTPException(429, str(exc), headers={"Retry-After": "30"}) from None
    if created:
        metrics.submitted.labels(who.team).inc()
        await store.add_event(job.id, JobStatusEvent(state="queued"))
        await store.wake(job.id)
    return job


@router.get("/jobs", response_model=JobList, tags=["jobs"], operation_id="list_jobs")
async def list_jobs(ctx: Context, who: Annotated[Principal, Depends(auth("jobs:read"))],
                    after: Annotated[Cursor | None, Query()] = None,
                    limit: Annotated[int, Query(ge=1, le=100)] = 20) -> JobList:
    """The team's jobs, newest first; ``after``: the ``last_id`` of the previous page."""
    jobs, more = await ctx.store.list_jobs(who.team, after, limit)
    return JobList(data=jobs, has_more=more, last_id=jobs[-1].id if jobs else None)


@router.get("/jobs/{job_id}", response_model=Job, tags=["jobs"], operation_id="get_job",
            responses=NOT_FOUND)
async def get_job(job_id: KeyPart, ctx: Context,
                  who: Annotated[Principal, Depends(auth("jobs:read"))]) -> Response:
    # The hot path of pollers: the stored JSON as it is (written from a Job), no
    # model round trip.
    raw = await ctx.store.job_json(job_id)
    team = json.loads(raw)["team"] if raw is not None else None
    if raw is None or (team != who.team and not who.may("admin")):
        raise HTTPException(404, f"no job {job_id!r}")
    return Response(raw, media_type="application/json")


@router.post("/jobs/{job_id}/cancel", response_model=Job, tags=["jobs"],
             operation_id="cancel_job", responses=NOT_FOUND)
async def cancel(job_id: KeyPart, ctx: Context,
                 who: Annotated[Principal, Depends(auth("jobs:cancel"))]) -> Job:
    """Cancel (idempotent): a queued job ends at once; a running one stops its episodes
    between two steps (accounts released, resources destroyed), then ends."""
    store = ctx.store
    await own_job(ctx, job_id, who)
    now = time.time()

    def change(job: Job) -> Job | None:
        if job.state in TERMINAL or job.cancel_requested and job.state != "queued":
            return None
        if job.state == "queued":
            return job.model_copy(update={"state": "cancelled", "cancel_requested": True,
                                          "finished_at": now})
        return job.model_copy(update={"cancel_requested": True})
    before = await store.get_job(job_id)
    job = await store.update_job(job_id, change)
    if job is None:
        raise HTTPException(404, f"no job {job_id!r}")
    if before is not None and before.state == "queued" and job.state == "cancelled":
        await store.add_event(job_id, JobStatusEvent(state="cancelled"))
        await store.add_event(job_id, JobCompletedEvent(
            state="cancelled", episodes=job.episodes, verdicts=job.verdicts))
    await store.wake(job_id)
    return job
