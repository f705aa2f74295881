"""Bad input never gives a 500: random parameters, malformed signatures, huge values."""
from __future__ import annotations

import json
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from consolerl.errors import CloudAPIError
from infra.console_sim.products import rpc_products

AUTH_CODES = {"MissingParameter", "IncompleteSignature", "InvalidAccessKeyId.NotFound",
              "SignatureDoesNotMatch", "InvalidTimeStamp.Expired", "InvalidTimeStamp.Format",
              "SignatureNonceUsed", "InvalidParameter", "InvalidVersion",
              "InvalidAction.NotFound"}
OSS_CODES = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "RequestTimeTooSkewed",
             "InvalidArgument"}
FUZZ = settings(max_examples=120, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

text = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40)
# Header values must be valid HTTP (visible ASCII); the HTTP layer refuses anything else first.
htext = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=40)
huge = st.integers(min_value=1, max_value=9_000).map(lambda n: "x" * n)
values = st.one_of(text, huge, st.sampled_from(["", "-1", "1e9", "null", "[]", '["i-1"]',
                                                "%zz", "0.0.0.0/0", "true", "[" * 3000]))
keys = st.one_of(text.filter(bool), st.sampled_from([
    "RegionId", "Action", "Version", "Signature", "AccessKeyId", "SignatureNonce", "Timestamp",
    "SignatureMethod", "SignatureVersion", "PageSize", "Tag.1.Key", "LookupAttribute.9.Key"]))
auth_headers = st.one_of(
    st.just(""), htext,
    st.builds(lambda a, b, c: f"ACS3-HMAC-SHA256 Credential={a},SignedHeaders={b},Signature={c}",
              htext, htext, htext),
    st.builds(lambda a, b: f"ACS3-HMAC-SHA256 Credential=LTAI5tLocalAlice000001,"
                           f"SignedHeaders=host;x-acs-action;x-acs-date;x-acs-signature-nonce;"
                           f"x-acs-version,Signature={a}{b}", htext, htext),
    st.builds(lambda a: f"OSS LTAI5tLocalAlice000001:{a}", htext))


def _assert_client_error(response: httpx.Response, allowed: set[str]) -> None:
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:300])
    if response.headers.get("content-type", "").startswith("application/xml"):
        assert "<Code>" in response.text
        code = response.text.split("<Code>")[1].split("</Code>")[0]
        assert code in OSS_CODES | {"NotImplemented", "MethodNotAllowed"}, code
        return
    body = response.json()
    assert {"RequestId", "HostId", "Code", "Message", "Recommend"} <= body.keys()
    assert body["Code"] in allowed, body


@FUZZ
@given(method=st.sampled_from(["GET", "POST", "PUT", "DELETE"]),
       params=st.dictionaries(keys, values, max_size=6),
       authorization=auth_headers,
       action=st.one_of(st.just(None), htext, st.sampled_from(["DescribeInstances", "LookupEvents"])),
       version=st.one_of(st.just(None), htext, st.sampled_from(["2014-05-26", "2020-07-06"])),
       date=st.one_of(st.just(None), htext, st.just("2020-01-01T00:00:00Z")),
       body=st.one_of(st.just(b""), st.binary(max_size=200)))
def test_malformed_requests_get_4xx(cloud, method, params, authorization, action, version, date, body):
    query = "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in params.items())
    headers = {"content-type": "application/x-www-form-urlencoded"}
    for name, value in (("authorization", authorization), ("x-acs-action", action),
                        ("x-acs-version", version), ("x-acs-date", date)):
        if value:
            headers[name] = value
    if date:
        headers["x-acs-signature-nonce"] = "n"
        headers["x-acs-content-sha256"] = "0" * 64
    try:
        response = httpx.request(method, f"{cloud.url}/?{query}", headers=headers, content=body,
                                 timeout=10)
    except httpx.RemoteProtocolError:
        pytest.fail("server dropped the connection instead of answering")
    _assert_client_error(response, AUTH_CODES)


@pytest.mark.parametrize("raw", [b"/?" + b"A" * 60_000, b"/?%ff%fe=1", b"/?a=%00",
                                 b"/?Signature=x&AccessKeyId=LTAI5tLocalAlice000001&a=1&a=2"])
def test_odd_urls_get_4xx(cloud, raw):
    response = httpx.request("POST", cloud.url + raw.decode("latin-1"), timeout=10)
    assert 400 <= response.status_code < 500, response.text[:200]


def test_huge_body_gets_4xx(cloud):
    response = httpx.post(f"{cloud.url}/", content=b"x" * (2 * 1024 * 1024), timeout=20,
                          headers={"content-type": "application/x-www-form-urlencoded"})
    assert response.status_code == 400 and response.json()["Code"] == "InvalidParameter"


ACTIONS = sorted((p.name, a) for p in rpc_products().values() for a in p.actions)
PARAM_NAMES = ["RegionId", "VpcId", "VSwitchId", "SecurityGroupId", "InstanceId", "ZoneId",
               "CidrBlock", "InstanceType", "ImageId", "UserName", "PolicyName", "PolicyType",
               "PageSize", "PageNumber", "MaxResults", "NextToken", "StartTime", "EndTime",
               "IpProtocol", "PortRange", "SourceCidrIp", "Permissions.1.IpProtocol",
               "Tag.1.Key", "Tag.1.Value", "Tag.200.Key", "InstanceIds", "SecurityGroupIds.1",
               "LookupAttribute.1.Key", "LookupAttribute.1.Value", "Amount", "Direction",
               "ResourceType", "ResourceId.1", "NewUserName", "MaxItems", "Marker", "Password"]


@FUZZ
@given(target=st.sampled_from(ACTIONS),
       params=st.dictionaries(st.sampled_from(PARAM_NAMES) | text.filter(bool), values, max_size=8),
       sig=st.sampled_from(["v3", "v2"]))
def test_signed_random_parameters_never_5xx(make_client, target, params, sig):
    product, action = target
    client = make_client(6, sig)
    try:
        client.rpc(product, action, params)
    except CloudAPIError as err:
        assert 400 <= err.status < 500, err
        assert err.code != "InternalError"


def test_metrics_count_requests(cloud, make_client):
    make_client(0).rpc("Ecs", "DescribeSecurityGroups", {"RegionId": "cn-hangzhou"})
    text_ = httpx.get(cloud.url + "/metrics", timeout=5).text
    assert 'consolerl_cloud_sim_requests_total{action="DescribeSecurityGroups",code="Success",product="Ecs"}' in text_
    assert "consolerl_cloud_sim_request_duration_seconds_bucket" in text_
    assert "LocalSecret" not in text_
    json.dumps(text_)


def _json_parameters() -> list[str]:
    """Every parameter the products read as JSON (``p.json_list("Name")``)."""
    import re
    from pathlib import Path

    from infra.console_sim import products
    found = set()
    for path in Path(products.__file__).parent.glob("*.py"):
        found |= set(re.findall(r'json_list\(\s*"(\w+)"', path.read_text()))
    return sorted(found)


JSON_PARAMS = _json_parameters()
# Each under the 32 KiB query limit once URL-encoded, so the JSON parser is what sees them.
DEEP = ["[" * 8_000, "[" * 2_000 + "]" * 2_000, '{"a":' * 1_000 + "1" + "}" * 1_000,
        "[" + '"x",' * 2_500 + '"x"]']


def test_json_parameters_are_found():
    assert {"InstanceIds", "SecurityGroupIds"} <= set(JSON_PARAMS)


@pytest.mark.parametrize("value", DEEP, ids=["open", "closed", "objects", "many"])
def test_deep_or_huge_json_parameters_are_400_naming_them(make_client, value):
    """Every action gets every JSON-valued parameter, deeply nested or huge: a clear 4xx, the
    parameter named where the action reads it, and the value never echoed."""
    client = make_client(6, "v3")
    named = set()
    for product, action in ACTIONS:
        for name in JSON_PARAMS:
            try:
                client.rpc(product, action, {"RegionId": "cn-hangzhou", name: value})
            except CloudAPIError as err:
                assert 400 <= err.status < 500 and err.code != "InternalError", (action, err)
                assert len(err.message) < 500, (action, err.message[:200])
                if err.code == "InvalidParameter" and f'"{name}"' in err.message:
                    named.add((action, name))
    assert {("DescribeInstances", "InstanceIds"),
            ("DescribeSecurityGroups", "SecurityGroupIds")} <= named
