"""The console as a web application: sessions, CSRF, malformed requests, what page views do to
the audit log, and what the browser session can and cannot reach."""
from __future__ import annotations

import dataclasses
import re
from urllib.parse import urljoin, urlsplit

import httpx
import oss2
import pytest
from playwright.sync_api import expect

from infra.console_sim.console.sessions import COOKIE
from infra.console_sim.console.signin import CSRF_COOKIE
from tests.conftest import CloudServer, _server
from tests.integration.console_kit import audit_events, sign_in_http, signin_token

HEIDI = 7


@pytest.fixture
def http(console_cloud: CloudServer, accounts):
    """An httpx client signed in to the console as heidi (cookie set by the sign-in form)."""
    client = httpx.Client(base_url=console_cloud.url, follow_redirects=False)
    r = sign_in_http(client, accounts[HEIDI], next="/console/")
    assert r.status_code == 303
    yield client
    client.close()


def _csrf(http: httpx.Client, path: str) -> str:
    return re.search(r'name="_csrf" value="([^"]+)"', http.get(path).text)[1]


def test_pages_need_a_session_and_keep_where_you_were_going(console_cloud):
    r = httpx.get(console_cloud.url + "/console/ecs/instances?page=2")
    assert r.status_code == 303
    assert r.headers["location"] == "/console/signin?next=%2Fconsole%2Fecs%2Finstances%3Fpage%3D2"


def test_session_cookie_flags_and_wrong_passwords(console_cloud, accounts):
    heidi = accounts[HEIDI]
    with httpx.Client(base_url=console_cloud.url) as client:
        bad = sign_in_http(client, heidi, password="guess")
        assert bad.status_code == 401 and "incorrect" in bad.text
        assert COOKIE not in bad.headers.get("set-cookie", "")
        unknown = sign_in_http(client, dataclasses.replace(heidi, login_name="mallory"), "x")
        assert unknown.status_code == 401 and unknown.text.count("incorrect") == 1
        empty = sign_in_http(client, dataclasses.replace(heidi, login_name=""), "")
        assert empty.status_code == 400
        ok = sign_in_http(client, heidi, next="https://evil.example/")
    assert ok.status_code == 303 and ok.headers["location"] == "/console/"   # no open redirect
    cookie = next(c for c in ok.headers.get_list("set-cookie") if c.startswith(COOKIE)).lower()
    assert "httponly" in cookie and "samesite=strict" in cookie and "path=/console" in cookie


ESCAPING_TARGETS = [
    "/console/../metrics", "/console/ecs/../../?Action=LookupEvents", "/console/%2e%2e/metrics",
    "/console/.%2E/metrics", "/console/..%2fmetrics", "/console/%5c..%5cmetrics",
    "/console/%252e%252e/metrics",
]


@pytest.mark.parametrize("target", ESCAPING_TARGETS)
def test_sign_in_next_and_region_back_stay_in_the_console(http, console_cloud, accounts, target):
    """``next`` (sign-in) and ``_back`` (the region switch) go through one check; a target
    that a browser, the server or a proxy would resolve outside /console/ falls back to
    /console/ in the form, in the redirect, and wherever the browser resolves it."""
    heidi = accounts[HEIDI]
    form = httpx.get(console_cloud.url + "/console/signin", params={"next": target})
    assert form.status_code == 200 and 'name="next" value="/console/"' in form.text
    with httpx.Client(base_url=console_cloud.url) as client:
        signed_in = sign_in_http(client, heidi, next=target)
    switched = http.post("/console/region", data={
        "_csrf": _csrf(http, "/console/"), "region": "cn-hangzhou", "_back": target})
    for response in (signed_in, switched):
        assert response.status_code == 303 and response.headers["location"] == "/console/"
        landed = urlsplit(urljoin(console_cloud.url + "/console/region",
                                  response.headers["location"]))
        assert landed.path == "/console/"


def test_posts_without_the_session_csrf_token_change_nothing(http, api):
    r = http.post("/console/ram/users/create", data={"UserName": "csrf-victim"})
    assert r.status_code == 403 and "expired" in r.text
    assert "csrf-victim" not in str(api(HEIDI).rpc("Ram", "ListUsers", {}))


@pytest.mark.parametrize("body,ctype,status", [
    (b"UserName=x", "application/json", 415),
    (b"UserName=" + b"x" * 70_000, "application/x-www-form-urlencoded", 413),
    (b"UserName=%ff%fe", "application/x-www-form-urlencoded", 400),
])
def test_malformed_posts_get_a_clear_error(http, body, ctype, status):
    r = http.post("/console/ram/users/create", content=body, headers={"content-type": ctype})
    assert r.status_code == status
    assert "<h1>Error" in r.text


def test_unknown_pages_and_resources_are_404_pages(http):
    assert http.get("/console/no/such/page").status_code == 404
    r = http.get("/console/ecs/instances/i-doesnotexist")
    assert r.status_code == 404 and "InvalidInstanceId.NotFound" in r.text
    r = http.post("/console/ecs/instances/i-x/explode",
                  data={"_csrf": _csrf(http, "/console/ecs/instances")})
    assert r.status_code == 404


def test_page_views_are_not_audited(http, api):
    client = api(HEIDI)
    sg = client.rpc("Ecs", "CreateSecurityGroup", {"RegionId": "cn-hangzhou"})["SecurityGroupId"]
    before = len(audit_events(client))
    for path in ("/console/", "/console/ecs/instances", "/console/ecs/instances/create",
                 f"/console/ecs/security-groups/{sg}", "/console/vpc/vpcs", "/console/vpc/vswitches",
                 "/console/ram/users", "/console/oss/buckets", "/console/oss/buckets/create"):
        assert http.get(path).status_code == 200, path
    after = audit_events(client)
    # Only the LookupEvents call of the first count was added, by the SDK.
    assert [e["eventName"] for e in after[before:]] == ["LookupEvents"]


def test_the_browser_session_cannot_reach_the_openapi_or_the_audit_log(console, api, accounts):
    c = console(HEIDI)
    c.goto("/console/ecs/instances")
    # The console's cookie is no credential for the OpenAPI on the same host.
    result = c.page.evaluate("""async () => {
        const r = await fetch('/?Action=LookupEvents&Version=2020-07-06&RegionId=cn-hangzhou',
                              {method: 'POST', credentials: 'include'});
        return [r.status, await r.text()]; }""")
    assert result[0] in (400, 403) and '"Events"' not in result[1]
    assert c.page.request.get(c.base + "/console/actiontrail/events").status == 404
    # Nothing the console serves carries the account's secrets.
    heidi = accounts[HEIDI]
    html = "".join(c.page.request.get(c.base + p).text() for p in (
        "/console/", "/console/ecs/instances", "/console/ram/users", "/console/oss/buckets"))
    for secret in (heidi.access_key_id, heidi.access_key_secret, heidi.password):
        assert secret not in html
    assert c.page.context.cookies()[0]["httpOnly"] is True
    assert c.page.evaluate("document.cookie") == ""


def test_an_oss_bucket_named_console_stays_reachable(api, http):
    bucket = api(HEIDI).oss_bucket("console")
    bucket.create_bucket(oss2.BUCKET_ACL_PUBLIC_READ)
    assert bucket.get_bucket_acl().acl == oss2.BUCKET_ACL_PUBLIC_READ
    assert http.get("/console/").status_code == 200     # the console still answers browsers
    bucket.delete_bucket()


def test_region_switch_search_and_pagination(console, api):
    client = api(HEIDI)
    for n in range(23):
        client.rpc("Ecs", "CreateSecurityGroup", {"RegionId": "cn-shenzhen",
                                                  "SecurityGroupName": f"page-sg-{n:02d}"})
    c = console(HEIDI)
    c.goto("/console/ecs/security-groups")
    c.switch_region("cn-shenzhen")
    expect(c.page.get_by_role("navigation", name="Pagination")).to_contain_text("Total 23 items")
    table = c.page.locator("#live tbody tr")
    expect(table).to_have_count(20)
    c.click_and_wait(c.link("Next page"))
    expect(table).to_have_count(3)
    c.page.get_by_role("searchbox", name="Search text").fill("page-sg-07")
    c.click_and_wait(c.button("Search"))
    expect(table).to_have_count(1)
    expect(table).to_contain_text("page-sg-07")


def test_sign_out_ends_the_session(http):
    csrf = _csrf(http, "/console/")
    assert http.post("/console/signout", data={"_csrf": csrf}).status_code == 303
    assert http.get("/console/ram/users").status_code == 303


def test_sessions_survive_a_server_restart(tmp_path_factory, accounts):
    gen = _server(tmp_path_factory, "console-restart", [])
    server = next(gen)
    try:
        heidi = accounts[HEIDI]
        with httpx.Client(base_url=server.url) as client:
            assert sign_in_http(client, heidi).status_code == 303
            server.restart()
            assert client.get("/console/ram/users").status_code == 200
    finally:
        next(gen, None)


def test_metrics_cover_the_console(http, console_cloud):
    http.get("/console/ram/users")
    text = httpx.get(console_cloud.url + "/metrics").text
    for name in ("consolerl_console_sim_pages_total", "consolerl_console_sim_page_duration_seconds",
                 "consolerl_console_sim_signins_total", "consolerl_console_sim_sessions"):
        assert name in text
    assert 'consolerl_console_sim_pages_total{page="ram_users",status="200"}' in text


# ---- sign-in: CSRF token and lockout ----------------------------------------------

def test_sign_in_needs_the_forms_csrf_token(console_cloud, accounts):
    heidi = accounts[HEIDI]
    creds = {"login_name": heidi.login_name, "password": heidi.password}
    with httpx.Client(base_url=console_cloud.url) as client:
        # A page elsewhere can post the form, but has neither the cookie nor the token.
        r = client.post("/console/signin", data=creds)
        assert r.status_code == 403 and "security token" in r.text
        assert COOKIE not in r.headers.get("set-cookie", "")
        token = signin_token(client)
        cookie = next(c for c in client.cookies.jar if c.name == CSRF_COOKIE)
        # The cookie names the pre-session; the token is the server's signature for it.
        assert cookie.value != token and cookie.path == "/console/signin"
        assert cookie.has_nonstandard_attr("HttpOnly")
        issued, mac = token.split(".")
        for wrong in ("", "x" * 32, "é" * 32, token[:-1], cookie.value,
                      f"{int(issued) + 1}.{mac}", f"{int(issued) - 2 * 86400}.{mac}"):
            r = client.post("/console/signin", data={**creds, "_csrf": wrong})
            assert r.status_code == 403 and "security token" in r.text, wrong
        r = client.post("/console/signin", data={**creds, "_csrf": token})
        assert r.status_code == 303 and COOKIE in r.headers["set-cookie"]
        # The token ends with the sign-in; the session cookie takes over.
        assert CSRF_COOKIE not in {c.name for c in client.cookies.jar}
    with httpx.Client(base_url=console_cloud.url) as other:   # the token without its cookie
        r = other.post("/console/signin", data={**creds, "_csrf": token})
        assert r.status_code == 403


def test_sign_in_page_does_not_echo_huge_input(console_cloud, accounts):
    with httpx.Client(base_url=console_cloud.url) as client:
        kinds = ",".join(f"kind{i}" for i in range(2_000))
        r = sign_in_http(client, dataclasses.replace(accounts[HEIDI], login_name="n" * 20_000),
                         "x", drift=kinds)
        assert r.status_code == 400 and len(r.text) < 10_000


def test_non_ascii_csrf_tokens_are_refused_not_500(http):
    r = http.post("/console/ram/users/create", data={"_csrf": "é" * 32, "UserName": "x"})
    assert r.status_code == 403 and "expired" in r.text
    r = http.post("/console/ram/users/create", data={"_csrf": "\U0001F600", "UserName": "x"})
    assert r.status_code == 403


@pytest.fixture
def lock_cloud(tmp_path_factory):
    """A server of the test's own: locks must not leak into other tests' sign-ins."""
    yield from _server(tmp_path_factory, "console-lock", [])


def test_wrong_passwords_lock_the_account_even_for_the_right_password(lock_cloud, accounts):
    heidi, other = accounts[HEIDI], accounts[0]
    with httpx.Client(base_url=lock_cloud.url) as client:
        answers = [sign_in_http(client, heidi, f"guess-{i}") for i in range(5)]
        assert [r.status_code for r in answers] == [401, 401, 401, 401, 429]
        r = sign_in_http(client, heidi)            # the right password, too late
        assert r.status_code == 429 and "Too many failed sign-in attempts for this account" \
            in r.text and "try again in 5 minutes" in r.text
        assert 290 <= int(r.headers["retry-after"]) <= 300
        assert COOKIE not in r.headers.get("set-cookie", "")
        # Another account from the same address signs in as usual.
        assert sign_in_http(client, other).status_code == 303
    text = httpx.get(lock_cloud.url + "/metrics").text
    assert 'consolerl_console_sim_signin_lockouts_total{scope="account"} 1.0' in text
    assert 'consolerl_console_sim_signins_total{outcome="locked"} 1.0' in text
    assert 'consolerl_console_sim_signins_total{outcome="failed"} 5.0' in text


def test_many_wrong_passwords_from_one_address_lock_the_address(lock_cloud, accounts):
    with httpx.Client(base_url=lock_cloud.url) as client:
        token = signin_token(client)
        codes = [client.post("/console/signin", data={
            "_csrf": token, "login_name": f"nobody{i}", "password": "x"}).status_code
            for i in range(100)]
        assert codes == [401] * 99 + [429]
        r = sign_in_http(client, accounts[0])
        assert r.status_code == 429 and "your network address" in r.text
    text = httpx.get(lock_cloud.url + "/metrics").text
    assert 'consolerl_console_sim_signin_lockouts_total{scope="address"} 1.0' in text
