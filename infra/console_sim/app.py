"""The local cloud's HTTP application: the RPC OpenAPI on ``/``, OSS's REST API (``Authorization:
OSS ...``), the console web UI under ``/console/``, ``/metrics`` and ``/healthz``."""
from __future__ import annotations

import contextlib
import json
import logging
import time
from email.utils import formatdate
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from . import ids, timeutil
from consolerl.accounts import Account, load_accounts
from consolerl.text import ascii_digits
from .auth import Authenticator
from .config import SimConfig
from .console.origin import SameOriginGuard
from .console.shell import build_console
from .errors import CloudError
from .faults import FaultFile
from .metrics import SimMetrics
from .products import all_products, oss, rpc_products
from .service import Caller, CloudService
from .store import Store

log = logging.getLogger("infra.console_sim")
_JSON = "application/json;charset=utf-8"


def error_body(err: CloudError, request_id: str, product: str = "") -> dict[str, str]:
    return {"RequestId": request_id, "HostId": ids.host_id(), "Code": err.code,
            "Message": err.message,
            "Recommend": f"https://api.aliyun.com/troubleshoot?q={err.code}&product={product}"}


def _json(body: dict[str, Any], status: int = 200) -> Response:
    return Response(json.dumps(body, ensure_ascii=False, separators=(",", ":")), status,
                    media_type=_JSON)


class CloudApp:
    """Holds the state of one local-cloud server and answers its requests."""

    def __init__(self, config: SimConfig, accounts: list[Account] | None = None):
        self.config = config
        self.accounts = accounts if accounts is not None else load_accounts(config.accounts_file)
        self.store = Store(config.state_dir)
        self.faults = FaultFile(config.state_dir)
        self.products = rpc_products()
        self.service = CloudService(self.store, config, all_products())
        self.service.runtime["faults"] = self.faults
        self.auth = Authenticator(self.accounts, self.store, config.max_clock_skew_s)
        self.metrics = SimMetrics()
        self.service.on_event.append(
            lambda e: self.metrics.events.labels(e["serviceName"], e["eventType"]).inc())
        self.service.runtime["on_delivery"] = \
            lambda delays: [self.metrics.delivery.observe(d) for d in delays]
        self.oss = oss.OssApi(self.service, self.accounts, config)
        self.console, self.console_routes = build_console(
            self.service, self.accounts, self.metrics.registry, self.oss.handle, config.signin)

    async def _read_body(self, request: Request) -> bytes:
        declared = request.headers.get("content-length")
        if declared and (not ascii_digits(declared) or int(declared) > self.config.max_body_bytes):
            raise CloudError("InvalidParameter", f"The request body is larger than "
                             f"{self.config.max_body_bytes} bytes.", 400)
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.config.max_body_bytes:
                raise CloudError("InvalidParameter", f"The request body is larger than "
                                 f"{self.config.max_body_bytes} bytes.", 400)
            chunks.append(chunk)
        return b"".join(chunks)

    async def rpc(self, request: Request) -> Response:
        if request.headers.get("authorization", "").startswith("OSS"):
            return await self.oss.handle(request)
        started = time.perf_counter()
        request_id = ids.request_id()
        product_name, action = "", request.headers.get("x-acs-action", "")
        try:
            query = request.scope.get("query_string", b"")
            if len(query) > self.config.max_query_bytes:
                raise CloudError("InvalidParameter", f"The query string is longer than "
                                 f"{self.config.max_query_bytes} bytes.", 400)
            body = await self._read_body(request)
            headers = {k.lower(): v for k, v in request.headers.items()}
            try:
                query_text = query.decode("utf-8")
            except UnicodeDecodeError:
                raise CloudError("InvalidParameter", "The query string is not valid UTF-8.", 400) from None
            try:
                authed = self.auth.verify(request.method, "/", query_text, headers, body)
            except CloudError as err:
                self.metrics.auth_failures.labels(err.code).inc()
                raise
            action = authed.action
            product = self.products.get(authed.version)
            if product is None:
                raise CloudError("InvalidVersion", f"Specified parameter Version "
                                 f"\"{authed.version[:32]}\" is not valid; versions: "
                                 f"{', '.join(sorted(self.products))}.", 400)
            product_name = product.name
            caller = Caller(account=authed.account, access_key_id=authed.access_key_id,
                            source_ip=request.client.host if request.client else "",
                            user_agent=request.headers.get("user-agent", "")[:512],
                            event_type="ApiCall")
            result = self.service.invoke(product, authed.action, authed.params, caller, request_id)
        except CloudError as err:
            self.metrics.requests.labels(product_name or "unknown",
                                         action[:64] if product_name else "unknown",
                                         err.code).inc()
            self.metrics.latency.labels(product_name or "unknown").observe(
                time.perf_counter() - started)
            return _json(error_body(err, request_id, product_name), err.status)
        except Exception:  # a bug, never a user's mistake: log it, answer InternalError
            log.exception("internal error answering %s", action)
            err = CloudError("InternalError", "The request processing has failed due to some "
                             "unknown error.", 500)
            return _json(error_body(err, request_id, product_name), 500)
        self.metrics.requests.labels(product_name, action, "Success").inc()
        self.metrics.latency.labels(product_name).observe(time.perf_counter() - started)
        return _json(result)

    async def metrics_endpoint(self, request: Request) -> Response:
        for rtype, count in self.store.db.execute(
                "SELECT rtype, COUNT(*) FROM resources WHERE rtype != 'client_token' GROUP BY rtype"):
            self.metrics.resources.labels(rtype).set(count)
        return Response(generate_latest(self.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def favicon(self, request: Request) -> Response:
        # Browsers ask for it on every console page; without this route it would reach OSS.
        return Response(status_code=204)

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "accounts": len(self.accounts)})

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/metrics", self.metrics_endpoint, methods=["GET"]),
            Route("/healthz", self.healthz, methods=["GET"]),
            Route("/favicon.ico", self.favicon, methods=["GET"]),
            *self.console_routes,
            Route("/", self.rpc, methods=["GET", "POST", "PUT", "DELETE", "HEAD"]),
            Route("/{bucket}", self.oss.handle, methods=["GET", "POST", "PUT", "DELETE", "HEAD"]),
            Route("/{bucket}/", self.oss.handle, methods=["GET", "POST", "PUT", "DELETE", "HEAD"]),
            Route("/{bucket}/{key:path}", self.oss.handle,
                  methods=["GET", "POST", "PUT", "DELETE", "HEAD"]),
        ]


def build_app(config: SimConfig, accounts: list[Account] | None = None) -> Starlette:
    cloud = CloudApp(config, accounts)
    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette):
        yield
        cloud.store.close()

    # The console's same-origin check sees every console request before its route does.
    app = Starlette(routes=cloud.routes(), lifespan=lifespan, middleware=[
        Middleware(SameOriginGuard, refuse=cloud.console.refuse_cross_site)])
    app.state.cloud = cloud
    return ClockedApp(app, cloud.faults)


class ClockedApp:
    """The cloud's ASGI app behind its clock: every request first takes up the fault
    settings (``faults.py``), and every response carries a ``Date`` header of the cloud's
    clock (the one clients estimate the cloud's clock from; the server's own is off)."""

    def __init__(self, app: Starlette, faults: FaultFile):
        self.app, self.faults = app, faults
        self.state = app.state

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.faults.refresh()

        async def dated(message: dict) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", [])
                           if k.lower() != b"date"]
                headers.append((b"date", formatdate(timeutil.now_s(), usegmt=True).encode()))
                message = {**message, "headers": headers}
            await send(message)
        await self.app(scope, receive, dated)
