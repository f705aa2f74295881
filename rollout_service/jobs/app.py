"""The jobs API: a FastAPI application, versioned under ``/v1`` (OpenAPI at ``/openapi.json``).

It keeps nothing in memory that matters: jobs, results, events and artifacts are in Redis
(:class:`~.store.JobStore`) and the scheduler (:mod:`.scheduler`) runs the episodes, so the API
restarts without losing a job and serves from as many processes as wanted.

Auth: ``Authorization: Bearer <token>``; 401 without a valid token, 403 without the route's
scope, 404 (never 403) for another team's job or artifact. Quotas at submission: queued jobs,
samples per job and env-minutes per day answer 429 with ``Retry-After``; concurrent episodes
are enforced by the scheduler (the job waits).
"""
# No "from __future__ import annotations": FastAPI reads the routes' annotations, which name
# closures of build_app (the auth dependencies).

import asyncio
import json
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Header, HTTPException, Query, Request, Response
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge,
                               Histogram, generate_latest)
from pydantic import BaseModel
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from sse_starlette.sse import EventSourceResponse, ServerSentEvent

from consolerl.errors import ConfigError
from consolerl.tasks import Task, parse_task
from consolerl.text import ascii_digits
from infra.http_errors import install_validation_handler

from .auth import Principal, TokenBook
from .report import build_report, render_html
from .schema import (EVENT_TYPES, TERMINAL, Job, JobCreate, JobList, Quota, ResultPage, Rollout,
                     RolloutSummary, TaskInfo, TaskList, ValidationResult, spec_tasks)
from .store import JobStore, StoreConflict, body_hash

_ID = r"^[A-Za-z0-9_-]{1,64}$"


class Detail(BaseModel):
    detail: str


_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": Detail, "description": "the body is not parseable"},
    401: {"model": Detail, "description": "no valid bearer token"},
    403: {"model": Detail, "description": "the token lacks the route's scope"},
    503: {"model": Detail, "description": "the job store is unreachable; retry"},
}
_NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"model": Detail,
                                                     "description": "no such job (of yours)"}}


# One Server-Sent Event: ``data`` is a JSON object; ``id`` resumes the stream (Last-Event-ID).
_SSE_EVENT = {"type": "object", "required": ["event", "data", "id"], "properties": {
    "event": {"type": "string", "enum": list(EVENT_TYPES)},
    "data": {"type": "string", "contentMediaType": "application/json"},
    "id": {"type": "string", "pattern": r"^\d+-\d+$"}}}


class ApiMetrics:
    def __init__(self, registry: CollectorRegistry):
        self.requests = Counter("consolerl_api_requests_total", "API requests, by route and "
                                "status.", ["route", "method", "status"], registry=registry)
        self.latency = Histogram("consolerl_api_request_seconds", "API request latency, by "
                                 "route.", ["route", "method"], registry=registry,
                                 buckets=(.002, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 10))
        self.sse = Gauge("consolerl_api_sse_connections", "Open event streams.",
                         registry=registry)
        self.submitted = Counter("consolerl_api_jobs_submitted_total", "Jobs accepted, by "
                                 "team.", ["team"], registry=registry)
        self.rejected = Counter("consolerl_api_quota_rejections_total", "Submissions refused "
                                "by a quota, by quota.", ["quota"], registry=registry)


class _Measure:
    """Requests by route and status, and their latency (a plain ASGI middleware: Starlette's
    BaseHTTPMiddleware costs more than the endpoints here)."""

    def __init__(self, app, metrics: ApiMetrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        status = [500]

        async def sending(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)
        try:
            await self.app(scope, receive, sending)
        finally:
            path = getattr(scope.get("route"), "path", "unmatched")
            self.metrics.requests.labels(path, scope["method"], str(status[0])).inc()
            self.metrics.latency.labels(path, scope["method"]).observe(
                time.perf_counter() - t0)


def unprocessable(where: str, message: str) -> HTTPException:
    """A 422 shaped like FastAPI's own validation errors (one documented error body):
    ``loc`` names the field, ``msg`` says what is wrong."""
    loc = ["body", *where.replace("[", ".").replace("]", "").split(".")] if where else ["body"]
    return HTTPException(422, [{"loc": [int(p) if ascii_digits(p) else p for p in loc],
                                "msg": message, "type": "value_error"}])


def _midnight_s() -> int:
    now = time.time()
    return int(86400 - now % 86400) + 1


def build_app(store: JobStore, tokens: TokenBook, catalog: Mapping[str, Task], *,
              models: tuple[str, ...] = ("live",), registry: CollectorRegistry | None = None,
              extra_metrics: Callable[[], Awaitable[bytes]] | None = None,
              sse_max_s: float = 300.0, sse_ping_s: float = 15.0,
              scheduler_required: bool = True) -> FastAPI:
    """The API over ``store``; ``catalog``: the task suite by id; ``models``: the names a job
    may ask for; ``extra_metrics``: more Prometheus text for ``/metrics`` (the scheduler's);
    ``sse_max_s``: an event stream ends after this long (the client resumes with
    ``Last-Event-ID``)."""
    registry = registry if registry is not None else CollectorRegistry()
    metrics = ApiMetrics(registry)
    app = FastAPI(title="console-rl jobs API", version="1.0.0",
                  description="Run documented console procedures with a trained agent, K "
                              "samples each, and learn which still work and where they "
                              "break.")
    install_validation_handler(app)
    v1 = APIRouter(prefix="/v1", responses=_ERRORS)

    app.add_middleware(_Measure, metrics=metrics)

    @app.exception_handler(RedisConnectionError)
    @app.exception_handler(RedisTimeoutError)
    async def store_down(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"detail": "the job store is unreachable; retry shortly"},
                            status_code=503, headers={"Retry-After": "2"})

    bearer = HTTPBearer(auto_error=False, description="a team's token (crl_...)")

    def auth(scope: str) -> Callable[..., Principal]:
        async def check(credentials: Annotated[HTTPAuthorizationCredentials | None,
                                         Depends(bearer)] = None) -> Principal:
            token = credentials.credentials if credentials is not None else ""
            who = tokens.verify(token) if token else None
            if who is None:
                raise HTTPException(401, "a valid 'Authorization: Bearer <token>' header is "
                                         "required", headers={"WWW-Authenticate": "Bearer"})
            if not who.may(scope):
                raise HTTPException(403, f"this token lacks the {scope!r} scope")
            return who
        return check

    async def own_job(job_id: str, who: Principal) -> Job:
        job = await store.get_job(job_id) if re.fullmatch(_ID, job_id) else None
        if job is None or (job.team != who.team and not who.may("admin")):
            raise HTTPException(404, f"no job {job_id!r}")
        return job

    # ---- submission ---------------------------------------------------------------------------
    def resolve(request: JobCreate) -> tuple[list[str], list[dict[str, Any]]]:
        """The job's task ids and their spec entries; ConfigError naming the field."""
        sel = request.tasks
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
            ids = [t for t in catalog if re.search(sel.id_regex or "", t)]
            if not ids:
                raise ConfigError(f"tasks.id_regex: {sel.id_regex!r} matches no task id")
        return ids, [{"id": t} for t in ids]

    job_link = {"job_id": "$response.body#/id"}
    links = {name: {"operationId": op, "parameters": job_link} for name, op in (
        ("GetJob", "get_job"), ("CancelJob", "cancel_job"), ("JobResults", "job_results"),
        ("JobReport", "job_report"), ("JobEvents", "job_events"))}

    @v1.post("/jobs", status_code=202, response_model=Job, tags=["jobs"],
             operation_id="submit_job", responses={
                 202: {"description": "accepted", "links": links},
                 429: {"model": Detail, "description": "a quota is spent; see Retry-After"}})
    async def submit(request: JobCreate, response: Response,
                     who: Annotated[Principal, Depends(auth("jobs:write"))],
                     idempotency_key: Annotated[str | None, Header(max_length=255)] = None
                     ) -> Job:
        """Submit a job (202). The same ``Idempotency-Key`` with the same body returns the
        same job; with another body, 422."""
        if request.model not in models:
            raise unprocessable("model", f"{request.model!r} is not served; one of "
                                         f"{', '.join(models)}")
        try:
            ids, entries = resolve(request)
        except ConfigError as exc:
            where, _, what = str(exc).partition(": ")
            if not where.startswith("tasks"):
                where, what = "tasks", str(exc)
            raise unprocessable(where, what) from None
        quota = tokens.quota(who.team)
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
        body = request.model_dump(mode="json")
        idem = (idempotency_key, body_hash(body)) if idempotency_key else None
        if idem is None or not await store.idempotency_known(who.team, idem[0]):
            queued = sum(j.team == who.team and j.state == "queued"
                         for j in await store.active_jobs())
            if queued >= quota.queued_jobs:
                metrics.rejected.labels("queued_jobs").inc()
                raise HTTPException(429, f"your team has {queued} queued jobs, its quota",
                                    headers={"Retry-After": "30"})
        now = time.time()
        job = Job(id=await store.new_job_id(), team=who.team, state="queued", created_at=now,
                  expires_at=None if request.deadline_s is None else now + request.deadline_s,
                  model=request.model, samples_per_task=request.samples_per_task,
                  sampling=request.sampling, priority=request.priority, task_ids=ids,
                  metadata=request.metadata)
        try:
            job, created = await store.create_job(job, {"tasks": entries}, idem)
        except StoreConflict as exc:
            raise HTTPException(422, [{"loc": ["header", "Idempotency-Key"], "msg": str(exc),
                                       "type": "value_error"}]) from None
        if created:
            metrics.submitted.labels(who.team).inc()
            await store.add_event(job.id, "job.status", {"state": "queued", "error": None})
            await store.wake(job.id)
        response.headers["Location"] = f"/v1/jobs/{job.id}"
        return job

    # ---- reading jobs -------------------------------------------------------------------------
    @v1.get("/jobs", response_model=JobList, tags=["jobs"], operation_id="list_jobs")
    async def list_jobs(who: Annotated[Principal, Depends(auth("jobs:read"))],
                        after: Annotated[str | None, Query(max_length=64)] = None,
                        limit: Annotated[int, Query(ge=1, le=100)] = 20) -> JobList:
        """The team's jobs, newest first; ``after``: the ``last_id`` of the previous page."""
        jobs, more = await store.list_jobs(who.team, after, limit)
        return JobList(data=jobs, has_more=more, last_id=jobs[-1].id if jobs else None)

    @v1.get("/jobs/{job_id}", response_model=Job, tags=["jobs"], operation_id="get_job",
            responses=_NOT_FOUND)
    async def get_job(job_id: str, who: Annotated[Principal, Depends(auth("jobs:read"))]
                      ) -> Response:
        # The hot path of pollers: the stored JSON as it is (written from a Job), no
        # model round trip.
        raw = await store.job_json(job_id) if re.fullmatch(_ID, job_id) else None
        team = json.loads(raw)["team"] if raw is not None else None
        if raw is None or (team != who.team and not who.may("admin")):
            raise HTTPException(404, f"no job {job_id!r}")
        return Response(raw, media_type="application/json")

    @v1.post("/jobs/{job_id}/cancel", response_model=Job, tags=["jobs"], operation_id="cancel_job", responses=_NOT_FOUND)
    async def cancel(job_id: str, who: Annotated[Principal, Depends(auth("jobs:cancel"))]
                     ) -> Job:
        """Cancel (idempotent): a queued job ends at once; a running one stops its episodes
        between two steps (accounts released, resources destroyed), then ends."""
        await own_job(job_id, who)
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
            await store.add_event(job_id, "job.status", {"state": "cancelled", "error": None})
            await store.add_event(job_id, "job.completed", {
                "state": "cancelled", "episodes": job.episodes.model_dump(),
                "verdicts": job.verdicts.model_dump()})
        await store.wake(job_id)
        return job

    @v1.get("/jobs/{job_id}/events", tags=["jobs"], operation_id="job_events", responses={
        **_NOT_FOUND, 200: {"content": {"text/event-stream": {"schema": _SSE_EVENT}},
                            "description": "Server-Sent Events, each event as described"}})
    async def events(job_id: str, request: Request,
                     who: Annotated[Principal, Depends(auth("jobs:read"))],
                     last_event_id: Annotated[str | None, Header(max_length=64)] = None,
                     after: Annotated[str | None, Query(max_length=64)] = None
                     ) -> EventSourceResponse:
        """The job's events as Server-Sent Events (``job.status``, ``rollout.started``,
        ``rollout.step``, ``rollout.completed``, ``task.summary``, ``job.completed``), each
        with an ``id``: reconnect with ``Last-Event-ID`` (or ``?after=``) to miss nothing. The
        stream ends after ``job.completed``, or after a while (reconnect)."""
        await own_job(job_id, who)
        start = last_event_id or after or "0"
        if not re.fullmatch(r"[0-9]{1,20}(-[0-9]{1,20})?", start):
            raise HTTPException(422, [{"loc": ["header", "Last-Event-ID"], "type": "value_error",
                                       "msg": "must be an event id from this stream"}])

        async def stream():
            metrics.sse.inc()
            cursor, deadline = start, time.monotonic() + sse_max_s
            try:
                while time.monotonic() < deadline and not await request.is_disconnected():
                    wait = max(1, int(min(5.0, deadline - time.monotonic()) * 1000))
                    for eid, kind, data in await store.read_events(job_id, cursor, wait):
                        cursor = eid
                        yield ServerSentEvent(data=data, event=kind, id=eid)
                        if kind == "job.completed":
                            return
            finally:
                metrics.sse.dec()
        return EventSourceResponse(stream(), ping=sse_ping_s)

    @v1.get("/jobs/{job_id}/results", response_model=ResultPage, tags=["results"], operation_id="job_results",
            responses=_NOT_FOUND)
    async def results(job_id: str, who: Annotated[Principal, Depends(auth("jobs:read"))],
                      verdict: Annotated[str | None, Query(
                          pattern="^(success|failure|infeasible|undetermined)$")] = None,
                      task_id: Annotated[str | None, Query(max_length=64)] = None,
                      after: Annotated[str | None, Query(max_length=64)] = None,
                      limit: Annotated[int, Query(ge=1, le=500)] = 100) -> ResultPage:
        """The job's rollouts in task order, filtered by ``verdict`` and ``task_id``."""
        await own_job(job_id, who)
        rows = [r for r in await store.rollouts(job_id)
                if (verdict is None or r.verdict == verdict)
                and (task_id is None or r.task_id == task_id)
                and (after is None or r.id > after)]
        page = rows[:limit]
        return ResultPage(data=[RolloutSummary(
            id=r.id, task_id=r.task_id, sample=r.sample, state=r.state, verdict=r.verdict,
            reward=r.reward, end_reason=r.end_reason, attempts=len(r.attempts)) for r in page],
            has_more=len(rows) > limit, last_id=page[-1].id if page else None)

    @v1.get("/jobs/{job_id}/rollouts/{rollout_id}", response_model=Rollout, tags=["results"], operation_id="get_rollout",
            responses=_NOT_FOUND)
    async def rollout(job_id: str, rollout_id: str,
                      who: Annotated[Principal, Depends(auth("jobs:read"))]) -> Rollout:
        """One rollout: its attempts, steps (action, element, page, error, screenshot
        artifact), verdict and deciding audit events."""
        await own_job(job_id, who)
        found = await store.get_rollout(job_id, rollout_id[:64])
        if found is None:
            raise HTTPException(404, f"no rollout {rollout_id[:64]!r} in job {job_id}")
        return found

    async def report_of(job_id: str, who: Principal) -> dict[str, Any]:
        job = await own_job(job_id, who)
        try:
            tasks = spec_tasks(await store.job_spec(job.id), catalog)
        except (KeyError, ConfigError):      # a catalog task removed since: report by id
            tasks = {}
        return build_report(job, tasks, await store.rollouts(job_id))

    @v1.get("/jobs/{job_id}/report", tags=["results"], operation_id="job_report", responses={
        **_NOT_FOUND, 200: {"content": {"application/json": {"schema": {"type": "object"}},
                                        "text/html": {"schema": {"type": "string"}}},
                            "description": "the report (JSON; HTML with Accept: text/html)"}})
    async def report(job_id: str, request: Request,
                     who: Annotated[Principal, Depends(auth("jobs:read"))]) -> Response:
        """The documentation-verification report: per procedure its pass rate over K, a
        verdict (works, broken, flaky, inconclusive) and, when broken, where and why."""
        data = await report_of(job_id, who)
        accept = request.headers.get("accept", "")
        if "text/html" in accept and "application/json" not in accept.split(",")[0]:
            return HTMLResponse(render_html(data))
        return JSONResponse(data)

    @v1.get("/jobs/{job_id}/report.html", tags=["results"], operation_id="job_report_html",
            responses={**_NOT_FOUND, 200: {"content": {"text/html": {"schema": {
                "type": "string"}}}, "description": "the report as a page"}})
    async def report_html(job_id: str, who: Annotated[Principal, Depends(auth("jobs:read"))]
                          ) -> HTMLResponse:
        return HTMLResponse(render_html(await report_of(job_id, who)))

    @v1.get("/artifacts/{artifact_id}", tags=["results"], operation_id="get_artifact", responses={
        404: {"model": Detail}, 200: {"content": {"image/jpeg": {}, "image/png": {}},
                                      "description": "the artifact's bytes"}})
    async def artifact(artifact_id: str,
                       who: Annotated[Principal, Depends(auth("artifacts:read"))]) -> Response:
        found = await store.get_artifact(who.team, artifact_id[:64])
        if found is None:
            raise HTTPException(404, f"no artifact {artifact_id[:64]!r}")
        return Response(found[1], media_type=found[0],
                        headers={"Cache-Control": "private, max-age=86400"})

    # ---- catalog, quota, models ---------------------------------------------------------------
    @v1.get("/tasks", response_model=TaskList, tags=["tasks"], operation_id="list_tasks")
    async def list_tasks(who: Annotated[Principal, Depends(auth("jobs:read"))],
                         product: Annotated[str | None, Query(max_length=16)] = None,
                         split: Annotated[str | None, Query(max_length=16)] = None,
                         q: Annotated[str | None, Query(max_length=100)] = None) -> TaskList:
        """The task catalog, filtered by product, split and a text in the id or title."""
        needle = (q or "").lower()
        return TaskList(data=[TaskInfo(id=t.id, product=t.product, title=t.title,
                                       split=t.split, difficulty=t.difficulty,
                                       expected=t.expected, procedure=t.procedure)
                              for t in catalog.values()
                              if (product is None or t.product == product)
                              and (split is None or t.split == split)
                              and (needle in t.id or needle in t.title.lower())])

    class ValidateBody(BaseModel):
        tasks: list[dict[str, Any]]

    @v1.post("/tasks/validate", response_model=ValidationResult, tags=["tasks"], operation_id="validate_tasks")
    async def validate(body: ValidateBody,
                       who: Annotated[Principal, Depends(auth("jobs:read"))]
                       ) -> ValidationResult:
        """Validate task definitions exactly as task files are; each error names the task
        and the field."""
        errors, ids = [], []
        for i, data in enumerate(body.tasks[:100]):
            try:
                ids.append(parse_task(data, f"tasks[{i}]").id)
            except ConfigError as exc:
                errors.append(str(exc))
        return ValidationResult(valid=not errors and bool(body.tasks), task_ids=ids,
                                errors=errors or ([] if body.tasks else ["tasks: empty"]))

    @v1.get("/quota", response_model=Quota, tags=["account"], operation_id="get_quota")
    async def quota(who: Annotated[Principal, Depends(auth("jobs:read"))]) -> Quota:
        q = tokens.quota(who.team)
        active = [j for j in await store.active_jobs() if j.team == who.team]
        return Quota(team=who.team, concurrent_episodes=q.concurrent_episodes,
                     queued_jobs=q.queued_jobs, samples_per_job=q.samples_per_job,
                     env_minutes_per_day=q.env_minutes_per_day, used={
                         "queued_jobs": sum(j.state == "queued" for j in active),
                         "running_episodes": sum(j.episodes.running for j in active),
                         "env_minutes_today": round(await store.usage_today(who.team) / 60,
                                                    3)})

    class ModelList(BaseModel):
        object: str = "list"
        data: list[str]

    @v1.get("/models", response_model=ModelList, tags=["account"], operation_id="list_models")
    async def list_models(who: Annotated[Principal, Depends(auth("jobs:read"))]) -> ModelList:
        """The models a job may name: ``live`` and those the operator registered."""
        return ModelList(data=list(models))

    app.include_router(v1)

    # ---- operations ---------------------------------------------------------------------------
    @app.get("/healthz", tags=["ops"])
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", tags=["ops"], responses={503: {"model": Detail}})
    async def readyz() -> JSONResponse:
        try:
            await asyncio.wait_for(store.ping(), 2.0)
            alive = await store.scheduler_alive()
        except (RedisConnectionError, RedisTimeoutError, asyncio.TimeoutError):
            return JSONResponse({"detail": "the job store is unreachable"}, status_code=503)
        if scheduler_required and not alive:
            return JSONResponse({"detail": "no scheduler is running"}, status_code=503)
        return JSONResponse({"status": "ready"})

    @app.get("/metrics", tags=["ops"], response_class=Response)
    async def prometheus() -> Response:
        body = generate_latest(registry)
        if extra_metrics is not None:
            try:
                body += await asyncio.wait_for(extra_metrics(), 2.0)
            except Exception:            # the scheduler's metrics are optional here
                pass
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    return app


if __name__ == "__main__":
    # The OpenAPI document, as committed in rollout_service/jobs/openapi.json.
    import sys
    from pathlib import Path

    from consolerl.tasks import TASKS_DIR, load_suite

    document = build_app(JobStore("redis://127.0.0.1:1/0"),
                         TokenBook(Path("/nonexistent/tokens.json")),
                         {t.id: t for t in load_suite(TASKS_DIR)}).openapi()
    sys.stdout.write(json.dumps(document, indent=1, sort_keys=True) + "\n")
