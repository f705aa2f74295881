"""ActionTrail 2020-07-06: LookupEvents over the audit log that every call appends to."""
from __future__ import annotations

import base64
import hashlib
import json
import re
import time
from collections import OrderedDict
from typing import Any

from ..errors import CloudError, invalid
from ..params import Params, json_value
from ..service import CallContext, Product
from ..timeutil import iso, parse_iso

PRODUCT = Product("Actiontrail", "2020-07-06", "actiontrail.aliyuncs.com",
                  "actiontrail.console.aliyun.com")

# LookupAttribute key -> SQL condition on events e
_COLUMN_KEYS = {"EventName": "e.event_name", "ServiceName": "e.service_name",
                "User": "e.user_name", "EventId": "e.event_id", "EventRW": "e.event_rw",
                "EventAccessKeyId": "e.access_key_id"}
_RESOURCE_KEYS = {"ResourceType": "rtype", "ResourceName": "rname"}
LOOKUP_KEYS = tuple(_COLUMN_KEYS) + tuple(_RESOURCE_KEYS)
_DEFAULT_WINDOW_MS = 7 * 24 * 3600 * 1000
_MAX_WINDOW_MS = 90 * 24 * 3600 * 1000


class TokenBucket:
    """``rate`` tokens a second, holding at most ``burst`` (default: ``rate``)."""

    def __init__(self, rate: float, burst: float | None = None):
        self.rate = rate
        self.burst = rate if burst is None else burst
        self.tokens = self.burst
        self.at = time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


def _fault(ctx: CallContext, name: str) -> float:
    """A setting of the cloud's config, unless a fault (faults.py) overrides it."""
    faults = ctx.runtime.get("faults")
    value = getattr(faults.faults, name) if faults is not None else None
    return getattr(ctx.config, name) if value is None else value


def _throttle(ctx: CallContext) -> None:
    rate = _fault(ctx, "lookup_qps")
    if rate <= 0:
        return
    buckets = ctx.runtime.setdefault("lookup_buckets", {})
    bucket = buckets.get((ctx.account_id, rate))
    if bucket is None:
        bucket = buckets[(ctx.account_id, rate)] = TokenBucket(rate, burst=max(rate, 1.0))
    if not bucket.take():
        raise CloudError("Throttling.User",
                         f"Request was denied due to user flow control: LookupEvents allows "
                         f"{rate:g} queries per second per account.", 400)


def _time(p: Params, name: str, default_ms: int) -> int:
    value = p.str(name, max_len=64)
    if value is None:
        return default_ms
    ms = parse_iso(value)
    if ms is None:
        raise invalid(name, "use ISO 8601 UTC, YYYY-MM-DDThh:mm:ssZ", "InvalidParameter")
    return ms


def _token_scope(attrs: list[tuple[str, str]], start: str | None, end: str | None,
                 direction: str) -> str:
    raw = json.dumps([attrs, start, end, direction]).encode()
    return hashlib.sha256(raw).hexdigest()[:16]


_TOKEN_TEXT = re.compile(r"[A-Za-z0-9_-]{2,512}")     # unpadded URL-safe base64
_MAX_CURSOR = 2 ** 63 - 1                              # SQLite's INTEGER


def _decode_token(token: str, scope: str) -> tuple[int, int]:
    """The (event time, seq) cursor of a token from :func:`_encode_token`. Anything else,
    however it was made, is InvalidParameter naming NextToken: never a 500."""
    not_ours = invalid("NextToken", "not a token returned by a previous LookupEvents call")
    if not _TOKEN_TEXT.fullmatch(token):
        raise not_ours
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    except ValueError:          # binascii.Error: a length no base64 text has
        raise not_ours from None
    try:
        data = json_value("NextToken", raw.decode("utf-8"), max_len=512, max_depth=1, why="")
    except (CloudError, UnicodeDecodeError):
        raise not_ours from None
    if not isinstance(data, dict) or set(data) != {"m", "s", "q"}:
        raise not_ours
    ms, seq, token_scope = data["m"], data["s"], data["q"]
    # type() is int: not a bool, not a float (1e999 is inf), and in the range SQLite holds.
    if not (type(ms) is int and type(seq) is int and 0 <= ms <= _MAX_CURSOR and
            0 <= seq <= _MAX_CURSOR and isinstance(token_scope, str)):
        raise not_ours
    if token_scope != scope:
        raise invalid("NextToken", "the other request parameters must be the same as in the "
                      "call that returned this token")
    return ms, seq


def _encode_token(ms: int, seq: int, scope: str) -> str:
    raw = json.dumps({"m": ms, "s": seq, "q": scope}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


@PRODUCT.action("LookupEvents", rw="Read")
def lookup_events(ctx: CallContext, p: Params) -> dict[str, Any]:
    _throttle(ctx)
    ctx.region = p.str("RegionId", max_len=64) or "cn-hangzhou"
    end = _time(p, "EndTime", ctx.now_ms)
    start = _time(p, "StartTime", end - _DEFAULT_WINDOW_MS)
    if start > end:
        raise invalid("StartTime", "must not be later than EndTime")
    if end - start > _MAX_WINDOW_MS:
        raise invalid("StartTime", "the time range can be at most 90 days")
    attrs = []
    for entry in p.structs("LookupAttribute", ("Key", "Value")):
        key = entry.get("Key", "")
        if key not in LOOKUP_KEYS:
            raise invalid("LookupAttribute.N.Key", f"allowed keys are {', '.join(LOOKUP_KEYS)}")
        value = entry.get("Value", "")
        if not value or len(value) > 512:
            raise invalid("LookupAttribute.N.Value", "must be 1 to 512 characters")
        attrs.append((key, value))
    if len(attrs) > 2:
        raise invalid("LookupAttribute", "at most two lookup attributes are allowed")
    max_results = p.int("MaxResults", default=20, lo=1, hi=50)
    assert max_results is not None
    direction = (p.str("Direction", default="BACKWARD", max_len=16) or "BACKWARD").upper()
    if direction not in ("FORWARD", "BACKWARD"):
        raise invalid("Direction", "allowed values are FORWARD, BACKWARD")
    # Defaults (EndTime = now) move between pages, so the scope uses the parameters as given.
    scope = _token_scope(attrs, p.raw.get("StartTime"), p.raw.get("EndTime"), direction)

    # Events still "in delivery" are not visible yet.
    visible_until = ctx.now_ms - int(_fault(ctx, "delivery_delay_s") * 1000)
    sql = ["SELECT e.seq, e.event_ms, e.body FROM events e WHERE e.account_id=?"
           " AND e.event_ms>=? AND e.event_ms<=?"]
    args: list[Any] = [ctx.account_id, start, min(end + 999, visible_until)]
    for key, value in attrs:
        if key in _COLUMN_KEYS:
            sql.append(f"AND {_COLUMN_KEYS[key]}=?")
        else:
            sql.append(f"AND EXISTS (SELECT 1 FROM event_resources r WHERE r.account_id=e.account_id"
                       f" AND r.seq=e.seq AND r.{_RESOURCE_KEYS[key]}=?)")
        args.append(value)
    token = p.str("NextToken", max_len=512)
    if token:
        ms, seq = _decode_token(token, scope)
        sql.append("AND (e.event_ms, e.seq) < (?, ?)" if direction == "BACKWARD"
                   else "AND (e.event_ms, e.seq) > (?, ?)")
        args += [ms, seq]
    order = "DESC" if direction == "BACKWARD" else "ASC"
    sql.append(f"ORDER BY e.event_ms {order}, e.seq {order} LIMIT ?")
    args.append(max_results + 1)
    rows = ctx.store.db.execute(" ".join(sql), args).fetchall()
    more = len(rows) > max_results
    rows = rows[:max_results]
    _note_delivery(ctx, rows)
    next_token = _encode_token(rows[-1][1], rows[-1][0], scope) if more else ""
    return {"StartTime": iso(start), "EndTime": iso(end), "NextToken": next_token,
            "Events": [json.loads(r[2]) for r in rows]}


_DELIVERED_MAX = 100_000


def _note_delivery(ctx: Any, rows: list[Any]) -> None:
    """Report, once per event, how long after it happened LookupEvents first returned it
    (``runtime["on_delivery"]``: the server's metrics hook)."""
    hook = ctx.runtime.get("on_delivery")
    if hook is None or not rows:
        return
    seen: OrderedDict[int, None] = ctx.runtime.setdefault("delivered", OrderedDict())
    delays = []
    for seq, event_ms, _body in rows:
        if seq in seen:
            continue
        seen[seq] = None
        delays.append(max(0.0, (ctx.now_ms - event_ms) / 1000))
    while len(seen) > _DELIVERED_MAX:
        seen.popitem(last=False)
    if delays:
        hook(delays)
