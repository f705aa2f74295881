"""The jobs API: a FastAPI application, versioned under ``/v1`` (OpenAPI at ``/openapi.json``).

It keeps nothing in memory that matters: jobs, results, events and artifacts are in Redis
(:class:`~.store.JobStore`) and the scheduler (:mod:`.scheduler`) runs the episodes, so the API
restarts without losing a job and serves from as many processes as wanted.

Auth: ``Authorization: Bearer <token>``; 401 without a valid token, 403 without the route's
scope, 404 (never 403) for another team's job or artifact. Quotas at submission: queued jobs,
samples per job and env-minutes per day answer 429 with ``Retry-After``; concurrent episodes
are enforced by the scheduler (the job waits).
"""
from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from consolerl.tasks import Task
from infra.http_errors import install_validation_handler

from .auth import TokenBook
from .blobs import BlobUnavailable
from .routers import catalog as catalog_routes
from .routers import docs as docs_routes
from .routers import events, jobs, ops, results
from .routers.context import ApiContext, ApiMetrics, unprocessable
from .store import JobStore

__all__ = ["ApiContext", "ApiMetrics", "build_app", "unprocessable"]
log = logging.getLogger("jobsapi.app")


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


MAX_BODY_BYTES = 4 * 2 ** 20
# POST /v1/docs carries pages (each at most 2 MiB: doccheck.service.MAX_PAGE_BYTES);
# a request holds at most this much in all: more pages go in more requests.
DOCS_MAX_BODY_BYTES = 16 * 2 ** 20


class _BodyLimit:
    """Answers 413 (JSON, naming the limit) to a request body larger than the route's limit,
    before anything reads it: by its Content-Length, or, without one, by counting while it
    buffers the body (a chunked upload) up to the limit."""

    def __init__(self, app, limits: dict[str, int], default: int):
        self.app, self.limits, self.default = app, limits, default

    def _limit(self, path: str) -> int:
        return self.limits.get(path.rstrip("/") or "/", self.default)

    @staticmethod
    async def _refuse(send, path: str, size: int | None, limit: int) -> None:
        what = f"{size} bytes" if size is not None else f"over {limit} bytes"
        body = json.dumps({"detail": f"the request body is {what}; {path} accepts at most "
                                     f"{limit} bytes ({limit / 2 ** 20:g} MiB)"}).encode()
        await send({"type": "http.response.start", "status": 413, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            return await self.app(scope, receive, send)
        limit, path = self._limit(scope["path"]), scope["path"][:200]
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None:
            size = int(length) if length.isdigit() else None
            if size is None or size > limit:
                return await self._refuse(send, path, size, limit)
            return await self.app(scope, receive, send)
        chunks, total, more = [], 0, True        # no length: buffer up to the limit
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return
            chunks.append(message.get("body", b""))
            total += len(chunks[-1])
            more = message.get("more_body", False)
            if total > limit:
                return await self._refuse(send, path, None, limit)
        replay = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def replayed():
            return replay.pop() if replay else await receive()
        return await self.app(scope, replayed, send)


async def _store_down(request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse({"detail": "the job store is unreachable; retry shortly"},
                        status_code=503, headers={"Retry-After": "2"})


async def _blobs_down(request: Request, exc: Exception) -> JSONResponse:
    # The message names the operation and the key, never a credential; the logs get it.
    log.warning("%s %s: %s", request.method, request.url.path[:200], exc)
    return JSONResponse({"detail": "the artifact store is unreachable; retry shortly"},
                        status_code=503, headers={"Retry-After": "5"})


def build_app(store: JobStore, tokens: TokenBook, catalog: Mapping[str, Task], *,
              models: tuple[str, ...] = ("live",), registry: CollectorRegistry | None = None,
              extra_metrics: Callable[[], Awaitable[bytes]] | None = None,
              sse_max_s: float = 300.0, sse_ping_s: float = 15.0,
              scheduler_required: bool = True,
              docs: Callable[[], Any] | None = None) -> FastAPI:
    """The API over ``store``; ``catalog``: the task suite by id; ``models``: the names a job
    may ask for; ``extra_metrics``: more Prometheus text for ``/metrics`` (the scheduler's);
    ``sse_max_s``: an event stream ends after this long (the client resumes with
    ``Last-Event-ID``); ``scheduler_required``: ``/readyz`` answers 503 while no scheduler
    is alive; ``docs``: makes the documentation checker of ``POST /v1/docs`` (a
    :class:`~doccheck.service.DocsService`), called once, on the first request
    (default: :meth:`DocsService.default`, the committed inventories)."""
    registry = registry if registry is not None else CollectorRegistry()
    metrics = ApiMetrics(registry)
    app = FastAPI(title="console-rl jobs API", version="1.0.0",
                  description="Run documented console procedures with a trained agent, K "
                              "samples each, and learn which still work and where they "
                              "break.")
    # What the routers share, handed out by the routers.context.context dependency.
    app.state.jobs_api = ApiContext(
        store=store, tokens=tokens, catalog=catalog, models=models, registry=registry,
        metrics=metrics, extra_metrics=extra_metrics, sse_max_s=sse_max_s,
        sse_ping_s=sse_ping_s, scheduler_required=scheduler_required,
        docs=docs_routes.once(docs))
    install_validation_handler(app)
    app.add_middleware(_BodyLimit, limits={"/v1/docs": DOCS_MAX_BODY_BYTES},
                       default=MAX_BODY_BYTES)
    app.add_middleware(_Measure, metrics=metrics)
    app.add_exception_handler(RedisConnectionError, _store_down)
    app.add_exception_handler(RedisTimeoutError, _store_down)
    app.add_exception_handler(BlobUnavailable, _blobs_down)
    # The order of the routes is the order of the OpenAPI document's paths.
    for module in (jobs, events, results, docs_routes, catalog_routes, ops):
        app.include_router(module.router)
    app.openapi = lambda: _openapi(app)      # type: ignore[method-assign]
    return app


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document plus the event payloads' schemas (see events.add_event_schemas)."""
    if app.openapi_schema is None:
        events.add_event_schemas(FastAPI.openapi(app))
    return app.openapi_schema


if __name__ == "__main__":
    # The OpenAPI document, as committed in jobsapi/openapi.json.
    import sys
    from pathlib import Path

    from consolerl.tasks import TASKS_DIR, load_suite

    document = build_app(JobStore("redis://127.0.0.1:1/0"),
                         TokenBook(Path("/nonexistent/tokens.json")),
                         {t.id: t for t in load_suite(TASKS_DIR)}).openapi()
    sys.stdout.write(json.dumps(document, indent=1, sort_keys=True) + "\n")
