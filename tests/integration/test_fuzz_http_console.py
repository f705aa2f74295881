"""Fuzzing of the local cloud's console: every page (signed in) with real or hostile path
parameters and queries, every form POST with or without its CSRF token and with hostile
``Origin`` / ``Sec-Fetch-Site`` headers, and the sign-in form,
against a real ``python -m infra.console_sim`` process of this module's own (the fuzz signs in
and out and fails sign-ins from 127.0.0.1: the address lockout would refuse other tests'
sign-ins). The properties and the counts: :mod:`tests.integration.fuzz_kit`."""
from __future__ import annotations

import re
import time
from collections.abc import Iterator
from email.utils import formatdate
from urllib.parse import quote, urlencode

import httpx
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from starlette.routing import Route

from consolerl.accounts import Account
from infra.cloud import CloudClient, CloudConfig, Credentials
from infra.console_sim.app import CloudApp
from infra.console_sim.config import SimConfig
from tests.conftest import CloudServer, wait_for
from tests.integration.console_kit import sign_in_http
from tests.integration.fuzz_kit import (CONSOLE, REGION, REQUEST_S, Tally, encode_query, fuzz,
                                        htext, huge, oss_sign, text, timed, values)
from tests.integration.fuzz_kit import fuzz_cloud  # noqa: F401 - the fixture

pytestmark = pytest.mark.timeout(240)


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
    signature = oss_sign(account.access_key_secret, "PUT", headers, "/fuzz-console-bucket/")
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
                "?" + encode_query(query) if query else "")
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
                status, elapsed = timed(client, "GET", "/console/signin?" + encode_query(
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



@pytest.mark.parametrize("n", [120])
def test_console_cross_site_headers_never_5xx(fuzz_cloud, console, console_ids, routes, n):
    """120 examples: every console POST route (and PUT, DELETE, PATCH on them) with the
    session's token and hostile ``Origin`` / ``Sec-Fetch-Site`` headers (other ports and
    schemes, ``null``, odd case, huge, non-ASCII bytes, junk). Never a 5xx; whenever either
    header names another site, a 403 before the route runs."""
    own = fuzz_cloud.url
    origins = st.one_of(st.none(), htext, st.sampled_from([
        own, own.upper(), own + "/", "null", "", "http://127.0.0.1:1",
        own.replace("http:", "https:"), own.replace("127.0.0.1", "localhost"),
        own + ".evil.example", "http://" + "a" * 5000, b"http://127.0.0.1:\xff"]))
    sites = st.one_of(st.none(), htext, st.sampled_from([
        "same-origin", "none", "same-site", "cross-site", "SAME-ORIGIN", ""]))
    with Tally("console_cross_site", fuzz_cloud) as tally:
        @fuzz(n)
        @given(template=st.sampled_from(routes["POST"]), hostile=path_params,
               method=st.sampled_from(["POST", "POST", "POST", "PUT", "DELETE", "PATCH"]),
               origin=origins, site=sites)
        def run(template, hostile, method, origin, site):
            headers: dict[str, str | bytes] = {
                "content-type": "application/x-www-form-urlencoded"}
            if origin is not None:
                headers["origin"] = origin
            if site is not None:
                headers["sec-fetch-site"] = site
            url = _fill(template, console_ids, hostile)
            body = urlencode({"_csrf": console.csrf, "region": REGION}).encode()
            response, elapsed = console.request(method, url, content=body, headers=headers)
            tally.check(response.status_code, elapsed, (method, url, headers))
            foreign = origin is not None and (
                not isinstance(origin, str) or origin.lower() != own.lower())
            if foreign or site not in (None, "same-origin", "none"):
                assert response.status_code == 403, (method, url, headers)
                assert "came from another site" in response.text
        run()
