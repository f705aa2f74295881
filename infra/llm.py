"""One chat client for every LLM the project asks: the reward service's judges, the
ResourceCoder and any teacher. :class:`ChatClient` is what they accept (anything with
``complete(messages) -> str``); :class:`OpenAIChatClient` speaks to any OpenAI-compatible
``/v1/chat/completions`` endpoint, the project's own policy server included; :class:`ChatError`
is every endpoint failure. The model's text is returned as it is: callers parse it, never run
it.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import httpx

from consolerl.errors import ConfigError, ConsoleRLError

log = logging.getLogger(__name__)


class ChatError(ConsoleRLError, RuntimeError):
    """The chat endpoint failed. ``kind``: ``transport`` (no connection, reset), ``timeout``
    (no answer in time), ``http`` (an error status, in ``status``), ``malformed`` (a 200
    without a text completion), or "" (not said); ``status``: the HTTP status, 0 when there
    was no HTTP answer. Callers retry on ``transport``, 5xx and 429 (the judge channel does)."""

    def __init__(self, message: str, status: int = 0, kind: str = ""):
        super().__init__(message)
        self.message, self.status, self.kind = message, status, kind

    def __reduce__(self):
        return (type(self), (self.message, self.status, self.kind))


class ChatClient(Protocol):
    """Anything that answers a chat: ``messages`` are ``{"role", "content"}`` dicts; returns
    the assistant's text. An endpoint failure should raise :class:`ChatError`."""

    def complete(self, messages: Sequence[Mapping[str, str]]) -> str: ...


class OpenAIChatClient:
    """``POST {base_url}/v1/chat/completions`` (``base_url`` may already end in ``/v1``).

    The API key is read from the environment variable named ``api_key_env`` (``None``: send no
    key, e.g. to a local policy server) and sent only as the ``Authorization`` header; it is
    never logged or shown by ``repr``.
    """

    def __init__(self, base_url: str, model: str, api_key_env: str | None = "OPENAI_API_KEY",
                 timeout_s: float = 60.0, temperature: float = 0.0, max_tokens: int = 2048,
                 transport: httpx.BaseTransport | None = None):
        if not base_url.startswith(("http://", "https://")):
            raise ConfigError(f"OpenAIChatClient.base_url: must start with http:// or https://,"
                              f" got {base_url!r}")
        if not model:
            raise ConfigError("OpenAIChatClient.model: required")
        root = base_url.rstrip("/")
        self.url = root + ("/chat/completions" if root.endswith("/v1")
                           else "/v1/chat/completions")
        self.model = model
        self.temperature = temperature
        self.max_tokens = max_tokens
        headers = {"Content-Type": "application/json"}
        if api_key_env is not None:
            key = os.environ.get(api_key_env, "")
            if not key:
                raise ConfigError(f"OpenAIChatClient.api_key_env: environment variable "
                                  f"{api_key_env} is not set (use api_key_env=None for an "
                                  "endpoint without a key)")
            headers["Authorization"] = f"Bearer {key}"
        self._http = httpx.Client(timeout=timeout_s, headers=headers, transport=transport)

    def __repr__(self) -> str:
        return f"OpenAIChatClient(url={self.url!r}, model={self.model!r})"

    def close(self) -> None:
        self._http.close()

    def complete(self, messages: Sequence[Mapping[str, str]],
                 timeout_s: float | None = None,
                 response_format: Mapping[str, Any] | None = None) -> str:
        """The assistant's text; ``timeout_s``: this call's timeout (default: the client's);
        ``response_format``: sent as the request's ``response_format`` (e.g. ``{"type":
        "json_schema", "json_schema": {"name", "schema"}}`` for structured output; an endpoint
        that does not support it answers an error status, a :class:`ChatError`)."""
        body: dict[str, Any] = {"model": self.model, "messages": [dict(m) for m in messages],
                                "temperature": self.temperature, "max_tokens": self.max_tokens}
        if response_format is not None:
            body["response_format"] = dict(response_format)
        log.debug("chat request to %s (model %s, %d messages)", self.url, self.model,
                  len(messages))
        extra = {} if timeout_s is None else {"timeout": timeout_s}
        try:
            response = self._http.post(self.url, json=body, **extra)
        except httpx.TimeoutException as exc:
            raise ChatError(f"{self.url}: {type(exc).__name__}: {exc}", 0, "timeout") from None
        except httpx.HTTPError as exc:
            raise ChatError(f"{self.url}: {type(exc).__name__}: {exc}", 0, "transport") from None
        if response.status_code != 200:
            raise ChatError(f"{self.url}: HTTP {response.status_code}: {response.text[:300]}",
                            response.status_code, "http")
        try:
            content = response.json()["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise ChatError(f"{self.url}: response has no choices[0].message.content: "
                            f"{response.text[:300]}", 200, "malformed") from None
        if not isinstance(content, str):
            raise ChatError(f"{self.url}: choices[0].message.content is not text", 200,
                            "malformed")
        return content
