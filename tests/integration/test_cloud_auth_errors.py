"""Authentication and the listed error codes, through the official SDK clients."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from alibabacloud_ecs20140526 import models as ecs
from alibabacloud_tea_openapi import client as openapi_client
from alibabacloud_tea_openapi.client import Client as OpenApiClient
from alibabacloud_tea_openapi.utils_models import OpenApiRequest, Params
from Tea.exceptions import TeaException

from consolerl.errors import CloudAPIError
from tests.conftest import CloudServer

SIGNATURES = ["v3", "v2"]


def describe_sgs(c):
    return c.call(c.ecs.describe_security_groups_with_options,
                  ecs.DescribeSecurityGroupsRequest(region_id="cn-hangzhou"))


def error_of(fn, *args) -> CloudAPIError:
    with pytest.raises(CloudAPIError) as info:
        fn(*args)
    return info.value


@pytest.mark.parametrize("sig", SIGNATURES)
def test_wrong_secret_is_refused(make_client, sig):
    err = error_of(describe_sgs, make_client(0, sig, secret="not-the-right-secret-at-all"))
    assert (err.code, err.status) == ("SignatureDoesNotMatch", 400)


@pytest.mark.parametrize("sig", SIGNATURES)
def test_unknown_access_key_is_refused(make_client, sig):
    err = error_of(describe_sgs, make_client(0, sig, key="LTAI5tUnknownKey00000"))
    assert (err.code, err.status) == ("InvalidAccessKeyId.NotFound", 404)


@pytest.mark.parametrize("sig", SIGNATURES)
def test_stale_date_is_refused(make_client, monkeypatch, sig):
    stale = (datetime.now(timezone.utc) - timedelta(minutes=16)).strftime("%Y-%m-%dT%H:%M:%SZ")
    monkeypatch.setattr(openapi_client.Utils, "get_timestamp", staticmethod(lambda: stale))
    err = error_of(describe_sgs, make_client(0, sig))
    assert (err.code, err.status) == ("InvalidTimeStamp.Expired", 400)


@pytest.mark.parametrize("sig", SIGNATURES)
def test_date_within_skew_is_accepted(make_client, monkeypatch, sig):
    early = (datetime.now(timezone.utc) - timedelta(minutes=10)).strftime("%Y-%m-%dT%H:%M:%SZ")
    monkeypatch.setattr(openapi_client.Utils, "get_timestamp", staticmethod(lambda: early))
    assert describe_sgs(make_client(0, sig)).request_id


@pytest.mark.parametrize("sig", SIGNATURES)
def test_replayed_nonce_is_refused(make_client, monkeypatch, sig):
    nonce = f"fixed-nonce-{sig}-{datetime.now().timestamp()}"
    monkeypatch.setattr(openapi_client.Utils, "get_nonce", staticmethod(lambda: nonce))
    c = make_client(0, sig)
    assert describe_sgs(c).request_id
    err = error_of(describe_sgs, c)
    assert (err.code, err.status) == ("SignatureNonceUsed", 400)


def test_unknown_action_and_version(make_client):
    c = make_client(0)
    err = error_of(c.rpc, "Ecs", "LaunchRockets", {"RegionId": "cn-hangzhou"})
    assert (err.code, err.status) == ("InvalidAction.NotFound", 404)
    api = Params(action="DescribeInstances", version="2099-01-01", protocol="HTTPS", pathname="/",
                 method="POST", auth_type="AK", style="RPC", req_body_type="formData",
                 body_type="json")
    with pytest.raises(TeaException) as info:
        OpenApiClient.call_api(c.ecs, api, OpenApiRequest(query={"RegionId": "cn-hangzhou"}),
                               c.runtime())
    assert (info.value.code, info.value.data["statusCode"]) == ("InvalidVersion", 400)


@pytest.mark.parametrize("sig", SIGNATURES)
def test_parameter_errors(make_client, sig):
    c = make_client(0, sig)
    err = error_of(c.rpc, "Ecs", "CreateSecurityGroup", {})
    assert (err.code, err.status) == ("MissingParameter", 400) and "RegionId" in err.message
    err = error_of(c.rpc, "Ecs", "DescribeSecurityGroups",
                   {"RegionId": "cn-hangzhou", "PageSize": "5000"})
    assert (err.code, err.status) == ("InvalidParameter", 400) and "PageSize" in err.message
    err = error_of(c.rpc, "Ecs", "DescribeSecurityGroups", {"RegionId": "mars-north-1"})
    assert err.code == "InvalidRegionId.NotFound"
    err = error_of(c.rpc, "Actiontrail", "LookupEvents", {"MaxResults": "51"})
    assert (err.code, err.status) == ("InvalidParameter", 400)


def test_not_found_codes(make_client):
    c = make_client(0)
    cases = [
        ("Ecs", "DescribeSecurityGroupAttribute", {"RegionId": "cn-hangzhou",
                                                   "SecurityGroupId": "sg-bp000"},
         "InvalidSecurityGroupId.NotFound"),
        ("Ecs", "StopInstance", {"InstanceId": "i-bp000"}, "InvalidInstanceId.NotFound"),
        ("Vpc", "DeleteVSwitch", {"VSwitchId": "vsw-bp000"}, "InvalidVSwitchId.NotFound"),
        ("Vpc", "DeleteVpc", {"VpcId": "vpc-bp000"}, "InvalidVpcId.NotFound"),
        ("Ram", "GetUser", {"UserName": "nobody"}, "EntityNotExist.User"),
    ]
    for product, action, params, code in cases:
        err = error_of(c.rpc, product, action, params)
        assert (err.code, err.status) == (code, 404), (action, err)


def test_throttling(tmp_path, make_client):
    server = CloudServer(tmp_path, ["--lookup-qps", "2"])
    server.start()
    try:
        c = make_client(0, server=server)
        codes = []
        for _ in range(6):
            try:
                c.rpc("Actiontrail", "LookupEvents", {"MaxResults": "1"})
                codes.append("ok")
            except CloudAPIError as err:
                codes.append(err.code)
        assert codes[:2] == ["ok", "ok"]
        assert "Throttling.User" in codes
        # The limit is per account: another account is not throttled.
        assert make_client(1, server=server).rpc("Actiontrail", "LookupEvents", {})["RequestId"]
    finally:
        server.stop()


def test_state_survives_restart(tmp_path, make_client, monkeypatch):
    server = CloudServer(tmp_path, ["--network-ready", "0"])
    server.start()
    try:
        c = make_client(0, server=server)
        vpc_id = c.rpc("Vpc", "CreateVpc", {"RegionId": "cn-hangzhou", "VpcName": "keep"})["VpcId"]
        sg_id = c.rpc("Ecs", "CreateSecurityGroup", {"RegionId": "cn-hangzhou", "VpcId": vpc_id})[
            "SecurityGroupId"]
        nonce = f"restart-nonce-{datetime.now().timestamp()}"
        monkeypatch.setattr(openapi_client.Utils, "get_nonce", staticmethod(lambda: nonce))
        c.rpc("Ram", "CreateUser", {"UserName": "survivor"})
        monkeypatch.undo()
        server.restart()
        assert [v["VpcId"] for v in c.rpc("Vpc", "DescribeVpcs", {"RegionId": "cn-hangzhou"})[
            "Vpcs"]["Vpc"]] == [vpc_id]
        groups = c.rpc("Ecs", "DescribeSecurityGroups", {"RegionId": "cn-hangzhou"})
        assert [g["SecurityGroupId"] for g in groups["SecurityGroups"]["SecurityGroup"]] == [sg_id]
        assert c.rpc("Ram", "GetUser", {"UserName": "survivor"})["User"]["UserName"] == "survivor"
        events = c.rpc("Actiontrail", "LookupEvents", {"LookupAttribute.1.Key": "EventName",
                                                       "LookupAttribute.1.Value": "CreateVpc"})
        assert [e["resourceName"] for e in events["Events"]] == [vpc_id]
        # A nonce used before the restart is still refused after it.
        monkeypatch.setattr(openapi_client.Utils, "get_nonce", staticmethod(lambda: nonce))
        err = error_of(c.rpc, "Ram", "GetUser", {"UserName": "survivor"})
        assert err.code == "SignatureNonceUsed"
    finally:
        server.stop()


def _signed_v1(account, params: dict[str, str]) -> dict[str, str]:
    """An RPC v1 (HMAC-SHA1) query over exactly ``params`` plus the signing envelope."""
    import secrets as _secrets
    from datetime import UTC, datetime

    from infra.console_sim.signing import rpc_v1_signature
    query = {**params, "Format": "json", "AccessKeyId": account.access_key_id,
             "SignatureMethod": "HMAC-SHA1", "SignatureVersion": "1.0",
             "SignatureNonce": _secrets.token_hex(16),
             "Timestamp": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}
    query["Signature"] = rpc_v1_signature("POST", query, account.access_key_secret)
    return query


def test_rpc_v1_runs_only_the_signed_action(cloud, accounts):
    """The action and version are part of what an RPC v1 signature covers: a request signed
    without them is refused, whatever the (unsigned) x-acs-action / x-acs-version headers say,
    and headers that disagree with the signed ones are refused too."""
    import httpx
    account = accounts[0]
    url = f"http://{cloud.endpoint}/"
    unsigned_action = _signed_v1(account, {"RegionId": "cn-hangzhou"})
    r = httpx.post(url, params=unsigned_action, timeout=10,
                   headers={"x-acs-action": "DescribeSecurityGroups",
                            "x-acs-version": "2014-05-26"})
    assert r.status_code == 400 and r.json()["Code"] == "MissingParameter", r.text
    assert "Action" in r.json()["Message"]

    signed = _signed_v1(account, {"Action": "DescribeSecurityGroups", "Version": "2014-05-26",
                                  "RegionId": "cn-hangzhou"})
    r = httpx.post(url, params=signed, timeout=10,
                   headers={"x-acs-action": "DeleteSecurityGroup", "x-acs-version": "2014-05-26"})
    assert r.status_code == 400 and r.json()["Code"] == "InvalidParameter", r.text
    assert "x-acs-action" in r.json()["Message"]

    ok = _signed_v1(account, {"Action": "DescribeSecurityGroups", "Version": "2014-05-26",
                              "RegionId": "cn-hangzhou"})
    r = httpx.post(url, params=ok, timeout=10,
                   headers={"x-acs-action": "DescribeSecurityGroups",
                            "x-acs-version": "2014-05-26"})
    assert r.status_code == 200, r.text


# ---- non-ASCII signatures, hashes and tokens are refused, never a 500 -----------

def _assert_refused(r, code: str) -> None:
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:300])
    if r.headers.get("content-type", "").startswith("application/xml"):
        assert f"<Code>{code}</Code>" in r.text, r.text[:300]
    else:
        body = r.json()
        assert {"RequestId", "HostId", "Code", "Message", "Recommend"} <= body.keys()
        assert body["Code"] == code, body


@pytest.mark.parametrize("signature", ["é", "\u6d4b\u8bd5", "\U0001F600" * 10, "é" * 28])
def test_non_ascii_rpc_v1_signature_is_refused(cloud, accounts, signature):
    import httpx
    query = _signed_v1(accounts[0], {"Action": "DescribeVpcs", "Version": "2016-04-28",
                                     "RegionId": "cn-hangzhou"})
    query["Signature"] = signature
    r = httpx.post(f"{cloud.url}/", params=query, timeout=10)
    _assert_refused(r, "SignatureDoesNotMatch")


def _acs3_headers(account, signature: bytes, content_sha256: bytes) -> dict[str, bytes]:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    signed = "host;x-acs-action;x-acs-content-sha256;x-acs-date;x-acs-signature-nonce;x-acs-version"
    return {"authorization": f"ACS3-HMAC-SHA256 Credential={account.access_key_id},"
                             f"SignedHeaders={signed},Signature=".encode() + signature,
            "x-acs-action": b"DescribeVpcs", "x-acs-version": b"2016-04-28",
            "x-acs-date": now.encode(), "x-acs-content-sha256": content_sha256,
            "x-acs-signature-nonce": _nonce().encode()}


def _nonce() -> str:
    import secrets as _secrets
    return _secrets.token_hex(16)


# Header bytes above 0x7F are legal HTTP (obs-text); the server reads them as Latin-1 text.
@pytest.mark.parametrize("signature,content_sha256", [
    (b"\xc3\xa9" * 32, b"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
    (b"00", b"\xc3\xa9" * 32),
    (b"\xff", b"\xe9"),
])
def test_non_ascii_acs3_signature_or_content_hash_is_refused(cloud, accounts, signature,
                                                             content_sha256):
    import httpx
    r = httpx.post(f"{cloud.url}/", timeout=10,
                   headers=_acs3_headers(accounts[0], signature, content_sha256))
    _assert_refused(r, "SignatureDoesNotMatch")


@pytest.mark.parametrize("signature", [b"\xc3\xa9", b"\xe9" * 28, b"abc\xff"])
def test_non_ascii_oss_signature_is_refused(cloud, accounts, signature):
    from email.utils import formatdate

    import httpx
    r = httpx.get(f"{cloud.url}/", timeout=10, headers={
        "authorization": f"OSS {accounts[0].access_key_id}:".encode() + signature,
        "date": formatdate(usegmt=True)})
    _assert_refused(r, "SignatureDoesNotMatch")


@pytest.mark.parametrize("data", [
    {"m": 10 ** 30, "s": 1}, {"m": 1, "s": 2 ** 64}, {"m": -1, "s": -1}, {"m": 1.5, "s": 1},
    {"m": True, "s": 1}, {"m": "1", "s": "1"}, b"inf", b"[]", b"\xff\xfe", "é",
    "!!!not base64!!!", b'{"m":1e999,"s":1,"q":"%s"}', b'{"m":NaN,"s":1,"q":"%s"}',
])
def test_crafted_next_tokens_are_invalid_parameter(make_client, data):
    """Tokens made to look like ours (right scope: no lookup attributes, default times,
    BACKWARD), with the wrong types or out-of-range numbers, and plain garbage."""
    import base64
    import hashlib
    import json
    scope = hashlib.sha256(json.dumps([[], None, None, "BACKWARD"]).encode()).hexdigest()[:16]
    if isinstance(data, dict):
        raw = json.dumps({**data, "q": scope}).encode()
    elif isinstance(data, bytes):
        raw = data.replace(b"%s", scope.encode())
    else:
        raw = None
    token = data if raw is None else base64.urlsafe_b64encode(raw).decode().rstrip("=")
    err = error_of(make_client(0).rpc, "Actiontrail", "LookupEvents", {"NextToken": token})
    assert (err.code, err.status) == ("InvalidParameter", 400) and "NextToken" in err.message


# ---- OSS decodes its query parameters and bucket paths strictly ------------------

def _oss_headers(account, method: str, resource: str) -> dict[str, str]:
    """Date and an OSS V1 signature over ``resource`` (what the client means by the URL)."""
    from email.utils import formatdate

    from tests.integration.fuzz_kit import oss_sign
    headers = {"date": formatdate(usegmt=True)}
    headers["authorization"] = (f"OSS {account.access_key_id}:"
                                f"{oss_sign(account.access_key_secret, method, headers, resource)}")
    return headers


@pytest.mark.parametrize("method,raw,resource,code,named", [
    ("GET", "/?prefix=%ff", "/", "InvalidArgument", '"prefix"'),
    ("GET", "/?marker=ok&prefix=a%c3", "/", "InvalidArgument", '"prefix"'),
    ("GET", "/?max-keys=%ed%a0%80", "/", "InvalidArgument", '"max-keys"'),  # a surrogate
    ("GET", "/?%ff=1", "/", "InvalidArgument", '"%ff"'),
    ("GET", "/?acl=%ff", "/?acl=\ufffd", "InvalidArgument", '"acl"'),
    ("PUT", "/%ff/", "/\ufffd/", "InvalidBucketName", "bucket"),
    ("GET", "/ab%c3/?acl", "/ab\ufffd/?acl", "InvalidBucketName", "bucket"),
    ("GET", "/some-bucket/k%ff", "/some-bucket/k\ufffd", "InvalidObjectName", "object key"),
    ("PUT", "/some-bucket/a/%c3", "/some-bucket/a/\ufffd", "InvalidObjectName", "object key"),
])
def test_oss_refuses_invalid_utf8_in_query_and_path(cloud, accounts, method, raw, resource,
                                                    code, named):
    """A signed OSS request whose query, bucket or object key percent-decodes to invalid UTF-8 is a
    400 naming the parameter, as the OpenAPI answers, never a lookup with U+FFFD in it."""
    import httpx
    headers = _oss_headers(accounts[0], method, resource)
    r = httpx.request(method, cloud.url + raw, headers=headers, timeout=10)
    assert r.status_code == 400, (r.status_code, r.text[:300])
    assert r.headers["content-type"].startswith("application/xml")
    assert f"<Code>{code}</Code>" in r.text and named in r.text, r.text[:400]
    assert "\ufffd" not in r.text


def test_oss_takes_valid_utf8_query_parameters(cloud, accounts, make_client):
    """A non-ASCII prefix is matched as sent, through oss2 and a raw signed request."""
    import httpx
    assert make_client(0).oss_service().list_buckets(prefix="\u00e9t\u00e9-").buckets == []
    r = httpx.get(cloud.url + "/?prefix=%C3%A9t%C3%A9-", headers=_oss_headers(
        accounts[0], "GET", "/"), timeout=10)
    assert r.status_code == 200 and "<Prefix>\u00e9t\u00e9-</Prefix>" in r.text, r.text[:300]
