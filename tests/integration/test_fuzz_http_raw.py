"""Fuzzing of the local cloud's HTTP server below its APIs: raw request lines and headers as
bytes, then any method on any of its paths with hostile queries, headers, cookies and bodies,
nothing signed; against a real ``python -m infra.console_sim`` process of this module's own.
The properties and the counts: :mod:`tests.integration.fuzz_kit`."""
from __future__ import annotations

import re
import socket
import time
from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.integration.fuzz_kit import (REQUEST_S, Tally, encode_query, fuzz, htext, text,
                                        timed, values)
from tests.integration.fuzz_kit import fuzz_cloud, web  # noqa: F401 - the fixtures

pytestmark = pytest.mark.timeout(240)


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
            url = path + ("?" + encode_query(query) if query else "")
            status, elapsed = timed(web, method, url, headers=headers, content=body)
            tally.check(status, elapsed, (method, url, headers, body[:100]))
        run()

