"""RAM 2015-05-01: users and system-policy attachments (a global service: no regions)."""
from __future__ import annotations

import re
from typing import Any

from .. import ids
from ..catalog import RT_RAM_POLICY, RT_RAM_USER, SYSTEM_POLICIES
from ..errors import CloudError
from ..params import Params
from ..service import CallContext, Product
from ..timeutil import iso

PRODUCT = Product("Ram", "2015-05-01", "ram.aliyuncs.com", "ram.console.aliyun.com", global_=True)
USER = "ram_user"
_GLOBAL = "global"
_USER_FIELDS = ("UserId", "UserName", "DisplayName", "MobilePhone", "Email", "Comments",
                "CreateDate", "UpdateDate", "LastLoginDate")


def _user_name(p: Params, field: str, required: bool = True) -> str | None:
    value = p.str(field, required=required, max_len=10_000)
    if value is None:
        return None
    if len(value) > 64:
        raise CloudError("InvalidParameter.UserName.Length",
                         f"The parameter {field} must be 1 to 64 characters.", 400)
    if not re.fullmatch(r"[A-Za-z0-9._-]+", value):
        raise CloudError("InvalidParameter.UserName.InvalidChars",
                         f"The parameter {field} may contain only letters, digits, periods (.), "
                         "underscores (_) and hyphens (-).", 400)
    return value


def _profile(p: Params, prefix: str, user: dict[str, Any]) -> None:
    display = p.str(prefix + "DisplayName", max_len=10_000)
    if display is not None:
        if len(display) > 128:
            raise CloudError("InvalidParameter.DisplayName.Length",
                             "The parameter DisplayName must be 1 to 128 characters.", 400)
        if re.search(r"[\x00-\x1f<>]", display):
            raise CloudError("InvalidParameter.DisplayName.InvalidChars",
                             "The parameter DisplayName contains illegal characters.", 400)
        user["DisplayName"] = display
    phone = p.str(prefix + "MobilePhone", max_len=32, pattern=r"[0-9]{1,4}-[0-9]{4,15}",
                  why="use the format countrycode-number, like 86-18600008888")
    if phone is not None:
        user["MobilePhone"] = phone
    email = p.str(prefix + "Email", max_len=128, pattern=r"[^@\s]+@[^@\s]+\.[A-Za-z]{2,}",
                  why="not a valid email address")
    if email is not None:
        user["Email"] = email
    comments = p.str(prefix + "Comments", max_len=128)
    if comments is not None:
        user["Comments"] = comments


def get_user(ctx: CallContext, user_name: str) -> dict[str, Any]:
    user = ctx.store.get(ctx.account_id, USER, user_name.lower())
    ctx.ref(RT_RAM_USER, user["UserName"] if user else user_name)
    if user is None:
        raise CloudError("EntityNotExist.User", f"The user does not exist: {user_name[:64]}.", 404)
    return user


def _save(ctx: CallContext, user: dict[str, Any]) -> None:
    ctx.store.put(ctx.account_id, USER, user["UserName"].lower(), _GLOBAL, user,
                  name=user["UserName"].lower(), created_ms=user["_created_ms"])


def _view(user: dict[str, Any]) -> dict[str, Any]:
    return {k: user[k] for k in _USER_FIELDS}


@PRODUCT.action("CreateUser", resource_type=RT_RAM_USER)
def create_user(ctx: CallContext, p: Params) -> dict[str, Any]:
    name = _user_name(p, "UserName")
    assert name is not None
    ctx.ref(RT_RAM_USER, name)
    if ctx.store.get(ctx.account_id, USER, name.lower()) is not None:
        raise CloudError("EntityAlreadyExists.User", f"The user already exists: {name}.", 409)
    now = iso(ctx.now_ms)
    user = {"UserId": ids.numeric_id(16), "UserName": name, "DisplayName": name,
            "MobilePhone": "", "Email": "", "Comments": "", "CreateDate": now,
            "UpdateDate": now, "LastLoginDate": "", "Policies": [], "_created_ms": ctx.now_ms}
    _profile(p, "", user)
    _save(ctx, user)
    return {"User": _view(user)}


@PRODUCT.action("GetUser", rw="Read", resource_type=RT_RAM_USER)
def get_user_action(ctx: CallContext, p: Params) -> dict[str, Any]:
    name = _user_name(p, "UserName")
    assert name is not None
    return {"User": _view(get_user(ctx, name))}


@PRODUCT.action("ListUsers", rw="Read", resource_type=RT_RAM_USER)
def list_users(ctx: CallContext, p: Params) -> dict[str, Any]:
    max_items = p.int("MaxItems", default=100, lo=1, hi=1000)
    marker = p.str("Marker", max_len=128)
    assert max_items is not None
    users = sorted(ctx.store.list(ctx.account_id, USER), key=lambda u: u["UserName"].lower())
    if marker:
        users = [u for u in users if u["UserName"].lower() > marker.lower()]
    shown = users[:max_items]
    truncated = len(users) > max_items
    return {"IsTruncated": truncated, "Marker": shown[-1]["UserName"] if truncated else "",
            "Users": {"User": [_view(u) for u in shown]}}


@PRODUCT.action("UpdateUser", resource_type=RT_RAM_USER)
def update_user(ctx: CallContext, p: Params) -> dict[str, Any]:
    name = _user_name(p, "UserName")
    assert name is not None
    user = get_user(ctx, name)
    new_name = _user_name(p, "NewUserName", required=False)
    _profile(p, "New", user)
    if new_name and new_name.lower() != name.lower():
        if ctx.store.get(ctx.account_id, USER, new_name.lower()) is not None:
            raise CloudError("EntityAlreadyExists.User", f"The user already exists: {new_name}.", 409)
        ctx.store.delete(ctx.account_id, USER, name.lower())
        ctx.ref(RT_RAM_USER, new_name)
    if new_name:
        user["UserName"] = new_name
    user["UpdateDate"] = iso(ctx.now_ms)
    _save(ctx, user)
    return {"User": _view(user)}


@PRODUCT.action("DeleteUser", resource_type=RT_RAM_USER)
def delete_user(ctx: CallContext, p: Params) -> dict[str, Any]:
    name = _user_name(p, "UserName")
    assert name is not None
    user = get_user(ctx, name)
    if user["Policies"]:
        raise CloudError("DeleteConflict.User.Policy",
                         "The user has attached policies; detach them before deleting the user.",
                         409)
    ctx.store.delete(ctx.account_id, USER, name.lower())
    return {}


def _policy(ctx: CallContext, p: Params) -> tuple[str, str]:
    policy_type = p.req("PolicyType", max_len=16, choices=("System", "Custom"))
    policy_name = p.req("PolicyName", max_len=128)
    ctx.ref(RT_RAM_POLICY, policy_name)
    if policy_type == "Custom" or policy_name not in SYSTEM_POLICIES:
        raise CloudError("EntityNotExist.Policy",
                         f"The policy does not exist: {policy_name[:128]} ({policy_type}).", 404)
    return policy_type, policy_name


@PRODUCT.action("AttachPolicyToUser", resource_type=RT_RAM_USER)
def attach_policy_to_user(ctx: CallContext, p: Params) -> dict[str, Any]:
    policy_type, policy_name = _policy(ctx, p)
    name = _user_name(p, "UserName")
    assert name is not None
    user = get_user(ctx, name)
    if any(a["PolicyName"] == policy_name for a in user["Policies"]):
        raise CloudError("EntityAlreadyExists.User.Policy",
                         f"The policy is already attached to the user: {policy_name}.", 409)
    user["Policies"].append({"PolicyName": policy_name, "PolicyType": policy_type,
                             "AttachDate": iso(ctx.now_ms)})
    _save(ctx, user)
    return {}


@PRODUCT.action("DetachPolicyFromUser", resource_type=RT_RAM_USER)
def detach_policy_from_user(ctx: CallContext, p: Params) -> dict[str, Any]:
    _, policy_name = _policy(ctx, p)
    name = _user_name(p, "UserName")
    assert name is not None
    user = get_user(ctx, name)
    if not any(a["PolicyName"] == policy_name for a in user["Policies"]):
        raise CloudError("EntityNotExist.User.Policy",
                         f"The policy is not attached to the user: {policy_name}.", 404)
    user["Policies"] = [a for a in user["Policies"] if a["PolicyName"] != policy_name]
    _save(ctx, user)
    return {}


@PRODUCT.action("ListPoliciesForUser", rw="Read", resource_type=RT_RAM_USER)
def list_policies_for_user(ctx: CallContext, p: Params) -> dict[str, Any]:
    name = _user_name(p, "UserName")
    assert name is not None
    user = get_user(ctx, name)
    return {"Policies": {"Policy": [
        {**a, "Description": SYSTEM_POLICIES.get(a["PolicyName"], ""), "DefaultVersion": "v1"}
        for a in user["Policies"]]}}
