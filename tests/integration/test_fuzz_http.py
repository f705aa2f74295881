"""Fuzzing of the HTTP surfaces (issue 23, item 3): the local cloud's OpenAPI (RPC, signed
ACS3 and v1) and OSS REST API, its console (pages, forms, sign-in) and raw HTTP, all against a
real ``python -m infra.console_sim`` process (:class:`tests.conftest.CloudServer`, its own
state); then the reward API and the policy API from their OpenAPI documents (schemathesis,
in process over ASGI) plus hostile but well-typed scoring requests.

Properties, per request: an answer (or, for broken HTTP, a closed connection) within
``REQUEST_S`` seconds, and never a 5xx. A 5xx fails the test with the server log's last
traceback. Hypothesis runs derandomized: the example counts are fixed (in each test's
``fuzz(N)``, its id, and the ``FUZZ <name>: N examples`` line it prints; ``pytest -rP``).

The policy API runs on its real tokenizer (the default model's: the chat template is part of
the surface) with a fake engine: the tiny random model would generate up to ``max_tokens`` =
8,192 tokens per request, minutes for a few dozen examples.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import re
import socket
import time
import uuid
from collections.abc import Iterator
from email.utils import formatdate
from urllib.parse import quote, urlencode

import httpx
import pytest
import schemathesis
from schemathesis import GenerationMode
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error, response_schema_conformance
from starlette.routing import Route

from consolerl.accounts import Account
from consolerl.tasks import TASKS_DIR, load_suite
from infra.cloud import CloudClient, CloudConfig, Credentials
from infra.console_sim.app import CloudApp
from infra.console_sim.config import SimConfig
from infra.console_sim.products import rpc_products
from infra.console_sim.signing import (ACS3, acs3_signature, acs3_string_to_sign,
                                       rpc_v1_signature)
from reward_service.actiontrail import TrailConfig
from reward_service.service import RewardService, build_app as build_reward_app
from tests.conftest import CloudServer, _server, wait_for
from tests.integration.console_kit import sign_in_http

pytestmark = pytest.mark.timeout(240)

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
        assert elapsed < REQUEST_S, f"{self.name}: {elapsed:.2f} s for {_show(what)}"
        assert status is None or status < 500, \
            f"{self.name}: HTTP {status} for {_show(what)}\n{self._last_traceback()}"

    def _last_traceback(self) -> str:
        if self.cloud is None:
            return ""
        log = (self.cloud.state_dir / "server.log").read_text(errors="replace")
        start = log.rfind("Traceback")
        return log[start:][-3000:] if start >= 0 else "(no traceback in the server log)"


def _show(value: object) -> str:
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


def _encode(params: dict[str, str]) -> str:
    return "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in params.items())


# -- raw HTTP --

methods = st.sampled_from(["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH",
                           "TRACE", "CONNECT", "G\x00T", "get", "X" * 300])
path_pieces = st.sampled_from([
    "/", "/console", "/console/", "/console/static/", "/console/static/../../pyproject.toml",
    "/console/static/%2e%2e/%2e%2e/pyproject.toml", "//", "/healthz", "/metrics",
    "/favicon.ico", "/console/signin", "/console/ecs/instances/", "/bucket", "/b-1/", "?",
    "?acl", "#", "%00", "%ff", "%", "\u00e9".encode().decode("latin-1"), "*", "http://evil/",
    "/console/ram/users/%2F..%2F", ";", "&", "=", " ", "\t"])
raw_targets = st.lists(st.one_of(path_pieces, st.text(
    st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=10)), max_size=8).map(
    lambda parts: "".join(parts) or "/")
raw_headers = st.lists(st.one_of(
    st.sampled_from([b"Content-Length: 5", b"Content-Length: -1", b"Content-Length: 1" * 1,
                     b"Content-Length: " + b"9" * 5000, b"Content-Length: 0x10",
                     b"Content-Length: 1, 2", b"Transfer-Encoding: chunked",
                     b"Transfer-Encoding: gzip, chunked", b"Host: ", b"Host: evil.example",
                     b"Content-Type: application/x-www-form-urlencoded",
                     b"Content-Type: multipart/form-data; boundary=x",
                     b"Authorization: OSS LTAI5tLocalAlice000001:x",
                     b"Authorization: ACS3-HMAC-SHA256 Credential=,SignedHeaders=,Signature=",
                     b"Cookie: consolerl_console=" + b"A" * 4000, b"Cookie: ;;;=;",
                     b"Expect: 100-continue", b"Connection: upgrade", b"Upgrade: websocket",
                     b"X: " + b"y" * 9000, b": empty-name", b"NoColon", b"X: \xff\xfe",
                     b"X:\x00y", b" Leading: space"]),
    st.builds(lambda n, v: n.encode() + b": " + v.encode(), htext.filter(bool), htext)),
    max_size=6)


def raw_request(port: int, data: bytes) -> int | None:
    """Send ``data`` and half-close; the answer's status, or None when the server closed the
    connection without one. A hang raises socket.timeout (the test fails on it)."""
    with socket.create_connection(("127.0.0.1", port), timeout=REQUEST_S) as sock:
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass
        answer = b""
        try:
            while b"\r\n" not in answer:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                answer += chunk
        except ConnectionResetError:
            pass
    m = re.match(rb"HTTP/1\.[01] (\d{3}) ", answer)
    return int(m[1]) if m else None


@pytest.mark.parametrize("n", [150])
def test_raw_http_never_5xx(fuzz_cloud, n):
    """150 examples: request lines and headers as bytes: odd methods, targets (dot segments,
    absolute URLs, NUL, bad escapes), versions, 5,000-digit or negative Content-Length,
    chunked junk, giant cookies and headers, unsigned or garbage Authorization."""
    with Tally("raw_http", fuzz_cloud) as tally:
        @fuzz(n)
        @given(method=methods, target=raw_targets,
               version=st.sampled_from(["HTTP/1.1", "HTTP/1.0", "HTTP/2.0", "HTTP/9.9", ""]),
               headers=raw_headers, body=st.binary(max_size=300))
        def run(method, target, version, headers, body):
            data = (f"{method} {target} {version}\r\n".encode("latin-1") +
                    b"Host: 127.0.0.1\r\n" + b"".join(h + b"\r\n" for h in headers) +
                    b"Connection: close\r\n\r\n" + body)
            started = time.perf_counter()
            status = raw_request(fuzz_cloud.port, data)
            tally.check(status, time.perf_counter() - started, data[:300])
        run()


# -- structured HTTP, unsigned --

segments = st.one_of(st.sampled_from([
    "console", "ecs", "instances", "security-groups", "vpc", "vpcs", "vswitches", "ram",
    "users", "oss", "buckets", "create", "delete", "rename", "acl", "grant", "rules",
    "policies", "detach", "region", "signout", "signin", "static", "app.css", "..", ".",
    "i-doesnotexist", "sg-1", "bucket-1", "metrics", "healthz"]), text)
paths = st.lists(segments, min_size=0, max_size=6).map(
    lambda parts: "/" + "/".join(quote(p, safe="") for p in parts))
content_types = st.sampled_from([
    None, "application/x-www-form-urlencoded", "application/x-www-form-urlencoded; charset=x",
    "application/json", "multipart/form-data; boundary=b", "text/plain", "application/xml",
    "x/" + "y" * 300])


@pytest.mark.parametrize("n", [200])
def test_unsigned_paths_queries_headers_never_5xx(fuzz_cloud, web, n):
    """200 examples: any method on any path of the cloud's routes (console, OSS buckets,
    static files, ``..``) with hostile queries, headers, cookies and bodies; nothing signed."""
    with Tally("unsigned_http", fuzz_cloud) as tally:
        @fuzz(n)
        @given(method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS",
                                       "PATCH"]),
               path=paths, query=st.dictionaries(text, values, max_size=4),
               headers=st.dictionaries(
                   st.sampled_from(["authorization", "x-acs-action", "x-acs-version",
                                    "x-acs-date", "x-oss-date", "date", "x-oss-acl", "range",
                                    "x-console-refresh", "if-none-match", "user-agent",
                                    "x-forwarded-for", "origin", "referer"]), htext, max_size=4),
               cookie=st.one_of(st.none(), htext), ctype=content_types,
               body=st.one_of(st.binary(max_size=400), values.map(str.encode)))
        def run(method, path, query, headers, cookie, ctype, body):
            headers = dict(headers)
            if cookie is not None:
                headers["cookie"] = f"consolerl_console={cookie}"
            if ctype is not None:
                headers["content-type"] = ctype
            url = path + ("?" + _encode(query) if query else "")
            status, elapsed = timed(web, method, url, headers=headers, content=body)
            tally.check(status, elapsed, (method, url, headers, body[:100]))
        run()


# -- the OpenAPI, signed (rightly and wrongly) --

PRODUCTS = {p.name: p for p in rpc_products().values()}
ACTIONS = sorted((p.name, a) for p in PRODUCTS.values() for a in p.actions)
PARAM_NAMES = ["RegionId", "VpcId", "VSwitchId", "SecurityGroupId", "InstanceId", "ZoneId",
               "CidrBlock", "InstanceType", "ImageId", "UserName", "PolicyName", "PolicyType",
               "PageSize", "PageNumber", "MaxResults", "NextToken", "StartTime", "EndTime",
               "IpProtocol", "PortRange", "SourceCidrIp", "Tag.1.Key", "Tag.1.Value",
               "Tag.99.Key", "InstanceIds", "SecurityGroupIds", "LookupAttribute.1.Key",
               "LookupAttribute.1.Value", "Amount", "ClientToken", "DryRun", "Description",
               "InstanceName", "VpcName", "DisplayName", "Comments", "Password", "Action",
               "Version", "Signature", "AccessKeyId", "SignatureNonce", "Timestamp"]


# Plausible values, so that most requests get past "missing parameter" into the actions.
PLAUSIBLE = {"VpcId": "vpc-fuzz", "VSwitchId": "vsw-fuzz", "SecurityGroupId": "sg-fuzz",
             "InstanceId": "i-fuzz", "ZoneId": "cn-hangzhou-k", "CidrBlock": "10.0.0.0/16",
             "InstanceType": "ecs.g7.large", "ImageId": "aliyun_3_x64_20G_alibase_20240819.vhd",
             "UserName": "fuzz-api-user", "PolicyName": "ReadOnlyAccess", "PolicyType": "System",
             "IpProtocol": "tcp", "PortRange": "22/22", "SourceCidrIp": "10.0.0.0/8",
             "ResourceType": "instance", "ResourceId.1": "i-fuzz", "Tag.1.Key": "k",
             "Tag.1.Value": "v", "PageSize": "10", "MaxResults": "10", "NewUserName": "fuzz-2",
             "InstanceName": "fuzz", "Description": "fuzz", "StartTime": "2026-01-01T00:00:00Z"}


def _acs3(account: Account, port: int, method: str, action: str, version: str,
          query: dict[str, str], body: bytes, secret: str, tamper: str) -> tuple[str, dict]:
    """An ACS3-HMAC-SHA256 request as the SDK signs it (``secret`` may be wrong); ``tamper``
    changes something after signing."""
    headers = {"host": f"127.0.0.1:{port}", "x-acs-action": action, "x-acs-version": version,
               "x-acs-date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "x-acs-signature-nonce": uuid.uuid4().hex,
               "x-acs-content-sha256": hashlib.sha256(body).hexdigest()}
    signed = sorted(headers)
    to_sign = acs3_string_to_sign(method, "/", query, headers, signed,
                                  headers["x-acs-content-sha256"])
    headers["authorization"] = (f"{ACS3} Credential={account.access_key_id},SignedHeaders="
                                f"{';'.join(signed)},Signature={acs3_signature(secret, to_sign)}")
    if tamper == "action":
        headers["x-acs-action"] = action + "X"
    elif tamper == "extra-header":
        headers["x-acs-extra"] = "1"
    elif tamper == "date":
        headers["x-acs-date"] = "2001-01-01T00:00:00Z"
    headers["content-type"] = "application/x-www-form-urlencoded"
    del headers["host"]
    return "/?" + _encode(query), headers


def _v1(account: Account, method: str, action: str, version: str, params: dict[str, str],
        secret: str, tamper: str) -> str:
    """An RPC v1 (HMAC-SHA1) request's URL, signed over every parameter."""
    full = {**params, "Action": action, "Version": version, "Format": "JSON",
            "AccessKeyId": account.access_key_id, "SignatureMethod": "HMAC-SHA1",
            "SignatureVersion": "1.0", "SignatureNonce": uuid.uuid4().hex,
            "Timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    full["Signature"] = rpc_v1_signature(method, full, secret)
    if tamper == "action":
        full["Action"] += "X"
    elif tamper == "date":
        full["Timestamp"] = "2001-01-01T00:00:00Z"
    return "/?" + _encode(full)


@pytest.mark.parametrize("n", [250])
def test_signed_openapi_requests_never_5xx(fuzz_cloud, web, accounts, n):
    """250 examples: ACS3 and v1 requests for every action with plausible and hostile
    parameters (in the query and the form body), signed with the right secret, a wrong one,
    or tampered with after signing (action, date, an unsigned x-acs header). A wrong
    signature is a 4xx JSON error; a right one reaches the action, which answers or refuses
    with a 4xx."""
    account = accounts[API]
    with Tally("signed_openapi", fuzz_cloud) as tally:
        @fuzz(n)
        @given(target=st.sampled_from(ACTIONS), mode=st.sampled_from(["acs3", "v1"]),
               method=st.sampled_from(["POST", "GET"]),
               dropped=st.sets(st.sampled_from(sorted(PLAUSIBLE)), max_size=3),
               query=st.dictionaries(st.sampled_from(PARAM_NAMES) | text.filter(bool), values,
                                     max_size=3),
               form=st.dictionaries(st.sampled_from(PARAM_NAMES), values, max_size=3),
               secret=st.sampled_from(["right", "right", "wrong"]),
               tamper=st.sampled_from(["", "", "", "action", "date", "extra-header"]))
        def run(target, mode, method, dropped, query, form, secret, tamper):
            product, action = target
            query = {"RegionId": REGION, **{k: v for k, v in PLAUSIBLE.items()
                                            if k not in dropped}, **query}
            version = PRODUCTS[product].version
            key = account.access_key_secret if secret == "right" else "x" * 30
            if mode == "acs3":
                body = urlencode(form).encode() if method == "POST" else b""
                url, headers = _acs3(account, fuzz_cloud.port, method, action, version,
                                     query, body, key, tamper)
                kw = {"headers": headers, "content": body}
            else:
                url, kw = _v1(account, method, action, version, {**query, **form}, key,
                              tamper), {}
            started = time.perf_counter()
            response = web.request(method, url, **kw)
            body_json = response.json()
            tally.check(response.status_code, time.perf_counter() - started, (mode, url, kw),
                        body_json.get("Code", "") if response.status_code >= 400 else "")
            if response.status_code >= 400:
                assert {"RequestId", "Code", "Message"} <= body_json.keys()
                assert len(body_json["Message"]) < 2000, len(body_json["Message"])
            if secret == "wrong" or tamper in ("action", "date") or \
                    (tamper and mode == "acs3"):   # v1 signs no header
                assert response.status_code >= 400, (mode, tamper, response.text[:300])
        run()


def test_a_huge_list_index_is_a_400(fuzz_cloud, web, accounts):
    """``Tag.<5,000 digits>.Key`` (5 KB, well within the 32 KiB query limit) on an action
    that reads tags."""
    account = accounts[API]
    url = _v1(account, "POST", "CreateVpc", PRODUCTS["Vpc"].version,
              {"RegionId": REGION, "Tag." + "9" * 5000 + ".Key": "k"},
              account.access_key_secret, "")
    response = web.post(url)
    assert response.status_code == 400, response.text[:300]
    assert response.json()["Code"] == "InvalidParameter"
    assert len(response.text) < 1000                    # the key is not echoed whole


# -- OSS --

def _oss_sign(secret: str, method: str, headers: dict[str, str], resource: str) -> str:
    """OSS signature V1, as oss2 computes it (``products/oss.py``'s rule, restated)."""
    lower = {k.lower(): v for k, v in headers.items()}
    oss_headers = "".join(f"{k}:{lower[k]}\n" for k in sorted(lower) if k.startswith("x-oss-"))
    date = lower.get("x-oss-date") or lower.get("date", "")
    to_sign = "\n".join([method, lower.get("content-md5", ""), lower.get("content-type", ""),
                         date, oss_headers + resource])
    return base64.b64encode(hmac.new(secret.encode(), to_sign.encode(),
                                     hashlib.sha1).digest()).decode()


SUBRESOURCES = ["acl", "bucketInfo", "location", "stat", "tagging", "cors", "uploads",
                "delete", "versioning", "prefix", "marker", "max-keys", "x"]
dates = st.one_of(
    st.just("now"), st.just("now"), htext,
    st.sampled_from(["", "Mon, 01 Jan 9999999999999999999 00:00:00 GMT",
                     "1 Jan 2020 00:00:00 +99999999999999999999", "Mon, 01 Jan 0000 00:00:00 GMT",
                     "Fri, 31 Dec 9999 23:59:59 -2359", "Mon, 01 Jan 2020 99:99:99 GMT",
                     "Thu, 01 Jan 1970 00:00:00 GMT", "2026-01-01T00:00:00Z"]))
buckets = st.one_of(st.sampled_from(["", "fuzz-bucket-1", "fuzz-bucket-2", "console", "ab",
                                     "a" * 64, "UPPER", "-x-", "metrics", "healthz"]),
                    text.filter(lambda t: "/" not in t))


@pytest.mark.parametrize("n", [200])
def test_oss_requests_never_5xx(fuzz_cloud, web, accounts, n):
    """200 examples: OSS REST calls on any bucket path and sub-resource, ACL headers and
    bodies, with Date headers from valid to absurd (20-digit years and offsets), signed with
    the right secret, a wrong one, or not at all. Errors are XML with an OSS code."""
    account = accounts[API]
    with Tally("oss", fuzz_cloud) as tally:
        @fuzz(n)
        @given(method=st.sampled_from(["GET", "PUT", "DELETE", "HEAD", "POST"]),
               bucket=buckets, sub=st.lists(st.sampled_from(SUBRESOURCES), max_size=3),
               sub_value=st.one_of(st.just(""), htext),
               acl=st.one_of(st.none(), st.sampled_from(["private", "public-read",
                                                         "public-read-write"]), htext),
               date=dates, secret=st.sampled_from(["right", "right", "wrong", "none"]),
               body=st.one_of(st.just(b""), st.binary(max_size=200), st.builds(
                   lambda s: f"<CreateBucketConfiguration><StorageClass>{s}</StorageClass>"
                             f"</CreateBucketConfiguration>".encode(), htext)))
        @example(method="GET", bucket="", sub=[], sub_value="", acl=None,
                 date="Mon, 01 Jan 9999999999999999999 00:00:00 GMT", secret="wrong", body=b"")
        @example(method="PUT", bucket="fuzz-bucket-1", sub=[], sub_value="", acl="private",
                 date="1 Jan 2020 00:00:00 +99999999999999999999", secret="wrong", body=b"")
        def run(method, bucket, sub, sub_value, acl, date, secret, body):
            headers = {"date": formatdate(usegmt=True) if date == "now" else date}
            if acl is not None:
                headers["x-oss-acl"] = acl
            query = {k: sub_value if k in ("prefix", "marker", "max-keys") else ""
                     for k in sub}
            subs = sorted(k for k in query if k in ("acl", "bucketInfo", "location", "stat",
                                                    "tagging", "cors", "uploads", "delete",
                                                    "versioning"))
            resource = (f"/{bucket}/" if bucket else "/") + \
                ("?" + "&".join(f"{k}={query[k]}" if query[k] else k for k in subs)
                 if subs else "")
            if secret != "none":
                key = account.access_key_secret if secret == "right" else "wrong-secret"
                headers["authorization"] = (f"OSS {account.access_key_id}:"
                                            f"{_oss_sign(key, method, headers, resource)}")
            path = "/" + quote(bucket, safe="") + ("/" if bucket else "")
            url = path + ("?" + "&".join(f"{quote(k)}={quote(v)}" if v else quote(k)
                                         for k, v in query.items()) if query else "")
            status, elapsed = timed(web, method, url, headers=headers, content=body)
            tally.check(status, elapsed, (method, url, headers, body[:80]))
        run()


# -- the console --

@pytest.fixture(scope="module")
def routes(tmp_path_factory) -> dict[str, list[str]]:
    """The path templates of the console's GET and POST routes, from the app itself.
    Sign-out is left out of POST: it would end the fuzzing session (the sign-in test
    signs out)."""
    cloud = CloudApp(SimConfig(state_dir=tmp_path_factory.mktemp("fuzz-routes")))
    found = [(r.path, r.methods or set()) for r in cloud.routes()
             if isinstance(r, Route) and r.path.startswith("/console")]
    cloud.store.close()
    return {"GET": sorted(p for p, m in found if "GET" in m),
            "POST": sorted(p for p, m in found if "POST" in m and p != "/console/signout")}


@pytest.fixture(scope="module")
def console_ids(fuzz_cloud, accounts) -> dict[str, str]:
    """Real ids of the console account's resources, by path parameter name."""
    account = accounts[CONSOLE]
    c = CloudClient(CloudConfig(endpoint=fuzz_cloud.endpoint),
                    Credentials(account.access_key_id, account.access_key_secret))
    vpc = c.rpc("Vpc", "CreateVpc", {"RegionId": REGION, "CidrBlock": "10.0.0.0/16"})["VpcId"]
    wait_for(lambda: c.rpc("Vpc", "DescribeVpcs", {"RegionId": REGION, "VpcId": vpc})
             ["Vpcs"]["Vpc"][0]["Status"] == "Available")
    vsw = c.rpc("Vpc", "CreateVSwitch", {"RegionId": REGION, "VpcId": vpc, "ZoneId":
                                         "cn-hangzhou-k", "CidrBlock": "10.0.1.0/24"})["VSwitchId"]
    wait_for(lambda: c.rpc("Vpc", "DescribeVSwitches", {"RegionId": REGION})
             ["VSwitches"]["VSwitch"][0]["Status"] == "Available")
    sg = c.rpc("Ecs", "CreateSecurityGroup", {"RegionId": REGION, "VpcId": vpc})[
        "SecurityGroupId"]
    c.rpc("Ecs", "AuthorizeSecurityGroup", {"RegionId": REGION, "SecurityGroupId": sg,
                                            "IpProtocol": "tcp", "PortRange": "22/22",
                                            "SourceCidrIp": "10.0.0.0/8"})
    rule = c.rpc("Ecs", "DescribeSecurityGroupAttribute", {
        "RegionId": REGION, "SecurityGroupId": sg})["Permissions"]["Permission"][0]
    instance = c.rpc("Ecs", "RunInstances", {
        "RegionId": REGION, "InstanceType": "ecs.g7.large", "VSwitchId": vsw,
        "ImageId": "aliyun_3_x64_20G_alibase_20240819.vhd", "SecurityGroupId": sg})[
        "InstanceIdSets"]["InstanceIdSet"][0]
    c.rpc("Ram", "CreateUser", {"UserName": "fuzz-user"})
    c.rpc("Ram", "AttachPolicyToUser", {"UserName": "fuzz-user", "PolicyType": "System",
                                        "PolicyName": "ReadOnlyAccess"})
    headers = {"date": formatdate(usegmt=True)}
    signature = _oss_sign(account.access_key_secret, "PUT", headers, "/fuzz-console-bucket/")
    headers["authorization"] = f"OSS {account.access_key_id}:{signature}"
    assert httpx.put(f"{fuzz_cloud.url}/fuzz-console-bucket/", headers=headers).status_code == 200
    return {"vpc_id": vpc, "vsw_id": vsw, "sg_id": sg, "instance_id": instance,
            "rule_id": rule.get("SecurityGroupRuleId", "sgr-x"), "user_name": "fuzz-user",
            "policy_name": "ReadOnlyAccess", "bucket": "fuzz-console-bucket",
            "op": "stop", "rest": "nowhere"}


class ConsoleSession:
    """A signed-in httpx client, signing in again when a fuzzed request ended the session."""

    def __init__(self, cloud: CloudServer, account: Account):
        self.client = httpx.Client(base_url=cloud.url, timeout=REQUEST_S * 2,
                                   follow_redirects=False)
        self.account = account
        self.sign_in()

    def sign_in(self) -> None:
        response = sign_in_http(self.client, self.account, next="/console/")
        assert response.status_code == 303, response.text[:300]
        self.csrf = re.search(r'name="_csrf" value="([^"]+)"',
                              self.client.get("/console/ram/users/create").text)[1]

    def request(self, method: str, url: str, **kw) -> tuple[httpx.Response, float]:
        started = time.perf_counter()
        response = self.client.request(method, url, **kw)
        elapsed = time.perf_counter() - started
        if response.status_code == 303 and response.headers.get(
                "location", "").startswith("/console/signin"):
            self.sign_in()
        return response, elapsed


@pytest.fixture(scope="module")
def console(fuzz_cloud, accounts, console_ids) -> Iterator[ConsoleSession]:
    session = ConsoleSession(fuzz_cloud, accounts[CONSOLE])
    yield session
    session.client.close()


@pytest.fixture(scope="module")
def form_fields(console, console_ids, routes) -> dict[str, list[str]]:
    """The field names each console form page declares (its inputs, selects, textareas)."""
    found = {}
    for template in routes["GET"]:
        response, _ = console.request("GET", _fill(template, console_ids, {}))
        names = re.findall(r'<(?:input|select|textarea)[^>]*\bname="([^"]+)"', response.text)
        found[template] = sorted(set(names) - {"_csrf"})
    return found


def _fill(template: str, ids: dict[str, str], hostile: dict[str, str]) -> str:
    """The path with its parameters: real ids, or the hostile values given (encoded)."""
    return re.sub(r"\{(\w+)(?::\w+)?\}",
                  lambda m: quote(hostile.get(m[1], ids.get(m[1], "x")), safe=""), template)


path_params = st.dictionaries(
    st.sampled_from(["vpc_id", "vsw_id", "sg_id", "instance_id", "rule_id", "user_name",
                     "policy_name", "bucket", "op", "rest"]),
    st.one_of(text.filter(bool), huge, st.sampled_from(["..", ".", "start", "restart",
                                                         "delete", "i-" + "0" * 300])),
    max_size=2)


@pytest.mark.parametrize("n", [150])
def test_console_pages_never_5xx(fuzz_cloud, console, console_ids, routes, n):
    """150 examples: every console page (signed in) with real or hostile path parameters and
    hostile list queries (page, size, by, q, region)."""
    with Tally("console_get", fuzz_cloud) as tally:
        @fuzz(n)
        @given(template=st.sampled_from(routes["GET"]), hostile=path_params,
               query=st.dictionaries(st.sampled_from(["page", "size", "by", "q", "region",
                                                       "next", "drift", "sort"]) | text,
                                     values, max_size=4),
               refresh=st.booleans())
        def run(template, hostile, query, refresh):
            url = _fill(template, console_ids, hostile) + (
                "?" + _encode(query) if query else "")
            headers = {"x-console-refresh": "1"} if refresh else {}
            response, elapsed = console.request("GET", url, headers=headers)
            tally.check(response.status_code, elapsed, url)
        run()


@pytest.mark.parametrize("n", [200])
def test_console_form_posts_never_5xx(fuzz_cloud, console, console_ids, form_fields, routes,
                                      n):
    """200 examples: every console POST (create forms, row actions, region) with the session's
    CSRF token (or a wrong one, or none), the form's own fields and others with hostile
    values, odd ``_form_token`` and ``_back``, wrong content types and undecodable bodies."""
    with Tally("console_post", fuzz_cloud) as tally:
        @fuzz(n)
        @given(template=st.sampled_from(routes["POST"]), hostile=path_params,
               data=st.data(), csrf=st.sampled_from(["session", "session", "session",
                                                     "wrong", "none"]),
               extra=st.dictionaries(st.sampled_from(["_back", "_form_token", "confirm",
                                                      "region"]) | text,
                                     values, max_size=3),
               encoding=st.sampled_from(["form", "form", "form", "json", "latin-1",
                                         "huge"]))
        def run(template, hostile, data, csrf, extra, encoding):
            fields = form_fields.get(template, [])
            form = data.draw(st.fixed_dictionaries({}, optional={f: values for f in fields}))
            form.update(extra)
            if csrf != "none":
                form["_csrf"] = console.csrf if csrf == "session" else "0" * 43
            url = _fill(template, console_ids, hostile)
            body = urlencode(form).encode()
            ctype = "application/x-www-form-urlencoded"
            if encoding == "json":
                ctype = "application/json"
            elif encoding == "latin-1":
                body += b"&x=\xff\xfe%ff"
            elif encoding == "huge":
                body += b"&pad=" + b"a" * 70_000
            response, elapsed = console.request("POST", url, content=body,
                                                headers={"content-type": ctype})
            tally.check(response.status_code, elapsed, (url, body[:300]))
            location = response.headers.get("location", "")
            if location:
                assert location.startswith("/console") and "//" not in location, location
        run()


@pytest.mark.parametrize("n", [80])
def test_console_signin_never_5xx(fuzz_cloud, accounts, n):
    """80 examples: the sign-in form (GET and POST) with hostile names, passwords, ``next``
    (absolute, protocol-relative, backslashed URLs) and ``drift``, with and without its CSRF
    token; a sign-in only ever redirects inside the console. Plus sign-out."""
    nexts = st.one_of(values, st.sampled_from([
        "/console/", "//evil.example/", "https://evil.example/", "/\\evil.example",
        "/console/../../x", "/console//evil", "javascript:alert(1)", "/console/%2F%2Fevil",
        "/console/ecs/instances?page=2", "\\\\evil"]))
    account = accounts[CONSOLE]
    with Tally("console_signin", fuzz_cloud) as tally, \
            httpx.Client(base_url=fuzz_cloud.url, timeout=REQUEST_S * 2) as client:
        @fuzz(n)
        @given(login=st.one_of(st.just(account.login_name), text, huge),
               password=st.one_of(st.just(account.password), text, huge), next_url=nexts,
               drift=st.one_of(st.just(""), st.sampled_from(["all", "rename,wizard"]), values),
               method=st.sampled_from(["POST", "POST", "GET"]),
               with_token=st.booleans(), signout=st.booleans())
        @example(login=account.login_name, password=account.password, next_url="//evil.example/",
                 drift="", method="POST", with_token=True, signout=True)
        @example(login=account.login_name, password=account.password, next_url="/\\evil.example",
                 drift="all", method="POST", with_token=True, signout=False)
        @example(login=account.login_name, password=account.password,
                 next_url="/console/%2F%2Fevil", drift="rename,wizard", method="POST",
                 with_token=True, signout=True)
        @example(login=account.login_name, password=account.password,
                 next_url="/console/ecs/instances?page=2", drift="x" * 5000, method="POST",
                 with_token=True, signout=False)
        def run(login, password, next_url, drift, method, with_token, signout):
            form = {"login_name": login, "password": password, "next": next_url,
                    "drift": drift}
            if method == "GET":
                status, elapsed = timed(client, "GET", "/console/signin?" + _encode(
                    {"next": next_url, "drift": drift}))
                tally.check(status, elapsed, form)
                return
            page = client.get("/console/signin")
            tally.check(page.status_code, 0.0, "GET /console/signin")
            token = re.search(r'name="_csrf" value="([^"]+)"', page.text)
            if with_token and token:
                form["_csrf"] = token[1]
            started = time.perf_counter()
            response = client.post("/console/signin", data=form)
            tally.check(response.status_code, time.perf_counter() - started, form)
            if response.status_code == 303:
                location = response.headers["location"]
                assert location.startswith("/console/") and "//" not in location and \
                    "\\" not in location, location
                if signout:
                    home = client.get("/console/ram/users/create").text
                    csrf = re.search(r'name="_csrf" value="([^"]+)"', home)
                    out = client.post("/console/signout", data={"_csrf": csrf[1] if csrf
                                                                else ""})
                    tally.check(out.status_code, 0.0, "POST /console/signout")
        run()


# ---- the reward API ------------------------------------------------------------------------

TASKS = load_suite(TASKS_DIR)


@pytest.fixture
def reward_app(fuzz_cloud, accounts):
    """A fresh app per test: a test client that ran the app's lifespan has shut its pool."""
    service = RewardService(TASKS, accounts, fuzz_cloud.endpoint,
                            TrailConfig(qps=50, settle_s=0.1, poll_s=0.05, clock_skew_s=5))
    return build_reward_app(service, max_concurrent_scores=4)


def _schema_cases(app, n: int, name: str, headers: dict[str, str] | None = None) -> Tally:
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


@pytest.mark.parametrize("n", [60])
def test_reward_api_schema(reward_app, n):
    """60 examples per operation (POST /v1/score, GET /metrics, GET /healthz)."""
    with _schema_cases(reward_app, n, "reward_api_schema") as tally:
        assert tally.operations >= 3


def _placeholders(task) -> list[str]:
    return sorted(task.success.placeholders())


@pytest.mark.parametrize("n", [60])
def test_reward_api_hostile_scores(reward_app, accounts, n):
    """60 examples: score requests that pass the document (a real task and account, a recent
    window) with hostile placeholder values, actions, pages and answers; the rule runs
    against the cloud. A verdict, or a 422 naming the field: hostile values are the
    caller's, never the service's 5xx."""
    from fastapi.testclient import TestClient
    client = TestClient(reward_app, raise_server_exceptions=False)
    with Tally("reward_api_hostile") as tally:
        @fuzz(n)
        @given(task=st.sampled_from(TASKS), account=st.sampled_from(accounts[2:]),
               data=st.data(), ago=st.floats(0, 3600),
               env_error=st.one_of(st.none(), st.none(), st.none(), text.filter(bool)),
               actions=st.lists(values, max_size=5), page=st.one_of(text, huge),
               answer=st.one_of(st.none(), text))
        def run(task, account, data, ago, env_error, actions, page, answer):
            names = _placeholders(task)
            chosen = data.draw(st.dictionaries(st.sampled_from(names) if names else text,
                                               st.text(anychar, max_size=80) | st.sampled_from(
                                                   ["", "..", "i-x", "%", "*"]),
                                               max_size=len(names) + 1))
            now = time.time()
            body = {"task_id": task.id, "account_id": account.account_id,
                    "started_at": now - ago, "ended_at": now,
                    "values": {**{k: "x" for k in names}, **chosen},
                    "actions": actions, "final_observation": page, "answer": answer,
                    "env_error": env_error}
            started = time.perf_counter()
            response = client.post("/v1/score", json=body)
            tally.check(response.status_code, time.perf_counter() - started,
                        (task.id, body["values"]))
            assert response.status_code in (200, 422), response.text[:500]
        run()


@pytest.mark.parametrize("body", [
    b"[" * 100_000, b'{"task_id":' + b"[" * 900 + b"]" * 900 + b"}",
    b'{"started_at": ' + b"1" * 5000 + b"}", b'{"started_at": NaN, "ended_at": Infinity}',
    b'{"values": {"' + b"k" * 100_000 + b'": "v"}}', b"\xff\xfe", b"", b"null", b"1e999999",
    b'{"task_id": "\\ud800"}', b'{"task_id": "a", "task_id": "b"}'],
    ids=["deep", "nested-field", "huge-int", "nan", "huge-key", "not-utf8", "empty", "null",
         "huge-float", "surrogate", "duplicate"])
def test_reward_api_raw_bodies(reward_app, body):
    """Bodies JSON parsers choke on: a 4xx, in time, with a short answer."""
    from fastapi.testclient import TestClient
    client = TestClient(reward_app, raise_server_exceptions=False)
    started = time.perf_counter()
    response = client.post("/v1/score", content=body,
                           headers={"content-type": "application/json"})
    assert time.perf_counter() - started < REQUEST_S
    assert 400 <= response.status_code < 500, response.text[:300]
    assert len(response.content) < 5000, len(response.content)


def test_reward_api_refuses_a_huge_body_unread(reward_app):
    """A 64 MiB body (ten times the largest valid request: 500 actions of 10,000 characters
    and a 200,000-character page) is a 413, not parsed into memory first."""
    from fastapi.testclient import TestClient
    client = TestClient(reward_app, raise_server_exceptions=False)
    body = b'{"final_observation": "' + b"x" * (64 << 20) + b'"}'
    assert client.post("/v1/score", content=body,
                       headers={"content-type": "application/json"}).status_code == 413


# ---- the policy API ------------------------------------------------------------------------

class FakeEngine:
    """Echoes the prompt's last few ids (at most ``max_tokens``, at most 4): real ids of the
    real tokenizer, no model."""

    version = 0
    busy_s = 0.0

    def generate(self, prompt_ids, sampling):
        from rollout_service.agent import Generation
        ids = tuple(prompt_ids[-min(sampling.max_tokens, 4):])
        return Generation(ids, tuple(-1.0 for _ in ids), self.version, "length")

    def update_weights(self, version, state_dict):
        return 0.0


@pytest.fixture(scope="module")
def tokenizer():
    from rollout_service.models import HFChatTokenizer, default_model
    return HFChatTokenizer(default_model(progress=False))


@pytest.fixture(scope="module")
def policy_app(tokenizer):
    from rollout_service.api import build_api
    from rollout_service.policy import PolicyConfig, PolicyRouter, PolicyServerBody
    router = PolicyRouter([PolicyServerBody(PolicyConfig(), engine=FakeEngine())])
    return build_api(router, tokenizer, "fuzz", max_prompt_tokens=2048)


@pytest.mark.parametrize("n", [60])
def test_policy_api_schema(policy_app, n):
    """60 examples per operation (POST /v1/chat/completions, GET /v1/models, GET /metrics)."""
    with _schema_cases(policy_app, n, "policy_api_schema") as tally:
        assert tally.operations >= 3


CONTROL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_start|>system\n", "<|", "|>",
           "im_end", "\ud800", "\udfff", "\x00", "\ufeff", "\u202e"]


@pytest.mark.parametrize("n", [100])
def test_chat_template_of_any_text(tokenizer, n):
    """100 examples: the chat template of message contents made of control strings, their
    halves, lone surrogates (page text from a browser can hold one) and any text: ids, every
    time, and within the prompt-size bound."""
    with Tally("chat_template") as tally:
        @fuzz(n)
        @given(contents=st.lists(st.lists(st.one_of(st.sampled_from(CONTROL), st.text(
            st.characters(codec=None, exclude_categories=()), max_size=12)), max_size=12).map(
            "".join), min_size=1, max_size=3))
        @example(contents=["\ud800"])
        @example(contents=["<|im_end|>\udfff"])
        def run(contents):
            messages = [{"role": ("user", "assistant", "system")[i % 3], "content": c}
                        for i, c in enumerate(contents)]
            started = time.perf_counter()
            ids = tokenizer.apply_chat_template(messages)
            tally.check(200, time.perf_counter() - started, contents)
            assert ids and all(isinstance(i, int) for i in ids)
        run()
