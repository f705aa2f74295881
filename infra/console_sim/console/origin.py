"""The same-origin check on every state-changing console request (login CSRF and CSRF from
other sites, other ports of the same host included).

A console request (path ``/console`` or under ``/console/``) with a method other than GET,
HEAD or OPTIONS is refused with a 403 page, before any route runs, when

- it has an ``Origin`` header that is not the console's own origin, ``scheme://host[:port]``
  exactly as the request's ``Host`` header names it (another port, scheme or host name of the
  same machine is another origin; ``Origin: null`` is refused), or
- it has a ``Sec-Fetch-Site`` header other than ``same-origin`` or ``none`` (``none``: a
  navigation the user started, which no other page can cause).

Requests with neither header are let through on purpose: every current browser sends
``Origin`` on a POST (and Chromium and Firefox ``Sec-Fetch-Site`` too), so such a request
comes from a non-browser client (an SDK, a test's httpx, curl). It carries no cookie it did
not choose itself, so there is no victim to forge for; the tokens still decide for it: the
session's form token on every signed-in form, and the server-signed sign-in token
(``signin.py``) on the sign-in form.

Left alone: requests signed for OSS (``Authorization: OSS ...``; the bucket named
``console`` is reachable at ``/console/``). OSS and the RPC OpenAPI authenticate each request
by its AccessKey signature and never by the console's cookie, so a cross-site request gains
nothing there; the OpenAPI is not under ``/console`` at all.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from starlette.datastructures import Headers
from starlette.responses import Response

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
ALLOWED_FETCH_SITES = frozenset({"same-origin", "none"})


def cross_site(method: str, scheme: str, headers: Mapping[str, str]) -> tuple[str, str] | None:
    """Why a console request must be refused: ``(check, message)`` with ``check`` "origin" or
    "fetch_site", or None when it may go on. ``headers`` has lower-case names."""
    if method in SAFE_METHODS:
        return None
    origin = headers.get("origin")
    if origin is not None:
        host = headers.get("host", "")
        if not host or origin.lower() != f"{scheme}://{host}".lower():
            return "origin", (f"The request came from another site (Origin {origin[:100]}) and "
                              "did not come from this console. Open the console's own page "
                              "and submit the form there.")
    site = headers.get("sec-fetch-site")
    if site is not None and site not in ALLOWED_FETCH_SITES:
        return "fetch_site", (f"The request came from another site (Sec-Fetch-Site "
                              f"{site[:32]}) and did not come from this console. Open the "
                              "console's own page and submit the form there.")
    return None


def _is_console(path: str) -> bool:
    return path == "/console" or path.startswith("/console/")


class SameOriginGuard:
    """ASGI middleware: applies :func:`cross_site` to every console request (see the module
    doc); ``refuse(check, message)`` makes the 403 answer (and counts it)."""

    def __init__(self, app: Any, refuse: Callable[[str, str], Response]):
        self.app = app
        self.refuse = refuse

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] not in SAFE_METHODS \
                and _is_console(scope["path"]):
            headers = Headers(scope=scope)
            if not headers.get("authorization", "").startswith("OSS"):
                refusal = cross_site(scope["method"], scope.get("scheme", "http"), headers)
                if refusal is not None:
                    await self.refuse(*refusal)(scope, receive, send)
                    return
        await self.app(scope, receive, send)
