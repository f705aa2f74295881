"""Unit tests of the local cloud's pure parts: signing, parameters, accounts, errors."""
from __future__ import annotations

import pickle
from types import SimpleNamespace

import pytest
from alibabacloud_tea_openapi.utils import Utils as SdkUtils

from consolerl.errors import CloudAPIError, ConfigError
from infra.cloud import CloudConfig, Credentials
from consolerl.accounts import load_accounts, parse_accounts
from infra.console_sim.auth import parse_params
from infra.console_sim.errors import CloudError
from infra.console_sim.params import Params
from infra.console_sim.service import redact
from infra.console_sim.signing import (acs3_signature, acs3_string_to_sign, canonical_query,
                                       parse_acs3_authorization, rpc_v1_signature)
from infra.console_sim.timeutil import iso, parse_iso

SECRET = "LocalSecretAlice0000000000000001"


def test_acs3_matches_the_sdk_signer():
    query = {"RegionId": "cn-hangzhou", "SecurityGroupName": "a b", "Description": "x/y~*",
             "Tag.1.Key": "k"}
    headers = {"host": "127.0.0.1:1", "x-acs-action": "CreateSecurityGroup",
               "x-acs-date": "2026-11-21T00:00:00Z", "x-acs-signature-nonce": "n1",
               "x-acs-version": "2014-05-26", "x-acs-content-sha256": "e3b0" + "0" * 60}
    request = SimpleNamespace(pathname="/", method="POST", query=query, headers=headers)
    sdk_auth = SdkUtils.get_authorization(request, "ACS3-HMAC-SHA256", headers["x-acs-content-sha256"],
                                          "AK", SECRET)
    key, signed, signature = parse_acs3_authorization(sdk_auth)
    ours = acs3_signature(SECRET, acs3_string_to_sign("POST", "/", query, headers, signed,
                                                      headers["x-acs-content-sha256"]))
    assert key == "AK" and signed == sorted(headers) and ours == signature


def test_rpc_v1_matches_the_sdk_signer():
    params = {"Action": "DescribeVpcs", "RegionId": "cn-hangzhou", "Name": "a b+c/~",
              "Timestamp": "2026-11-21T00:00:00Z", "SignatureNonce": "n"}
    assert rpc_v1_signature("POST", params, SECRET) == SdkUtils.get_rpcsignature(params, "POST", SECRET)


def test_canonical_query_sorts_and_encodes():
    assert canonical_query({"b": "x y", "a": "1/2", "c": "~"}) == "a=1%2F2&b=x%20y&c=~"


@pytest.mark.parametrize("header", ["", "ACS3-HMAC-SHA256", "ACS3-HMAC-SHA256 Credential=a",
                                    "ACS3-HMAC-SHA256 Credential=,SignedHeaders=h,Signature=s",
                                    "Bearer x"])
def test_malformed_authorization_is_none(header):
    assert parse_acs3_authorization(header) is None


def test_parse_params_refuses_duplicates_and_nul():
    assert parse_params("a=1&b=x+y", "c=%2F") == {"a": "1", "b": "x y", "c": "/"}
    with pytest.raises(CloudError, match="more than once"):
        parse_params("a=1&a=2")
    with pytest.raises(CloudError, match="NUL"):
        parse_params("a=%00")
    with pytest.raises(CloudError, match="UTF-8"):
        parse_params("a=%ff")


def test_params_typed_access():
    p = Params({"PageSize": "20", "Tag.2.Key": "b", "Tag.1.Key": "a", "Tag.1.Value": "1",
                "Ids.2": "y", "Ids.1": "x", "Flag": "true", "J": '["i-1"]'})
    assert p.int("PageSize", lo=1, hi=50) == 20
    assert p.structs("Tag", ("Key", "Value")) == [{"Key": "a", "Value": "1"}, {"Key": "b"}]
    assert p.list("Ids") == ["x", "y"]
    assert p.bool("Flag") is True and p.json_list("J") == ["i-1"]
    with pytest.raises(CloudError) as info:
        p.int("PageSize", lo=1, hi=10)
    assert info.value.code == "InvalidParameter" and "PageSize" in info.value.message
    with pytest.raises(CloudError) as info:
        p.req("Missing")
    assert info.value.code == "MissingParameter"
    with pytest.raises(CloudError):
        Params({"Tag.1.Colour": "x"}).structs("Tag", ("Key", "Value"))
    with pytest.raises(CloudError):
        Params({"J": "{not json"}).json_list("J")


def test_redact_hides_secrets_and_envelope():
    out = redact({"Password": "p", "SystemDisk.Password": "q", "AccessKeyId": "AK",
                  "Signature": "s", "RegionId": "r", "NextToken": "t"})
    assert out == {"Password": "******", "SystemDisk.Password": "******", "RegionId": "r",
                   "NextToken": "t"}


def test_accounts_validation_names_the_field(tmp_path):
    good = {"account_id": "1234567", "login_name": "a", "password": "p",
            "access_key_id": "LTAI12345678", "access_key_secret": "s" * 16}
    assert parse_accounts([good])[0].login_name == "a"
    with pytest.raises(ConfigError, match="account #1: field 'password' is required"):
        parse_accounts([{**good, "password": ""}])
    with pytest.raises(ConfigError, match="unknown field"):
        parse_accounts([{**good, "role": "x"}])
    with pytest.raises(ConfigError, match="duplicate access_key_id"):
        parse_accounts([good, {**good, "account_id": "7654321", "login_name": "b"}])
    bad = tmp_path / "a.yaml"
    bad.write_text("- [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_accounts(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_accounts(tmp_path / "missing.yaml")


def test_default_accounts_file_has_at_least_four():
    from infra.console_sim.config import DEFAULT_ACCOUNTS_FILE
    accounts = load_accounts(DEFAULT_ACCOUNTS_FILE)
    assert len(accounts) >= 4
    assert all(a.password not in repr(a) and a.access_key_secret not in repr(a) for a in accounts)


def test_errors_pickle_round_trip():
    for err in (CloudError("X.Y", "m", 404), CloudAPIError("Code", "msg", 400, "rid", "Act")):
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err) and back.__dict__ == err.__dict__ and str(back) == str(err)
    assert isinstance(CloudAPIError("a", "b"), RuntimeError)
    assert isinstance(CloudError("a", "b"), ValueError)


def test_cloud_config_validation_and_secret_hiding():
    with pytest.raises(ConfigError, match="protocol"):
        CloudConfig(protocol="ftp")
    with pytest.raises(ConfigError, match="endpoint"):
        CloudConfig(endpoint="http://x/")
    assert CloudConfig(endpoint=None).oss_endpoint() == "https://oss-cn-hangzhou.aliyuncs.com"
    assert "topsecret" not in repr(Credentials("AK", "topsecret"))


def test_time_round_trip():
    ms = parse_iso("2026-11-21T19:50:51Z")
    assert ms is not None and iso(ms) == "2026-11-21T19:50:51Z"
    assert parse_iso("2026-13-01T00:00:00Z") is None and parse_iso("yesterday") is None
