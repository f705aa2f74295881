"""Request signatures of the Alibaba Cloud OpenAPI, computed the way the official SDK does.

Used by the server to verify requests and by the benchmark's light client to sign them.

- ACS3-HMAC-SHA256: ``Authorization: ACS3-HMAC-SHA256 Credential=AK,SignedHeaders=a;b,Signature=hex``
  over ``METHOD\\n/\\nsorted query (k=quote(v,'~'))\\nname:value\\n per signed header\\n
  signed header list\\nhex sha256(body)``.
- RPC v1 (``signature_algorithm="v2"`` in the SDK): ``Signature`` query parameter, base64
  HMAC-SHA1 with key ``secret + "&"`` over ``METHOD&%2F&quote(sorted k=v joined by &)``.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping
from urllib.parse import quote

ACS3 = "ACS3-HMAC-SHA256"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


def canonical_query(query: Mapping[str, str]) -> str:
    return "&".join(f"{k}={quote(query[k], safe='~')}" for k in sorted(query))


def acs3_string_to_sign(method: str, path: str, query: Mapping[str, str],
                        headers: Mapping[str, str], signed_headers: list[str],
                        payload_sha256: str) -> str:
    """``headers`` maps lower-case names to values; ``signed_headers`` is sorted, lower-case."""
    canon_headers = "".join(f"{name}:{headers.get(name, '').strip()}\n" for name in signed_headers)
    canonical_request = (f"{method}\n{path or '/'}\n{canonical_query(query)}\n"
                         f"{canon_headers}\n{';'.join(signed_headers)}\n{payload_sha256}")
    digest = hashlib.sha256(canonical_request.encode("utf-8")).hexdigest()
    return f"{ACS3}\n{digest}"


def acs3_signature(secret: str, string_to_sign: str) -> str:
    return hmac.new(secret.encode("utf-8"), string_to_sign.encode("utf-8"),
                    hashlib.sha256).hexdigest()


def rpc_v1_signature(method: str, params: Mapping[str, str], secret: str) -> str:
    canon = "&".join(f"{quote(k, safe='~')}={quote(params[k], safe='~')}" for k in sorted(params))
    string_to_sign = f"{method}&%2F&{quote(canon, safe='~')}"
    digest = hmac.new(f"{secret}&".encode("utf-8"), string_to_sign.encode("utf-8"),
                      hashlib.sha1).digest()
    return base64.b64encode(digest).decode("ascii")


def parse_acs3_authorization(value: str) -> tuple[str, list[str], str] | None:
    """``(access_key_id, signed_headers, signature)`` or None when the header is malformed."""
    if not value.startswith(ACS3 + " "):
        return None
    parts: dict[str, str] = {}
    for piece in value[len(ACS3) + 1:].split(","):
        key, sep, val = piece.strip().partition("=")
        if not sep:
            return None
        parts[key] = val
    if not {"Credential", "SignedHeaders", "Signature"} <= parts.keys():
        return None
    signed = [h for h in parts["SignedHeaders"].split(";") if h]
    if not signed or not parts["Credential"] or not parts["Signature"]:
        return None
    return parts["Credential"], signed, parts["Signature"]
