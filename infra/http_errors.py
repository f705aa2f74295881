"""One 422 for every console-rl HTTP API (the policy API, the reward API, the jobs API).

FastAPI's default answer to a request that fails validation echoes the offending input back:
a multi-megabyte field comes back whole, and a ``NaN`` or ``Infinity`` (which Python's JSON
parser accepts) cannot be written as JSON at all, so the client got a 500 instead of a 422.
This handler answers the same shape (``detail``: a list of ``loc``, ``msg``, ``type``) without
the input.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from consolerl.errors import ConsoleRLError

MAX_MSG_CHARS = 500
MAX_LOC_CHARS = 100     # a loc part can be a key of the request's own (100 KB of it)


def validation_detail(exc: RequestValidationError) -> list[dict[str, Any]]:
    """The errors as FastAPI lists them, less ``input`` and ``ctx``; messages and locations
    bounded."""
    return [{"loc": [part if isinstance(part, int) else str(part)[:MAX_LOC_CHARS]
                     for part in e.get("loc", ())],
             "msg": str(e.get("msg", ""))[:MAX_MSG_CHARS], "type": str(e.get("type", ""))}
            for e in exc.errors()]


def field_error(loc: Sequence[str | int], msg: str, type_: str = "value_error"
                ) -> dict[str, Any]:
    """One entry of a 422's ``detail``, for a check made after validation (one that needs the
    service's state): the same shape as :func:`validation_detail`'s."""
    return {"loc": list(loc), "msg": msg[:MAX_MSG_CHARS], "type": type_}


def install_validation_handler(app: FastAPI, max_body_bytes: int = 16 << 20) -> None:
    """The shared 422, and a 413 for a request body over ``max_body_bytes`` (refused from
    its Content-Length before it is read, or as soon as a chunked body passes the limit)."""
    @app.exception_handler(RequestValidationError)
    async def invalid_request(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": validation_detail(exc)}, status_code=422)
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)


class _TooLarge(ConsoleRLError, RuntimeError):
    """A request body passed the limit while the app read it."""


class BodyLimit:
    """ASGI middleware: 413 for a request body larger than ``max_bytes``."""

    def __init__(self, app: Any, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def _refuse(self, send: Any) -> None:
        body = JSONResponse({"detail": [field_error(
            ["body"], f"the request body is larger than {self.max_bytes:,} bytes",
            "too_large")]}, status_code=413)
        await body({"type": "http"}, None, send)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length", b"")
        if declared and (len(declared) > 15 or not declared.isdigit()
                         or int(declared) > self.max_bytes):
            await self._refuse(send)
            return
        seen = 0
        started = False

        async def counted() -> dict:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge
            return message

        async def tracked(message: dict) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)
        try:
            await self.app(scope, counted, tracked)
        except _TooLarge:
            if not started:
                await self._refuse(send)
