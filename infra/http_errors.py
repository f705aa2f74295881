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

MAX_MSG_CHARS = 500


def validation_detail(exc: RequestValidationError) -> list[dict[str, Any]]:
    """The errors as FastAPI lists them, less ``input`` and ``ctx``; messages bounded."""
    return [{"loc": [part if isinstance(part, int) else str(part) for part in e.get("loc", ())],
             "msg": str(e.get("msg", ""))[:MAX_MSG_CHARS], "type": str(e.get("type", ""))}
            for e in exc.errors()]


def field_error(loc: Sequence[str | int], msg: str, type_: str = "value_error"
                ) -> dict[str, Any]:
    """One entry of a 422's ``detail``, for a check made after validation (one that needs the
    service's state): the same shape as :func:`validation_detail`'s."""
    return {"loc": list(loc), "msg": msg[:MAX_MSG_CHARS], "type": type_}


def install_validation_handler(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid_request(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": validation_detail(exc)}, status_code=422)
