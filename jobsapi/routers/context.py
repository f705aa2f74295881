"""What the jobs API's routers share: one :class:`ApiContext` per app (``app.state``), the
FastAPI dependencies that hand it out and check a bearer token's scope, the documented
error bodies, and the types of the parameters that reach Redis (each checked against Redis'
domain before the route runs: a 422 whose ``loc`` names the parameter)."""
# No "from __future__ import annotations": FastAPI reads the dependencies' annotations.

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from pydantic import AfterValidator, BaseModel, WithJsonSchema

from consolerl.tasks import Task
from consolerl.text import ascii_digits

from ..auth import Principal, TokenBook
from ..schema import Job
from ..store import (KEY_PART, KEY_PART_MAX_CHARS, STREAM_ID, STREAM_ID_MAX_CHARS, U64_MAX,
                     JobStore, key_part, stream_id)


def _or_empty(check: Callable[[str], str]) -> Callable[[str], str]:
    """``check``, except that an empty value stays empty: an optional cursor sent empty is
    no cursor (an EventSource sends no Last-Event-ID rather than an empty one)."""
    return lambda value: value and check(value)


# An id that names a key (a job, rollout or artifact id, a team): never ':' or a glob.
KeyPart = Annotated[str, AfterValidator(key_part), WithJsonSchema({
    "type": "string", "pattern": KEY_PART, "maxLength": KEY_PART_MAX_CHARS})]
# A cursor that is an id of the list it pages (empty: the first page).
Cursor = Annotated[str, AfterValidator(_or_empty(key_part)), WithJsonSchema({
    "type": "string", "pattern": f"^$|{KEY_PART}", "maxLength": KEY_PART_MAX_CHARS})]
# A Redis stream id: <ms>-<seq> or <ms>, each part at most 2^64-1 (empty: from the start);
# the value is the canonical id Redis is given.
StreamId = Annotated[str, AfterValidator(_or_empty(stream_id)), WithJsonSchema({
    "type": "string", "pattern": f"^$|{STREAM_ID}", "maxLength": STREAM_ID_MAX_CHARS,
    "description": f"a stream id <ms>-<seq> or <ms> (<ms>-0), each at most {U64_MAX}"})]


class Detail(BaseModel):
    detail: str


ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": Detail, "description": "the body is not parseable"},
    401: {"model": Detail, "description": "no valid bearer token"},
    403: {"model": Detail, "description": "the token lacks the route's scope"},
    503: {"model": Detail, "description": "the job store is unreachable; retry"},
}
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"model": Detail,
                                                    "description": "no such job (of yours)"}}


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
        # Observed where the server runs timed full collections (the Ray actor hosting).
        self.gc_pause = Histogram("consolerl_api_gc_pause_seconds", "Full garbage "
                                  "collections the HTTP side runs on a timer, by duration.",
                                  registry=registry,
                                  buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, 1))


@dataclass(frozen=True)
class ApiContext:
    """The state of one jobs API app (see :func:`~..app.build_app` for the fields)."""

    store: JobStore
    tokens: TokenBook
    catalog: Mapping[str, Task]
    models: tuple[str, ...]
    registry: CollectorRegistry
    metrics: ApiMetrics
    extra_metrics: Callable[[], Awaitable[bytes]] | None
    sse_max_s: float
    sse_ping_s: float
    scheduler_required: bool
    # () -> doccheck.service.DocsService, built on first use (see build_app)
    docs: Callable[[], Any] | None = None


def context(request: Request) -> ApiContext:
    return request.app.state.jobs_api


Context = Annotated[ApiContext, Depends(context)]
bearer = HTTPBearer(auto_error=False, description="a team's token (crl_...)")


def auth(scope: str) -> Callable[..., Awaitable[Principal]]:
    """A dependency: the caller's :class:`Principal`; 401 without a valid bearer token, 403
    without ``scope``."""
    async def check(ctx: Context,
                    credentials: Annotated[HTTPAuthorizationCredentials | None,
                                           Depends(bearer)] = None) -> Principal:
        token = credentials.credentials if credentials is not None else ""
        who = ctx.tokens.verify(token) if token else None
        if who is None:
            raise HTTPException(401, "a valid 'Authorization: Bearer <token>' header is "
                                     "required", headers={"WWW-Authenticate": "Bearer"})
        if not who.may(scope):
            raise HTTPException(403, f"this token lacks the {scope!r} scope")
        return who
    return check


async def own_job(ctx: ApiContext, job_id: str, who: Principal) -> Job:
    """The job, when ``who``'s team owns it (or ``who`` is an admin); 404 otherwise (never 403:
    another team's job does not exist for the caller)."""
    job = await ctx.store.get_job(key_part(job_id))
    if job is None or (job.team != who.team and not who.may("admin")):
        raise HTTPException(404, f"no job {job_id!r}")
    return job


def unprocessable(where: str, message: str) -> HTTPException:
    """A 422 shaped like FastAPI's own validation errors (one documented error body):
    ``loc`` names the field, ``msg`` says what is wrong."""
    loc = ["body", *where.replace("[", ".").replace("]", "").split(".")] if where else ["body"]
    return HTTPException(422, [{"loc": [int(p) if ascii_digits(p) else p for p in loc],
                                "msg": message, "type": "value_error"}])
