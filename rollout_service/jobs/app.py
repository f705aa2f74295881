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
from .routers import catalog as catalog_routes
from .routers import events, jobs, ops, results
from .routers.context import ApiContext, ApiMetrics, unprocessable
from .store import JobStore

__all__ = ["ApiContext", "ApiMetrics", "build_app", "unprocessable"]


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


async def _store_down(request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse({"detail": "the job store is unreachable; retry shortly"},
                        status_code=503, headers={"Retry-After": "2"})


def build_app(store: JobStore, tokens: TokenBook, catalog: Mapping[str, Task], *,
              models: tuple[str, ...] = ("live",), registry: CollectorRegistry | None = None,
              extra_metrics: Callable[[], Awaitable[bytes]] | None = None,
              sse_max_s: float = 300.0, sse_ping_s: float = 15.0,
              scheduler_required: bool = True) -> FastAPI:
    """The API over ``store``; ``catalog``: the task suite by id; ``models``: the names a job
    may ask for; ``extra_metrics``: more Prometheus text for ``/metrics`` (the scheduler's);
    ``sse_max_s``: an event stream ends after this long (the client resumes with
    ``Last-Event-ID``); ``scheduler_required``: ``/readyz`` answers 503 while no scheduler
    is alive."""
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
        sse_ping_s=sse_ping_s, scheduler_required=scheduler_required)
    install_validation_handler(app)
    app.add_middleware(_Measure, metrics=metrics)
    app.add_exception_handler(RedisConnectionError, _store_down)
    app.add_exception_handler(RedisTimeoutError, _store_down)
    # The order of the routes is the order of the OpenAPI document's paths.
    for module in (jobs, events, results, catalog_routes, ops):
        app.include_router(module.router)
    app.openapi = lambda: _openapi(app)      # type: ignore[method-assign]
    return app


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document plus the event payloads' schemas (see events.add_event_schemas)."""
    if app.openapi_schema is None:
        events.add_event_schemas(FastAPI.openapi(app))
    return app.openapi_schema


if __name__ == "__main__":
    # The OpenAPI document, as committed in rollout_service/jobs/openapi.json.
    import sys
    from pathlib import Path

    from consolerl.tasks import TASKS_DIR, load_suite

    document = build_app(JobStore("redis://127.0.0.1:1/0"),
                         TokenBook(Path("/nonexistent/tokens.json")),
                         {t.id: t for t in load_suite(TASKS_DIR)}).openapi()
    sys.stdout.write(json.dumps(document, indent=1, sort_keys=True) + "\n")
