"""VPC console pages: VPCs and vSwitches (list, create, detail, delete with the API's
dependency errors shown on the page)."""
from __future__ import annotations

from typing import Any

from starlette.responses import Response

from ..catalog import REGIONS
from ..errors import not_found
from .core import ConsoleApp, Page, PagedSource, ProductNav
from .ui import Button, Column, Field, FormSpec, Option, Section, Step

NAV = ProductNav("vpc", "Virtual Private Cloud", "VPC", (
    ("VPCs", "/console/vpc/vpcs", "Networks"),
    ("vSwitches", "/console/vpc/vswitches", "Networks"),
))
VPCS = "/console/vpc/vpcs"
VSWITCHES = "/console/vpc/vswitches"
NAME_HELP = ("2 to 128 characters. Starts with a letter; letters, digits, periods (.), "
             "underscores (_), hyphens (-) and colons (:).")
DESC_HELP = "At most 256 characters; cannot start with http:// or https://."


def _vpc_row(v: dict[str, Any]) -> dict[str, Any]:
    return {**v, "VSwitchCount": len(v["VSwitchIds"]["VSwitchId"]),
            "Default": "Yes" if v["IsDefault"] else "No", "_href": f"{VPCS}/{v['VpcId']}"}


def _vsw_row(v: dict[str, Any]) -> dict[str, Any]:
    return {**v, "_href": f"{VSWITCHES}/{v['VSwitchId']}"}


def _vsw_buttons(row: dict[str, Any]) -> list[Button]:
    vid = row["VSwitchId"]
    return [Button("Manage", href=row["_href"]),
            Button("Delete", post=f"{VSWITCHES}/{vid}/delete", danger=True, confirm_id=vid,
                   confirm=f"Delete vSwitch {vid}? It must not hold instances.")]


def _get_vpc(page: Page, vpc_id: str) -> dict[str, Any]:
    found = page.read("Vpc", "DescribeVpcs", RegionId=page.region, VpcId=vpc_id[:64].replace(
        ",", ""))["Vpcs"]["Vpc"]
    if not found:
        raise not_found("InvalidVpcId.NotFound", "VpcId", vpc_id[:64])
    return found[0]


def _vsw_columns(with_vpc: bool) -> list[Column]:
    cols = [Column("VSwitchId", "vSwitch ID/Name", "link", sub="VSwitchName")]
    if with_vpc:
        cols.append(Column("VpcId", "VPC", "mono"))
    return cols + [Column("ZoneId", "Zone"), Column("CidrBlock", "IPv4 CIDR Block", "mono"),
                   Column("Status", "Status", "status"),
                   Column("AvailableIpAddressCount", "Available IPs"),
                   Column("CreationTime", "Created")]


def register(console: ConsoleApp) -> None:
    console.navs.append(NAV)

    @console.route("/vpc/vpcs", name="vpc_vpcs")
    def vpcs(page: Page) -> Response:
        rows = PagedSource("Vpc", "DescribeVpcs", "Vpcs.Vpc", _vpc_row,
                           (("RegionId", page.region),))
        return console.list_page(
            page, product=NAV, active=VPCS, title="VPCs", rows=rows,
            columns=[Column("VpcId", "VPC ID/Name", "link", sub="VpcName"),
                     Column("CidrBlock", "IPv4 CIDR Block", "mono"),
                     Column("Status", "Status", "status"), Column("VSwitchCount", "vSwitches"),
                     Column("Default", "Default VPC"), Column("CreationTime", "Created")],
            actions=lambda r: [
                Button("Manage", href=r["_href"]),
                Button("Create vSwitch", href=f"{VSWITCHES}/create?vpc={r['VpcId']}"),
                Button("Delete", post=f"{VPCS}/{r['VpcId']}/delete", danger=True,
                       confirm_id=r["VpcId"],
                       confirm=f"Delete VPC {r['VpcId']}? It must not hold vSwitches or "
                               "security groups.")],
            toolbar=[Button("Create VPC", href=f"{VPCS}/create", primary=True)],
            search=(("VpcName", "VPC name"), ("VpcId", "VPC ID"), ("CidrBlock", "CIDR block")))

    @console.route("/vpc/vpcs/create", methods=("GET", "POST"), name="vpc_vpc_create")
    def create_vpc(page: Page) -> Response:
        spec = FormSpec("Create VPC", [Step("VPC", (
            Field("VpcName", "VPC Name", help=NAME_HELP),
            Field("CidrBlock", "IPv4 CIDR Block", required=True, default="192.168.0.0/16",
                  placeholder="192.168.0.0/16",
                  help="10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16 or a subnet of them, with a "
                       "mask from /8 to /28."),
            Field("Description", "Description", "textarea", help=DESC_HELP),
        ))], submit="Create", cancel=VPCS)
        return console.form(
            page, spec, product=NAV, active=VPCS, product_name="Vpc", action="CreateVpc",
            fixed={"RegionId": page.region}, client_token=True,
            done=lambda r, _v: (f"{VPCS}/{r['VpcId']}", f"VPC {r['VpcId']} created."))

    @console.route("/vpc/vpcs/{vpc_id}", name="vpc_vpc")
    def vpc(page: Page, vpc_id: str) -> Response:
        v = _vpc_row(_get_vpc(page, vpc_id))
        vid = v["VpcId"]
        vsws = [_vsw_row(s) for s in page.read_all("Vpc", "DescribeVSwitches", "VSwitches.VSwitch",
                                                   RegionId=page.region, VpcId=vid)]
        sections = [
            Section("Basic Information", fields=[
                ("VPC ID", vid), ("VPC Name", v["VpcName"]), ("Status", {"status": v["Status"]}),
                ("IPv4 CIDR Block", v["CidrBlock"]), ("vRouter", v["VRouterId"]),
                ("Route Table", v["RouteTableId"]), ("Default VPC", v["Default"]),
                ("Description", v["Description"]), ("Created", v["CreationTime"])]),
            Section("vSwitches", columns=_vsw_columns(False), rows=vsws, row_actions=_vsw_buttons,
                    actions=[Button("Create vSwitch", href=f"{VSWITCHES}/create?vpc={vid}",
                                    primary=True)], empty="No vSwitches in this VPC"),
        ]
        return page.render(
            "detail.html", product=NAV, active=VPCS, title=vid, status=v["Status"],
            list_href=VPCS, list_label="VPCs", sections=sections, tab="",
            live=v["Status"] == "Pending" or any(s["Status"] == "Pending" for s in vsws),
            page_actions=[Button("Delete", post=f"{VPCS}/{vid}/delete", danger=True,
                                 confirm_id=vid, confirm=f"Delete VPC {vid}?")])

    @console.route("/vpc/vpcs/{vpc_id}/delete", methods=("POST",), name="vpc_vpc_delete")
    def delete_vpc(page: Page, vpc_id: str) -> Response:
        vid = vpc_id[:64]
        return console.act(page, "Vpc", "DeleteVpc", {"RegionId": page.region, "VpcId": vid},
                           back=VPCS, ok=f"VPC {vid} deleted.", confirm_id=vid)

    @console.route("/vpc/vswitches", name="vpc_vswitches")
    def vswitches(page: Page) -> Response:
        rows = PagedSource("Vpc", "DescribeVSwitches", "VSwitches.VSwitch", _vsw_row,
                           (("RegionId", page.region),))
        return console.list_page(
            page, product=NAV, active=VSWITCHES, title="vSwitches", rows=rows,
            columns=_vsw_columns(True), actions=_vsw_buttons,
            toolbar=[Button("Create vSwitch", href=f"{VSWITCHES}/create", primary=True)],
            search=(("VSwitchName", "vSwitch name"), ("VSwitchId", "vSwitch ID"),
                    ("VpcId", "VPC ID")))

    @console.route("/vpc/vswitches/create", methods=("GET", "POST"), name="vpc_vswitch_create")
    def create_vswitch(page: Page) -> Response:
        vpcs = page.read_all("Vpc", "DescribeVpcs", "Vpcs.Vpc", RegionId=page.region)
        spec = FormSpec("Create vSwitch", [Step("vSwitch", (
            Field("VpcId", "VPC", "select", required=True, options=tuple(
                Option(v["VpcId"], f"{v['VpcName'] or '-'} / {v['VpcId']} ({v['CidrBlock']})")
                for v in vpcs)),
            Field("VSwitchName", "vSwitch Name", help=NAME_HELP),
            Field("ZoneId", "Zone", "select", required=True,
                  options=tuple(Option(z, z) for z in REGIONS[page.region][1])),
            Field("CidrBlock", "IPv4 CIDR Block", required=True, placeholder="192.168.1.0/24",
                  help="Inside the VPC's CIDR block, mask /16 to /29, not overlapping another "
                       "vSwitch."),
            Field("Description", "Description", "textarea", help=DESC_HELP),
        ))], submit="Create", cancel=VSWITCHES)
        return console.form(
            page, spec, product=NAV, active=VSWITCHES, product_name="Vpc", action="CreateVSwitch",
            fixed={"RegionId": page.region}, client_token=True,
            initial={"VpcId": page.query.get("vpc", "")[:64]},
            done=lambda r, v: (f"{VPCS}/{v['VpcId']}", f"vSwitch {r['VSwitchId']} created."))

    @console.route("/vpc/vswitches/{vsw_id}", name="vpc_vswitch")
    def vswitch(page: Page, vsw_id: str) -> Response:
        found = page.read("Vpc", "DescribeVSwitches", RegionId=page.region,
                          VSwitchId=vsw_id[:64].replace(",", ""))["VSwitches"]["VSwitch"]
        if not found:
            raise not_found("InvalidVSwitchId.NotFound", "VSwitchId", vsw_id[:64])
        s = _vsw_row(found[0])
        sid = s["VSwitchId"]
        sections = [Section("Basic Information", fields=[
            ("vSwitch ID", sid), ("vSwitch Name", s["VSwitchName"]),
            ("Status", {"status": s["Status"]}),
            ("VPC", {"href": f"{VPCS}/{s['VpcId']}", "text": s["VpcId"]}), ("Zone", s["ZoneId"]),
            ("IPv4 CIDR Block", s["CidrBlock"]),
            ("Available IPs", s["AvailableIpAddressCount"]), ("Description", s["Description"]),
            ("Created", s["CreationTime"])])]
        return page.render(
            "detail.html", product=NAV, active=VSWITCHES, title=sid, status=s["Status"],
            list_href=VSWITCHES, list_label="vSwitches", sections=sections, tab="",
            live=s["Status"] == "Pending", page_actions=_vsw_buttons(s)[1:])

    @console.route("/vpc/vswitches/{vsw_id}/delete", methods=("POST",), name="vpc_vswitch_delete")
    def delete_vswitch(page: Page, vsw_id: str) -> Response:
        sid = vsw_id[:64]
        return console.act(page, "Vpc", "DeleteVSwitch", {"RegionId": page.region,
                                                          "VSwitchId": sid},
                           back=page.back(VSWITCHES) if "/vpc/vpcs/" in page.back("") else
                           VSWITCHES, ok=f"vSwitch {sid} deleted.", confirm_id=sid)
