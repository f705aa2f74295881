"""A Python client of the console-rl jobs API (``/v1``), for other teams.

It needs only the standard library, ``httpx``, ``httpx-sse``, ``pydantic`` (the event models
of :mod:`.schema`) and :mod:`consolerl.errors`::

    from jobsapi.client import ApiError, JobsClient

    with JobsClient("http://rl.internal:8000", token=os.environ["CONSOLE_RL_TOKEN"]) as api:
        job = api.submit(tasks={"split": "heldout"}, samples_per_task=4,
                         sampling={"temperature": 0.7}, idempotency_key="docs-2024-06-01")
        for event in api.events(job["id"]):                     # reconnects by itself
            print(event.type, event.payload)                    # ... until job.completed
        for row in api.results(job["id"], verdict="failure"):   # every page
            print(row["task_id"], api.rollout(job["id"], row["id"])["reasons"])
        print(api.report(job["id"])["totals"])
    # Errors: ApiError(status, message, retry_after); status 0 when the server is unreachable.

The command line over it is :mod:`.cli` (``console-rl``).
"""
from __future__ import annotations

import email.utils
import json
import time
from collections.abc import Iterator
from typing import Any, NamedTuple, Self
from urllib.parse import quote

import httpx
from httpx_sse import SSEError, connect_sse

from consolerl.errors import ConsoleRLError    # stdlib-only: the client stays light

from .schema import JobEvent, parse_event      # pydantic only (a test keeps it so)

__all__ = ["TERMINAL_STATES", "ApiError", "JobsClient", "StreamEvent"]

TERMINAL_STATES = frozenset({"completed", "failed", "cancelled", "expired"})


class ApiError(ConsoleRLError, RuntimeError):
    """An error answer of the API (``status`` 401, 403, 404, 422, 429, 5xx), or ``status`` 0
    when the server could not be reached. ``retry_after``: seconds, when the server said."""

    def __init__(self, status: int, message: str, retry_after: float | None = None):
        self.status, self.message, self.retry_after = status, message, retry_after
        super().__init__(str(self))

    def __str__(self) -> str:
        head = f"HTTP {self.status}: " if self.status else ""
        tail = f" (retry after {self.retry_after:g} s)" if self.retry_after is not None else ""
        return f"{head}{self.message}{tail}"

    def __repr__(self) -> str:
        return f"ApiError({self.status}, {self.message!r}, retry_after={self.retry_after!r})"

    def __reduce__(self):
        return (type(self), (self.status, self.message, self.retry_after))


def _detail_text(detail: Any) -> str:
    """A body's ``detail`` as one line: a string as is; FastAPI's list of {loc, msg} as
    ``field.path: msg; ...``."""
    if isinstance(detail, str):
        return detail
    if isinstance(detail, list):
        parts = []
        for item in detail:
            if isinstance(item, dict):
                loc = ".".join(str(p) for p in item.get("loc", ()) if p != "body")
                msg = str(item.get("msg", item))
                parts.append(f"{loc}: {msg}" if loc else msg)
            else:
                parts.append(str(item))
        return "; ".join(parts) or "invalid request"
    return json.dumps(detail) if detail is not None else ""


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, round(when.timestamp() - time.time()))


class StreamEvent(NamedTuple):
    """One event of a job's stream: its ``id`` (resume after it), its ``type`` and its ``data``
    as sent (a dict; unpacks as ``(id, type, data)``); :attr:`payload` is that data as the
    type's model (:class:`~.schema.JobStatusEvent`, ...)."""

    id: str
    type: str
    data: dict[str, Any]

    @property
    def payload(self) -> JobEvent:
        """The data as its model; ``ValueError`` for a type this client does not know (a
        newer server's) or a malformed event."""
        return parse_event(self.type, self.data)


class JobsClient:
    """A synchronous client; ``token``: the team's bearer token (``crl_...``), never shown
    in a repr or an error. Use it as a context manager, or call :meth:`close`."""

    def __init__(self, base_url: str, token: str, timeout: float = 30.0):
        token = (token or "").strip()
        if not token or not token.isascii() or not token.isprintable() or " " in token:
            raise ValueError("a bearer token (crl_...) is required")
        self.base_url = base_url.rstrip("/")
        self._token = token
        self._timeout = timeout
        # Streams wait longer between bytes: the server sends a keep-alive every 15 s.
        self._stream_timeout = httpx.Timeout(timeout, read=max(timeout, 60.0))
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout, headers={
            "Authorization": f"Bearer {token}", "User-Agent": "console-rl-client/1"})

    def __repr__(self) -> str:
        return f"JobsClient({self.base_url!r})"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # ---- plumbing -------------------------------------------------------------------------------
    def _scrub(self, text: str) -> str:
        return text.replace(self._token, "crl_***")

    def _error(self, response: httpx.Response) -> ApiError:
        try:
            body = response.json()
            message = _detail_text(body.get("detail", body) if isinstance(body, dict) else body)
        except ValueError:
            message = response.text.strip()[:300] or response.reason_phrase
        return ApiError(response.status_code, self._scrub(message),
                        _retry_after(response.headers.get("retry-after")))

    def _unreachable(self, exc: Exception) -> ApiError:
        return ApiError(0, self._scrub(f"cannot reach {self.base_url}: "
                                       f"{type(exc).__name__}: {exc}"))

    def _request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None
        if response.status_code >= 400:
            raise self._error(response)
        return response

    def _json(self, method: str, path: str, **kw: Any) -> Any:
        return self._request(method, path, **kw).json()

    @staticmethod
    def _id(value: str) -> str:
        return quote(str(value), safe="")

    def _pages(self, path: str, params: dict[str, Any]) -> Iterator[dict[str, Any]]:
        after = None
        while True:
            page = self._json("GET", path, params={**params, **({"after": after} if after
                                                                 else {})})
            yield from page["data"]
            if not page.get("has_more") or not page.get("last_id"):
                return
            after = page["last_id"]

    # ---- jobs -----------------------------------------------------------------------------------
    def submit(self, tasks: dict[str, Any] | list[str], samples_per_task: int | None = None,
               model: str | None = None, sampling: dict[str, Any] | None = None,
               priority: int | None = None, deadline_s: float | None = None,
               idempotency_key: str | None = None,
               metadata: dict[str, str] | None = None) -> dict[str, Any]:
        """Submit a job; ``tasks``: one of ``{"ids": [...]}``, ``{"split": "heldout"}``,
        ``{"id_regex": "..."}`` (RE2 syntax), ``{"inline": [task, ...]}`` (a list of ids is taken as
        ``ids``). Options left None take the server's defaults."""
        selection = {"ids": list(tasks)} if isinstance(tasks, (list, tuple)) else tasks
        body: dict[str, Any] = {"tasks": selection}
        for key, value in (("samples_per_task", samples_per_task), ("model", model),
                           ("sampling", sampling), ("priority", priority),
                           ("deadline_s", deadline_s), ("metadata", metadata)):
            if value is not None:
                body[key] = value
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return self._json("POST", "/v1/jobs", json=body, headers=headers)

    def job(self, job_id: str) -> dict[str, Any]:
        return self._json("GET", f"/v1/jobs/{self._id(job_id)}")

    def jobs(self, limit: int = 20, after: str | None = None) -> dict[str, Any]:
        """One page of the team's jobs, newest first: ``{data, has_more, last_id}``."""
        params: dict[str, Any] = {"limit": limit, **({"after": after} if after else {})}
        return self._json("GET", "/v1/jobs", params=params)

    def iter_jobs(self, page_size: int = 50) -> Iterator[dict[str, Any]]:
        """Every job of the team, newest first, page after page."""
        return self._pages("/v1/jobs", {"limit": page_size})

    def cancel(self, job_id: str) -> dict[str, Any]:
        return self._json("POST", f"/v1/jobs/{self._id(job_id)}/cancel")

    def events(self, job_id: str, last_event_id: str | None = None, *,
               max_retries: int = 5, backoff_s: float = 0.5
               ) -> Iterator[StreamEvent]:
        """The job's events as :class:`StreamEvent` ``(id, type, data)`` with the typed
        ``payload``, from the start (or after
        ``last_event_id``) until ``job.completed``. When the server ends the stream or the
        connection drops, it reconnects with ``Last-Event-ID`` (nothing missed, nothing
        twice); after ``max_retries`` failed connections in a row it raises ApiError."""
        path = f"/v1/jobs/{self._id(job_id)}/events"
        last, failures = last_event_id, 0
        while True:
            got_any = False
            try:
                headers = {"Last-Event-ID": last} if last else {}
                with connect_sse(self._http, "GET", path, headers=headers,
                                 timeout=self._stream_timeout) as source:
                    response = source.response
                    if response.status_code >= 400:
                        response.read()
                        error = self._error(response)
                        if response.status_code < 500:
                            raise error
                        raise _Retry(str(error))
                    for sse in source.iter_sse():
                        if not sse.data and sse.event in ("", "message"):
                            continue     # a keep-alive comment (it keeps the last id)
                        try:
                            data = json.loads(sse.data) if sse.data else {}
                        except ValueError:
                            data = {"raw": sse.data}
                        last = sse.id or last
                        got_any, failures = True, 0
                        yield StreamEvent(sse.id, sse.event, data)
                        if sse.event == "job.completed":
                            return
            except (httpx.TransportError, SSEError, _Retry) as exc:
                failures += 1
                if failures > max_retries:
                    raise ApiError(0, self._scrub(
                        f"the event stream of {job_id} was lost {failures} times in a row "
                        f"(last: {type(exc).__name__}: {exc})")) from None
                time.sleep(min(backoff_s * 2 ** (failures - 1), 10.0))
                continue
            # The server ended the stream (it does after a while): resume, unless the job
            # has ended and there is nothing more to read.
            if not got_any and self.job(job_id)["state"] in TERMINAL_STATES:
                return

    # ---- results --------------------------------------------------------------------------------
    def results(self, job_id: str, verdict: str | None = None, task_id: str | None = None,
                page_size: int = 100) -> Iterator[dict[str, Any]]:
        """The job's rollouts (summaries) in task order, every page."""
        params = {k: v for k, v in (("verdict", verdict), ("task_id", task_id),
                                    ("limit", page_size)) if v is not None}
        return self._pages(f"/v1/jobs/{self._id(job_id)}/results", params)

    def rollout(self, job_id: str, rollout_id: str) -> dict[str, Any]:
        return self._json("GET", f"/v1/jobs/{self._id(job_id)}/rollouts/"
                                 f"{self._id(rollout_id)}")

    def report(self, job_id: str) -> dict[str, Any]:
        return self._json("GET", f"/v1/jobs/{self._id(job_id)}/report",
                          headers={"Accept": "application/json"})

    def report_html(self, job_id: str) -> str:
        return self._request("GET", f"/v1/jobs/{self._id(job_id)}/report.html").text

    def artifact(self, artifact_id: str) -> bytes:
        return self._request("GET", f"/v1/artifacts/{self._id(artifact_id)}").content

    # ---- documentation ------------------------------------------------------------------------
    def docs(self, pages: list[dict[str, str]], drift: str = "", run: bool = False,
             samples: int | None = None, model: str | None = None,
             idempotency_key: str | None = None) -> dict[str, Any]:
        """Check pages of documentation (``POST /v1/docs``): ``pages`` as ``{"name",
        "content", "content_type"}`` (text/markdown or text/html); with ``run`` the answer's
        ``job`` runs the drafted tasks (follow it with :meth:`events`, read :meth:`report`)."""
        body: dict[str, Any] = {"pages": pages, "drift": drift, "run": run}
        for key, value in (("samples", samples), ("model", model)):
            if value is not None:
                body[key] = value
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return self._json("POST", "/v1/docs", json=body, headers=headers,
                          timeout=max(self._timeout, 120.0))

    # ---- catalog and account --------------------------------------------------------------------
    def tasks(self, product: str | None = None, split: str | None = None,
              q: str | None = None) -> list[dict[str, Any]]:
        params = {k: v for k, v in (("product", product), ("split", split), ("q", q)) if v}
        return self._json("GET", "/v1/tasks", params=params)["data"]

    def validate(self, tasks: list[dict[str, Any]]) -> dict[str, Any]:
        """Check task definitions as the server would: ``{valid, errors, task_ids}``."""
        return self._json("POST", "/v1/tasks/validate", json={"tasks": tasks})

    def quota(self) -> dict[str, Any]:
        return self._json("GET", "/v1/quota")

    def models(self) -> list[str]:
        return self._json("GET", "/v1/models")["data"]


class _Retry(ConsoleRLError, RuntimeError):
    """A 5xx answer to an event stream: retried like a dropped connection."""
