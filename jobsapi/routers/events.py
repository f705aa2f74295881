"""A job's events as Server-Sent Events (``/v1/jobs/{job_id}/events``)."""
# No "from __future__ import annotations": FastAPI reads the routes' annotations.

import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request
from pydantic.json_schema import models_json_schema
from sse_starlette.sse import EventSourceResponse, ServerSentEvent

from ..auth import Principal
from ..schema import EVENT_MODELS, EVENT_TYPES
from .context import ERRORS, NOT_FOUND, Context, KeyPart, StreamId, auth, own_job

router = APIRouter(prefix="/v1", responses=ERRORS)

_REF = "#/components/schemas/{model}"
# One Server-Sent Event: ``data`` is a JSON object; ``id`` resumes the stream (Last-Event-ID).
# The ``oneOf`` pairs each ``event`` type with the schema of its ``data`` (schema.EVENT_MODELS,
# put into the document's components by add_event_schemas).
_SSE_EVENT = {"type": "object", "required": ["event", "data", "id"], "properties": {
    "event": {"type": "string", "enum": list(EVENT_TYPES)},
    "data": {"type": "string", "contentMediaType": "application/json"},
    "id": {"type": "string", "pattern": r"^\d+-\d+$"}},
    "oneOf": [{"properties": {
        "event": {"const": kind},
        "data": {"contentMediaType": "application/json",
                 "contentSchema": {"$ref": _REF.format(model=model.__name__)}}}}
        for kind, model in EVENT_MODELS.items()]}


def add_event_schemas(document: dict[str, Any]) -> None:
    """Put the event models (and the models they use) into ``document``'s component schemas,
    which FastAPI leaves out: no route returns them as JSON. A model FastAPI already put there
    must have the same schema here."""
    _, defs = models_json_schema([(m, "serialization") for m in EVENT_MODELS.values()],
                                 ref_template=_REF)
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    for name, schema in defs.get("$defs", {}).items():
        if schemas.setdefault(name, schema) != schema:
            raise ValueError(f"two schemas named {name!r} in the OpenAPI document")
    document["components"]["schemas"] = dict(sorted(schemas.items()))


@router.get("/jobs/{job_id}/events", tags=["jobs"], operation_id="job_events", responses={
    **NOT_FOUND, 200: {"content": {"text/event-stream": {"schema": _SSE_EVENT}},
                       "description": "Server-Sent Events, each event as described"}})
async def events(job_id: KeyPart, request: Request, ctx: Context,
                 who: Annotated[Principal, Depends(auth("jobs:read"))],
                 last_event_id: Annotated[StreamId | None, Header(alias="Last-Event-ID")] = None,
                 after: Annotated[StreamId | None, Query()] = None
                 ) -> EventSourceResponse:
    """The job's events as Server-Sent Events (``job.status``, ``rollout.started``,
    ``rollout.step``, ``rollout.completed``, ``task.summary``, ``job.completed``), each
    with an ``id``: reconnect with ``Last-Event-ID`` (or ``?after=``; the header wins) to miss
    nothing. An id is ``<ms>-<seq>`` or ``<ms>`` (``<ms>-0``), each part at most 2^64-1, and
    is checked before the stream starts (422 naming the header or ``after``). The stream ends
    after ``job.completed``, or after a while (reconnect)."""
    await own_job(ctx, job_id, who)
    start = last_event_id or after or "0-0"
    store, metrics = ctx.store, ctx.metrics

    async def stream():
        metrics.sse.inc()
        cursor, deadline = start, time.monotonic() + ctx.sse_max_s
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
    return EventSourceResponse(stream(), ping=ctx.sse_ping_s)
