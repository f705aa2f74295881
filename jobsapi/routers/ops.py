"""Operations: liveness (``/healthz``), readiness (``/readyz``: the store answers and, unless
told otherwise, a scheduler is alive) and Prometheus metrics (``/metrics``)."""
# No "from __future__ import annotations": FastAPI reads the routes' annotations.

import asyncio

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .context import Context, Detail

router = APIRouter()


@router.get("/healthz", tags=["ops"])
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", tags=["ops"], responses={503: {"model": Detail}})
async def readyz(ctx: Context) -> JSONResponse:
    try:
        await asyncio.wait_for(ctx.store.ping(), 2.0)
        alive = await ctx.store.scheduler_alive()
    except (RedisConnectionError, RedisTimeoutError, asyncio.TimeoutError):
        return JSONResponse({"detail": "the job store is unreachable"}, status_code=503)
    if ctx.scheduler_required and not alive:
        return JSONResponse({"detail": "no scheduler is running"}, status_code=503)
    return JSONResponse({"status": "ready"})


@router.get("/metrics", tags=["ops"], response_class=Response)
async def prometheus(ctx: Context) -> Response:
    body = generate_latest(ctx.registry)
    if ctx.extra_metrics is not None:
        try:
            body += await asyncio.wait_for(ctx.extra_metrics(), 2.0)
        except Exception:            # the scheduler's metrics are optional here
            pass
    return Response(body, media_type=CONTENT_TYPE_LATEST)
