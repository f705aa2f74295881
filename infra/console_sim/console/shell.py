"""The console around the products: sign-in and sign-out, the region selector, the home page,
static files, and the console's own 404."""
from __future__ import annotations

import math
import secrets
from collections.abc import Awaitable, Callable
from urllib.parse import quote

from prometheus_client import CollectorRegistry
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from consolerl import drift as drift_mod
from consolerl.accounts import Account
from consolerl.drift import Drift
from consolerl.errors import ConfigError
from consolerl.text import same_secret

from ..catalog import DEFAULT_REGION, REGIONS
from ..config import SigninLimits
from ..service import CloudService
from . import ecs, network, oss, ram
from .core import HERE, BadRequest, ConsoleApp, Page, _safe_next
from .sessions import COOKIE
from .signin import CSRF_COOKIE, Lock, SigninGuard, SigninTokens, set_pre_session_cookie

_METHODS = ["GET", "POST", "PUT", "DELETE", "HEAD"]


def build_console(service: CloudService, accounts: list[Account], registry: CollectorRegistry,
                  oss_handler: Callable[[Request], Awaitable[Response]],
                  signin_limits: SigninLimits) -> tuple[ConsoleApp, list[BaseRoute]]:
    """The console and its routes (all under ``/console``). ``/console`` and ``/console/`` are
    also OSS's path-style address of a bucket named ``console``: requests signed for OSS go to
    ``oss_handler``."""
    console = ConsoleApp(service, accounts, registry)
    for module in (ecs, network, ram, oss):
        module.register(console)

    def home(page: Page) -> Response:
        region = page.region

        def total(product: str, action: str) -> int:
            return page.read(product, action, RegionId=region, PageSize=1)["TotalCount"]
        cards = [
            {"title": "Elastic Compute Service", "href": "/console/ecs/instances",
             "text": "Virtual machines and the security groups that guard them.",
             "counts": [("Instances", "/console/ecs/instances", total("Ecs", "DescribeInstances")),
                        ("Security Groups", "/console/ecs/security-groups",
                         total("Ecs", "DescribeSecurityGroups"))]},
            {"title": "Virtual Private Cloud", "href": "/console/vpc/vpcs",
             "text": "Private networks and their vSwitches.",
             "counts": [("VPCs", "/console/vpc/vpcs", total("Vpc", "DescribeVpcs")),
                        ("vSwitches", "/console/vpc/vswitches", total("Vpc", "DescribeVSwitches"))]},
            {"title": "Resource Access Management", "href": "/console/ram/users",
             "text": "Users of the account and the policies they hold.",
             "counts": [("Users", "/console/ram/users",
                         len(page.read("Ram", "ListUsers", MaxItems=1000)["Users"]["User"]))]},
            {"title": "Object Storage Service", "href": "/console/oss/buckets",
             "text": "Buckets for objects, with access control.",
             "counts": [("Buckets", "/console/oss/buckets",
                         len(page.read("Oss", "ListBuckets", **{"max-keys": 1000})["Buckets"]))]},
        ]
        return page.render("home.html", title="Home", product=None, active="", cards=cards)

    @console.route("/region", methods=("POST",), name="region")
    def switch_region(page: Page) -> Response:
        region = page.form.get("region", "")
        if region not in REGIONS:
            page.toast("error", f"Unknown region {region[:32]!r}; choose one of: "
                                f"{', '.join(REGIONS)}.")
        else:
            page.console.sessions.set_region(page.session, region)
        # A detail page of the old region would show "not found": go to the product's list.
        back = page.back("/console/")
        parts = back.split("?")[0].split("/")
        return page.redirect("/".join(parts[:4]) if len(parts) > 4 else back)

    @console.route("/signout", methods=("POST",), name="signout")
    def signout(page: Page) -> Response:
        page.console.sessions.delete(page.session)
        response = RedirectResponse("/console/signin", 303)
        response.delete_cookie(COOKIE, path="/console")
        return response

    guard = SigninGuard(signin_limits,
                        on_lock=lambda scope: console.metrics.signin_lockouts.labels(scope).inc())
    tokens = SigninTokens()

    async def signin(request: Request) -> Response:
        """The sign-in form (GET) and its submit (POST); see ``signin.py`` for the CSRF token
        and the lockout."""
        if request.method == "GET":
            next_url = request.query_params.get("next", "/console/")
            drift_text = request.query_params.get("drift", "")
            login_name = ""
        else:
            try:
                form = await console.read_form(request)
            except BadRequest as err:
                return console.plain_error(err.status, err.message)
            next_url, drift_text = form.get("next", "/console/"), form.get("drift", "")
            login_name = form.get("login_name", "").strip()
        next_url = next_url if _safe_next(next_url) else "/console/"

        def page(error: str, status: int, drift: str | None = None) -> Response:
            return _signin_page(console, tokens, request, next_url,
                                drift_text if drift is None else drift, login_name, error, status)
        try:
            kinds = drift_mod.parse(drift_text)
        except ConfigError as err:
            return page(f"Invalid drift: {err}", 400, drift="")
        if request.method == "GET":
            return page("", 200)
        if not tokens.valid(request, form):
            console.metrics.signins.labels("bad_token").inc()
            console.metrics.csrf_refusals.labels("signin_token").inc()
            return page("This sign-in page has expired or did not come from this console (its "
                        "security token is missing or wrong). Sign in again on this page.", 403)
        password = form.get("password", "")
        if not login_name or not password:
            console.metrics.signins.labels("missing").inc()
            return page("Enter your account name and password.", 400)
        # Keys of the lockout: names are at most 64 characters, so a longer one is no account.
        name_key, address = login_name[:128], request.client.host if request.client else ""
        lock = guard.locked(name_key, address)
        if lock is not None:
            console.metrics.signins.labels("locked").inc()
            return _locked(page, lock)
        account = console.accounts.get(login_name)
        # Compare in constant time, and also when the account does not exist.
        expected = account.password if account else secrets.token_hex(16)
        if not same_secret(password, expected) or account is None:
            console.metrics.signins.labels("failed").inc()
            lock = guard.failed(name_key, address)
            if lock is not None:
                return _locked(page, lock)
            return page("The account name or password is incorrect.", 401)
        guard.succeeded(name_key)
        token, _ = console.sessions.create(account.account_id, DEFAULT_REGION, Drift(kinds))
        console.metrics.signins.labels("success").inc()
        response = RedirectResponse(next_url, 303)
        response.set_cookie(COOKIE, token, httponly=True, samesite="strict", path="/console",
                            max_age=int(console.sessions.ttl_ms / 1000))
        response.delete_cookie(CSRF_COOKIE, path="/console/signin")
        return response

    async def not_found(request: Request) -> Response:
        return console.plain_error(404, f"The console has no page at {request.url.path[:200]}.")

    home_endpoint = console.endpoint(home, "home")

    async def root(request: Request) -> Response:
        if request.headers.get("authorization", "").startswith("OSS"):
            request.scope["path_params"] = {"bucket": "console"}
            return await oss_handler(request)
        if request.url.path == "/console":
            return RedirectResponse("/console/", 307)
        return await home_endpoint(request)

    routes: list[BaseRoute] = [
        Route("/console", root, methods=_METHODS),
        Route("/console/", root, methods=_METHODS),
        Route("/console/signin", signin, methods=["GET", "POST"]),
        Mount("/console/static", CachedStatic(directory=HERE / "static"), name="static"),
        *console.routes,
        Route("/console/{rest:path}", not_found, methods=["GET", "POST"]),
    ]
    return console, routes


class CachedStatic(StaticFiles):
    """Static files that browsers keep: pages link them with a content hash (``?v=``), so a
    page view costs no revalidation requests."""

    def file_response(self, *args, **kwargs) -> Response:
        response = super().file_response(*args, **kwargs)
        response.headers["cache-control"] = "public, max-age=604800, immutable"
        return response


def _signin_page(console: ConsoleApp, tokens: SigninTokens, request: Request, next_url: str,
                 drift_text: str, login_name: str, error: str, status: int) -> Response:
    """The form, with its CSRF token (the pre-session cookie, the signed token in a hidden
    field); echoes at most 128 characters of the name typed."""
    pre_session = tokens.pre_session(request)
    html = console.env.get_template("signin.html").render(
        next=next_url, drift=drift_text[:256], login_name=login_name[:128], error=error,
        csrf=tokens.issue(pre_session))
    response = HTMLResponse(html, status_code=status)
    set_pre_session_cookie(response, pre_session)
    return response


def _locked(page: Callable[[str, int], Response], lock: Lock) -> Response:
    response = page(lock.message(), 429)
    response.headers["retry-after"] = str(max(1, math.ceil(lock.seconds)))
    return response


def signin_url(next_url: str = "/console/", drift: str = "") -> str:
    url = f"/console/signin?next={quote(next_url, safe='')}"
    return url + (f"&drift={quote(drift)}" if drift else "")
