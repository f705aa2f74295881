"""SDK-backed cloud client.

Every cloud call in console-rl goes through :class:`CloudClient`: typed product SDK clients
(ECS, VPC, RAM, ActionTrail; ``oss2`` for OSS) and a generic :meth:`CloudClient.rpc` for
allow-listed actions given as parameter dicts. SDK exceptions become
:class:`consolerl.errors.CloudAPIError` with the cloud's error code.

Pointing at the real cloud is one setting: leave ``endpoint`` unset and each product SDK
resolves its regional endpoint (``ecs.cn-hangzhou.aliyuncs.com`` ...), OSS uses
``https://oss-<region>.aliyuncs.com``.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from alibabacloud_tea_openapi.client import Client as OpenApiClient
from alibabacloud_tea_openapi.utils_models import Config as SdkConfig
from alibabacloud_tea_openapi.utils_models import OpenApiRequest, Params
from darabonba.runtime import RuntimeOptions
from Tea.exceptions import TeaException

from consolerl.config import Checked
from consolerl.errors import CloudAPIError, ConfigError

T = TypeVar("T")

# product -> (API version, SDK module, endpoint-less default host for generic calls)
PRODUCTS: dict[str, tuple[str, str]] = {
    "Ecs": ("2014-05-26", "alibabacloud_ecs20140526.client"),
    "Vpc": ("2016-04-28", "alibabacloud_vpc20160428.client"),
    "Ram": ("2015-05-01", "alibabacloud_ram20150501.client"),
    "Actiontrail": ("2020-07-06", "alibabacloud_actiontrail20200706.client"),
}


@dataclass(frozen=True)
class Credentials:
    """An AccessKey pair. ``repr`` never shows the secret."""

    access_key_id: str
    access_key_secret: str = field(repr=False)

    @classmethod
    def from_env(cls) -> Credentials:
        key = os.environ.get("ALIBABA_CLOUD_ACCESS_KEY_ID", "")
        secret = os.environ.get("ALIBABA_CLOUD_ACCESS_KEY_SECRET", "")
        if not key or not secret:
            raise ConfigError("ALIBABA_CLOUD_ACCESS_KEY_ID and ALIBABA_CLOUD_ACCESS_KEY_SECRET "
                              "must be set")
        return cls(key, secret)


@dataclass(frozen=True)
class CloudConfig(Checked):
    """Where the cloud is. ``endpoint=None`` means the real Alibaba Cloud.

    ``signature`` is ``"v3"`` (ACS3-HMAC-SHA256, the SDK default) or ``"v2"`` (RPC HMAC-SHA1).
    Timeouts are in milliseconds.
    """

    endpoint: str | None = "127.0.0.1:18080"
    protocol: Literal["http", "https"] = "http"
    region_id: str = "cn-hangzhou"
    signature: Literal["v2", "v3"] = "v3"
    connect_timeout_ms: int = 5000
    read_timeout_ms: int = 10000
    max_attempts: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.endpoint is not None and ("/" in self.endpoint or not self.endpoint.strip()):
            raise ConfigError("CloudConfig.endpoint is host[:port] without scheme or path, "
                              f"got {self.endpoint!r}")

    @property
    def is_local(self) -> bool:
        return self.endpoint is not None

    def oss_endpoint(self) -> str:
        if self.endpoint is not None:
            return f"{self.protocol}://{self.endpoint}"
        return f"https://oss-{self.region_id}.aliyuncs.com"


def _api_error(exc: TeaException, action: str) -> CloudAPIError:
    data = getattr(exc, "data", None) or {}
    status = getattr(exc, "status_code", None) or getattr(exc, "statusCode", None) \
        or data.get("statusCode") or 0
    # The SDK's message wraps the cloud's ("code: 400, <Message> request id: ..."); the error
    # body it keeps in ``data`` holds the cloud's own words.
    message = data.get("Message") or exc.message or str(exc)
    return CloudAPIError(str(exc.code or "Unknown"), str(message), int(status),
                         str(data.get("RequestId", "")), action)


class CloudClient:
    """Cloud clients for one account. Thread-compatible: one instance per thread or actor."""

    def __init__(self, config: CloudConfig, credentials: Credentials):
        self.config = config
        self.credentials = credentials
        self._clients: dict[str, Any] = {}
        self._user_agent = ""

    @property
    def user_agent(self) -> str:
        """Appended to the SDKs' user agent of every call (the audit log records it)."""
        return self._user_agent

    @user_agent.setter
    def user_agent(self, value: str) -> None:
        if value != self._user_agent:
            self._user_agent = value
            self._clients.clear()           # the SDK clients take it when they are built

    def _sdk_config(self) -> SdkConfig:
        cfg = SdkConfig(access_key_id=self.credentials.access_key_id,
                        access_key_secret=self.credentials.access_key_secret,
                        region_id=self.config.region_id, protocol=self.config.protocol,
                        connect_timeout=self.config.connect_timeout_ms,
                        read_timeout=self.config.read_timeout_ms)
        if self.config.endpoint is not None:
            cfg.endpoint = self.config.endpoint
        if self.config.signature == "v2":
            cfg.signature_algorithm = "v2"
        if self._user_agent:
            cfg.user_agent = self._user_agent
        return cfg

    def sdk(self, product: str) -> Any:
        """The official SDK client of ``product`` (``Ecs``, ``Vpc``, ``Ram``, ``Actiontrail``)."""
        if product not in PRODUCTS:
            raise ConfigError(f"unknown product {product!r}; known: {', '.join(PRODUCTS)}")
        client = self._clients.get(product)
        if client is None:
            module = __import__(PRODUCTS[product][1], fromlist=["Client"])
            client = self._clients[product] = module.Client(self._sdk_config())
        return client

    @property
    def ecs(self) -> Any:
        return self.sdk("Ecs")

    @property
    def vpc(self) -> Any:
        return self.sdk("Vpc")

    @property
    def ram(self) -> Any:
        return self.sdk("Ram")

    @property
    def actiontrail(self) -> Any:
        return self.sdk("Actiontrail")

    def oss_service(self) -> Any:
        import oss2
        return oss2.Service(self._oss_auth(), self.config.oss_endpoint(),
                            app_name=self._user_agent, connect_timeout=self.config.connect_timeout_ms / 1000)

    def oss_bucket(self, name: str) -> Any:
        import oss2
        return oss2.Bucket(self._oss_auth(), self.config.oss_endpoint(), name,
                           app_name=self._user_agent, connect_timeout=self.config.connect_timeout_ms / 1000)

    def _oss_auth(self) -> Any:
        import oss2
        return oss2.Auth(self.credentials.access_key_id, self.credentials.access_key_secret)

    def runtime(self) -> RuntimeOptions:
        return RuntimeOptions(autoretry=self.config.max_attempts > 1,
                              max_attempts=self.config.max_attempts,
                              connect_timeout=self.config.connect_timeout_ms,
                              read_timeout=self.config.read_timeout_ms)

    def call(self, fn: Callable[..., T], request: Any, action: str = "") -> Any:
        """Call a typed SDK method (``client.ecs.describe_instances_with_options``) and return
        the response body model; errors become :class:`CloudAPIError`."""
        try:
            return fn(request, self.runtime()).body
        except TeaException as exc:
            raise _api_error(exc, action or getattr(fn, "__name__", "")) from None

    def call_with_headers(self, fn: Callable[..., T], request: Any, action: str = ""
                          ) -> tuple[Any, dict[str, str]]:
        """:meth:`call`, also returning the response's HTTP headers (``date``: the cloud's
        clock)."""
        try:
            response = fn(request, self.runtime())
        except TeaException as exc:
            raise _api_error(exc, action or getattr(fn, "__name__", "")) from None
        headers = {str(k).lower(): str(v) for k, v in (response.headers or {}).items()}
        return response.body, headers

    def rpc(self, product: str, action: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """A generic RPC call through the official OpenAPI client: ``params`` are already
        flattened (``Tag.1.Key``). Returns the response body as a dict."""
        if product not in PRODUCTS:
            raise ConfigError(f"unknown product {product!r}; known: {', '.join(PRODUCTS)}")
        client = self.sdk(product)
        query = {k: str(v) for k, v in (params or {}).items() if v is not None}
        api = Params(action=action, version=PRODUCTS[product][0], protocol="HTTPS", pathname="/",
                     method="POST", auth_type="AK", style="RPC", req_body_type="formData",
                     body_type="json")
        try:
            response = OpenApiClient.call_api(client, api, OpenApiRequest(query=query),
                                              self.runtime())
        except TeaException as exc:
            raise _api_error(exc, action) from None
        return response.get("body") or {}
