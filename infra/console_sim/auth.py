"""Verification of signed OpenAPI requests: ACS3-HMAC-SHA256 and RPC v1 HMAC-SHA1, date skew,
nonce replay, unknown AccessKeys. Raises :class:`CloudError` with the real codes."""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from urllib.parse import parse_qsl

from consolerl.accounts import Account
from consolerl.text import same_secret
from .errors import CloudError, missing
from . import timeutil
from .signing import (ACS3, acs3_signature, acs3_string_to_sign, parse_acs3_authorization,
                      rpc_v1_signature)
from .store import Store
from .timeutil import parse_iso


@dataclass(frozen=True)
class Authenticated:
    account: Account
    access_key_id: str
    action: str
    version: str
    params: dict[str, str]      # action parameters (signing envelope removed for v1)
    mode: str                   # "ACS3" or "RPCv1"


def parse_params(query: str, form: str = "") -> dict[str, str]:
    params: dict[str, str] = {}
    for source in (query, form):
        if not source:
            continue
        try:
            pairs = parse_qsl(source, keep_blank_values=True, errors="strict")
        except (UnicodeDecodeError, ValueError):
            raise CloudError("InvalidParameter", "The request parameters are not valid UTF-8 "
                             "URL-encoded text.", 400) from None
        for key, value in pairs:
            if key in params:
                raise CloudError("InvalidParameter", f'The parameter "{key[:64]}" is given more '
                                 "than once.", 400)
            if "\x00" in key or "\x00" in value:
                raise CloudError("InvalidParameter", f'The parameter "{key[:64]}" contains a '
                                 "NUL character.", 400)
            params[key] = value
    return params


class NonceCache:
    """Nonces seen within the skew window, in memory and in SQLite (so a restart still refuses
    a replay)."""

    def __init__(self, store: Store, window_s: float):
        self.store = store
        self.window_ms = int(window_s * 1000)
        self.seen: OrderedDict[str, int] = OrderedDict()
        now = timeutil.now_ms()
        for nonce, ts in store.recent_nonces(now - 2 * self.window_ms):
            self.seen[nonce] = ts
        self._inserts = 0

    def use(self, nonce: str, now_ms: int) -> bool:
        """Record ``nonce``; False when it was already used."""
        if nonce in self.seen:
            return False
        self.seen[nonce] = now_ms
        self.store.add_nonce(nonce, now_ms)
        self._inserts += 1
        if self._inserts % 1000 == 0:
            self._prune(now_ms)
        return True

    def _prune(self, now_ms: int) -> None:
        cutoff = now_ms - 2 * self.window_ms
        while self.seen:
            nonce, ts = next(iter(self.seen.items()))
            if ts >= cutoff:
                break
            self.seen.popitem(last=False)
        self.store.prune_nonces(cutoff)


class Authenticator:
    def __init__(self, accounts: list[Account], store: Store, max_skew_s: float = 900.0):
        self.by_key = {a.access_key_id: a for a in accounts}
        self.max_skew_ms = int(max_skew_s * 1000)
        self.nonces = NonceCache(store, max_skew_s)

    def verify(self, method: str, path: str, query: str, headers: dict[str, str],
               body: bytes) -> Authenticated:
        """``headers`` has lower-case names."""
        form = ""
        if body and headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
            try:
                form = body.decode("utf-8")
            except UnicodeDecodeError:
                raise CloudError("InvalidParameter", "The request body is not valid UTF-8.", 400) from None
        authorization = headers.get("authorization", "")
        if authorization.startswith(ACS3):
            params = parse_params(query)
            return self._verify_acs3(method, path, params, headers, body, form, authorization)
        params = parse_params(query, form)
        if "Signature" in params or "AccessKeyId" in params:
            return self._verify_v1(method, params, headers)
        if authorization:
            raise CloudError("IncompleteSignature", "The Authorization header is not in a "
                             "supported format (ACS3-HMAC-SHA256).", 400)
        raise CloudError("MissingParameter", 'The request is not signed: neither an '
                         '"Authorization" header nor the "Signature" and "AccessKeyId" '
                         "parameters are present.", 400)

    def _account(self, access_key_id: str) -> Account:
        account = self.by_key.get(access_key_id)
        if account is None:
            raise CloudError("InvalidAccessKeyId.NotFound",
                             f"Specified access key is not found: {access_key_id[:64]}.", 404)
        return account

    def _check_time(self, value: str, field: str, now_ms: int) -> None:
        ts = parse_iso(value)
        if ts is None:
            raise CloudError("InvalidTimeStamp.Format",
                             f"The specified {field} \"{value[:64]}\" is not in the format "
                             "YYYY-MM-DDThh:mm:ssZ.", 400)
        if abs(now_ms - ts) > self.max_skew_ms:
            raise CloudError("InvalidTimeStamp.Expired",
                             f"Specified time stamp or date value is expired: {field} is more than "
                             f"{self.max_skew_ms // 60000} minutes away from the server time.", 400)

    def _use_nonce(self, nonce: str, now_ms: int) -> None:
        if not self.nonces.use(nonce, now_ms):
            raise CloudError("SignatureNonceUsed",
                             "Specified signature nonce was used already.", 400)

    def _verify_acs3(self, method: str, path: str, params: dict[str, str],
                     headers: dict[str, str], body: bytes, form: str,
                     authorization: str) -> Authenticated:
        parsed = parse_acs3_authorization(authorization)
        if parsed is None:
            raise CloudError("IncompleteSignature", "The Authorization header must be "
                             "ACS3-HMAC-SHA256 Credential=...,SignedHeaders=...,Signature=...", 400)
        access_key_id, signed_headers, signature = parsed
        now_ms = timeutil.now_ms()
        for name in ("x-acs-action", "x-acs-version", "x-acs-date", "x-acs-signature-nonce",
                     "x-acs-content-sha256"):
            if not headers.get(name):
                raise missing(name)
        if len(headers["x-acs-signature-nonce"]) > 128:
            raise CloudError("InvalidParameter", "x-acs-signature-nonce is longer than 128 "
                             "characters.", 400)
        unsigned = [h for h in headers if (h.startswith("x-acs-") or h == "host")
                    and h not in signed_headers]
        if unsigned or signed_headers != sorted(signed_headers):
            raise CloudError("IncompleteSignature", "SignedHeaders must be sorted and include "
                             f"host and every x-acs-* header; not signed: {', '.join(unsigned)}.",
                             400)
        account = self._account(access_key_id)
        self._check_time(headers["x-acs-date"], "x-acs-date", now_ms)
        payload_hash = headers["x-acs-content-sha256"]
        if not same_secret(payload_hash, hashlib.sha256(body).hexdigest()):
            raise CloudError("SignatureDoesNotMatch", "x-acs-content-sha256 does not match the "
                             "SHA-256 of the request body.", 400)
        string_to_sign = acs3_string_to_sign(method, path, params, headers, signed_headers,
                                             payload_hash)
        expected = acs3_signature(account.access_key_secret, string_to_sign)
        if not same_secret(signature, expected):
            raise CloudError("SignatureDoesNotMatch",
                             "The request signature does not conform to Aliyun standards. "
                             f"server string to sign is:{string_to_sign}", 400)
        self._use_nonce(headers["x-acs-signature-nonce"], now_ms)
        if form:
            # Body parameters are covered by x-acs-content-sha256, which is signed.
            for key, value in parse_params(form).items():
                if key in params:
                    raise CloudError("InvalidParameter", f'The parameter "{key[:64]}" is given '
                                     "more than once.", 400)
                params[key] = value
        return Authenticated(account, access_key_id, headers["x-acs-action"],
                             headers["x-acs-version"], params, "ACS3")

    def _verify_v1(self, method: str, params: dict[str, str],
                   headers: dict[str, str]) -> Authenticated:
        for name in ("AccessKeyId", "Signature", "SignatureNonce", "Timestamp",
                     "SignatureMethod", "SignatureVersion"):
            if not params.get(name):
                raise missing(name)
        # The signature covers the query only: the action and version must be in it. The
        # x-acs-* headers the SDK also sends are unsigned, so they may only repeat them.
        action, version = params.get("Action", ""), params.get("Version", "")
        if not action:
            raise missing("Action")
        if not version:
            raise missing("Version")
        for header, signed_value in (("x-acs-action", action), ("x-acs-version", version)):
            given = headers.get(header)
            if given is not None and given != signed_value:
                raise CloudError("InvalidParameter", f'The header "{header}" does not match '
                                 "the signed parameter "
                                 f'"{header.removeprefix("x-acs-").capitalize()}".', 400)
        if params["SignatureMethod"] != "HMAC-SHA1":
            raise CloudError("InvalidParameter", 'The specified parameter "SignatureMethod" is '
                             "not valid: allowed value is HMAC-SHA1.", 400)
        if params["SignatureVersion"] != "1.0":
            raise CloudError("InvalidParameter", 'The specified parameter "SignatureVersion" is '
                             "not valid: allowed value is 1.0.", 400)
        if len(params["SignatureNonce"]) > 128:
            raise CloudError("InvalidParameter", "SignatureNonce is longer than 128 characters.", 400)
        now_ms = timeutil.now_ms()
        account = self._account(params["AccessKeyId"])
        self._check_time(params["Timestamp"], "Timestamp", now_ms)
        signed = {k: v for k, v in params.items() if k != "Signature"}
        expected = rpc_v1_signature(method, signed, account.access_key_secret)
        if not same_secret(params["Signature"], expected):
            raise CloudError("SignatureDoesNotMatch",
                             "Specified signature is not matched with our calculation.", 400)
        self._use_nonce(params["SignatureNonce"], now_ms)
        envelope = {"Action", "Version", "Format", "Timestamp", "SignatureNonce",
                    "SignatureMethod", "SignatureVersion", "Signature", "AccessKeyId"}
        action_params = {k: v for k, v in params.items() if k not in envelope}
        return Authenticated(account, params["AccessKeyId"], action, version, action_params,
                             "RPCv1")
