"""ECS console pages: instances (list, create wizard, detail, start/stop/restart/rename/
release) and security groups (list, create, detail with inbound/outbound rules)."""
from __future__ import annotations

import json
from typing import Any

from starlette.responses import Response

from ..catalog import IMAGES, INSTANCE_TYPES, REGIONS
from ..errors import CloudError, not_found
from .core import REGION_NAMES, ConsoleApp, Page, PagedSource, ProductNav
from .ui import Button, Column, Field, FormSpec, Option, Section, Step

NAV = ProductNav("ecs", "Elastic Compute Service", "ECS", (
    ("Instances", "/console/ecs/instances", "Instances & Images"),
    ("Security Groups", "/console/ecs/security-groups", "Network & Security"),
))
INSTANCES = "/console/ecs/instances"
GROUPS = "/console/ecs/security-groups"
NAME_HELP = ("2 to 128 characters. Starts with a letter; letters, digits, periods (.), "
             "underscores (_), hyphens (-) and colons (:).")
# op -> (API action, statuses it is offered in, past-tense message, confirmation)
INSTANCE_OPS: dict[str, tuple[str, tuple[str, ...], str, str]] = {
    "start": ("StartInstance", ("Stopped",), "is starting", ""),
    "stop": ("StopInstance", ("Running",), "is stopping",
             "Stop instance {id}? Services on it become unavailable until it is started."),
    "reboot": ("RebootInstance", ("Running",), "is restarting",
               "Restart instance {id}? Services on it are briefly unavailable."),
    "delete": ("DeleteInstance", ("Stopped",), "was released",
               "Release instance {id}? It is deleted permanently with its system disk."),
}
_OP_LABELS = {"start": "Start", "stop": "Stop", "reboot": "Restart", "delete": "Delete"}


def _instance_row(inst: dict[str, Any]) -> dict[str, Any]:
    ips = inst["VpcAttributes"]["PrivateIpAddress"]["IpAddress"]
    return {
        "InstanceId": inst["InstanceId"], "InstanceName": inst["InstanceName"],
        "Status": inst["Status"], "ZoneId": inst["ZoneId"],
        "PrivateIp": ", ".join(ips), "PublicIp": ", ".join(inst["PublicIpAddress"]["IpAddress"]),
        "InstanceType": inst["InstanceType"],
        "Spec": f"{inst['Cpu']} vCPU {inst['Memory'] // 1024} GiB", "OSName": inst["OSName"],
        "CreationTime": inst["CreationTime"], "VpcId": inst["VpcAttributes"]["VpcId"],
        "VSwitchId": inst["VpcAttributes"]["VSwitchId"], "ImageId": inst["ImageId"],
        "SecurityGroupIds": inst["SecurityGroupIds"]["SecurityGroupId"],
        "Description": inst["Description"],
        "_href": f"{INSTANCES}/{inst['InstanceId']}",
    }


def _group_row(g: dict[str, Any]) -> dict[str, Any]:
    return {**g, "_href": f"{GROUPS}/{g['SecurityGroupId']}",
            "Type": "Basic" if g["SecurityGroupType"] == "normal" else "Advanced"}


def _instance_buttons(row: dict[str, Any], with_manage: bool) -> list[Button]:
    iid, status = row["InstanceId"], row["Status"]
    buttons = [Button("Manage", href=row["_href"])] if with_manage else []
    for op, (_, allowed, _, confirm) in INSTANCE_OPS.items():
        disabled = status not in allowed
        why = (f"Available when the instance is {' or '.join(allowed)}." if disabled else "")
        if op == "delete" and disabled:
            why = "Stop the instance before you release it."
        buttons.append(Button(_OP_LABELS[op], post=f"{INSTANCES}/{iid}/{op}",
                              confirm=confirm.format(id=iid),
                              confirm_id=iid if op == "delete" else "",
                              danger=op == "delete", disabled=disabled, why_disabled=why))
        if op == "reboot" and not with_manage:
            buttons.append(Button("Rename", href=f"{INSTANCES}/{iid}/rename"))
    return buttons


def _get_instance(page: Page, instance_id: str) -> dict[str, Any]:
    found = page.read("Ecs", "DescribeInstances", RegionId=page.region,
                      InstanceIds=json.dumps([instance_id[:64]]))["Instances"]["Instance"]
    if not found:
        raise not_found("InvalidInstanceId.NotFound", "InstanceId", instance_id[:64])
    return found[0]


def _get_group(page: Page, sg_id: str) -> dict[str, Any]:
    return page.read("Ecs", "DescribeSecurityGroupAttribute", RegionId=page.region,
                     SecurityGroupId=sg_id[:64])


def _vpc_options(page: Page) -> tuple[Option, ...]:
    vpcs = page.read_all("Vpc", "DescribeVpcs", "Vpcs.Vpc", RegionId=page.region)
    return tuple(Option(v["VpcId"], f"{v['VpcName'] or '-'} / {v['VpcId']} ({v['CidrBlock']})")
                 for v in vpcs)


def register(console: ConsoleApp) -> None:
    console.navs.append(NAV)

    # ---- instances ------------------------------------------------------------------------
    @console.route("/ecs/instances", name="ecs_instances")
    def instances(page: Page) -> Response:
        rows = PagedSource("Ecs", "DescribeInstances", "Instances.Instance", _instance_row,
                           (("RegionId", page.region),), max_page_size=100)
        return console.list_page(
            page, product=NAV, active=INSTANCES, title="Instances", rows=rows,
            columns=[Column("InstanceId", "Instance ID/Name", "link", sub="InstanceName"),
                     Column("Status", "Status", "status"), Column("ZoneId", "Zone"),
                     Column("PrivateIp", "IP Address", "mono"),
                     Column("Spec", "Instance Type", sub="InstanceType"),
                     Column("CreationTime", "Created")],
            actions=lambda r: _instance_buttons(r, True),
            toolbar=[Button("Create Instance", href=f"{INSTANCES}/create", primary=True)],
            search=(("InstanceName", "Instance name"), ("InstanceId", "Instance ID"),
                    ("PrivateIp", "IP address")))

    @console.route("/ecs/instances/create", methods=("GET", "POST"), name="ecs_instance_create")
    def create_instance(page: Page) -> Response:
        region = page.region
        vswitches = page.read_all("Vpc", "DescribeVSwitches", "VSwitches.VSwitch",
                                  RegionId=region)
        groups = page.read_all("Ecs", "DescribeSecurityGroups", "SecurityGroups.SecurityGroup",
                               RegionId=region)
        spec = FormSpec("Create Instance", [
            Step("Region and Zone", (
                Field("Region", "Region", "readonly", api=False, default=REGION_NAMES[region],
                      help="Change the region in the top bar."),
                Field("ZoneId", "Zone", "select", placeholder="Any zone (decided by the vSwitch)",
                      options=tuple(Option(z, z) for z in REGIONS[region][1])))),
            Step("Instance Type", (
                Field("InstanceType", "Instance Type", "radio", required=True, columns=("spec",),
                      options=tuple(Option(t, t, hint=f"{c} vCPU | {m // 1024} GiB | {fam}")
                                    for t, (fam, c, m) in INSTANCE_TYPES.items())),)),
            Step("Image", (
                Field("ImageId", "Image", "radio", required=True,
                      options=tuple(Option(i, name, hint=i) for i, (name, _) in IMAGES.items())),)),
            Step("Network", (
                Field("VpcId", "VPC", "select", required=True, api=False,
                      options=_vpc_options(page), help="Create VPCs in the VPC console."),
                Field("VSwitchId", "vSwitch", "select", required=True,
                      filter_by=("VpcId", "ZoneId"),
                      options=tuple(Option(v["VSwitchId"], f"{v['VSwitchName'] or '-'} / "
                                           f"{v['VSwitchId']} ({v['ZoneId']}, {v['CidrBlock']})",
                                           data=(("VpcId", v["VpcId"]), ("ZoneId", v["ZoneId"])))
                                    for v in vswitches)))),
            Step("Security Group", (
                Field("SecurityGroupId", "Security Group", "select", required=True,
                      filter_by=("VpcId",),
                      options=tuple(Option(g["SecurityGroupId"],
                                           f"{g['SecurityGroupName'] or '-'} / {g['SecurityGroupId']}",
                                           data=(("VpcId", g["VpcId"]),)) for g in groups)),)),
            Step("Instance Name", (
                Field("InstanceName", "Instance Name", help=NAME_HELP + " Empty: the instance ID."),
                Field("Description", "Description", "textarea",
                      help="At most 256 characters; cannot start with http:// or https://."))),
        ], submit="Create Instance", cancel=INSTANCES)
        return console.form(
            page, spec, product=NAV, active=INSTANCES, product_name="Ecs", action="RunInstances",
            fixed={"RegionId": region, "Amount": "1"}, client_token=True,
            done=lambda result, _v: (INSTANCES, "Instance {} is being created.".format(
                ", ".join(result["InstanceIdSets"]["InstanceIdSet"]))))

    @console.route("/ecs/instances/{instance_id}", name="ecs_instance")
    def instance(page: Page, instance_id: str) -> Response:
        row = _instance_row(_get_instance(page, instance_id))
        sections = [
            Section("Basic Information", fields=[
                ("Instance ID", row["InstanceId"]), ("Instance Name", row["InstanceName"]),
                ("Status", {"status": row["Status"]}), ("Zone", row["ZoneId"]),
                ("Instance Type", row["InstanceType"]), ("Specifications", row["Spec"]),
                ("Image", row["ImageId"]), ("Operating System", row["OSName"]),
                ("Description", row["Description"]), ("Created", row["CreationTime"])]),
            Section("Network", fields=[
                ("VPC", {"href": f"/console/vpc/vpcs/{row['VpcId']}", "text": row["VpcId"]}),
                ("vSwitch", {"href": f"/console/vpc/vswitches/{row['VSwitchId']}",
                             "text": row["VSwitchId"]}),
                ("Private IP Address", row["PrivateIp"]), ("Public IP Address", row["PublicIp"]),
                *[("Security Group", {"href": f"{GROUPS}/{sg}", "text": sg})
                  for sg in row["SecurityGroupIds"]]]),
        ]
        return page.render("detail.html", product=NAV, active=INSTANCES, title=row["InstanceId"],
                           status=row["Status"], list_href=INSTANCES, list_label="Instances",
                           page_actions=_instance_buttons(row, False), sections=sections,
                           tab="", live=row["Status"] in ("Pending", "Starting", "Stopping"))

    @console.route("/ecs/instances/{instance_id}/rename", methods=("GET", "POST"),
                   name="ecs_instance_rename")
    def rename_instance(page: Page, instance_id: str) -> Response:
        inst = _get_instance(page, instance_id)
        iid = inst["InstanceId"]
        spec = FormSpec(f"Rename {iid}", [Step("Instance Name", (
            Field("InstanceName", "Instance Name", required=True, help=NAME_HELP),))],
            submit="Save", cancel=f"{INSTANCES}/{iid}")
        return console.form(
            page, spec, product=NAV, active=INSTANCES, product_name="Ecs",
            action="ModifyInstanceAttribute", fixed={"RegionId": page.region, "InstanceId": iid},
            initial={"InstanceName": inst["InstanceName"]},
            done=lambda _r, v: (f"{INSTANCES}/{iid}", f"Instance {iid} renamed to "
                                                     f"{v['InstanceName']}."))

    @console.route("/ecs/instances/{instance_id}/{op}", methods=("POST",), name="ecs_instance_op")
    def instance_op(page: Page, instance_id: str, op: str) -> Response:
        if op not in INSTANCE_OPS:
            raise CloudError("InvalidAction.NotFound", f"Unknown instance operation {op[:32]!r}; "
                             f"allowed: {', '.join(INSTANCE_OPS)}.", 404)
        action, _, done, _ = INSTANCE_OPS[op]
        back = INSTANCES if op == "delete" else page.back(INSTANCES)
        return console.act(page, "Ecs", action, {"RegionId": page.region,
                                                 "InstanceId": instance_id[:64]},
                           back=back, ok=f"Instance {instance_id[:64]} {done}.",
                           confirm_id=instance_id[:64] if op == "delete" else "")

    # ---- security groups ------------------------------------------------------------------
    @console.route("/ecs/security-groups", name="ecs_groups")
    def groups(page: Page) -> Response:
        rows = PagedSource("Ecs", "DescribeSecurityGroups", "SecurityGroups.SecurityGroup",
                           _group_row, (("RegionId", page.region),))
        return console.list_page(
            page, product=NAV, active=GROUPS, title="Security Groups", rows=rows,
            columns=[Column("SecurityGroupId", "Security Group ID/Name", "link",
                            sub="SecurityGroupName"),
                     Column("VpcId", "VPC", "mono"), Column("Type", "Type"),
                     Column("RuleCount", "Rules"), Column("EcsCount", "Instances"),
                     Column("Description", "Description"), Column("CreationTime", "Created")],
            actions=lambda r: [
                Button("Manage Rules", href=r["_href"]),
                Button("Delete", post=f"{GROUPS}/{r['SecurityGroupId']}/delete", danger=True,
                       confirm=f"Delete security group {r['SecurityGroupId']}? Its rules are "
                               "deleted with it.", confirm_id=r["SecurityGroupId"])],
            toolbar=[Button("Create Security Group", href=f"{GROUPS}/create", primary=True)],
            search=(("SecurityGroupName", "Security group name"),
                    ("SecurityGroupId", "Security group ID"), ("VpcId", "VPC ID")))

    @console.route("/ecs/security-groups/create", methods=("GET", "POST"), name="ecs_group_create")
    def create_group(page: Page) -> Response:
        vpcs = _vpc_options(page)
        spec = FormSpec("Create Security Group", [Step("Basic Information", (
            Field("SecurityGroupName", "Security Group Name", help=NAME_HELP),
            Field("VpcId", "Network (VPC)", "select", options=vpcs,
                  placeholder="No VPC (classic network)",
                  help="Instances can join a security group of their own VPC only."),
            Field("SecurityGroupType", "Security Group Type", "radio", options=(
                Option("normal", "Basic Security Group",
                       hint="Instances in the group can reach each other."),
                Option("enterprise", "Advanced Security Group",
                       hint="Instances in the group are isolated from each other.")),
                default="normal"),
            Field("Description", "Description", "textarea",
                  help="At most 256 characters; cannot start with http:// or https://."),
        ))], submit="Create", cancel=GROUPS)
        return console.form(
            page, spec, product=NAV, active=GROUPS, product_name="Ecs",
            action="CreateSecurityGroup", fixed={"RegionId": page.region}, client_token=True,
            initial={"VpcId": vpcs[0].value if vpcs else ""},
            done=lambda r, _v: (f"{GROUPS}/{r['SecurityGroupId']}",
                                f"Security group {r['SecurityGroupId']} created."))

    @console.route("/ecs/security-groups/{sg_id}", name="ecs_group")
    def group(page: Page, sg_id: str) -> Response:
        sg = _get_group(page, sg_id)
        sid = sg["SecurityGroupId"]
        tab = "egress" if page.query.get("tab") == "egress" else "ingress"
        columns = [Column("Policy", "Policy"), Column("Priority", "Priority"),
                   Column("IpProtocol", "Protocol"), Column("PortRange", "Port Range", "mono"),
                   Column("Peer", "Authorization Object", "mono"),
                   Column("Description", "Description"), Column("CreateTime", "Created")]
        sections = [Section("Basic Information", fields=[
            ("Security Group ID", sid), ("Security Group Name", sg["SecurityGroupName"]),
            ("VPC", {"href": f"/console/vpc/vpcs/{sg['VpcId']}", "text": sg["VpcId"]}
             if sg["VpcId"] else ""),
            ("Intra-group Policy", sg["InnerAccessPolicy"]), ("Description", sg["Description"])])]
        for direction, title in (("ingress", "Inbound"), ("egress", "Outbound")):
            rules = [{**r, "Policy": "Allow" if r["Policy"].lower() == "accept" else "Deny",
                      "Peer": (r["SourceCidrIp"] or r["SourceGroupId"]) if direction == "ingress"
                      else (r["DestCidrIp"] or r["DestGroupId"])}
                     for r in sg["Permissions"]["Permission"] if r["Direction"] == direction]
            sections.append(Section(
                title, columns=columns, rows=rules, tab=direction, empty="No rules",
                actions=[Button("Add Rule", href=f"{GROUPS}/{sid}/rules/create?direction="
                                                 f"{direction}", primary=True)],
                row_actions=lambda r, d=direction: [Button(
                    "Delete", post=f"{GROUPS}/{sid}/rules/{r['SecurityGroupRuleId']}/delete",
                    params=(("direction", d),), danger=True,
                    confirm=f"Delete the {r['IpProtocol']} {r['PortRange']} rule for "
                            f"{r['Peer']}?")]))
        return page.render(
            "detail.html", product=NAV, active=GROUPS, title=sid, status="",
            list_href=GROUPS, list_label="Security Groups", sections=sections, tab=tab,
            live=False, page_actions=[Button("Delete", post=f"{GROUPS}/{sid}/delete", danger=True,
                                             confirm=f"Delete security group {sid}?",
                                             confirm_id=sid)])

    @console.route("/ecs/security-groups/{sg_id}/rules/create", methods=("GET", "POST"),
                   name="ecs_rule_create")
    def create_rule(page: Page, sg_id: str) -> Response:
        sg = _get_group(page, sg_id)
        sid = sg["SecurityGroupId"]
        egress = page.query.get("direction") == "egress"
        peer = "DestCidrIp" if egress else "SourceCidrIp"
        title = f"Add {'Outbound' if egress else 'Inbound'} Rule"
        spec = FormSpec(title, [Step("Rule", (
            Field("Policy", "Action", "radio", required=True, default="accept", options=(
                Option("accept", "Allow"), Option("drop", "Deny"))),
            Field("Priority", "Priority", "number", default="1",
                  help="1 to 100; a smaller number is a higher priority."),
            Field("IpProtocol", "Protocol", "select", required=True, default="TCP", options=(
                Option("TCP", "Custom TCP"), Option("UDP", "Custom UDP"),
                Option("ICMP", "All ICMP (IPv4)"), Option("GRE", "GRE"), Option("ALL", "All"))),
            Field("PortRange", "Port Range", placeholder="22/22",
                  help="start/end, like 22/22 or 8000/8080. ICMP, GRE and All use -1/-1."),
            Field(peer, "Authorization Object", required=True, placeholder="0.0.0.0/0",
                  help=f"The {'destination' if egress else 'source'} IPv4 address or CIDR block."),
            Field("Description", "Description", "textarea",
                  help="At most 256 characters; cannot start with http:// or https://."),
        ))], submit="Save", cancel=f"{GROUPS}/{sid}",
            intro=f"Security group {sid} ({sg['SecurityGroupName'] or 'no name'}).")
        return console.form(
            page, spec, product=NAV, active=GROUPS, product_name="Ecs",
            action="AuthorizeSecurityGroupEgress" if egress else "AuthorizeSecurityGroup",
            fixed={"RegionId": page.region, "SecurityGroupId": sid},
            done=lambda _r, _v: (f"{GROUPS}/{sid}?tab={'egress' if egress else 'ingress'}",
                                 "Rule added."))

    @console.route("/ecs/security-groups/{sg_id}/rules/{rule_id}/delete", methods=("POST",),
                   name="ecs_rule_delete")
    def delete_rule(page: Page, sg_id: str, rule_id: str) -> Response:
        egress = page.form.get("direction") == "egress"
        return console.act(
            page, "Ecs", "RevokeSecurityGroupEgress" if egress else "RevokeSecurityGroup",
            {"RegionId": page.region, "SecurityGroupId": sg_id[:64],
             "SecurityGroupRuleId.1": rule_id[:64]},
            back=f"{GROUPS}/{sg_id[:64]}?tab={'egress' if egress else 'ingress'}",
            ok="Rule deleted.")

    @console.route("/ecs/security-groups/{sg_id}/delete", methods=("POST",),
                   name="ecs_group_delete")
    def delete_group(page: Page, sg_id: str) -> Response:
        sid = sg_id[:64]
        return console.act(page, "Ecs", "DeleteSecurityGroup",
                           {"RegionId": page.region, "SecurityGroupId": sid},
                           back=GROUPS, ok=f"Security group {sid} deleted.", confirm_id=sid)
