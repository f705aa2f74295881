"""Unit tests of the local cloud's pure parts: signing, parameters, accounts, errors."""
from __future__ import annotations

import base64
import hmac
import json
import pickle
from pathlib import Path
from types import SimpleNamespace

import pytest
from alibabacloud_tea_openapi.utils import Utils as SdkUtils
from hypothesis import given, settings
from hypothesis import strategies as st

from consolerl.errors import CloudAPIError, ConfigError
from infra.cloud import CloudConfig, Credentials
from consolerl.accounts import load_accounts, parse_accounts
from infra.console_sim.auth import parse_params
from consolerl.text import same_secret
from infra.console_sim.config import SigninLimits
from infra.console_sim.console.origin import cross_site
from infra.console_sim.console.signin import CSRF_COOKIE, Lock, SigninGuard, SigninTokens
from infra.console_sim.errors import CloudError
from infra.console_sim.params import Params, json_depth
from infra.console_sim.products.actiontrail import _decode_token, _encode_token, _token_scope
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


# ---- secrets, tokens and JSON from outside never give a 500 -----------------------

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("given,expected,equal", [
    ("abc", "abc", True), ("é", "é", True), ("é", "e", False), ("abc", "é", False),
    ("\ud800", "\ud800", True), ("\ud800", "x", False), (b"\xc3\xa9", "é", True),
    ("", "", True), (None, "x", False), ("x", None, False), (None, None, False), (1, 1, False),
])
def test_same_secret_compares_utf8_bytes_and_never_raises(given, expected, equal):
    assert same_secret(given, expected) is equal


def test_stdlib_compare_digest_raises_on_non_ascii_text():
    """Why the helper exists: what auth, OSS and the console called before."""
    with pytest.raises(TypeError):
        hmac.compare_digest("é", "e")


def test_secrets_are_compared_only_through_same_secret():
    """Every secret comparison of the repository goes through ``consolerl.text.same_secret``:
    a direct ``compare_digest`` on text is a 500 waiting to happen."""
    found = []
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        if rel.parts[0].startswith((".venv", ".")) or rel.parts[0] == "tests" or \
                rel == Path("consolerl/text.py"):
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if "compare_digest" in line:
                found.append(f"{rel}:{number}: {line.strip()}")
    assert not found, "use consolerl.text.same_secret:\n" + "\n".join(found)


@pytest.mark.parametrize("value", ["[" * 5_000, "[" * 5_000 + "]" * 5_000,
                                   '[["i-1"]]', '{"a": ["i-1"]}', "[" * 20_000])
def test_json_list_refuses_nested_or_huge_json_naming_the_parameter(value):
    with pytest.raises(CloudError) as info:
        Params({"InstanceIds": value}).json_list("InstanceIds")
    assert info.value.code == "InvalidParameter" and '"InstanceIds"' in info.value.message
    assert len(info.value.message) < 300


def test_json_depth_ignores_brackets_inside_strings():
    assert json_depth('["[[[", "{\\"]]", "x"]') == 1
    assert json_depth('"no"') == 0 and json_depth('[{"a": [1]}]') == 3
    assert Params({"Ids": '["[[[[", "a\\\\"]'}).json_list("Ids") == ["[[[[", "a\\"]


def _token(data: object) -> str:
    raw = data if isinstance(data, bytes) else json.dumps(data).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


SCOPE = _token_scope([], None, None, "BACKWARD")


@pytest.mark.parametrize("token", [
    "!!!", "é" * 8, "a", "abcde", _token(b"\xff\xfe\xfd"), _token(b"not json"),
    _token([1, 2]), _token("m"), _token(None), _token({"m": 1, "s": 1}),
    _token({"m": 1, "s": 1, "q": SCOPE, "x": 0}),
    _token({"m": "1", "s": 1, "q": SCOPE}), _token({"m": True, "s": 1, "q": SCOPE}),
    _token({"m": 1.5, "s": 1, "q": SCOPE}), _token({"m": 1, "s": 1, "q": 7}),
    _token({"m": 10 ** 30, "s": 1, "q": SCOPE}), _token({"m": 1, "s": 2 ** 63, "q": SCOPE}),
    _token({"m": -1, "s": 1, "q": SCOPE}), _token({"m": 1, "s": -5, "q": SCOPE}),
    _token(b'{"m":1e999,"s":1,"q":"' + SCOPE.encode() + b'"}'),
    _token(b'{"m":NaN,"s":1,"q":"' + SCOPE.encode() + b'"}'),
    _token(b'{"m":[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]],"s":1,"q":"x"}'),
    _token({"m": 1, "s": 1, "q": "\ud800"}),
])
def test_crafted_next_tokens_are_invalid_parameter(token):
    with pytest.raises(CloudError) as info:
        _decode_token(token, SCOPE)
    assert (info.value.code, info.value.status) == ("InvalidParameter", 400)
    assert '"NextToken"' in info.value.message


def test_next_tokens_round_trip():
    assert _decode_token(_encode_token(1_700_000_000_000, 42, SCOPE), SCOPE) == \
        (1_700_000_000_000, 42)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=80), st.binary(max_size=300).map(_token),
                 st.recursive(st.none() | st.booleans() | st.integers() | st.floats() |
                              st.text(max_size=8),
                              lambda inner: st.lists(inner, max_size=3) |
                              st.dictionaries(st.sampled_from("msqx"), inner, max_size=4),
                              max_leaves=8).map(_token)))
def test_any_next_token_is_a_round_trip_or_invalid_parameter(token):
    try:
        ms, seq = _decode_token(token, SCOPE)
    except CloudError as err:
        assert err.code == "InvalidParameter" and '"NextToken"' in err.message
    else:
        assert 0 <= ms < 2 ** 63 and 0 <= seq < 2 ** 63


# ---- sign-in lockout ----------------------------------------------------------------------

class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _guard(**limits) -> tuple[SigninGuard, FakeClock, list[str]]:
    clock, locks = FakeClock(), []
    return SigninGuard(SigninLimits(**limits), clock, locks.append), clock, locks


def test_five_wrong_passwords_lock_the_name_for_five_minutes():
    guard, clock, locks = _guard()
    assert [guard.failed("heidi", "10.0.0.1") for _ in range(4)] == [None] * 4
    assert guard.locked("heidi", "10.0.0.1") is None
    lock = guard.failed("heidi", "10.0.0.1")
    assert lock == Lock("account", 300.0) and locks == ["account"]
    clock.now += 299
    # From any address, and whatever the password: the caller does not even check it.
    assert guard.locked("heidi", "10.9.9.9") == Lock("account", 1.0)
    assert guard.locked("alice", "10.0.0.1") is None
    clock.now += 1
    assert guard.locked("heidi", "10.0.0.1") is None


def test_failures_age_out_of_the_window():
    guard, clock, _ = _guard()
    for _ in range(4):
        guard.failed("heidi", "a")
    clock.now += 301
    assert guard.failed("heidi", "a") is None and guard.locked("heidi", "a") is None


def test_locks_in_a_row_double_up_to_an_hour_and_success_resets_them():
    guard, clock, _ = _guard()
    seconds = []
    for _ in range(6):
        lock = None
        for _ in range(5):
            lock = guard.failed("heidi", f"addr{len(seconds)}")
        seconds.append(lock.seconds)
        clock.now += lock.seconds
    assert seconds == [300, 600, 1200, 2400, 3600, 3600]
    guard.succeeded("heidi")
    for _ in range(5):
        lock = guard.failed("heidi", "addr-x")
    assert lock.seconds == 300


def test_wrong_passwords_from_one_address_lock_the_address():
    guard, _, locks = _guard(address_failures=10)
    for i in range(9):
        assert guard.failed(f"name{i}", "10.0.0.7") is None
    assert guard.failed("name9", "10.0.0.7") == Lock("address", 300.0)
    assert guard.locked("alice", "10.0.0.7").scope == "address"
    assert guard.locked("alice", "10.0.0.8") is None and locks == ["address"]
    assert "your network address" in Lock("address", 61).message()
    assert "try again in 2 minutes" in Lock("address", 61).message()


def test_the_guard_keeps_a_bounded_number_of_names():
    guard, _, _ = _guard(max_tracked=50)
    for i in range(1_000):
        guard.failed(f"name{i}", f"10.0.{i // 250}.{i % 250}")
    assert len(guard._records) == 50


@pytest.mark.parametrize("field,value", [("account_failures", 0), ("address_failures", True),
                                         ("window_s", float("nan")), ("lockout_s", -1)])
def test_signin_limits_refuse_nonsense(field, value):
    with pytest.raises(ConfigError, match=field):
        SigninLimits(**{field: value})


# ---- sign-in tokens and the same-origin check ------------------------------------

def _signin_request(cookie: str) -> SimpleNamespace:
    return SimpleNamespace(cookies={CSRF_COOKIE: cookie} if cookie else {})


def test_signin_tokens_are_signed_for_their_pre_session_and_expire():
    clock = FakeClock()
    tokens = SigninTokens(b"k" * 32, ttl_s=3600, clock=clock)
    pre = tokens.pre_session(_signin_request(""))
    assert tokens.pre_session(_signin_request(pre)) == pre        # two tabs share it
    token = tokens.issue(pre)
    assert tokens.valid(_signin_request(pre), {"_csrf": token})
    other = tokens.pre_session(_signin_request("bad cookie"))
    assert other != pre and not tokens.valid(_signin_request(other), {"_csrf": token})
    # A double-submit copy, another server's signature, a changed time: all refused.
    assert not tokens.valid(_signin_request(pre), {"_csrf": pre})
    assert not tokens.valid(_signin_request(pre), {"_csrf": SigninTokens(b"x" * 32,
                                                                         clock=clock).issue(pre)})
    issued, mac = token.split(".")
    assert not tokens.valid(_signin_request(pre), {"_csrf": f"{int(issued) + 1}.{mac}"})
    clock.now += 3601
    assert not tokens.valid(_signin_request(pre), {"_csrf": token})
    assert "k" * 32 not in repr(tokens) and "secret" not in repr(tokens)


@given(cookie=st.text(max_size=40), token=st.text(max_size=80))
@settings(max_examples=200, deadline=None)
def test_signin_tokens_of_any_text_are_refused_not_errors(cookie, token):
    assert SigninTokens(b"k" * 32).valid(_signin_request(cookie), {"_csrf": token}) is False


@pytest.mark.parametrize("method,headers,refused", [
    ("GET", {"origin": "http://evil.example", "sec-fetch-site": "cross-site"}, None),
    ("POST", {}, None),
    ("POST", {"host": "127.0.0.1:8080", "origin": "http://127.0.0.1:8080"}, None),
    ("POST", {"host": "Console.Local:8080", "origin": "http://console.local:8080"}, None),
    ("POST", {"sec-fetch-site": "same-origin"}, None),
    ("POST", {"sec-fetch-site": "none"}, None),
    ("POST", {"host": "127.0.0.1:8080", "origin": "http://127.0.0.1:8081"}, "origin"),
    ("POST", {"host": "127.0.0.1:8080", "origin": "https://127.0.0.1:8080"}, "origin"),
    ("POST", {"host": "127.0.0.1:8080", "origin": "null"}, "origin"),
    ("POST", {"origin": "http://127.0.0.1:8080"}, "origin"),          # no Host to match
    ("DELETE", {"host": "h", "origin": "http://h", "sec-fetch-site": "same-site"}, "fetch_site"),
    ("PATCH", {"sec-fetch-site": "cross-site"}, "fetch_site"),
])
def test_cross_site_names_the_check(method, headers, refused):
    refusal = cross_site(method, "http", headers)
    assert (refusal[0] if refusal else None) == refused
    if refusal:
        assert "did not come from this console" in refusal[1]


@pytest.mark.parametrize("token", ["é", "\ud800", "Ã©" * 40, "crl_" + "é" * 43])
def test_jobs_api_tokens_of_any_text_are_unknown_not_errors(tmp_path, token):
    """The jobs API looks a bearer token up by its SHA-256; odd text is just no team's."""
    from jobsapi.auth import TokenBook
    book = TokenBook(tmp_path / "tokens.json")
    real = book.create("docs", ["jobs:read"])
    assert book.verify(token) is None and book.verify(real).team == "docs"
