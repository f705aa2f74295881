"""Fuzzing of the local cloud's APIs: the OpenAPI (RPC, signed ACS3 and v1, rightly, wrongly
or tampered with after signing) and the OSS REST API (signature V1), against a real
``python -m infra.console_sim`` process of this module's own. The properties and the counts:
:mod:`tests.integration.fuzz_kit`."""
from __future__ import annotations

import hashlib
import time
import uuid
from email.utils import formatdate
from urllib.parse import quote, urlencode

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from consolerl.accounts import Account
from infra.console_sim.products import rpc_products
from infra.console_sim.signing import (ACS3, acs3_signature, acs3_string_to_sign,
                                       rpc_v1_signature)
from tests.integration.fuzz_kit import (API, REGION, Tally, encode_query, fuzz, htext,
                                        oss_sign, text, timed, values)
from tests.integration.fuzz_kit import fuzz_cloud, web  # noqa: F401 - the fixtures

pytestmark = pytest.mark.timeout(240)


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
    return "/?" + encode_query(query), headers


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
    return "/?" + encode_query(full)


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
                                            f"{oss_sign(key, method, headers, resource)}")
            path = "/" + quote(bucket, safe="") + ("/" if bucket else "")
            url = path + ("?" + "&".join(f"{quote(k)}={quote(v)}" if v else quote(k)
                                         for k, v in query.items()) if query else "")
            status, elapsed = timed(web, method, url, headers=headers, content=body)
            tally.check(status, elapsed, (method, url, headers, body[:80]))
        run()

