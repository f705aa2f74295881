"""VPC 2016-04-28: VPCs and vSwitches, with CIDR checks and dependency errors."""
from __future__ import annotations

import ipaddress
from typing import Any

from .. import ids
from ..catalog import REGIONS, RT_VPC, RT_VSWITCH
from ..errors import CloudError
from ..params import Params
from ..service import CallContext, Product
from ..timeutil import iso
from . import common

PRODUCT = Product("Vpc", "2016-04-28", "vpc.aliyuncs.com", "vpc.console.aliyun.com")
VPC = "vpc"
VSWITCH = "vswitch"
_PRIVATE = [ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16")]


def _settle(ctx: CallContext, item: dict[str, Any]) -> dict[str, Any]:
    if item["Status"] == "Pending" and ctx.tick_ms >= item["_ready_ms"]:
        item["Status"] = "Available"
    return item


def get_vpc(ctx: CallContext, vpc_id: str) -> dict[str, Any]:
    return _settle(ctx, common.lookup(ctx, VPC, vpc_id, RT_VPC, "InvalidVpcId.NotFound", "VpcId"))


def get_vswitch(ctx: CallContext, vsw_id: str) -> dict[str, Any]:
    return _settle(ctx, common.lookup(ctx, VSWITCH, vsw_id, RT_VSWITCH,
                                      "InvalidVSwitchId.NotFound", "VSwitchId"))


def _network(field: str, value: str, code: str) -> ipaddress.IPv4Network:
    try:
        net = ipaddress.ip_network(value, strict=True)
    except ValueError:
        raise CloudError(code, f"The specified {field} \"{value[:64]}\" is not a valid CIDR block "
                         "(for example 192.168.0.0/16).", 400) from None
    if not isinstance(net, ipaddress.IPv4Network):
        raise CloudError(code, f"The specified {field} must be an IPv4 CIDR block.", 400)
    return net


@PRODUCT.action("CreateVpc", resource_type=RT_VPC)
def create_vpc(ctx: CallContext, p: Params) -> dict[str, Any]:
    region = common.region(ctx, p)
    token_key, previous = common.client_token(ctx, p, "CreateVpc")
    if previous is not None:
        ctx.ref(RT_VPC, previous["VpcId"])
        return previous
    cidr = p.str("CidrBlock", default="172.16.0.0/12", max_len=64) or "172.16.0.0/12"
    net = _network("CidrBlock", cidr, "InvalidCidrBlock.Malformed")
    if not any(net.subnet_of(block) for block in _PRIVATE) or not 8 <= net.prefixlen <= 28:
        raise CloudError("InvalidCidrBlock.Malformed",
                         "CidrBlock must be 10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16 or a "
                         "subnet of them with a mask between /8 and /28.", 400)
    vpc_name = common.name(p, "VpcName", "InvalidVpcName.Malformed") or ""
    desc = common.description(p) or ""
    tags = p.tags()
    if p.bool("DryRun"):
        raise CloudError("DryRunOperation",
                         "Request validation has been passed with DryRun flag set.", 400)
    vpc_id = ids.resource_id("vpc", region)
    vpc = {
        "VpcId": vpc_id, "VpcName": vpc_name, "Description": desc, "CidrBlock": str(net),
        "RegionId": region, "Status": "Pending", "IsDefault": False,
        "CreationTime": iso(ctx.now_ms), "VRouterId": ids.resource_id("vrt", region),
        "RouteTableId": ids.resource_id("vtb", region), "ResourceGroupId": "rg-acfmlocal0000000",
        "Tags": [{"Key": k, "Value": v} for k, v in tags],
        "_ready_ms": ctx.tick_ms + int(ctx.config.network_ready_s * 1000),
        "_created_ms": ctx.now_ms,
    }
    ctx.store.put(ctx.account_id, VPC, vpc_id, region, vpc, name=vpc_name, created_ms=ctx.now_ms)
    ctx.ref(RT_VPC, vpc_id)
    body = {"VpcId": vpc_id, "VRouterId": vpc["VRouterId"], "RouteTableId": vpc["RouteTableId"],
            "ResourceGroupId": vpc["ResourceGroupId"]}
    common.remember_token(ctx, token_key, body)
    return body


def _vpc_view(ctx: CallContext, vpc: dict[str, Any]) -> dict[str, Any]:
    vswitches = [v["VSwitchId"] for v in ctx.store.list(ctx.account_id, VSWITCH,
                                                         parent_id=vpc["VpcId"])]
    view = {k: v for k, v in vpc.items() if not k.startswith("_") and k != "Tags"}
    view["VSwitchIds"] = {"VSwitchId": vswitches}
    view["Tags"] = {"Tag": vpc["Tags"]}
    view["UserCidrs"] = {"UserCidr": []}
    view["SecondaryCidrBlocks"] = {"SecondaryCidrBlock": []}
    return view


@PRODUCT.action("DescribeVpcs", rw="Read", resource_type=RT_VPC)
def describe_vpcs(ctx: CallContext, p: Params) -> dict[str, Any]:
    region = common.region(ctx, p)
    wanted = p.str("VpcId", max_len=1024)
    wanted_ids = set(filter(None, (v.strip() for v in wanted.split(",")))) if wanted else None
    if wanted_ids and len(wanted_ids) > 20:
        raise CloudError("InvalidParameter", "VpcId accepts at most 20 comma-separated ids.", 400)
    wanted_name = p.str("VpcName", max_len=128)
    is_default = p.raw.get("IsDefault")
    default_filter = p.bool("IsDefault") if is_default else None
    has_tags = common.tag_filter(p, lambda r: {t["Key"]: t["Value"] for t in r["Tags"]})
    vpcs = [_settle(ctx, v) for v in ctx.store.list(ctx.account_id, VPC, region=region)]
    vpcs = [v for v in vpcs
            if (wanted_ids is None or v["VpcId"] in wanted_ids)
            and (wanted_name is None or v["VpcName"] == wanted_name)
            and (default_filter is None or v["IsDefault"] == default_filter) and has_tags(v)]
    shown, paging = common.page(p, vpcs, default_size=10, max_size=50)
    return {**paging, "Vpcs": {"Vpc": [_vpc_view(ctx, v) for v in shown]}}


@PRODUCT.action("DeleteVpc", resource_type=RT_VPC)
def delete_vpc(ctx: CallContext, p: Params) -> dict[str, Any]:
    common.region(ctx, p, required=False)
    vpc = get_vpc(ctx, p.req("VpcId", max_len=64))
    vpc_id = vpc["VpcId"]
    if vpc["Status"] != "Available":
        raise CloudError("IncorrectVpcStatus",
                         "Current VPC status does not support this operation.", 400)
    if ctx.store.count(ctx.account_id, VSWITCH, parent_id=vpc_id):
        raise CloudError("DependencyViolation.VSwitch",
                         "Specified object has dependent resources: the VPC still has vSwitches; "
                         "delete them first.", 400)
    if ctx.store.count(ctx.account_id, "ecs_sg", parent_id=vpc_id):
        raise CloudError("DependencyViolation.SecurityGroup",
                         "Specified object has dependent resources SecurityGroup: delete the "
                         "security groups of this VPC first.", 400)
    if p.bool("DryRun"):
        raise CloudError("DryRunOperation",
                         "Request validation has been passed with DryRun flag set.", 400)
    ctx.store.delete(ctx.account_id, VPC, vpc_id)
    return {}


@PRODUCT.action("CreateVSwitch", resource_type=RT_VSWITCH)
def create_vswitch(ctx: CallContext, p: Params) -> dict[str, Any]:
    region = common.region(ctx, p)
    token_key, previous = common.client_token(ctx, p, "CreateVSwitch")
    if previous is not None:
        ctx.ref(RT_VSWITCH, previous["VSwitchId"])
        return previous
    zone = p.req("ZoneId", max_len=64)
    if not common.zone_ok(region, zone):
        raise CloudError("InvalidZoneId.NotFound",
                         f"The specified ZoneId \"{zone[:64]}\" does not exist in {region}; "
                         f"zones: {', '.join(REGIONS[region][1])}.", 404)
    cidr = p.req("CidrBlock", max_len=64)
    vpc = get_vpc(ctx, p.req("VpcId", max_len=64))
    net = _network("CidrBlock", cidr, "InvalidCidrBlock.Malformed")
    vpc_net = ipaddress.ip_network(vpc["CidrBlock"])
    if not net.subnet_of(vpc_net) or not 16 <= net.prefixlen <= 29:
        raise CloudError("InvalidCidrBlock.Malformed",
                         f"The vSwitch CidrBlock must be inside the VPC's {vpc['CidrBlock']} with "
                         "a mask between /16 and /29.", 400)
    siblings = ctx.store.list(ctx.account_id, VSWITCH, parent_id=vpc["VpcId"])
    if any(net.overlaps(ipaddress.ip_network(s["CidrBlock"])) for s in siblings):
        raise CloudError("InvalidCidrBlock.Overlapped",
                         "The specified CidrBlock overlaps with another vSwitch in this VPC.", 400)
    if vpc["Status"] != "Available":
        raise CloudError("IncorrectVpcStatus",
                         "Current VPC status does not support this operation.", 400)
    vsw_name = common.name(p, "VSwitchName", "InvalidVSwitchName.Malformed") or ""
    desc = common.description(p) or ""
    tags = p.tags()
    vsw_id = ids.resource_id("vsw", region)
    vsw = {
        "VSwitchId": vsw_id, "VSwitchName": vsw_name, "Description": desc, "VpcId": vpc["VpcId"],
        "ZoneId": zone, "CidrBlock": str(net), "RegionId": region, "Status": "Pending",
        "IsDefault": False, "CreationTime": iso(ctx.now_ms),
        "AvailableIpAddressCount": net.num_addresses - 4, "ResourceGroupId": vpc["ResourceGroupId"],
        "Tags": [{"Key": k, "Value": v} for k, v in tags],
        "_ready_ms": ctx.tick_ms + int(ctx.config.network_ready_s * 1000),
        "_created_ms": ctx.now_ms,
    }
    ctx.store.put(ctx.account_id, VSWITCH, vsw_id, region, vsw, name=vsw_name,
                  parent_id=vpc["VpcId"], created_ms=ctx.now_ms)
    ctx.ref(RT_VSWITCH, vsw_id)
    body = {"VSwitchId": vsw_id}
    common.remember_token(ctx, token_key, body)
    return body


@PRODUCT.action("DescribeVSwitches", rw="Read", resource_type=RT_VSWITCH)
def describe_vswitches(ctx: CallContext, p: Params) -> dict[str, Any]:
    region = common.region(ctx, p)
    vpc_id = p.str("VpcId", max_len=64)
    wanted = p.str("VSwitchId", max_len=1024)
    wanted_ids = set(filter(None, (v.strip() for v in wanted.split(",")))) if wanted else None
    zone = p.str("ZoneId", max_len=64)
    wanted_name = p.str("VSwitchName", max_len=128)
    has_tags = common.tag_filter(p, lambda r: {t["Key"]: t["Value"] for t in r["Tags"]})
    items = [_settle(ctx, v) for v in ctx.store.list(ctx.account_id, VSWITCH, region=region)]
    items = [v for v in items
             if (vpc_id is None or v["VpcId"] == vpc_id)
             and (wanted_ids is None or v["VSwitchId"] in wanted_ids)
             and (zone is None or v["ZoneId"] == zone)
             and (wanted_name is None or v["VSwitchName"] == wanted_name) and has_tags(v)]
    shown, paging = common.page(p, items, default_size=10, max_size=50)
    views = []
    for v in shown:
        view = {k: val for k, val in v.items() if not k.startswith("_") and k != "Tags"}
        view["Tags"] = {"Tag": v["Tags"]}
        views.append(view)
    return {**paging, "VSwitches": {"VSwitch": views}}


@PRODUCT.action("DeleteVSwitch", resource_type=RT_VSWITCH)
def delete_vswitch(ctx: CallContext, p: Params) -> dict[str, Any]:
    common.region(ctx, p, required=False)
    vsw = get_vswitch(ctx, p.req("VSwitchId", max_len=64))
    if vsw["Status"] != "Available":
        raise CloudError("IncorrectVSwitchStatus", "vpc subnet status not working.", 400)
    if ctx.store.count(ctx.account_id, "ecs_instance", parent_id=vsw["VSwitchId"]):
        raise CloudError("DependencyViolation",
                         "Specified object has dependent resources: instances still use this "
                         "vSwitch.", 400)
    ctx.store.delete(ctx.account_id, VSWITCH, vsw["VSwitchId"])
    return {}
