"""The service layer of the local cloud: every change, from the OpenAPI or (later) the console
UI, goes through :meth:`CloudService.invoke`, which runs the action in one transaction and
appends its ActionTrail event (also for failed calls, with their errorCode)."""
from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import timeutil
from . import ids
from consolerl.accounts import Account
from .config import SimConfig
from .errors import CloudError
from .params import Params
from .store import Store
from .timeutil import iso

_SECRET_PARAM = re.compile(r"password|secret|privatekey", re.IGNORECASE)
# Parameters of the request envelope (signing), not of the action; never logged.
ENVELOPE_PARAMS = frozenset({
    "Action", "Version", "Format", "Timestamp", "SignatureNonce", "SignatureMethod",
    "SignatureVersion", "Signature", "AccessKeyId", "SecurityToken", "SignatureType",
})


@dataclass(frozen=True)
class Caller:
    """Who makes a call and from where; becomes the event's userIdentity, sourceIpAddress,
    userAgent and eventType."""

    account: Account
    access_key_id: str = ""
    source_ip: str = "127.0.0.1"
    user_agent: str = ""
    event_type: str = "ApiCall"   # or "ConsoleOperation"


@dataclass
class CallContext:
    store: Store
    config: SimConfig
    caller: Caller
    region: str
    now_ms: int
    resources: dict[str, list[str]] = field(default_factory=dict)
    runtime: dict[str, Any] = field(default_factory=dict)   # in-memory state of the service

    @property
    def account_id(self) -> str:
        return self.caller.account.account_id

    @property
    def tick_ms(self) -> int:
        """The machine's own clock, for durations (status transitions): a skewed or stepped
        cloud clock (``now_ms``, see faults.py) moves reported times, not how long things
        take."""
        return int(time.time() * 1000)

    def ref(self, rtype: str, *rids: str) -> None:
        """Record resources this call references (for referencedResources)."""
        seen = self.resources.setdefault(rtype, [])
        for rid in rids:
            if rid and rid not in seen:
                seen.append(rid)


Handler = Callable[[CallContext, Params], dict[str, Any]]


@dataclass(frozen=True)
class ActionSpec:
    name: str
    handler: Handler
    rw: str                       # "Read" or "Write"
    resource_type: str = ""


@dataclass
class Product:
    """One cloud product's API: ``name`` as ActionTrail's serviceName (``Ecs``), ``version``
    as in x-acs-version, ``host`` its endpoint host (eventSource), ``global_`` for products
    without regions (RAM)."""

    name: str
    version: str
    host: str
    console_host: str
    global_: bool = False
    actions: dict[str, ActionSpec] = field(default_factory=dict)

    def action(self, name: str, rw: str = "Write", resource_type: str = ""):
        def register(fn: Handler) -> Handler:
            self.actions[name] = ActionSpec(name, fn, rw, resource_type)
            return fn
        return register


def redact(params: dict[str, str]) -> dict[str, str]:
    return {k: ("******" if _SECRET_PARAM.search(k.split(".")[-1]) else v)
            for k, v in params.items() if k not in ENVELOPE_PARAMS}


class CloudService:
    def __init__(self, store: Store, config: SimConfig, products: dict[str, Product]):
        self.store = store
        self.config = config
        self.products = products            # by serviceName: Ecs, Vpc, Ram, Actiontrail, Oss
        self.on_event: list[Callable[[dict[str, Any]], None]] = []
        self.runtime: dict[str, Any] = {}

    def invoke(self, product: Product, action: str, raw: dict[str, str], caller: Caller,
               request_id: str | None = None) -> dict[str, Any]:
        """Run ``action`` and audit it. Returns the response body with RequestId; raises
        :class:`CloudError` (after auditing the failure) when the action fails."""
        request_id = request_id or ids.request_id()
        spec = product.actions.get(action)
        if spec is None:
            raise CloudError("InvalidAction.NotFound",
                             f"Specified api is not found, please check your url and method. "
                             f"({product.name} {product.version} has no action {action!r})", 404)
        params = Params(raw)
        now_ms = timeutil.now_ms()
        # Handlers set the region once they have validated RegionId (or found the resource).
        ctx = CallContext(self.store, self.config, caller, "", now_ms, runtime=self.runtime)
        try:
            with self.store.tx():
                body = spec.handler(ctx, params)
                self._append_event(product, spec, raw, caller, ctx, request_id, body, None)
        except CloudError as err:
            with self.store.tx():
                self._append_event(product, spec, raw, caller, ctx, request_id, None, err)
            raise
        return {"RequestId": request_id, **body}

    def read(self, product: Product, action: str, raw: dict[str, str], caller: Caller
             ) -> dict[str, Any]:
        """Run a read-only action without auditing it: how console page views read state (a page
        view is not an API call and must not appear in ActionTrail). Refuses write actions."""
        spec = product.actions.get(action)
        if spec is None or spec.rw != "Read":
            raise ValueError(f"{product.name} {action} is not a read action")
        ctx = CallContext(self.store, self.config, caller, "", timeutil.now_ms(),
                          runtime=self.runtime)
        with self.store.tx():
            return spec.handler(ctx, Params(raw))

    def _append_event(self, product: Product, spec: ActionSpec, raw: dict[str, str],
                      caller: Caller, ctx: CallContext, request_id: str,
                      body: dict[str, Any] | None, err: CloudError | None) -> None:
        account = caller.account
        resources = {t: list(v) for t, v in ctx.resources.items() if v}
        rtype = spec.resource_type or (next(iter(resources)) if resources else "")
        names = resources.get(rtype, []) if rtype else []
        console = caller.event_type == "ConsoleOperation"
        event = {
            "eventId": str(uuid.uuid4()).upper(),
            "eventName": spec.name,
            "eventSource": product.console_host if console else product.host,
            "eventTime": iso(ctx.now_ms),
            "eventType": caller.event_type,
            "eventRW": spec.rw,
            "eventVersion": "1",
            "acsRegion": ctx.region or ("cn-hangzhou" if product.global_ else ""),
            "serviceName": product.name,
            "apiVersion": product.version,
            "requestId": request_id,
            "requestParameters": redact(raw),
            "responseElements": (redact_deep(body) if body is not None and spec.rw == "Write"
                                 else None),
            "referencedResources": resources,
            "resourceName": ";".join(names),
            "resourceType": rtype,
            "errorCode": err.code if err else "",
            "errorMessage": err.message if err else "",
            "sourceIpAddress": caller.source_ip,
            "userAgent": caller.user_agent,
            "isGlobal": product.global_,
            "userIdentity": {
                "type": "root-account",
                "principalId": account.account_id,
                "accountId": account.account_id,
                "accessKeyId": caller.access_key_id,
                "userName": "root",
            },
        }
        cur = self.store.db.execute(
            "INSERT INTO events (account_id, event_ms, event_id, event_name, service_name,"
            " user_name, event_rw, access_key_id, body) VALUES (?,?,?,?,?,?,?,?,?)",
            (account.account_id, ctx.now_ms, event["eventId"], spec.name, product.name, "root",
             spec.rw, caller.access_key_id, json.dumps(event, separators=(",", ":"))))
        seq = cur.lastrowid
        rows = [(seq, account.account_id, t, name) for t, names_ in resources.items()
                for name in names_]
        if rows:
            self.store.db.executemany(
                "INSERT INTO event_resources (seq, account_id, rtype, rname) VALUES (?,?,?,?)", rows)
        for hook in self.on_event:
            hook(event)


def redact_deep(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: ("******" if _SECRET_PARAM.search(k) else redact_deep(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_deep(v) for v in value]
    return value
