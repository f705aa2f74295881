"""ECS 2014-05-26: security groups and their rules, instances with status transitions, tags."""
from __future__ import annotations

import fnmatch
import ipaddress
import re
from typing import Any

from .. import ids
from ..catalog import IMAGES, INSTANCE_TYPES, RT_INSTANCE, RT_SECURITY_GROUP
from ..errors import CloudError, invalid, not_found
from ..params import Params
from ..service import CallContext, Product
from ..timeutil import iso_minutes
from . import common
from .vpc import get_vswitch, get_vpc

PRODUCT = Product("Ecs", "2014-05-26", "ecs.aliyuncs.com", "ecs.console.aliyun.com")
SG = "ecs_sg"
INSTANCE = "ecs_instance"

PROTOCOLS = ("TCP", "UDP", "ICMP", "ICMPV6", "GRE", "ALL")
RULE_FIELDS = ("IpProtocol", "PortRange", "SourceCidrIp", "DestCidrIp", "SourceGroupId",
               "DestGroupId", "Policy", "Priority", "NicType", "Description", "SourcePortRange",
               "Ipv6SourceCidrIp", "Ipv6DestCidrIp", "SourcePrefixListId", "DestPrefixListId")
MAX_RULES = 200
INCORRECT_STATUS = "The current status of the resource does not support this operation."


# ---- security groups --------------------------------------------------------------------------

def get_sg(ctx: CallContext, sg_id: str) -> dict[str, Any]:
    return common.lookup(ctx, SG, sg_id, RT_SECURITY_GROUP, "InvalidSecurityGroupId.NotFound",
                         "SecurityGroupId")


def _save_sg(ctx: CallContext, sg: dict[str, Any]) -> None:
    ctx.store.put(ctx.account_id, SG, sg["SecurityGroupId"], sg["RegionId"], sg,
                  name=sg["SecurityGroupName"], parent_id=sg["VpcId"],
                  created_ms=sg["_created_ms"])


@PRODUCT.action("CreateSecurityGroup", resource_type=RT_SECURITY_GROUP)
def create_security_group(ctx: CallContext, p: Params) -> dict[str, Any]:
    region = common.region(ctx, p)
    token_key, previous = common.client_token(ctx, p, "CreateSecurityGroup")
    if previous is not None:
        ctx.ref(RT_SECURITY_GROUP, previous["SecurityGroupId"])
        return previous
    sg_name = common.name(p, "SecurityGroupName", "InvalidSecurityGroupName.Malformed") or ""
    desc = common.description(p) or ""
    sg_type = p.str("SecurityGroupType", default="normal", choices=("normal", "enterprise"))
    vpc_id = p.str("VpcId", max_len=64) or ""
    if vpc_id:
        get_vpc(ctx, vpc_id)
    tags = p.tags()
    sg_id = ids.resource_id("sg", region)
    sg = {
        "SecurityGroupId": sg_id, "SecurityGroupName": sg_name, "Description": desc,
        "VpcId": vpc_id, "RegionId": region, "SecurityGroupType": sg_type,
        "InnerAccessPolicy": "Accept" if sg_type == "normal" else "Drop",
        "CreationTime": iso_minutes(ctx.now_ms), "ResourceGroupId": "",
        "Tags": [{"TagKey": k, "TagValue": v} for k, v in tags], "Permissions": [],
        "_created_ms": ctx.now_ms,
    }
    _save_sg(ctx, sg)
    ctx.ref(RT_SECURITY_GROUP, sg_id)
    body = {"SecurityGroupId": sg_id}
    common.remember_token(ctx, token_key, body)
    return body


def _cidr(field: str, value: str) -> str:
    try:
        return str(ipaddress.ip_network(value, strict=False))
    except ValueError:
        raise CloudError("InvalidSourceCidrIp.Malformed" if "Source" in field
                         else "InvalidDestCidrIp.Malformed",
                         f"The specified {field} \"{value[:64]}\" is not a valid IPv4 address "
                         "or CIDR block.", 400) from None


def _port_range(protocol: str, value: str | None) -> str:
    if protocol in ("ICMP", "ICMPV6", "GRE", "ALL"):
        if value not in (None, "", "-1/-1"):
            raise CloudError("InvalidPortRange.Malformed",
                             f"PortRange must be -1/-1 when IpProtocol is {protocol}.", 400)
        return "-1/-1"
    if not value:
        raise CloudError("MissingParameter",
                         'The input parameter "PortRange" that is mandatory for processing this '
                         "request is not supplied.", 400)
    m = re.fullmatch(r"([0-9]{1,5})/([0-9]{1,5})", value)
    if not m or not (1 <= int(m[1]) <= int(m[2]) <= 65535):
        raise CloudError("InvalidPortRange.Malformed",
                         f"The specified PortRange \"{value[:32]}\" is not valid: use start/end "
                         "with 1 <= start <= end <= 65535, like 22/22 or 8000/8080.", 400)
    return f"{int(m[1])}/{int(m[2])}"


def _parse_rules(ctx: CallContext, p: Params, direction: str) -> list[dict[str, Any]]:
    entries = p.structs("Permissions", RULE_FIELDS)
    top = {f: p.raw[f] for f in RULE_FIELDS if p.raw.get(f)}
    if top:
        entries.insert(0, top)
    if not entries:
        raise CloudError("MissingParameter",
                         'The input parameter "IpProtocol" (or "Permissions.N.IpProtocol") that '
                         "is mandatory for processing this request is not supplied.", 400)
    rules = []
    for entry in entries:
        sub = Params(entry)
        protocol = sub.req("IpProtocol", max_len=16).upper()
        if protocol not in PROTOCOLS:
            raise CloudError("InvalidIpProtocol.Malformed",
                             f"The specified IpProtocol is not valid; allowed: "
                             f"{', '.join(PROTOCOLS)}.", 400)
        peer_cidr_field = "SourceCidrIp" if direction == "ingress" else "DestCidrIp"
        peer_group_field = "SourceGroupId" if direction == "ingress" else "DestGroupId"
        cidr = sub.str(peer_cidr_field, max_len=64)
        group = sub.str(peer_group_field, max_len=64)
        if not cidr and not group:
            raise CloudError("MissingParameter",
                             f'The input parameter "{peer_cidr_field}" (or "{peer_group_field}") '
                             "that is mandatory for processing this request is not supplied.", 400)
        if group:
            get_sg(ctx, group)
        priority = sub.int("Priority", default=1, lo=1, hi=100)
        rules.append({
            "Direction": direction,
            "IpProtocol": protocol,
            "PortRange": _port_range(protocol, sub.str("PortRange", max_len=16)),
            "SourceCidrIp": _cidr("SourceCidrIp", cidr) if cidr and direction == "ingress" else "",
            "DestCidrIp": _cidr("DestCidrIp", cidr) if cidr and direction == "egress" else "",
            "SourceGroupId": group if direction == "ingress" and group else "",
            "DestGroupId": group if direction == "egress" and group else "",
            "Policy": (sub.str("Policy", default="accept", max_len=8, choices=(
                "accept", "drop", "Accept", "Drop")) or "accept").capitalize(),
            "Priority": str(priority),
            "NicType": sub.str("NicType", default="intranet", choices=("intranet", "internet")),
            "Description": common.description(sub) or "",
            "SourcePortRange": "", "Ipv6SourceCidrIp": "", "Ipv6DestCidrIp": "",
        })
    return rules


_MATCH_KEYS = ("Direction", "IpProtocol", "PortRange", "SourceCidrIp", "DestCidrIp",
               "SourceGroupId", "DestGroupId", "Policy", "NicType")


def _same_rule(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return all(a[k] == b[k] for k in _MATCH_KEYS)


def _authorize(ctx: CallContext, p: Params, direction: str) -> dict[str, Any]:
    common.region(ctx, p)
    sg = get_sg(ctx, p.req("SecurityGroupId", max_len=64))
    rules = _parse_rules(ctx, p, direction)
    for rule in rules:
        if any(_same_rule(rule, old) for old in sg["Permissions"]):
            raise CloudError("InvalidPermission.Duplicate", "The specified rule already exists.", 400)
        if len(sg["Permissions"]) >= MAX_RULES:
            raise CloudError("RulesPerGroup.LimitExceeded",
                             f"A security group can have at most {MAX_RULES} rules.", 400)
        rule["SecurityGroupRuleId"] = ids.resource_id("sgr", sg["RegionId"])
        rule["CreateTime"] = iso_minutes(ctx.now_ms).replace("Z", ":00Z")
        sg["Permissions"].append(rule)
    _save_sg(ctx, sg)
    return {}


def _revoke(ctx: CallContext, p: Params, direction: str) -> dict[str, Any]:
    common.region(ctx, p)
    sg = get_sg(ctx, p.req("SecurityGroupId", max_len=64))
    rule_ids = p.list("SecurityGroupRuleId")
    if rule_ids:
        for rid in rule_ids:
            if not any(r["SecurityGroupRuleId"] == rid and r["Direction"] == direction
                       for r in sg["Permissions"]):
                raise not_found("InvalidSecurityGroupRuleId.NotFound", "SecurityGroupRuleId", rid)
        sg["Permissions"] = [r for r in sg["Permissions"] if r["SecurityGroupRuleId"] not in rule_ids]
    else:
        # Like the real API, revoking a rule that does not exist succeeds.
        for rule in _parse_rules(ctx, p, direction):
            sg["Permissions"] = [r for r in sg["Permissions"] if not _same_rule(rule, r)]
    _save_sg(ctx, sg)
    return {}


@PRODUCT.action("AuthorizeSecurityGroup", resource_type=RT_SECURITY_GROUP)
def authorize_security_group(ctx: CallContext, p: Params) -> dict[str, Any]:
    return _authorize(ctx, p, "ingress")


@PRODUCT.action("AuthorizeSecurityGroupEgress", resource_type=RT_SECURITY_GROUP)
def authorize_security_group_egress(ctx: CallContext, p: Params) -> dict[str, Any]:
    return _authorize(ctx, p, "egress")


@PRODUCT.action("RevokeSecurityGroup", resource_type=RT_SECURITY_GROUP)
def revoke_security_group(ctx: CallContext, p: Params) -> dict[str, Any]:
    return _revoke(ctx, p, "ingress")


@PRODUCT.action("RevokeSecurityGroupEgress", resource_type=RT_SECURITY_GROUP)
def revoke_security_group_egress(ctx: CallContext, p: Params) -> dict[str, Any]:
    return _revoke(ctx, p, "egress")


def _sg_view(sg: dict[str, Any], members: int) -> dict[str, Any]:
    return {
        "SecurityGroupId": sg["SecurityGroupId"], "SecurityGroupName": sg["SecurityGroupName"],
        "Description": sg["Description"], "VpcId": sg["VpcId"], "CreationTime": sg["CreationTime"],
        "SecurityGroupType": sg["SecurityGroupType"], "ResourceGroupId": sg["ResourceGroupId"],
        "ServiceManaged": False, "RuleCount": len(sg["Permissions"]), "EcsCount": members,
        "AvailableInstanceAmount": 2000 - members, "GroupToGroupRuleCount": sum(
            1 for r in sg["Permissions"] if r["SourceGroupId"] or r["DestGroupId"]),
        "Tags": {"Tag": sg["Tags"]},
    }


@PRODUCT.action("DescribeSecurityGroups", rw="Read", resource_type=RT_SECURITY_GROUP)
def describe_security_groups(ctx: CallContext, p: Params) -> dict[str, Any]:
    region = common.region(ctx, p)
    vpc_id = p.str("VpcId", max_len=64)
    wanted_ids = p.json_list("SecurityGroupIds")
    wanted_name = p.str("SecurityGroupName", max_len=128)
    wanted_type = p.str("SecurityGroupType", choices=("normal", "enterprise"))
    has_tags = common.tag_filter(p, lambda r: {t["TagKey"]: t["TagValue"] for t in r["Tags"]})
    groups = [g for g in ctx.store.list(ctx.account_id, SG, region=region)
              if (vpc_id is None or g["VpcId"] == vpc_id)
              and (wanted_ids is None or g["SecurityGroupId"] in wanted_ids)
              and (wanted_name is None or g["SecurityGroupName"] == wanted_name)
              and (wanted_type is None or g["SecurityGroupType"] == wanted_type)
              and has_tags(g)]
    shown, paging = common.page(p, groups, default_size=10, max_size=50)
    # Instance counts per group, from one pass over the region's instances.
    members = dict.fromkeys((g["SecurityGroupId"] for g in shown), 0)
    for inst in ctx.store.list(ctx.account_id, INSTANCE, region=region) if shown else ():
        for sg_id in inst["SecurityGroupIds"]["SecurityGroupId"]:
            if sg_id in members:
                members[sg_id] += 1
    return {**paging, "RegionId": region, "SecurityGroups": {"SecurityGroup": [
        _sg_view(g, members[g["SecurityGroupId"]]) for g in shown]}}


@PRODUCT.action("DescribeSecurityGroupAttribute", rw="Read", resource_type=RT_SECURITY_GROUP)
def describe_security_group_attribute(ctx: CallContext, p: Params) -> dict[str, Any]:
    region = common.region(ctx, p)
    sg = get_sg(ctx, p.req("SecurityGroupId", max_len=64))
    direction = p.str("Direction", default="all", choices=("ingress", "egress", "all"))
    nic = p.str("NicType", choices=("intranet", "internet"))
    rules = [dict(r) for r in sg["Permissions"]
             if direction in ("all", r["Direction"]) and (nic is None or r["NicType"] == nic)]
    return {"RegionId": region, "SecurityGroupId": sg["SecurityGroupId"],
            "SecurityGroupName": sg["SecurityGroupName"], "Description": sg["Description"],
            "VpcId": sg["VpcId"], "InnerAccessPolicy": sg["InnerAccessPolicy"],
            "Permissions": {"Permission": rules}}


@PRODUCT.action("DeleteSecurityGroup", resource_type=RT_SECURITY_GROUP)
def delete_security_group(ctx: CallContext, p: Params) -> dict[str, Any]:
    common.region(ctx, p)
    sg = get_sg(ctx, p.req("SecurityGroupId", max_len=64))
    sg_id = sg["SecurityGroupId"]
    for inst in ctx.store.list(ctx.account_id, INSTANCE, region=sg["RegionId"]):
        if sg_id in inst["SecurityGroupIds"]["SecurityGroupId"]:
            raise CloudError("DependencyViolation",
                             "There is still instance(s) in the specified security group.", 403)
    for other in ctx.store.list(ctx.account_id, SG, region=sg["RegionId"]):
        if other["SecurityGroupId"] != sg_id and any(
                sg_id in (r["SourceGroupId"], r["DestGroupId"]) for r in other["Permissions"]):
            raise CloudError("DependencyViolation",
                             "The specified security group is referenced by a rule of security "
                             f"group {other['SecurityGroupId']}.", 403)
    ctx.store.delete(ctx.account_id, SG, sg_id)
    return {}


# ---- instances --------------------------------------------------------------------------------

def settle(inst: dict[str, Any], now_ms: int) -> dict[str, Any]:
    """Apply a due status transition (Pending → Running after the transition time, ...)."""
    nxt = inst.get("_next")
    if nxt and now_ms >= nxt[1]:
        inst["Status"] = nxt[0]
        inst["_next"] = None
    return inst


def _transition(ctx: CallContext, inst: dict[str, Any], now_status: str, final: str) -> None:
    inst["Status"] = now_status
    inst["_next"] = [final, ctx.tick_ms + int(ctx.config.transition_s * 1000)]


def get_instance(ctx: CallContext, instance_id: str) -> dict[str, Any]:
    inst = common.lookup(ctx, INSTANCE, instance_id, RT_INSTANCE, "InvalidInstanceId.NotFound",
                         "InstanceId")
    return settle(inst, ctx.tick_ms)


def _save_instance(ctx: CallContext, inst: dict[str, Any]) -> None:
    ctx.store.put(ctx.account_id, INSTANCE, inst["InstanceId"], inst["RegionId"], inst,
                  name=inst["InstanceName"], parent_id=inst["VpcAttributes"]["VSwitchId"],
                  created_ms=inst["_created_ms"])


def _password(p: Params) -> None:
    """Checked like the real API, then dropped: the emulator never stores passwords."""
    value = p.str("Password", max_len=10_000)
    if value is None:
        return
    classes = sum(bool(re.search(rx, value)) for rx in (r"[a-z]", r"[A-Z]", r"\d",
                                                         r"[()`~!@#$%^&*\-_+=|{}\[\]:;'<>,.?/]"))
    if not 8 <= len(value) <= 30 or classes < 3 or not value.isascii():
        raise CloudError("InvalidPassword.Malformed",
                         "The password must be 8 to 30 characters and contain three of: "
                         "lowercase letters, uppercase letters, digits, special characters.", 400)


def _new_instances(ctx: CallContext, p: Params, amount: int, initial_final: str) -> list[str]:
    region = common.region(ctx, p)
    itype = p.req("InstanceType", max_len=64)
    if itype not in INSTANCE_TYPES:
        raise CloudError("InvalidInstanceType.ValueNotSupported",
                         f"The specified InstanceType \"{itype[:64]}\" is not supported; "
                         f"available: {', '.join(INSTANCE_TYPES)}.", 400)
    image = p.req("ImageId", max_len=128)
    if image not in IMAGES:
        raise not_found("InvalidImageId.NotFound", "ImageId", image[:128])
    vsw_id = p.str("VSwitchId", max_len=64)
    if not vsw_id:
        raise CloudError("MissingParameter",
                         'The input parameter "VSwitchId" that is mandatory for processing this '
                         "request is not supplied (instances are created in a VPC).", 400)
    vsw = get_vswitch(ctx, vsw_id)
    zone = p.str("ZoneId", max_len=64) or vsw["ZoneId"]
    if zone != vsw["ZoneId"]:
        raise CloudError("InvalidParameter.Mismatch",
                         f"The specified ZoneId \"{zone[:64]}\" does not match the zone of "
                         f"vSwitch {vsw_id} ({vsw['ZoneId']}).", 400)
    sg_ids = p.list("SecurityGroupIds") or ([p.raw["SecurityGroupId"]]
                                            if p.raw.get("SecurityGroupId") else [])
    if not sg_ids:
        raise CloudError("MissingParameter",
                         'The input parameter "SecurityGroupId" that is mandatory for processing '
                         "this request is not supplied.", 400)
    for sg_id in sg_ids:
        sg = get_sg(ctx, sg_id)
        if sg["VpcId"] != vsw["VpcId"]:
            raise CloudError("InvalidSecurityGroupId.NotVpc",
                             f"Security group {sg_id} is not in the VPC of vSwitch {vsw_id} "
                             f"({vsw['VpcId']}).", 400)
    base_name = common.name(p, "InstanceName", "InvalidInstanceName.Malformed")
    desc = common.description(p) or ""
    host = p.str("HostName", max_len=64, pattern=r"[A-Za-z0-9][A-Za-z0-9.-]{1,63}",
                 why="2 to 64 letters, digits, periods and hyphens")
    _password(p)
    charge = p.str("InstanceChargeType", default="PostPaid", choices=("PostPaid", "PrePaid"))
    bandwidth = p.int("InternetMaxBandwidthOut", default=0, lo=0, hi=100)
    disk_category = p.str("SystemDisk.Category", default="cloud_essd", choices=(
        "cloud_essd", "cloud_ssd", "cloud_efficiency", "cloud", "cloud_auto", "cloud_essd_entry"))
    disk_size = p.int("SystemDisk.Size", default=40, lo=20, hi=2048)
    unique_suffix = p.bool("UniqueSuffix")
    tags = p.tags()
    if p.bool("DryRun"):
        raise CloudError("DryRunOperation",
                         "Request validation has been passed with DryRun flag set.", 400)
    family, cpu, memory = INSTANCE_TYPES[itype]
    os_name, os_type = IMAGES[image]
    created = []
    for n in range(amount):
        inst_id = ids.resource_id("i", region)
        inst_name = base_name or inst_id
        if unique_suffix and amount > 1:
            inst_name = f"{inst_name}{n + 1:03d}"
        count = ctx.store.count(ctx.account_id, INSTANCE, parent_id=vsw_id) + 1
        inst = {
            "InstanceId": inst_id, "InstanceName": inst_name, "Description": desc,
            "HostName": host or f"iZ{inst_id[2:]}Z", "RegionId": region, "ZoneId": zone,
            "InstanceType": itype, "InstanceTypeFamily": family, "Cpu": cpu, "Memory": memory,
            "ImageId": image, "OSName": os_name, "OSType": os_type,
            "InstanceNetworkType": "vpc", "InstanceChargeType": charge,
            "InternetChargeType": "PayByTraffic", "InternetMaxBandwidthOut": bandwidth,
            "InternetMaxBandwidthIn": 100 if bandwidth else 0,
            "VpcAttributes": {"VpcId": vsw["VpcId"], "VSwitchId": vsw_id, "NatIpAddress": "",
                              "PrivateIpAddress": {"IpAddress": [_private_ip(vsw, count)]}},
            "SecurityGroupIds": {"SecurityGroupId": list(sg_ids)},
            "PublicIpAddress": {"IpAddress": [f"47.96.{count % 250}.{(count * 7) % 250 + 1}"]
                                if bandwidth else []},
            "EipAddress": {"AllocationId": "", "IpAddress": "", "Bandwidth": 0},
            "CreationTime": iso_minutes(ctx.now_ms), "StartTime": "", "ExpiredTime":
                "2099-12-31T15:59Z", "DeletionProtection": False, "Recyclable": False,
            "SystemDisk": {"Category": disk_category, "Size": disk_size},
            "SerialNumber": ids.request_id().lower(), "IoOptimized": True,
            "ResourceGroupId": "", "Status": "Pending", "_next": None,
            "Tags": {"Tag": [{"TagKey": k, "TagValue": v} for k, v in tags]},
            "OperationLocks": {"LockReason": []}, "_created_ms": ctx.now_ms + n,
        }
        _transition(ctx, inst, "Pending", initial_final)
        _save_instance(ctx, inst)
        ctx.ref(RT_INSTANCE, inst_id)
        created.append(inst_id)
    return created


def _private_ip(vsw: dict[str, Any], n: int) -> str:
    net = ipaddress.ip_network(vsw["CidrBlock"])
    return str(net.network_address + 2 + (n % max(1, net.num_addresses - 4)))


@PRODUCT.action("RunInstances", resource_type=RT_INSTANCE)
def run_instances(ctx: CallContext, p: Params) -> dict[str, Any]:
    token_key, previous = common.client_token(ctx, p, "RunInstances")
    if previous is not None:
        ctx.ref(RT_INSTANCE, *previous["InstanceIdSets"]["InstanceIdSet"])
        return previous
    amount = p.int("Amount", default=1, lo=1, hi=100)
    assert amount is not None
    created = _new_instances(ctx, p, amount, "Running")
    body = {"InstanceIdSets": {"InstanceIdSet": created}, "OrderId": ids.numeric_id(15),
            "TradePrice": 0.0}
    common.remember_token(ctx, token_key, body)
    return body


@PRODUCT.action("CreateInstance", resource_type=RT_INSTANCE)
def create_instance(ctx: CallContext, p: Params) -> dict[str, Any]:
    token_key, previous = common.client_token(ctx, p, "CreateInstance")
    if previous is not None:
        ctx.ref(RT_INSTANCE, previous["InstanceId"])
        return previous
    # CreateInstance leaves the instance Stopped; it must be started explicitly.
    created = _new_instances(ctx, p, 1, "Stopped")
    body = {"InstanceId": created[0], "OrderId": ids.numeric_id(15), "TradePrice": 0.0}
    common.remember_token(ctx, token_key, body)
    return body


def _instance_view(inst: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in inst.items() if not k.startswith("_")}


@PRODUCT.action("DescribeInstances", rw="Read", resource_type=RT_INSTANCE)
def describe_instances(ctx: CallContext, p: Params) -> dict[str, Any]:
    region = common.region(ctx, p)
    wanted_ids = p.json_list("InstanceIds")
    filters = {f: p.str(f, max_len=128) for f in ("VpcId", "VSwitchId", "ZoneId", "InstanceType",
                                                  "ImageId", "SecurityGroupId")}
    status = p.str("Status", choices=("Pending", "Running", "Starting", "Stopping", "Stopped"))
    name_glob = p.str("InstanceName", max_len=128)
    has_tags = common.tag_filter(
        p, lambda r: {t["TagKey"]: t["TagValue"] for t in r["Tags"]["Tag"]})
    found = []
    for inst in ctx.store.list(ctx.account_id, INSTANCE, region=region):
        settle(inst, ctx.tick_ms)
        vpc_attr = inst["VpcAttributes"]
        if wanted_ids is not None and inst["InstanceId"] not in wanted_ids:
            continue
        if filters["VpcId"] and vpc_attr["VpcId"] != filters["VpcId"]:
            continue
        if filters["VSwitchId"] and vpc_attr["VSwitchId"] != filters["VSwitchId"]:
            continue
        if filters["SecurityGroupId"] and \
                filters["SecurityGroupId"] not in inst["SecurityGroupIds"]["SecurityGroupId"]:
            continue
        if any(filters[f] and inst[f] != filters[f] for f in ("ZoneId", "InstanceType", "ImageId")):
            continue
        if status and inst["Status"] != status:
            continue
        if name_glob and not fnmatch.fnmatchcase(inst["InstanceName"], name_glob):
            continue
        if has_tags(inst):
            found.append(_instance_view(inst))
    shown, paging = common.page(p, found, default_size=10, max_size=100)
    return {**paging, "NextToken": "", "Instances": {"Instance": shown}}


def _change_status(ctx: CallContext, p: Params, allowed: tuple[str, ...], now_status: str,
                   final: str, force_field: str | None = None) -> dict[str, Any]:
    common.region(ctx, p, required=False)
    inst = get_instance(ctx, p.req("InstanceId", max_len=64))
    if inst["Status"] not in allowed:
        raise CloudError("IncorrectInstanceStatus", INCORRECT_STATUS, 403)
    if force_field:
        p.bool(force_field)  # validated; a forced stop behaves the same in the emulator
    _transition(ctx, inst, now_status, final)
    if final == "Running":
        inst["StartTime"] = iso_minutes(ctx.now_ms)
    _save_instance(ctx, inst)
    return {}


@PRODUCT.action("StartInstance", resource_type=RT_INSTANCE)
def start_instance(ctx: CallContext, p: Params) -> dict[str, Any]:
    return _change_status(ctx, p, ("Stopped",), "Starting", "Running")


@PRODUCT.action("StopInstance", resource_type=RT_INSTANCE)
def stop_instance(ctx: CallContext, p: Params) -> dict[str, Any]:
    return _change_status(ctx, p, ("Running",), "Stopping", "Stopped", "ForceStop")


@PRODUCT.action("RebootInstance", resource_type=RT_INSTANCE)
def reboot_instance(ctx: CallContext, p: Params) -> dict[str, Any]:
    return _change_status(ctx, p, ("Running",), "Starting", "Running", "ForceStop")


@PRODUCT.action("ModifyInstanceAttribute", resource_type=RT_INSTANCE)
def modify_instance_attribute(ctx: CallContext, p: Params) -> dict[str, Any]:
    common.region(ctx, p, required=False)
    inst = get_instance(ctx, p.req("InstanceId", max_len=64))
    new_name = common.name(p, "InstanceName", "InvalidInstanceName.Malformed")
    new_desc = common.description(p)
    host = p.str("HostName", max_len=64, pattern=r"[A-Za-z0-9][A-Za-z0-9.-]{1,63}",
                 why="2 to 64 letters, digits, periods and hyphens")
    _password(p)
    sg_ids = p.list("SecurityGroupIds")
    for sg_id in sg_ids:
        sg = get_sg(ctx, sg_id)
        if sg["VpcId"] != inst["VpcAttributes"]["VpcId"]:
            raise CloudError("InvalidSecurityGroupId.NotVpc",
                             f"Security group {sg_id} is not in the instance's VPC.", 400)
    if p.raw.get("DeletionProtection"):
        inst["DeletionProtection"] = p.bool("DeletionProtection")
    if new_name is not None:
        inst["InstanceName"] = new_name
    if new_desc is not None:
        inst["Description"] = new_desc
    if host is not None:
        inst["HostName"] = host
    if sg_ids:
        inst["SecurityGroupIds"] = {"SecurityGroupId": sg_ids}
    _save_instance(ctx, inst)
    return {}


@PRODUCT.action("DeleteInstance", resource_type=RT_INSTANCE)
def delete_instance(ctx: CallContext, p: Params) -> dict[str, Any]:
    common.region(ctx, p, required=False)
    inst = get_instance(ctx, p.req("InstanceId", max_len=64))
    force = p.bool("Force")
    if inst["DeletionProtection"]:
        raise CloudError("InvalidOperation.DeletionProtection",
                         "The instance has deletion protection enabled.", 403)
    if inst["Status"] != "Stopped" and not (force and inst["Status"] == "Running"):
        raise CloudError("IncorrectInstanceStatus", INCORRECT_STATUS, 403)
    ctx.store.delete(ctx.account_id, INSTANCE, inst["InstanceId"])
    return {}


_TAGGABLE = {"instance": (INSTANCE, RT_INSTANCE, get_instance, _save_instance),
             "securitygroup": (SG, RT_SECURITY_GROUP, get_sg, _save_sg)}


@PRODUCT.action("TagResources")
def tag_resources(ctx: CallContext, p: Params) -> dict[str, Any]:
    common.region(ctx, p)
    rtype = p.req("ResourceType", max_len=32).lower()
    if rtype not in _TAGGABLE:
        raise invalid("ResourceType", f"allowed values are {', '.join(_TAGGABLE)}",
                      "InvalidResourceType.NotSupported")
    _, _, getter, saver = _TAGGABLE[rtype]
    resource_ids = p.list("ResourceId")
    if not resource_ids:
        raise CloudError("MissingParameter", 'The input parameter "ResourceId.N" that is '
                         "mandatory for processing this request is not supplied.", 400)
    if len(resource_ids) > 50:
        raise invalid("ResourceId", "at most 50 resources per call")
    tags = p.tags()
    if not tags:
        raise CloudError("MissingParameter", 'The input parameter "Tag.N.Key" that is mandatory '
                         "for processing this request is not supplied.", 400)
    for rid in resource_ids:
        resource = getter(ctx, rid)
        holder = resource["Tags"]["Tag"] if rtype == "instance" else resource["Tags"]
        merged = common.merge_tags(holder, tags, "TagKey", "TagValue")
        if rtype == "instance":
            resource["Tags"]["Tag"] = merged
        else:
            resource["Tags"] = merged
        saver(ctx, resource)
    return {}
