"""What the HTTP fuzz tests (``test_fuzz_http_*.py``, one per surface) share: the properties
every answer must have, the counting, the local cloud they run against, and the hostile values.

Properties, per request: an answer (or, for broken HTTP, a closed connection) within
``REQUEST_S`` seconds, and never a 5xx. A 5xx fails the test with the server log's last
traceback. Hypothesis runs derandomized: the example counts are fixed (in each test's
``fuzz(N)``, its id, and the ``FUZZ <name>: N examples`` line it prints; ``pytest -rP``).

The fixtures :func:`fuzz_cloud` and :func:`web` are module-scoped: a test module that imports
them gets a ``python -m infra.console_sim`` process of its own
(:class:`tests.conftest.CloudServer`, its own state).
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import time
from collections.abc import Iterator
from urllib.parse import quote

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error, response_schema_conformance

from tests.conftest import CloudServer, _server

REQUEST_S = 2.0            # the bound on one request's answer
CONSOLE, API = 0, 1        # account indices: the console's and the OpenAPI's
REGION = "cn-hangzhou"


def fuzz(n: int) -> settings:
    return settings(max_examples=n, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))


class Tally:
    """Counts one test's examples and its slowest answer; prints them at the end."""

    def __init__(self, name: str, cloud: CloudServer | None = None):
        self.name, self.cloud = name, cloud
        self.runs, self.slowest, self.statuses = 0, 0.0, {}

    def __enter__(self) -> "Tally":
        return self

    def __exit__(self, *exc: object) -> None:
        seen = ", ".join(f"{k}: {v}" for k, v in sorted(self.statuses.items(), key=str))
        print(f"FUZZ {self.name}: {self.runs} examples, slowest {self.slowest * 1000:.0f} ms, "
              f"statuses {{{seen}}}")

    def check(self, status: int | None, elapsed: float, what: object, code: str = "") -> None:
        """One answer: no 5xx, in time. ``code``: the error code, counted with the status."""
        self.runs += 1
        self.slowest = max(self.slowest, elapsed)
        key = f"{status} {code}" if code else status
        self.statuses[key] = self.statuses.get(key, 0) + 1
        assert elapsed < REQUEST_S, f"{self.name}: {elapsed:.2f} s for {show(what)}"
        assert status is None or status < 500, \
            f"{self.name}: HTTP {status} for {show(what)}\n{self._last_traceback()}"

    def _last_traceback(self) -> str:
        if self.cloud is None:
            return ""
        log = (self.cloud.state_dir / "server.log").read_text(errors="replace")
        start = log.rfind("Traceback")
        return log[start:][-3000:] if start >= 0 else "(no traceback in the server log)"


def show(value: object) -> str:
    text = repr(value)
    return text if len(text) < 600 else text[:600] + f"... ({len(text)} chars)"


# ---- the local cloud -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def fuzz_cloud(tmp_path_factory) -> Iterator[CloudServer]:
    """A server of its own: the fuzz creates and deletes resources, signs in and out and
    fails sign-ins from 127.0.0.1 (the address lockout would refuse other tests' sign-ins)."""
    yield from _server(tmp_path_factory, "fuzz-http", ["--lookup-qps", "0", "--transition",
                                                       "0.3", "--network-ready", "0.1"])


@pytest.fixture(scope="module")
def web(fuzz_cloud) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=fuzz_cloud.url, timeout=REQUEST_S * 2,
                      follow_redirects=False) as client:
        yield client


def timed(client: httpx.Client, method: str, url: str, **kw) -> tuple[int | None, float]:
    started = time.perf_counter()
    try:
        status: int | None = client.request(method, url, **kw).status_code
    except httpx.RemoteProtocolError:
        status = None          # the server closed the connection without an answer
    return status, time.perf_counter() - started


anychar = st.characters(codec="utf-8", exclude_categories=["Cs"])
text = st.text(anychar, max_size=40)
# Header values the HTTP layer lets through (visible ASCII, spaces inside).
htext = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=60).map(
    str.strip)
huge = st.integers(1, 12_000).map(lambda n: "x" * n)
values = st.one_of(text, huge, st.sampled_from([
    "", "-1", "0", "1e9", "9" * 30, "null", "[]", '["i-1"]', "[" * 3000, '{"a":' * 100,
    "%zz", "%00", "0.0.0.0/0", "true", "cn-hangzhou", "ä", "\u202e", "../../etc/passwd",
    "<script>alert(1)</script>", "'; DROP TABLE resources; --", "${jndi:x}", "{{7*7}}"]))


def encode_query(params: dict[str, str]) -> str:
    return "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in params.items())



def oss_sign(secret: str, method: str, headers: dict[str, str], resource: str) -> str:
    """OSS signature V1, as oss2 computes it (``products/oss.py``'s rule, restated)."""
    lower = {k.lower(): v for k, v in headers.items()}
    oss_headers = "".join(f"{k}:{lower[k]}\n" for k in sorted(lower) if k.startswith("x-oss-"))
    date = lower.get("x-oss-date") or lower.get("date", "")
    to_sign = "\n".join([method, lower.get("content-md5", ""), lower.get("content-type", ""),
                         date, oss_headers + resource])
    return base64.b64encode(hmac.new(secret.encode(), to_sign.encode(),
                                     hashlib.sha1).digest()).decode()



def schema_cases(app, n: int, name: str, headers: dict[str, str] | None = None) -> Tally:
    """Every operation of the app's OpenAPI document, ``n`` generated requests each (valid and
    invalid by the document: schemathesis's positive and negative modes), in process over
    ASGI: no 5xx, responses as documented. (An operation without parameters has one request
    to make: Hypothesis stops after it.)"""
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    operations = [result.ok() for result in schema.get_all_operations()]
    tally = Tally(name)
    for operation in operations:
        @fuzz(n)
        @given(case=operation.as_strategy(GenerationMode.POSITIVE) |
               operation.as_strategy(GenerationMode.NEGATIVE))
        def run(case):
            started = time.perf_counter()
            response = case.call_and_validate(
                headers=headers, checks=[not_a_server_error, response_schema_conformance])
            tally.check(response.status_code, time.perf_counter() - started,
                        (case.method, case.path, case.body))
        run()
    tally.operations = len(operations)
    return tally
