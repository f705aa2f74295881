"""The console's request plumbing: sessions, CSRF, per-request :class:`Page`, and the generic
list, form and action handlers that the product pages are built from.

Every change a page makes goes through :meth:`CloudService.invoke` with a ``ConsoleOperation``
caller (user agent ``<product>.console.aliyun.com``, the browser's IP), so it lands in the same
audit log as an API call. Page views read through :meth:`CloudService.read`, which is not
audited. The console never holds an AccessKey and offers no generic API proxy: each route calls
the one action it is for, with parameters built only from the fields the form declares.
"""
from __future__ import annotations

import hashlib
import logging
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from consolerl.accounts import Account
from consolerl.errors import ConsoleRLError
from ..errors import CloudError
from ..service import Caller, CloudService
from consolerl.drift import Drift
from consolerl.text import ascii_digits, same_secret
from .metrics import ConsoleMetrics
from .sessions import COOKIE, Session, SessionStore
from .ui import STATUS_TONE, TRANSITIONAL, Button, Column, Field, FormSpec

log = logging.getLogger("infra.console_sim.console")
HERE = Path(__file__).parent
MAX_FORM_BYTES = 64 * 1024
PAGE_SIZES = (10, 20, 50, 100)
REGION_NAMES = {
    "cn-hangzhou": "China (Hangzhou)", "cn-shanghai": "China (Shanghai)",
    "cn-beijing": "China (Beijing)", "cn-shenzhen": "China (Shenzhen)",
    "ap-southeast-1": "Singapore", "us-west-1": "US (Silicon Valley)",
}


@dataclass(frozen=True)
class ProductNav:
    """A product's place in the console: its left navigation (label, href, drift group)."""

    key: str
    title: str
    short: str
    items: tuple[tuple[str, str, str], ...]
    regional: bool = True


@dataclass(frozen=True)
class PagedSource:
    """A paged Describe* action as a list's source: ``path`` to the items (``Instances.
    Instance``), ``to_row`` makes a table row of an item, ``params`` are fixed (RegionId)."""

    product: str
    action: str
    path: str
    to_row: Callable[[dict[str, Any]], dict[str, Any]]
    params: tuple[tuple[str, str], ...] = ()
    max_page_size: int = 50

    def page(self, page: Page, number: int, size: int) -> tuple[list[dict[str, Any]], int]:
        body = page.read(self.product, self.action, PageNumber=number, PageSize=size,
                         **dict(self.params))
        items = body
        for key in self.path.split("."):
            items = items[key]
        return [self.to_row(i) for i in items], body["TotalCount"]

    def all(self, page: Page) -> list[dict[str, Any]]:
        return [self.to_row(i) for i in page.read_all(
            self.product, self.action, self.path, page_size=self.max_page_size,
            **dict(self.params))]


class BadRequest(ConsoleRLError, ValueError):
    """A request the console cannot take (malformed form, stale page); answered with a page
    of HTTP ``status`` that shows ``message``."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message

    def __reduce__(self):
        return (type(self), (self.status, self.message))


class Page:
    """One request of a signed-in user: what a product page handler works with."""

    def __init__(self, console: ConsoleApp, request: Request, session: Session, account: Account,
                 form: dict[str, str]):
        self.console = console
        self.request = request
        self.session = session
        self.account = account
        self.form = form
        self.query = request.query_params
        self.drift: Drift = session.drift
        self.region = session.region

    @property
    def is_post(self) -> bool:
        return self.request.method == "POST"

    def caller(self, product_name: str) -> Caller:
        product = self.console.service.products[product_name]
        ip = self.request.client.host if self.request.client else ""
        # The console's host, then the browser's own user agent (what ActionTrail keeps of a
        # console call; console-rl's env workers put their lease's mark in it).
        browser = self.request.headers.get("user-agent", "")
        agent = f"{product.console_host} {browser}" if browser else product.console_host
        return Caller(self.account, "", ip, agent[:512], "ConsoleOperation")

    def read(self, product_name: str, action: str, **params: Any) -> dict[str, Any]:
        service = self.console.service
        return service.read(service.products[product_name], action,
                            {k: str(v) for k, v in params.items() if v is not None},
                            self.caller(product_name))

    def read_all(self, product_name: str, action: str, path: str, page_size: int = 50,
                 **params: Any) -> list[dict[str, Any]]:
        """Every item of a paged Describe* action; ``path`` is ``Instances.Instance``."""
        items: list[dict[str, Any]] = []
        number = 1
        while True:
            body = self.read(product_name, action, PageNumber=number, PageSize=page_size, **params)
            chunk = body
            for key in path.split("."):
                chunk = chunk[key]
            items.extend(chunk)
            if not chunk or len(items) >= body["TotalCount"]:
                return items
            number += 1

    def write(self, product_name: str, action: str, params: dict[str, str]) -> dict[str, Any]:
        service = self.console.service
        started = time.perf_counter()
        try:
            result = service.invoke(service.products[product_name], action, params,
                                    self.caller(product_name))
        except CloudError as err:
            self.console.metrics.operations.labels(product_name, action, err.code).inc()
            raise
        finally:
            self.console.metrics.operation_latency.labels(product_name).observe(
                time.perf_counter() - started)
        self.console.metrics.operations.labels(product_name, action, "Success").inc()
        return result

    def toast(self, kind: str, text: str) -> None:
        self.session.flashes.append((kind, text))

    def redirect(self, url: str) -> Response:
        return RedirectResponse(url, status_code=303)

    def back(self, default: str) -> str:
        """Where a POST returns to: the page it came from (a console path only)."""
        target = self.form.get("_back", "")
        return target if _safe_next(target) else default

    def render(self, template: str, http_status: int = 200, **ctx: Any) -> Response:
        # A background status refresh must not eat the toasts meant for the next page view.
        toasts: list[tuple[str, str]] = []
        if "x-console-refresh" not in self.request.headers:
            toasts = list(self.session.flashes)
            self.session.flashes.clear()
        html = self.console.env.get_template(template).render(
            account=self.account, session=self.session, drift=self.drift, t=self.drift.label,
            csrf=self.session.csrf, toasts=toasts, regions=REGION_NAMES, region=self.region,
            path=self.request.url.path + (f"?{self.request.url.query}" if self.request.url.query
                                          else ""),
            products=self.console.navs, **ctx)
        return HTMLResponse(html, status_code=http_status)


_STATIC_URLS: dict[str, str] = {}


def static_url(name: str) -> str:
    """``/console/static/<name>?v=<content hash>``: a new URL whenever the file changes."""
    if name not in _STATIC_URLS:
        digest = hashlib.sha256((HERE / "static" / name).read_bytes()).hexdigest()[:12]
        _STATIC_URLS[name] = f"/console/static/{name}?v={digest}"
    return _STATIC_URLS[name]


_NEXT_RE = re.compile(r"/console/[A-Za-z0-9/_.?=&%:,-]*")
# In the path: a percent-encoded dot, slash, backslash or percent (which a browser, the server
# or a proxy may decode into a dot segment or a separator), or control character.
_ENCODED_TRICK_RE = re.compile(r"%(?:2e|2f|5c|25|[01][0-9a-f]|7f)", re.IGNORECASE)


def _safe_next(target: str) -> bool:
    """Whether the console may send the browser to ``target`` (sign-in's ``next``, a form's
    ``_back``): a path under ``/console/`` with an optional query, at most 2,048 characters,
    that stays under ``/console/`` however a browser, server or proxy reads it. Refused: a
    scheme or host (``https:``, ``//``), a backslash, space or control character, and in the
    path a dot segment (``/console/../metrics``) or a percent-encoded dot, slash, backslash,
    percent or control character (``/console/%2e%2e/metrics``, ``/console/..%2fmetrics``)."""
    if not isinstance(target, str) or len(target) > 2048 or "//" in target \
            or not _NEXT_RE.fullmatch(target):
        return False
    path = target.split("?", 1)[0]
    if _ENCODED_TRICK_RE.search(path):
        return False
    return not any(segment in (".", "..") for segment in path.split("/"))


# Error codes whose code and message name no parameter, and the parameter they are about.
_CODE_FIELDS = {"EntityAlreadyExists.User": "UserName", "BucketAlreadyExists": "BucketName",
                "TooManyBuckets": "BucketName"}


def field_for(err: CloudError, fields: list[Field]) -> str | None:
    """The form field an API error is about: the API parameter its message names, else the one
    its code names (``InvalidBucketName``, ``InvalidParameter.UserName.Length``)."""
    candidates = sorted((f.name for f in fields if f.api), key=len, reverse=True)
    for name in candidates:
        if re.search(rf"(?<![\w.]){re.escape(name)}(?![\w])", err.message):
            return name
    for name in candidates:
        if name in err.code:
            return name
    by_code = _CODE_FIELDS.get(err.code)
    return by_code if by_code in candidates else None


class ConsoleApp:
    def __init__(self, service: CloudService, accounts: list[Account], registry):
        self.service = service
        self.accounts = {a.login_name: a for a in accounts}
        self.accounts_by_id = {a.account_id: a for a in accounts}
        self.sessions = SessionStore(service.store)
        self.metrics = ConsoleMetrics(registry, self.sessions)
        self.env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
            trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined)
        self.env.globals.update(TRANSITIONAL=TRANSITIONAL, STATUS_TONE=STATUS_TONE,
                                static=static_url)
        self.navs: list[ProductNav] = []
        self.routes: list[Route] = []
        # (session, form token) -> where the first submit went: a repeated submit creates
        # nothing new. In memory; the API's ClientToken covers restarts where it exists.
        self._submitted: OrderedDict[tuple[str, str], str] = OrderedDict()

    # ---- routing ------------------------------------------------------------------------------
    def route(self, path: str, methods: tuple[str, ...] = ("GET",), name: str = ""
              ) -> Callable[[Callable[..., Response]], Callable[..., Response]]:
        """Register a signed-in page; the handler gets a :class:`Page` and the path params."""
        def register(fn: Callable[..., Response]) -> Callable[..., Response]:
            self.routes.append(Route("/console" + path, self.endpoint(fn, name or fn.__name__),
                                     methods=list(methods)))
            return fn
        return register

    def endpoint(self, fn: Callable[..., Response], label: str):
        """The ASGI endpoint of a signed-in page handler (``label`` names it in metrics)."""
        async def endpoint(request: Request) -> Response:
            return await self._serve(request, fn, label)
        return endpoint

    async def _serve(self, request: Request, fn: Callable[..., Response], label: str) -> Response:
        started = time.perf_counter()
        status = 500
        try:
            session = self.sessions.get(request.cookies.get(COOKIE))
            account = self.accounts_by_id.get(session.account_id) if session else None
            if session is None or account is None:
                target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                status = 303
                return RedirectResponse(f"/console/signin?next={quote(target, safe='')}", 303)
            form: dict[str, str] = {}
            if request.method == "POST":
                form = await self.read_form(request)
                if not same_secret(form.get("_csrf", ""), session.csrf):
                    self.metrics.csrf_refusals.labels("session_token").inc()
                    raise BadRequest(403, "This page has expired (the form's security token does "
                                          "not match your session). Reload the page and try again.")
            page = Page(self, request, session, account, form)
            try:
                response = fn(page, **request.path_params)
            except CloudError as err:   # a read failed: unknown id, bad filter
                response = page.render("error.html", http_status=err.status if err.status < 500
                                       else 500, code=err.code, message=err.message, product=None)
            status = response.status_code
            return response
        except BadRequest as err:
            status = err.status
            return self.plain_error(err.status, err.message)
        except Exception:  # a bug: logged, answered without details
            log.exception("console page %s failed", label)
            status = 500
            return self.plain_error(500, "The console hit an internal error. Try again later.")
        finally:
            self.metrics.pages.labels(label, str(status)).inc()
            self.metrics.page_latency.labels(label).observe(time.perf_counter() - started)

    def refuse_cross_site(self, check: str, message: str) -> Response:
        """The answer to a request the same-origin check refused (``origin.py``)."""
        self.metrics.csrf_refusals.labels(check).inc()
        return self.plain_error(403, message)

    def plain_error(self, status: int, message: str) -> Response:
        html = self.env.get_template("plain_error.html").render(status=status, message=message)
        return HTMLResponse(html, status_code=status)

    async def read_form(self, request: Request) -> dict[str, str]:
        ctype = request.headers.get("content-type", "").split(";")[0].strip()
        if ctype != "application/x-www-form-urlencoded":
            raise BadRequest(415, "Forms must be sent as application/x-www-form-urlencoded.")
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_FORM_BYTES:
                raise BadRequest(413, f"The form is larger than {MAX_FORM_BYTES} bytes.")
        try:
            pairs = parse_qsl(body.decode("utf-8"), keep_blank_values=True, strict_parsing=False,
                              max_num_fields=200, errors="strict")
        except (UnicodeDecodeError, ValueError):
            raise BadRequest(400, "The form data is not valid UTF-8 URL-encoded text.") from None
        return {k: v for k, v in pairs}

    # ---- generic pages ------------------------------------------------------------------------
    def list_page(self, page: Page, *, product: ProductNav, active: str, title: str,
                  rows: list[dict[str, Any]] | PagedSource, columns: list[Column],
                  actions: Callable[[dict[str, Any]], list[Button]], toolbar: list[Button],
                  search: tuple[tuple[str, str], ...], intro: str = "") -> Response:
        """A list with a search box (``by`` one of ``search`` keys, ``q`` a substring), page
        numbers, a status column that refreshes itself while anything is in transition.
        ``rows``: all rows, or a :class:`PagedSource` that reads just the page shown when
        there is no search."""
        by = page.query.get("by", search[0][0])
        if by not in dict(search):
            by = search[0][0]
        q = page.query.get("q", "").strip()[:128]
        size = _int(page.query.get("size"), 20)
        size = size if size in PAGE_SIZES else 20
        wanted = max(1, _int(page.query.get("page"), 1))
        if isinstance(rows, PagedSource):
            if not q and size <= rows.max_page_size:
                shown, total = rows.page(page, wanted, size)
                if not shown and total and wanted > 1:   # past the end: show the last page
                    wanted = -(-total // size)
                    shown, total = rows.page(page, wanted, size)
                return self._render_list(page, product, active, title, intro, shown, total,
                                         wanted, columns, actions, toolbar, search, by, q, size)
            rows = rows.all(page)
        if q:
            rows = [r for r in rows if q.lower() in str(r.get(by, "")).lower()]
        number = min(wanted, max(1, -(-len(rows) // size)))
        shown = rows[(number - 1) * size: number * size]
        return self._render_list(page, product, active, title, intro, shown, len(rows), number,
                                 columns, actions, toolbar, search, by, q, size)

    def _render_list(self, page: Page, product: ProductNav, active: str, title: str, intro: str,
                     shown: list[dict[str, Any]], total: int, number: int,
                     columns: list[Column], actions: Callable[[dict[str, Any]], list[Button]],
                     toolbar: list[Button], search: tuple[tuple[str, str], ...], by: str,
                     q: str, size: int) -> Response:
        return page.render(
            "list.html", product=product, active=active, title=title, intro=intro, rows=shown,
            columns=columns, actions=actions, toolbar=toolbar, search=search, by=by, q=q,
            total=total, size=size, sizes=PAGE_SIZES, number=number,
            pages=max(1, -(-total // size)),
            live=any(r.get("Status") in TRANSITIONAL for r in shown))

    def form(self, page: Page, spec: FormSpec, *, product: ProductNav, active: str,
             product_name: str, action: str, done: Callable[[dict[str, Any], dict[str, str]],
                                                           tuple[str, str]],
             build: Callable[[dict[str, str]], dict[str, str]] | None = None,
             client_token: bool = False, fixed: dict[str, str] | None = None,
             initial: dict[str, str] | None = None) -> Response:
        """GET: the form. POST: validate through the API action itself (the same rules and
        messages as the API), then redirect with a toast, or show the form again with the error
        on its field. A repeated submit of one rendered form (its ``_form_token``) creates
        nothing new; with ``client_token`` the token is also the API's ClientToken."""
        fields = spec.fields
        if not page.is_post:
            values = {f.name: (initial or {}).get(f.name, f.default) for f in fields}
            return self._render_form(page, spec, product, active, values, {}, None,
                                     secrets.token_hex(16), 200)
        values = {f.name: page.form.get(f.name, "") for f in fields}
        token = page.form.get("_form_token", "")
        if not re.fullmatch(r"[0-9a-f]{32}", token):
            token = secrets.token_hex(16)
        key = (page.session.token_hash, token)
        if key in self._submitted:
            page.toast("info", "This form was already submitted; nothing new was created.")
            return page.redirect(self._submitted[key])
        params = build(values) if build else {f.name: v for f in fields
                                              if f.api and (v := values[f.name]) != ""}
        params.update(fixed or {})
        if client_token:
            params["ClientToken"] = token
        try:
            result = page.write(product_name, action, params)
        except CloudError as err:
            where = field_for(err, fields)
            errors = {where: err.message} if where else {}
            page.toast("error", f"{err.message} ({err.code})")
            return self._render_form(page, spec, product, active, values, errors, err, token, 400)
        url, message = done(result, values)
        self._submitted[key] = url
        while len(self._submitted) > 10_000:
            self._submitted.popitem(last=False)
        page.toast("success", message)
        return page.redirect(url)

    def _render_form(self, page: Page, spec: FormSpec, product: ProductNav, active: str,
                     values: dict[str, str], errors: dict[str, str], err: CloudError | None,
                     token: str, status: int) -> Response:
        steps = list(spec.steps)
        if "wizard" in page.drift and len(steps) == 1 and len(steps[0].fields) >= 2:
            # The drifted console splits a one-page form in two.
            fields = steps[0].fields
            half = (len(fields) + 1) // 2
            steps = [type(steps[0])("Basic Settings", fields[:half]),
                     type(steps[0])("Additional Settings", fields[half:])]
        active_step = 0
        for i, step in enumerate(steps):
            if any(f.name in errors for f in step.fields):
                active_step = i
                break
        return page.render("form.html", http_status=status, product=product, active=active, spec=spec,
                           steps=steps, values=values, errors=errors, error=err, token=token,
                           active_step=active_step)

    def act(self, page: Page, product_name: str, action: str, params: dict[str, str], *,
            back: str, ok: str, confirm_id: str = "") -> Response:
        """A row or page action (start, delete, ...): run it, toast the outcome and go to
        ``back``; when it fails, stay on the page it came from."""
        if confirm_id and "extra_confirm" in page.drift and \
                page.form.get("confirm", "").strip() != confirm_id:
            page.toast("error", f"Confirmation failed: type {confirm_id} exactly to confirm.")
            return page.redirect(page.back(back))
        try:
            page.write(product_name, action, params)
        except CloudError as err:
            page.toast("error", f"{err.message} ({err.code})")
            return page.redirect(page.back(back))
        page.toast("success", ok)
        return page.redirect(back)


def _int(text: str | None, default: int) -> int:
    return int(text) if text and ascii_digits(text) and len(text) < 9 else default
