"""Cross-site requests against the console: login CSRF from another port of the same host (a
tossed sign-in cookie), and the same-origin check (``Origin``, ``Sec-Fetch-Site``) on every
state-changing console route, enumerated from the app's route table."""
from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from starlette.routing import Route

from infra.console_sim.app import CloudApp
from infra.console_sim.config import SimConfig
from infra.console_sim.console.sessions import COOKIE
from infra.console_sim.console.signin import CSRF_COOKIE
from infra.local_cloud import free_port
from tests.conftest import CloudServer
from tests.integration.console_kit import sign_in_http, signin_token
from tests.integration.fuzz_kit import oss_sign

HEIDI, IVAN = 7, 6          # the victim's browser, the attacker's account
FABRICATED = "A" * 32       # a well-formed pre-session value the server never issued
UNSAFE = {"POST", "PUT", "DELETE", "PATCH"}
REFUSED = "came from another site"   # only the same-origin check says this


class AttackerSite:
    """A page on another port of 127.0.0.1 (cookies ignore ports): it sets the console's
    sign-in cookie for ``Path=/console/signin`` and auto-submits the sign-in form, with the
    same token in the body, cross-origin to the console."""

    def __init__(self, console_url: str, cookie: str, token: str, login: str, password: str):
        page = f"""<!doctype html><html><body>
<form id="f" method="post" action="{console_url}/console/signin">
<input type="hidden" name="_csrf" value="{token}">
<input type="hidden" name="login_name" value="{login}">
<input type="hidden" name="password" value="{password}">
<input type="hidden" name="next" value="/console/">
</form><script>document.getElementById("f").submit();</script></body></html>""".encode()
        set_cookie = f"{CSRF_COOKIE}={cookie}; Path=/console/signin"

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/html; charset=utf-8")
                self.send_header("set-cookie", set_cookie)
                self.send_header("content-length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)

            def log_message(self, *args) -> None:
                pass

        self.port = free_port()
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def __enter__(self) -> "AttackerSite":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("pair", ["fabricated", "server_issued"])
def test_login_csrf_from_a_sibling_port_is_refused(browser, console_cloud, accounts, pair):
    """Real Chromium: the victim opens the attacker's page on 127.0.0.1:OTHER; it tosses a
    sign-in cookie and posts the attacker's credentials with the matching token. Refused with
    a 403 either way: a made-up cookie fails the signed token, and a pair the attacker got
    from the console itself fails the origin check. No session cookie is set."""
    attacker = accounts[IVAN]
    if pair == "fabricated":
        cookie = token = FABRICATED
    else:
        with httpx.Client(base_url=console_cloud.url) as own:
            token = signin_token(own)
            cookie = own.cookies[CSRF_COOKIE]
    context = browser.new_context()
    try:
        page = context.new_page()
        with AttackerSite(console_cloud.url, cookie, token, attacker.login_name,
                          attacker.password) as site:
            with page.expect_response(lambda r: r.url.endswith("/console/signin")
                                      and r.request.method == "POST") as answer:
                page.goto(site.url)
            response = answer.value
            assert response.request.all_headers().get("origin") == site.url.rstrip("/")
            assert response.status == 403, response.status
            page.wait_for_load_state()
            assert REFUSED in page.content()
        assert COOKIE not in {c["name"] for c in context.cookies()}
        # The tossed cookie did reach the console: the test exercises the real attack.
        assert any(c["name"] == CSRF_COOKIE and c["value"] == cookie
                   for c in context.cookies(console_cloud.url + "/console/signin"))
    finally:
        context.close()


def test_a_tossed_signin_cookie_with_the_same_body_token_is_refused(console_cloud, accounts):
    """Without any browser header: the sign-in token is signed by the server for its
    pre-session, so a cookie value and a matching body token made up by someone else fail."""
    heidi = accounts[HEIDI]
    with httpx.Client(base_url=console_cloud.url, follow_redirects=False) as client:
        client.cookies.set(CSRF_COOKIE, FABRICATED, path="/console/signin")
        r = client.post("/console/signin", data={
            "_csrf": FABRICATED, "login_name": heidi.login_name, "password": heidi.password})
        assert r.status_code == 403 and "security token" in r.text
        assert COOKIE not in r.headers.get("set-cookie", "")
        # The form the 403 shows works (its token is signed for the same pre-session).
        assert sign_in_http(client, heidi).status_code == 303


def test_a_signin_token_is_bound_to_its_pre_session(console_cloud, accounts):
    heidi = accounts[HEIDI]
    creds = {"login_name": heidi.login_name, "password": heidi.password}
    with httpx.Client(base_url=console_cloud.url) as one, \
            httpx.Client(base_url=console_cloud.url) as two:
        token_one, token_two = signin_token(one), signin_token(two)
        assert token_one != one.cookies[CSRF_COOKIE]     # not a double-submit copy
        one.cookies.set(CSRF_COOKIE, two.cookies[CSRF_COOKIE], path="/console/signin")
        r = one.post("/console/signin", data={**creds, "_csrf": token_one})
        assert r.status_code == 403 and "security token" in r.text
        r = one.post("/console/signin", data={**creds, "_csrf": token_two},
                     follow_redirects=False)
        assert r.status_code == 303


@pytest.fixture(scope="module")
def unsafe_routes(tmp_path_factory) -> list[tuple[str, str]]:
    """(method, path template) of every console route that takes a state-changing method,
    from the app's own route table."""
    cloud = CloudApp(SimConfig(state_dir=tmp_path_factory.mktemp("csrf-routes")))
    found = sorted((method, r.path) for r in cloud.routes()
                   if isinstance(r, Route) and r.path.startswith("/console")
                   for method in (r.methods or set()) & UNSAFE)
    cloud.store.close()
    assert ("POST", "/console/signin") in found and ("POST", "/console/signout") in found
    return found


@pytest.fixture
def session(console_cloud, accounts) -> Iterator[tuple[httpx.Client, str]]:
    """A signed-in client and its session's form token."""
    client = httpx.Client(base_url=console_cloud.url, follow_redirects=False)
    assert sign_in_http(client, accounts[HEIDI]).status_code == 303
    csrf = re.search(r'name="_csrf" value="([^"]+)"', client.get("/console/").text)[1]
    yield client, csrf
    client.close()


CROSS_SITE = [{"origin": "http://127.0.0.1:1"}, {"origin": "null"},
              {"origin": "http://evil.example"}, {"sec-fetch-site": "cross-site"},
              {"sec-fetch-site": "same-site"}, {"sec-fetch-site": "bogus"},
              {"origin": "SAME", "sec-fetch-site": "cross-site"},
              {"origin": "http://127.0.0.1:1", "sec-fetch-site": "same-origin"}]


def test_every_state_changing_console_route_refuses_other_origins(
        console_cloud, session, accounts, unsafe_routes):
    """Each (method, route) with every cross-site header set: a 403 that says why, before the
    route runs (the requests carry the session's valid form token and, for sign-in, a valid
    sign-in token and the right password)."""
    client, csrf = session
    own_origin = console_cloud.url
    heidi = accounts[HEIDI]
    for method, template in unsafe_routes:
        path = re.sub(r"\{\w+(?::\w+)?\}", "x", template)
        form = {"_csrf": csrf, "region": "cn-shanghai", "UserName": "csrf-victim"}
        if template == "/console/signin":
            form = {"_csrf": signin_token(client), "login_name": heidi.login_name,
                    "password": heidi.password}
        for headers in CROSS_SITE:
            headers = {k: own_origin if v == "SAME" else v for k, v in headers.items()}
            r = client.request(method, path, data=form, headers=headers)
            assert r.status_code == 403 and REFUSED in r.text, (method, path, headers,
                                                                r.status_code)
    assert client.get("/console/ram/users").status_code == 200      # still signed in
    text = httpx.get(console_cloud.url + "/metrics").text
    assert re.search(r'consolerl_console_sim_csrf_refusals_total\{check="origin"\} [1-9]', text)
    assert re.search(r'consolerl_console_sim_csrf_refusals_total\{check="fetch_site"\} [1-9]',
                     text)


@pytest.mark.parametrize("headers", [
    {}, {"origin": "SAME"}, {"sec-fetch-site": "same-origin"}, {"sec-fetch-site": "none"},
    {"origin": "SAME", "sec-fetch-site": "same-origin"}])
def test_same_origin_and_headerless_posts_work(console_cloud, accounts, headers):
    """Same-origin browsers and non-browser clients (no Origin, no Sec-Fetch-Site) sign in
    and submit forms as before; the tokens still decide."""
    headers = {k: console_cloud.url if v == "SAME" else v for k, v in headers.items()}
    with httpx.Client(base_url=console_cloud.url, follow_redirects=False) as client:
        r = client.post("/console/signin", headers=headers, data={
            "_csrf": signin_token(client), "login_name": accounts[HEIDI].login_name,
            "password": accounts[HEIDI].password})
        assert r.status_code == 303, r.text[:300]
        csrf = re.search(r'name="_csrf" value="([^"]+)"', client.get("/console/").text)[1]
        r = client.post("/console/region", headers=headers,
                        data={"_csrf": csrf, "region": "cn-shanghai"})
        assert r.status_code == 303
        r = client.post("/console/region", headers=headers, data={"region": "cn-shanghai"})
        assert r.status_code == 403 and "expired" in r.text      # the session token holds
        r = client.post("/console/signout", headers=headers, data={"_csrf": csrf})
        assert r.status_code == 303


def test_the_origin_must_match_the_host_exactly(console_cloud, session):
    """Another port, scheme or host name of the same machine is another origin."""
    client, csrf = session
    port = console_cloud.port
    for origin in (f"http://127.0.0.1:{port + 1}", f"https://127.0.0.1:{port}",
                   f"http://localhost:{port}", f"http://127.0.0.1:{port}/",
                   f"http://127.0.0.1:{port}.evil.example"):
        r = client.post("/console/region", headers={"origin": origin},
                        data={"_csrf": csrf, "region": "cn-shanghai"})
        assert r.status_code == 403 and REFUSED in r.text, origin
    # Through the name the browser used (its Host header), the server is its own origin.
    r = client.post("/console/region", data={"_csrf": csrf, "region": "cn-shanghai"},
                    headers={"host": f"localhost:{port}", "origin": f"http://localhost:{port}"})
    assert r.status_code == 303


def test_oss_and_the_openapi_do_not_take_the_console_cookie(console_cloud, session, api,
                                                            accounts):
    """The OpenAPI and OSS authenticate each request by its AccessKey signature, never by the
    console's cookie, so the origin check leaves them alone: a signed OSS call on the bucket
    named ``console`` works with a foreign Origin, and the cookie alone changes nothing."""
    client, _ = session
    heidi = accounts[HEIDI]
    bucket = api(HEIDI).oss_bucket("console")
    bucket.create_bucket()
    try:
        r = client.post("/", params={"Action": "DescribeRegions", "Version": "2014-05-26"},
                        headers={"origin": "http://127.0.0.1:1"})
        assert r.status_code == 400 and r.json()["Code"] == "MissingParameter"
        client.put("/console/?acl", headers={"x-oss-acl": "public-read"})
        assert bucket.get_bucket_acl().acl == "private"
        headers = {"date": formatdate(usegmt=True), "x-oss-acl": "public-read",
                   "origin": "http://127.0.0.1:1", "sec-fetch-site": "cross-site"}
        signature = oss_sign(heidi.access_key_secret, "PUT", headers, "/console/?acl")
        headers["authorization"] = f"OSS {heidi.access_key_id}:{signature}"
        r = httpx.put(console_cloud.url + "/console/?acl", headers=headers)
        assert r.status_code == 200, r.text
        assert bucket.get_bucket_acl().acl == "public-read"
    finally:
        bucket.delete_bucket()


def test_refusals_do_not_echo_secrets_or_huge_origins(console_cloud, session):
    client, csrf = session
    r = client.post("/console/region", headers={"origin": "http://" + "a" * 5000},
                    data={"_csrf": csrf, "region": "cn-shanghai"})
    assert r.status_code == 403 and len(r.text) < 5000
    assert csrf not in r.text
