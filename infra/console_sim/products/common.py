"""Helpers shared by the product modules."""
from __future__ import annotations

import re
from typing import Any

from ..catalog import REGIONS
from ..errors import CloudError, invalid, not_found
from ..params import Params
from ..service import CallContext

# Names in ECS/VPC: 2-128 characters, start with a letter (or CJK), then letters, digits,
# and . _ - :, and not starting with http:// or https://.
NAME_RE = r"[A-Za-z\u4e00-\u9fa5][A-Za-z0-9\u4e00-\u9fa5._:-]{1,127}"


def region(ctx: CallContext, p: Params, required: bool = True) -> str:
    value = p.str("RegionId", required=required, max_len=64)
    if value is None:
        # Optional and absent: the resource's own region applies (ids are global).
        return ""
    if value not in REGIONS:
        raise CloudError("InvalidRegionId.NotFound",
                         f"The specified RegionId \"{value[:64]}\" does not exist. "
                         f"Valid regions: {', '.join(REGIONS)}.", 404)
    ctx.region = value
    return value


def lookup(ctx: CallContext, kind: str, rid: str, resource_type: str, code: str,
           field: str) -> dict[str, Any]:
    """A regional resource of the caller's account by id, referenced for the audit event even
    when missing; outside the call's region it does not exist. Without a RegionId the call
    takes the resource's region."""
    ctx.ref(resource_type, rid)
    item = ctx.store.get(ctx.account_id, kind, rid)
    if item is None or (ctx.region and item["RegionId"] != ctx.region):
        raise not_found(code, field, rid)
    ctx.region = ctx.region or item["RegionId"]
    return item


def zone_ok(region_id: str, zone: str) -> bool:
    return zone in REGIONS[region_id][1]


def name(p: Params, field: str, code: str, *, required: bool = False) -> str | None:
    value = p.str(field, required=required, max_len=10_000)
    if value is None:
        return None
    if value.startswith(("http://", "https://")) or not re.fullmatch(NAME_RE, value):
        raise CloudError(code, f"The specified {field} is not valid: it must be 2 to 128 "
                         "characters, start with a letter, and contain only letters, digits, "
                         "periods (.), underscores (_), hyphens (-) and colons (:); it cannot "
                         "start with http:// or https://.", 400)
    return value


def description(p: Params, field: str = "Description", code: str = "InvalidDescription.Malformed"
                ) -> str | None:
    value = p.str(field, max_len=10_000)
    if value is None:
        return None
    if len(value) > 256 or value.startswith(("http://", "https://")):
        raise CloudError(code, f"The specified {field} is not valid: at most 256 characters, "
                         "not starting with http:// or https://.", 400)
    return value


def page(p: Params, items: list[Any], *, default_size: int = 10, max_size: int = 100
         ) -> tuple[list[Any], dict[str, int]]:
    number = p.int("PageNumber", default=1, lo=1, hi=1_000_000)
    size = p.int("PageSize", default=default_size, lo=1, hi=max_size)
    assert number is not None and size is not None
    start = (number - 1) * size
    return items[start:start + size], {"TotalCount": len(items), "PageNumber": number,
                                       "PageSize": size}


def tag_filter(p: Params, tags_of) -> Any:
    wanted = p.tags()
    if not wanted:
        return lambda _r: True

    def match(resource: dict[str, Any]) -> bool:
        have = tags_of(resource)
        return all(have.get(k) == v for k, v in wanted if v != "") and \
            all(k in have for k, _ in wanted)
    return match


def merge_tags(existing: list[dict[str, str]], new: list[tuple[str, str]], kk: str, vk: str
               ) -> list[dict[str, str]]:
    tags = {t[kk]: t[vk] for t in existing}
    for key, value in new:
        tags[key] = value
    if len(tags) > 20:
        raise CloudError("InvalidTagCount", "A resource can have at most 20 tags.", 400)
    return [{kk: k, vk: v} for k, v in tags.items()]


def client_token(ctx: CallContext, p: Params, action: str) -> tuple[str | None, dict | None]:
    """Idempotency: a repeated ClientToken returns the first call's response body."""
    token = p.str("ClientToken", max_len=64)
    if token is None:
        return None, None
    if not token.isascii():
        raise invalid("ClientToken", "only ASCII characters are allowed")
    key = f"{action}:{token}"
    return key, ctx.store.get(ctx.account_id, "client_token", key)


def remember_token(ctx: CallContext, key: str | None, body: dict[str, Any]) -> None:
    if key:
        ctx.store.put(ctx.account_id, "client_token", key, ctx.region, body, created_ms=ctx.now_ms)
