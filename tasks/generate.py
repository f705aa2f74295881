"""Writes the task suite (``tasks/<product>/*.yaml``) from the families below.

``python tasks/generate.py`` rewrites the files; the YAML is what the system reads (this script
only saves typing the variants by hand). Every family is a documented console procedure with
its prerequisites (Resource META), its success rule over audit events and end state, and the
oracle script that solves it; variants change names, options and UI drift; every fourth task
is held out. Wrong-documentation tasks (:func:`wrongdoc`) describe a button, field or option
the console does not have, or a step it refuses; their oracle walks the documented steps to the
page that shows it, then reports the task infeasible.
"""
from __future__ import annotations

import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent
NET = [{"id": "net", "type": "vpc", "properties": {"name": "net-{episode}",
                                                   "cidr_block": "192.168.0.0/16"}}]
SW = [{"id": "sw", "type": "vswitch", "properties": {"vpc": "${net}", "zone": "cn-hangzhou-h",
                                                     "cidr_block": "192.168.1.0/24",
                                                     "name": "sw-{episode}"}}]
SG = [{"id": "sg", "type": "security_group", "properties": {"vpc": "${net}",
                                                            "name": "sg-{episode}"}}]


def instance(status: str) -> list[dict]:
    return NET + SW + SG + [{"id": "vm", "type": "instance", "properties": {
        "vswitch": "${sw}", "security_group": "${sg}", "name": "vm-{episode}",
        "status": status}}]


def ev(event: str, service: str, **where: str) -> dict:
    return {"event": event, "service": service, "where": where} if where else \
        {"event": event, "service": service}


def task(tid: str, product: str, title: str, steps: list[str], start: str, difficulty: int,
         *, params: dict | None = None, prereq: list | None = None, required: list | None = None,
         forbidden: list | None = None, end_state: list | None = None, family: str = "",
         args: dict | None = None, drift: str = "", expected: str = "success",
         reason: str = "", split: str = "") -> dict:
    doc = {"schema": 1, "id": tid, "product": product, "title": title,
           "procedure": "".join(f"{i}. {s}\n" for i, s in enumerate(steps, 1)),
           "start_page": start, "split": split, "difficulty": difficulty}
    if drift:
        doc["drift"] = drift
    if params:
        doc["parameters"] = params
    if prereq:
        doc["prerequisites"] = prereq
    doc["expected"] = expected
    if reason:
        doc["infeasible_reason"] = reason
    success = {}
    if required:
        success["required_events"] = required
    if forbidden:
        success["forbidden_events"] = forbidden
    if end_state:
        success["end_state"] = end_state
    doc["success"] = success
    if family:
        doc["oracle"] = {"family": family, "args": args or {}}
    return doc


def wrongdoc(tid: str, product: str, title: str, steps: list[str], start: str, difficulty: int,
             *, kind: str, oracle: dict, reason: str, split: str = "", **kw) -> dict:
    """A procedure that is wrong for this console (``expected: infeasible``). ``kind`` is the
    wrongness (``missing``: a button, tab or menu entry the console does not have; ``field``: a
    form field it does not have; ``option``: a choice its select or radio group does not offer;
    ``refused``: a step whose documented values the console rejects with an error). ``oracle``
    is the ``wrongdoc_<kind>`` family's args: ``steps`` the documented steps as far as the
    console allows (see datagen/oracle.py), then ``absent`` (names that must not be on
    the page reached), ``option`` or ``code`` (the error the console shows). ``reason`` names
    the missing thing exactly as the procedure writes it, or quotes the error code."""
    assert kind in ("missing", "field", "option", "refused"), kind
    return task(tid, product, title, steps, start, difficulty, expected="infeasible",
                reason=reason, family=f"wrongdoc_{kind}", args=oracle, split=split, **kw)


def ram_tasks() -> list[dict]:
    out = []
    for n, (display, drift) in enumerate([("Deploy Bot", ""), ("CI Runner", "rename"),
                                          ("Auditor", "wizard"), ("", ""), ("Ops", "all")]):
        params = {"user_name": f"user{n}-{{episode}}"}
        args = {"user_name": "{user_name}"}
        steps = ["Open the RAM console and choose Identities > Users.",
                 "Click Create User.", "Enter {user_name} as the logon name."]
        expect = {"User.UserName": "{user_name}"}
        if display:
            params["display_name"] = display
            args["display_name"] = "{display_name}"
            steps.append("Enter {display_name} as the display name.")
            expect["User.DisplayName"] = "{display_name}"
        steps.append("Click Create to create the user.")
        out.append(task(f"ram-create-user-{n}", "ram", "Create a RAM user", steps,
                        "/console/ram/users", 2, params=params, drift=drift,
                        required=[ev("CreateUser", "Ram", **{"requestParameters.UserName":
                                                            "{user_name}"})],
                        forbidden=[ev("DeleteUser", "Ram", **{"requestParameters.UserName": "{user_name}"})],
                        end_state=[{"service": "Ram", "action": "GetUser",
                                    "params": {"UserName": "{user_name}"}, "expect": expect}],
                        family="ram_create_user", args=args))
    user = [{"id": "dev", "type": "ram_user", "properties": {"name": "dev-{episode}"}}]
    for n, (policy, drift) in enumerate([("ReadOnlyAccess", ""), ("AliyunECSFullAccess", ""),
                                         ("AliyunOSSReadOnlyAccess", "rename"),
                                         ("AliyunVPCReadOnlyAccess", "more_menu"),
                                         ("AliyunRAMReadOnlyAccess", "wizard"),
                                         ("AdministratorAccess", "")]):
        out.append(task(f"ram-grant-policy-{n}", "ram", f"Grant {policy} to a RAM user",
                        ["Open the RAM console and choose Users.",
                         "Find user {dev} and click Add Permissions in its row.",
                         f"Select the system policy {policy}.", "Click OK."],
                        "/console/ram/users", 2, prereq=user, drift=drift,
                        required=[ev("AttachPolicyToUser", "Ram", **{
                            "requestParameters.UserName": "{dev}",
                            "requestParameters.PolicyName": policy})],
                        forbidden=[ev("DeleteUser", "Ram", **{"requestParameters.UserName": "{dev}"})],
                        end_state=[{"service": "Ram", "action": "ListPoliciesForUser",
                                    "params": {"UserName": "{dev}"},
                                    "expect": {"Policies.Policy.0.PolicyName": policy}}],
                        family="ram_grant_policy", args={"user_name": "{dev}",
                                                         "policy": policy}))
    # Two-step procedures: the second event must come after the first and name the resource
    # the first one made (ordering + a resource reference).
    for n, (policy, drift, split) in enumerate([("ReadOnlyAccess", "", "train"),
                                                ("AliyunOSSReadOnlyAccess", "rename",
                                                 "heldout")]):
        params = {"user_name": f"onb{n}-{{episode}}"}
        out.append(task(f"ram-onboard-user-{n}", "ram", f"Create a RAM user and grant {policy}",
                        ["Open the RAM console and choose Identities > Users.",
                         "Click Create User, enter {user_name} as the logon name and click Create.",
                         "On the new user's page click Add Permissions.",
                         f"Select the system policy {policy} and click OK."],
                        "/console/ram/users", 4, params=params, drift=drift, split=split,
                        required=[{"id": "user", **ev("CreateUser", "Ram", **{
                                      "requestParameters.UserName": "{user_name}"})},
                                  {"id": "grant", "after": ["user"], **ev(
                                      "AttachPolicyToUser", "Ram", **{
                                          "requestParameters.UserName":
                                              {"ref": "user.responseElements.User.UserName"},
                                          "requestParameters.PolicyName": {"in": [policy]},
                                          "requestParameters.PolicyType": "System"})}],
                        forbidden=[ev("DeleteUser", "Ram", **{
                            "requestParameters.UserName": "{user_name}"})],
                        family="ram_onboard_user",
                        args={"user_name": "{user_name}", "policy": policy}))
    granted = [{"id": "dev", "type": "ram_user", "properties": {
        "name": "dev-{episode}", "policies": ["ReadOnlyAccess"]}}]
    for n, drift in enumerate(["", "extra_confirm"]):
        out.append(task(f"ram-revoke-policy-{n}", "ram", "Remove a policy from a RAM user",
                        ["Open the RAM console and choose Users.",
                         "Click Manage for user {dev}.",
                         "In Permissions, click Remove next to ReadOnlyAccess and confirm."],
                        "/console/ram/users", 3, prereq=granted, drift=drift,
                        required=[ev("DetachPolicyFromUser", "Ram", **{
                            "requestParameters.UserName": "{dev}",
                            "requestParameters.PolicyName": "ReadOnlyAccess"})],
                        end_state=[{"service": "Ram", "action": "ListPoliciesForUser",
                                    "params": {"UserName": "{dev}"},
                                    "expect": {"Policies.Policy": "[]"}}],
                        family="ram_revoke_policy", args={"user_name": "{dev}",
                                                          "policy": "ReadOnlyAccess"}))
    for n, drift in enumerate(["", "extra_confirm", "more_menu"]):
        out.append(task(f"ram-delete-user-{n}", "ram", "Delete a RAM user",
                        ["Open the RAM console and choose Users.",
                         "Click Delete in the row of user {dev}.", "Confirm the deletion."],
                        "/console/ram/users", 2, prereq=user, drift=drift,
                        required=[ev("DeleteUser", "Ram", **{"requestParameters.UserName":
                                                            "{dev}"})],
                        end_state=[{"service": "Ram", "action": "GetUser",
                                    "params": {"UserName": "{dev}"},
                                    "expect_error": "EntityNotExist.User"}],
                        family="ram_delete_user", args={"user_name": "{dev}"}))
    out.append(wrongdoc(
        "ram-create-accesskey-wrongdoc", "ram", "Create an AccessKey for a RAM user",
        ["Open the RAM console and choose Users.", "Click user {dev}.",
         "On the Authentication tab, click Create AccessKey.", "Save the AccessKey secret."],
        "/console/ram/users", 3, prereq=user, kind="missing",
        oracle={"steps": "link:{dev}", "absent": "Authentication|Create AccessKey"},
        reason="The user's page has no Authentication tab and no Create AccessKey button; "
               "AccessKeys cannot be created in this console.",
        forbidden=[ev("DeleteUser", "Ram", **{"requestParameters.UserName": "{dev}"})]))
    # Later wrong-documentation families (explicit splits).
    out.append(wrongdoc(
        "ram-deactivate-user-wrongdoc", "ram", "Deactivate a RAM user",
        ["Open the RAM console and choose Users.",
         "Click Deactivate in the row of user {dev}.", "Confirm."],
        "/console/ram/users", 2, prereq=user, kind="missing", split="train",
        # The row's Delete is another thing (it removes the user): the doc's button is gone.
        oracle={"steps": "", "absent": "Deactivate"},
        reason="The Users list has no Deactivate action in the user's row; the console can "
               "only delete a user, which is not what the procedure does.",
        forbidden=[ev("DeleteUser", "Ram", **{"requestParameters.UserName": "{dev}"})]))
    out.append(wrongdoc(
        "ram-user-groups-wrongdoc", "ram", "Create a RAM user group",
        ["Open the RAM console and choose Identities > User Groups.",
         "Click Create User Group.", "Enter {group} as the group name and click OK."],
        "/console/ram/users", 2, params={"group": "ops-{episode}"}, kind="missing",
        split="heldout", oracle={"steps": "", "absent": "User Groups|Create User Group"},
        reason="The RAM console has no User Groups page and no Create User Group button; "
               "its navigation lists only users.",
        forbidden=[ev("CreateUser", "Ram", **{"requestParameters.UserName": "{group}"})]))
    out.append(wrongdoc(
        "ram-create-user-console-password-wrongdoc", "ram",
        "Create a RAM user with console access",
        ["Open the RAM console and choose Users.", "Click Create User.",
         "Enter {user_name} as the logon name.",
         "Select Console Access and enter a password in the Console Password field.",
         "Click Create."],
        "/console/ram/users", 3, params={"user_name": "web-{episode}"}, kind="field",
        split="heldout",
        oracle={"steps": "press:Create User; field:Logon Name|{user_name}",
                "absent": "Console Access|Console Password"},
        reason="The Create User form has no Console Access option and no Console Password "
               "field; a user with console logon cannot be created as documented.",
        # A user without the documented console access is not what the procedure makes.
        forbidden=[ev("CreateUser", "Ram", **{"requestParameters.UserName": "{user_name}"})]))
    out.append(wrongdoc(
        "ram-grant-slb-policy-wrongdoc", "ram", "Grant AliyunSLBFullAccess to a RAM user",
        ["Open the RAM console and choose Users.",
         "Find user {dev} and click Add Permissions in its row.",
         "Select the system policy AliyunSLBFullAccess.", "Click OK."],
        "/console/ram/users", 2, prereq=user, drift="rename", kind="option", split="train",
        oracle={"steps": "row:{dev}|Add Permissions", "field": "System Policy",
                "option": "AliyunSLBFullAccess", "reveal": "radio|ReadOnlyAccess"},
        reason="The system policy AliyunSLBFullAccess is not offered: the policy list of the "
               "permissions form does not include it.",
        forbidden=[ev("DeleteUser", "Ram", **{"requestParameters.UserName": "{dev}"}),
                   ev("AttachPolicyToUser", "Ram", **{"requestParameters.UserName": "{dev}"})]))
    out.append(wrongdoc(
        "ram-delete-user-with-policy-wrongdoc", "ram", "Delete a RAM user",
        ["Open the RAM console and choose Users.",
         "Click Delete in the row of user {dev}.", "Confirm the deletion."],
        "/console/ram/users", 2, prereq=granted, kind="refused", split="train",
        oracle={"steps": "row:{dev}|Delete; confirm:{dev}",
                "code": "DeleteConflict.User.Policy"},
        reason="The console refuses the step with DeleteConflict.User.Policy: the user still "
               "has an attached policy, which the procedure never detaches.",
        forbidden=[ev("DetachPolicyFromUser", "Ram", **{"requestParameters.UserName": "{dev}"}),
                   ev("DeleteUser", "Ram", **{"requestParameters.UserName": "{dev}"})]))
    return out


def oss_tasks() -> list[dict]:
    out = []
    for n, (acl_label, acl, storage, drift) in enumerate([
            ("Private", "private", "Standard", ""), ("Public Read", "public-read", "IA", ""),
            ("Private", "private", "Archive", "wizard"), ("Public Read", "public-read",
                                                          "Standard", "rename"),
            ("Private", "private", "IA", ""), ("Public Read", "public-read", "Standard", "nav")]):
        params = {"bucket": f"bkt{n}-{{episode}}"}
        out.append(task(f"oss-create-bucket-{n}", "oss", "Create an OSS bucket",
                        ["Open the OSS console and choose Buckets.", "Click Create Bucket.",
                         "Enter {bucket} as the bucket name.",
                         f"Choose the {storage} storage class and the {acl_label} ACL.",
                         "Click OK."],
                        "/console/oss/buckets", 2, params=params, drift=drift,
                        required=[ev("PutBucket", "Oss", **{"requestParameters.BucketName":
                                                           "{bucket}"})],
                        end_state=[{"service": "Oss", "action": "GetBucketInfo",
                                    "params": {"BucketName": "{bucket}"},
                                    "expect": {"Bucket.Acl": acl,
                                               "Bucket.StorageClass": storage}}],
                        family="oss_create_bucket",
                        args={"bucket": "{bucket}", "acl": acl_label,
                              "storage_class": {"IA": "IA", "Archive": "Archive",
                                                "Standard": "Standard"}[storage]}))
    bucket = [{"id": "b", "type": "oss_bucket", "properties": {"name": "data-{episode}"}}]
    for n, (acl_label, acl, drift) in enumerate([("Public Read", "public-read", ""),
                                                 ("Public Read/Write", "public-read-write", ""),
                                                 ("Public Read", "public-read", "more_menu")]):
        out.append(task(f"oss-set-acl-{n}", "oss", f"Make a bucket {acl_label}",
                        ["Open the OSS console and choose Buckets.",
                         "Click Change ACL in the row of bucket {b}.",
                         f"Select {acl_label}.", "Click Save."],
                        "/console/oss/buckets", 2, prereq=bucket, drift=drift,
                        required=[ev("PutBucketAcl", "Oss", **{"requestParameters.BucketName":
                                                              "{b}", "requestParameters.Acl":
                                                              acl})],
                        forbidden=[ev("DeleteBucket", "Oss", **{"requestParameters.BucketName": "{b}"})],
                        end_state=[{"service": "Oss", "action": "GetBucketAcl",
                                    "params": {"BucketName": "{b}"}, "expect": {"Acl": acl}}],
                        family="oss_set_acl", args={"bucket": "{b}", "acl": acl_label}))
    for n, drift in enumerate(["", "extra_confirm", "rename"]):
        out.append(task(f"oss-delete-bucket-{n}", "oss", "Delete an empty OSS bucket",
                        ["Open the OSS console and choose Buckets.",
                         "Click Delete in the row of bucket {b}.", "Confirm."],
                        "/console/oss/buckets", 2, prereq=bucket, drift=drift,
                        required=[ev("DeleteBucket", "Oss", **{"requestParameters.BucketName":
                                                              "{b}"})],
                        end_state=[{"service": "Oss", "action": "GetBucketInfo",
                                    "params": {"BucketName": "{b}"},
                                    "expect_error": "NoSuchBucket"}],
                        family="oss_delete_bucket", args={"bucket": "{b}"}))
    out.append(wrongdoc(
        "oss-enable-versioning-wrongdoc", "oss", "Enable versioning on a bucket",
        ["Open the OSS console and click bucket {b}.",
         "Choose Redundancy for Versioning > Versioning.", "Click Enable and confirm."],
        "/console/oss/buckets", 3, prereq=bucket, kind="missing",
        oracle={"steps": "link:{b}", "absent": "Redundancy for Versioning|Versioning"},
        reason="The bucket's page has no Redundancy for Versioning menu and no Versioning "
               "settings in this console.",
        forbidden=[ev("DeleteBucket", "Oss", **{"requestParameters.BucketName": "{b}"})]))
    # Later wrong-documentation families (explicit splits).
    out.append(wrongdoc(
        "oss-create-bucket-zrs-wrongdoc", "oss", "Create a zone-redundant OSS bucket",
        ["Open the OSS console and choose Buckets.", "Click Create Bucket.",
         "Enter {bucket} as the bucket name.", "Select Zone-Redundant Storage.", "Click OK."],
        "/console/oss/buckets", 2, params={"bucket": "zrs-{episode}"}, kind="field",
        split="heldout",
        oracle={"steps": "press:Create Bucket; field:Bucket Name|{bucket}",
                "absent": "Zone-Redundant Storage"},
        reason="The Create Bucket form has no Zone-Redundant Storage option; its redundancy "
               "cannot be chosen in this console.",
        forbidden=[ev("PutBucket", "Oss", **{"requestParameters.BucketName": "{bucket}"})]))
    out.append(wrongdoc(
        "oss-set-acl-authenticated-read-wrongdoc", "oss", "Make a bucket Authenticated Read",
        ["Open the OSS console and choose Buckets.",
         "Click Change ACL in the row of bucket {b}.", "Select Authenticated Read.",
         "Click Save."],
        "/console/oss/buckets", 2, prereq=bucket, drift="rename", kind="option", split="train",
        oracle={"steps": "row:{b}|Change ACL", "field": "Bucket ACL",
                "option": "Authenticated Read"},
        reason="The bucket ACL form does not offer Authenticated Read; only private, public "
               "read and public read/write are listed.",
        forbidden=[ev("DeleteBucket", "Oss", **{"requestParameters.BucketName": "{b}"}),
                   ev("PutBucketAcl", "Oss", **{"requestParameters.BucketName": "{b}"})]))
    out.append(wrongdoc(
        "oss-create-bucket-invalid-name-wrongdoc", "oss", "Create a bucket for team backups",
        ["Open the OSS console and choose Buckets.", "Click Create Bucket.",
         "Enter {bucket} as the bucket name.", "Click OK."],
        "/console/oss/buckets", 2, params={"bucket": "Team_Backups-{episode}"},
        kind="refused", split="train",
        oracle={"steps": "press:Create Bucket; field:Bucket Name|{bucket}; submit:OK",
                "code": "InvalidBucketName"},
        reason="The console refuses the documented bucket name with InvalidBucketName: "
               "uppercase letters and underscores are not allowed in a bucket name.",
        forbidden=[ev("PutBucket", "Oss", **{"requestParameters.BucketName": {
            "contains": "{episode}"}})]))
    return out


def vpc_tasks() -> list[dict]:
    out = []
    for n, (cidr, drift) in enumerate([("192.168.0.0/16", ""), ("10.0.0.0/8", ""),
                                       ("172.16.0.0/12", "wizard"), ("10.20.0.0/16", "rename"),
                                       ("192.168.0.0/24", ""), ("10.30.0.0/16", "nav"),
                                       ("172.20.0.0/16", "")]):
        params = {"name": f"vpc{n}-{{episode}}"}
        out.append(task(f"vpc-create-vpc-{n}", "vpc", "Create a VPC in China (Hangzhou)",
                        ["Open the VPC console in the China (Hangzhou) region and choose VPCs.",
                         "Click Create VPC.",
                         "Enter {name} as the name and " + cidr + " as the IPv4 CIDR block.",
                         "Click Create."],
                        "/console/vpc/vpcs", 2, params=params, drift=drift,
                        required=[{"id": "vpc", **ev("CreateVpc", "Vpc", **{
                            "requestParameters.VpcName": "{name}",
                            "requestParameters.CidrBlock": cidr,
                            "acsRegion": "cn-hangzhou"})}],
                        forbidden=[ev("DeleteVpc", "Vpc", **{"requestParameters.VpcId": {
                            "ref": "vpc.responseElements.VpcId"}})],
                        family="vpc_create_vpc", args={"name": "{name}", "cidr": cidr}))
    for n, (zone, cidr, drift) in enumerate([("cn-hangzhou-h", "192.168.1.0/24", ""),
                                             ("cn-hangzhou-i", "192.168.8.0/21", ""),
                                             ("cn-hangzhou-j", "192.168.2.0/24", "more_menu"),
                                             ("cn-hangzhou-k", "192.168.3.0/24", "")]):
        params = {"name": f"vsw{n}-{{episode}}"}
        out.append(task(f"vpc-create-vswitch-{n}", "vpc", "Create a vSwitch in a VPC",
                        ["Open the VPC console and choose VPCs.",
                         "Click Create vSwitch in the row of VPC {net}.",
                         f"Enter {{name}} as the name, choose zone {zone}, enter {cidr}.",
                         "Click Create."],
                        "/console/vpc/vpcs", 3, params=params, prereq=NET, drift=drift,
                        required=[{"id": "vsw", **ev("CreateVSwitch", "Vpc", **{
                            "requestParameters.VpcId": "{net}",
                            "requestParameters.ZoneId": zone,
                            "requestParameters.CidrBlock": cidr})}],
                        forbidden=[ev("DeleteVpc", "Vpc", **{"requestParameters.VpcId": "{net}"}),
                                   ev("DeleteVSwitch", "Vpc", **{"requestParameters.VSwitchId": {
                                       "ref": "vsw.responseElements.VSwitchId"}})],
                        family="vpc_create_vswitch", args={"vpc": "{net}", "name": "{name}",
                                                           "zone": zone, "cidr": cidr}))
    for n, drift in enumerate(["", "extra_confirm", "rename"]):
        out.append(task(f"vpc-delete-vswitch-{n}", "vpc", "Delete a vSwitch",
                        ["Open the VPC console and choose vSwitches.",
                         "Click Delete in the row of vSwitch {sw}.", "Confirm."],
                        "/console/vpc/vswitches", 2, prereq=NET + SW, drift=drift,
                        required=[ev("DeleteVSwitch", "Vpc", **{"requestParameters.VSwitchId":
                                                               "{sw}"})],
                        forbidden=[ev("DeleteVpc", "Vpc", **{"requestParameters.VpcId": "{net}"})],
                        family="vpc_delete_vswitch", args={"vswitch": "{sw}"}))
    for n, drift in enumerate(["", "more_menu"]):
        out.append(task(f"vpc-delete-vpc-{n}", "vpc", "Delete an empty VPC",
                        ["Open the VPC console and choose VPCs.",
                         "Click Delete in the row of VPC {net}.", "Confirm."],
                        "/console/vpc/vpcs", 2, prereq=NET, drift=drift,
                        required=[ev("DeleteVpc", "Vpc", **{"requestParameters.VpcId":
                                                           "{net}"})],
                        family="vpc_delete_vpc", args={"vpc": "{net}"}))
    out.append(wrongdoc(
        "vpc-resize-vswitch-wrongdoc", "vpc", "Enlarge a vSwitch CIDR block",
        ["Open the VPC console and choose vSwitches.",
         "Click Edit next to the IPv4 CIDR block of vSwitch {sw}.",
         "Enter 192.168.0.0/20 and click OK."],
        "/console/vpc/vswitches", 3, prereq=NET + SW, kind="missing",
        oracle={"steps": "link:{sw}", "absent": "Edit"},
        reason="The vSwitch's page has no Edit button next to its CIDR block: a vSwitch's "
               "CIDR block cannot be changed in this console.",
        forbidden=[ev("DeleteVSwitch", "Vpc", **{"requestParameters.VSwitchId": "{sw}"})]))
    out.append(wrongdoc(
        "vpc-tag-vpc-wrongdoc", "vpc", "Add a tag to a VPC",
        ["Open the VPC console and choose VPCs.", "Click Edit Tags in the row of VPC {net}.",
         "Add the tag env=prod and click OK."],
        "/console/vpc/vpcs", 2, prereq=NET, kind="missing",
        oracle={"steps": "", "absent": "Edit Tags"},
        reason="The VPC list has no Edit Tags action in the VPC's row in this console.",
        forbidden=[ev("DeleteVpc", "Vpc", **{"requestParameters.VpcId": "{net}"})]))
    # Later wrong-documentation families (explicit splits).
    out.append(wrongdoc(
        "vpc-create-vswitch-outside-cidr-wrongdoc", "vpc", "Create a vSwitch in a VPC",
        ["Open the VPC console and choose VPCs.",
         "Click Create vSwitch in the row of VPC {net}.",
         "Choose zone cn-hangzhou-h and enter 10.0.1.0/24 as the IPv4 CIDR block.",
         "Click Create."],
        "/console/vpc/vpcs", 3, prereq=NET, kind="refused", split="heldout",
        oracle={"steps": "row:{net}|Create vSwitch; select:Zone|cn-hangzhou-h; "
                         "field:IPv4 CIDR Block|10.0.1.0/24; submit:Create",
                "code": "InvalidCidrBlock.Malformed"},
        reason="The console refuses 10.0.1.0/24 with InvalidCidrBlock.Malformed: a vSwitch's "
               "block must lie inside the VPC's 192.168.0.0/16.",
        forbidden=[ev("DeleteVpc", "Vpc", **{"requestParameters.VpcId": "{net}"}),
                   ev("CreateVSwitch", "Vpc", **{"requestParameters.VpcId": "{net}"})]))
    out.append(wrongdoc(
        "vpc-delete-vpc-with-vswitch-wrongdoc", "vpc", "Delete a VPC",
        ["Open the VPC console and choose VPCs.",
         "Click Delete in the row of VPC {net}.", "Confirm."],
        "/console/vpc/vpcs", 2, prereq=NET + SW, kind="refused", split="train",
        oracle={"steps": "row:{net}|Delete; confirm:{net}",
                "code": "DependencyViolation.VSwitch"},
        reason="The console refuses the step with DependencyViolation.VSwitch: the VPC still "
               "holds a vSwitch, which the procedure never removes.",
        forbidden=[ev("DeleteVSwitch", "Vpc", **{"requestParameters.VSwitchId": "{sw}"}),
                   ev("DeleteVpc", "Vpc", **{"requestParameters.VpcId": "{net}"})]))
    out.append(wrongdoc(
        "vpc-create-vswitch-zone-wrongdoc", "vpc", "Create a vSwitch in zone A",
        ["Open the VPC console and choose VPCs.",
         "Click Create vSwitch in the row of VPC {net}.",
         "Enter {name} as the name, choose zone cn-hangzhou-a, enter 192.168.5.0/24.",
         "Click Create."],
        "/console/vpc/vpcs", 3, params={"name": "vswa-{episode}"}, prereq=NET,
        drift="rename", kind="option", split="heldout",
        oracle={"steps": "row:{net}|Create vSwitch", "field": "Zone",
                "option": "cn-hangzhou-a"},
        reason="Zone cn-hangzhou-a is not offered: the vSwitch form's zone list does not "
               "include it.",
        forbidden=[ev("DeleteVpc", "Vpc", **{"requestParameters.VpcId": "{net}"}),
                   ev("CreateVSwitch", "Vpc", **{"requestParameters.VpcId": "{net}"})]))
    out.append(wrongdoc(
        "vpc-create-vpc-ipv6-wrongdoc", "vpc", "Create a dual-stack VPC",
        ["Open the VPC console and choose VPCs.", "Click Create VPC.",
         "Enter {name} as the name and 192.168.0.0/16 as the IPv4 CIDR block.",
         "Select Enable IPv6 and choose an IPv6 CIDR Block.", "Click Create."],
        "/console/vpc/vpcs", 3, params={"name": "dual-{episode}"}, kind="field",
        split="train",
        oracle={"steps": "press:Create VPC; field:VPC Name|{name}; "
                         "field:IPv4 CIDR Block|192.168.0.0/16",
                "absent": "Enable IPv6|IPv6 CIDR Block"},
        reason="The Create VPC form has no Enable IPv6 option and no IPv6 CIDR Block field; "
               "only an IPv4 block can be given.",
        forbidden=[ev("CreateVpc", "Vpc", **{"requestParameters.VpcName": "{name}"})]))
    return out


def ecs_tasks() -> list[dict]:
    out = []
    for n, (gtype, drift) in enumerate([("normal", ""), ("enterprise", ""), ("normal", "wizard"),
                                        ("normal", "rename")]):
        params = {"name": f"web{n}-{{episode}}"}
        out.append(task(f"ecs-create-sg-{n}", "ecs", "Create a security group in a VPC",
                        ["Open the ECS console and choose Network & Security > Security "
                         "Groups.", "Click Create Security Group.",
                         "Enter {name} as the name and choose VPC {net}."
                         + (" Choose Advanced Security Group." if gtype == "enterprise" else ""),
                         "Click Create."],
                        "/console/ecs/security-groups", 2, params=params, prereq=NET,
                        drift=drift,
                        required=[{"id": "sg", **ev("CreateSecurityGroup", "Ecs", **{
                            "requestParameters.SecurityGroupName": "{name}",
                            "requestParameters.VpcId": "{net}"})}],
                        forbidden=[ev("DeleteSecurityGroup", "Ecs", **{
                            "requestParameters.SecurityGroupId": {
                                "ref": "sg.responseElements.SecurityGroupId"}})],
                        family="ecs_create_sg", args={"name": "{name}", "vpc": "{net}",
                                                      "group_type": gtype}))
    for n, (port, drift, split) in enumerate([("22/22", "", "train"),
                                              ("8080/8080", "more_menu", "heldout")]):
        params = {"name": f"app{n}-{{episode}}"}
        def group() -> dict:
            return {"ref": "sg.responseElements.SecurityGroupId"}
        out.append(task(f"ecs-sg-with-rule-{n}", "ecs",
                        f"Create a security group that allows TCP {port}",
                        ["Open the ECS console and choose Network & Security > Security "
                         "Groups.", "Click Create Security Group.",
                         "Enter {name} as the name, choose VPC {net} and click Create.",
                         "On the new group's Inbound tab click Add Rule.",
                         f"Choose Allow, protocol Custom TCP, port range {port}, authorization "
                         "object 10.0.0.0/8, and click Save."],
                        "/console/ecs/security-groups", 4, params=params, prereq=NET,
                        drift=drift, split=split,
                        required=[{"id": "sg", **ev("CreateSecurityGroup", "Ecs", **{
                                      "requestParameters.SecurityGroupName": "{name}",
                                      "requestParameters.VpcId": "{net}",
                                      "responseElements.SecurityGroupId": {"prefix": "sg-"}})},
                                  {"after": ["sg"], **ev("AuthorizeSecurityGroup", "Ecs", **{
                                      "requestParameters.SecurityGroupId": group(),
                                      "requestParameters.IpProtocol": {"regex": "(?i)tcp"},
                                      "requestParameters.PortRange": port,
                                      "requestParameters.SourceCidrIp": "10.0.0.0/8"})}],
                        forbidden=[ev("DeleteSecurityGroup", "Ecs", **{
                            "requestParameters.SecurityGroupId": group()})],
                        family="ecs_create_sg_with_rule",
                        args={"name": "{name}", "vpc": "{net}", "protocol_label": "Custom TCP",
                              "port": port, "cidr": "10.0.0.0/8", "direction": "ingress"}))
    rules = [("ingress", "Custom TCP", "TCP", "22/22", "10.0.0.0/8", "accept", ""),
             ("ingress", "Custom TCP", "TCP", "443/443", "0.0.0.0/0", "accept", ""),
             ("ingress", "Custom UDP", "UDP", "53/53", "192.168.0.0/16", "accept", "rename"),
             ("egress", "Custom TCP", "TCP", "3306/3306", "10.1.0.0/16", "accept", ""),
             ("ingress", "Custom TCP", "TCP", "3389/3389", "0.0.0.0/0", "drop", "more_menu"),
             ("ingress", "All ICMP (IPv4)", "ICMP", "", "0.0.0.0/0", "accept", ""),
             ("ingress", "Custom TCP", "TCP", "8000/8080", "172.16.0.0/12", "accept", "wizard"),
             ("egress", "Custom UDP", "UDP", "123/123", "0.0.0.0/0", "accept", "")]
    for n, (direction, label, proto, port, cidr, policy, drift) in enumerate(rules):
        action = "AuthorizeSecurityGroupEgress" if direction == "egress" else \
            "AuthorizeSecurityGroup"
        where = {"requestParameters.SecurityGroupId": "{sg}",
                 "requestParameters.IpProtocol": proto}
        if port:
            where["requestParameters.PortRange"] = port
        what = f"{proto} {port or 'traffic'} from {cidr}" if direction == "ingress" else \
            f"{proto} {port} to {cidr}"
        out.append(task(f"ecs-add-rule-{n}", "ecs",
                        f"{'Deny' if policy == 'drop' else 'Allow'} {what}",
                        ["Open the ECS console and choose Security Groups.",
                         "Click Manage Rules for security group {sg}.",
                         f"On the {'Outbound' if direction == 'egress' else 'Inbound'} tab "
                         "click Add Rule.",
                         f"Choose {'Deny' if policy == 'drop' else 'Allow'}, protocol {label}"
                         + (f", port range {port}" if port else "")
                         + f", authorization object {cidr}.", "Click Save."],
                        "/console/ecs/security-groups", 3, prereq=NET + SG, drift=drift,
                        required=[ev(action, "Ecs", **where)],
                        # Deleting the group, or revoking a rule of it (the console revokes
                        # by rule id), undoes the task: the group is the episode's own.
                        forbidden=[ev("DeleteSecurityGroup", "Ecs", **{
                                       "requestParameters.SecurityGroupId": "{sg}"}),
                                   ev(action.replace("Authorize", "Revoke"), "Ecs", **{
                                       "requestParameters.SecurityGroupId": "{sg}"})],
                        family="ecs_add_rule",
                        args={"sg": "{sg}", "direction": direction, "protocol_label": label,
                              "port": port, "cidr": cidr, "policy": policy}))
    with_rule = NET + SG + [{"id": "ssh", "type": "security_group_rule", "properties": {
        "security_group": "${sg}", "port_range": "22/22", "cidr": "0.0.0.0/0"}}]
    for n, drift in enumerate(["", "rename"]):
        out.append(task(f"ecs-delete-rule-{n}", "ecs", "Remove the SSH rule of a security group",
                        ["Open the ECS console and choose Security Groups.",
                         "Click Manage Rules for security group {sg}.",
                         "Click Delete in the row of the 22/22 rule and confirm."],
                        "/console/ecs/security-groups", 3, prereq=with_rule, drift=drift,
                        required=[ev("RevokeSecurityGroup", "Ecs", **{
                            "requestParameters.SecurityGroupId": "{sg}"})],
                        forbidden=[ev("DeleteSecurityGroup", "Ecs", **{"requestParameters.SecurityGroupId": "{sg}"})],
                        end_state=[{"service": "Ecs", "action": "DescribeSecurityGroupAttribute",
                                    "params": {"RegionId": "cn-hangzhou",
                                               "SecurityGroupId": "{sg}"},
                                    "expect": {"Permissions.Permission": "[]"}}],
                        family="ecs_delete_rule", args={"sg": "{sg}", "port": "22/22"}))
    for n, drift in enumerate(["", "extra_confirm", "more_menu"]):
        out.append(task(f"ecs-delete-sg-{n}", "ecs", "Delete a security group",
                        ["Open the ECS console and choose Security Groups.",
                         "Click Delete in the row of security group {sg}.", "Confirm."],
                        "/console/ecs/security-groups", 2, prereq=NET + SG, drift=drift,
                        required=[ev("DeleteSecurityGroup", "Ecs", **{
                            "requestParameters.SecurityGroupId": "{sg}"})],
                        family="ecs_delete_sg", args={"sg": "{sg}"}))
    ops = [("Stop", "StopInstance", "Running", "Stopped", ""),
           ("Stop", "StopInstance", "Running", "Stopped", "rename"),
           ("Start", "StartInstance", "Stopped", "Running", ""),
           ("Start", "StartInstance", "Stopped", "Running", "more_menu"),
           ("Restart", "RebootInstance", "Running", "Running", ""),
           ("Delete", "DeleteInstance", "Stopped", "", ""),
           ("Delete", "DeleteInstance", "Stopped", "", "extra_confirm")]
    for n, (op, action, before, after, drift) in enumerate(ops):
        end = [{"service": "Ecs", "action": "DescribeInstances",
                "params": {"RegionId": "cn-hangzhou", "InstanceIds": '["{vm}"]'},
                "expect": {"Instances.Instance.0.Status": after} if after
                else {"TotalCount": "0"}}]
        verb = {"Delete": "Release", "Restart": "Restart"}.get(op, op)
        out.append(task(f"ecs-instance-{op.lower()}-{n}", "ecs", f"{verb} an ECS instance",
                        ["Open the ECS console and choose Instances.",
                         f"Find instance {{vm}} and click {verb if op != 'Delete' else 'Release'}"
                         " in its row.", "Confirm if asked."],
                        "/console/ecs/instances", 2 if op != "Delete" else 3,
                        prereq=instance(before), drift=drift,
                        required=[ev(action, "Ecs", **{"requestParameters.InstanceId":
                                                       "{vm}"})],
                        forbidden=[ev("DeleteInstance", "Ecs", **{"requestParameters.InstanceId": "{vm}"})] if op != "Delete" else None,
                        end_state=end if op != "Restart" else None,
                        family="ecs_instance_op", args={"instance": "{vm}", "op": op}))
    for n, drift in enumerate(["", "rename", "more_menu"]):
        params = {"new_name": f"renamed{n}-{{episode}}"}
        out.append(task(f"ecs-rename-instance-{n}", "ecs", "Rename an ECS instance",
                        ["Open the ECS console and choose Instances.",
                         "Click Manage for instance {vm}.",
                         "Click Rename, enter {new_name} and click Save."],
                        "/console/ecs/instances", 3, params=params, prereq=instance("Running"),
                        drift=drift,
                        required=[ev("ModifyInstanceAttribute", "Ecs", **{
                            "requestParameters.InstanceId": "{vm}",
                            "requestParameters.InstanceName": "{new_name}"})],
                        forbidden=[ev("DeleteInstance", "Ecs", **{"requestParameters.InstanceId": "{vm}"})],
                        end_state=[{"service": "Ecs", "action": "DescribeInstances",
                                    "params": {"RegionId": "cn-hangzhou",
                                               "InstanceIds": '["{vm}"]'},
                                    "expect": {"Instances.Instance.0.InstanceName":
                                               "{new_name}"}}],
                        family="ecs_rename_instance",
                        args={"instance": "{vm}", "new_name": "{new_name}"}))
    for n, (itype, image, drift) in enumerate([
            ("ecs.g7.large", "Ubuntu 22.04 64-bit", ""),
            ("ecs.c7.large", "Alibaba Cloud Linux 3.2104 LTS 64-bit", ""),
            ("ecs.t6-c1m1.large", "Debian 12.6 64-bit", "rename")]):
        params = {"name": f"app{n}-{{episode}}"}
        out.append(task(f"ecs-create-instance-{n}", "ecs", "Create an ECS instance",
                        ["Open the ECS console and choose Instances.", "Click Create Instance.",
                         f"Choose instance type {itype} and the {image} image.",
                         "Choose VPC {net}, vSwitch {sw} and security group {sg}.",
                         "Enter {name} as the instance name and click Create Instance."],
                        "/console/ecs/instances", 5, params=params, prereq=NET + SW + SG,
                        drift=drift,
                        required=[ev("RunInstances", "Ecs", **{
                            "requestParameters.InstanceType": itype,
                            "requestParameters.VSwitchId": "{sw}",
                            "requestParameters.InstanceName": "{name}"})],
                        family="ecs_create_instance",
                        args={"instance_type": itype, "image": image, "vpc": "{net}",
                              "vswitch": "{sw}", "sg": "{sg}", "name": "{name}"}))
    out.append(wrongdoc(
        "ecs-instance-bandwidth-wrongdoc", "ecs", "Raise an instance's bandwidth",
        ["Open the ECS console and choose Instances.",
         "Click More > Network and Security Group > Modify Bandwidth for {vm}.",
         "Set the peak bandwidth to 100 Mbit/s and confirm."],
        "/console/ecs/instances", 3, prereq=instance("Running"), kind="missing",
        # No More menu in the row: the oracle also opens the instance's page.
        oracle={"steps": "row:{vm}|Manage",
                "absent": "Network and Security Group|Modify Bandwidth"},
        reason="The console has no Network and Security Group menu and no Modify Bandwidth "
               "action for instances, in the row or on the instance's page.",
        forbidden=[ev("DeleteInstance", "Ecs", **{"requestParameters.InstanceId": "{vm}"})]))
    out.append(wrongdoc(
        "ecs-sg-clone-wrongdoc", "ecs", "Clone a security group",
        ["Open the ECS console and choose Security Groups.",
         "Click Clone in the row of security group {sg}.", "Enter a name and click OK."],
        "/console/ecs/security-groups", 2, prereq=NET + SG, kind="missing",
        oracle={"steps": "", "absent": "Clone"},
        reason="The security group's row has no Clone action in this console.",
        forbidden=[ev("DeleteSecurityGroup", "Ecs", **{
            "requestParameters.SecurityGroupId": "{sg}"})]))
    # Later wrong-documentation families (explicit splits).
    out.append(wrongdoc(
        "ecs-instance-reset-password-wrongdoc", "ecs", "Reset an instance's password",
        ["Open the ECS console and choose Instances.", "Click Manage for instance {vm}.",
         "Click Reset Instance Password.", "Enter the new password twice and click OK."],
        "/console/ecs/instances", 3, prereq=instance("Running"), kind="missing",
        split="heldout", oracle={"steps": "row:{vm}|Manage", "absent": "Reset Instance Password"},
        reason="The instance's page has no Reset Instance Password button in this console.",
        forbidden=[ev("DeleteInstance", "Ecs", **{"requestParameters.InstanceId": "{vm}"})]))
    out.append(wrongdoc(
        "ecs-create-instance-type-wrongdoc", "ecs", "Create an ECS instance of type g8i",
        ["Open the ECS console and choose Instances.", "Click Create Instance.",
         "Choose instance type ecs.g8i.large and the Ubuntu 22.04 64-bit image.",
         "Choose VPC {net}, vSwitch {sw} and security group {sg}.",
         "Enter {name} as the instance name and click Create Instance."],
        "/console/ecs/instances", 4, params={"name": "g8i-{episode}"}, prereq=NET + SW + SG,
        kind="option", split="train",
        oracle={"steps": "press:Create Instance; reveal:radio|ecs.g7.large",
                "field": "Instance Type", "option": "ecs.g8i.large"},
        reason="Instance type ecs.g8i.large is not offered: the instance type list of the "
               "create form does not include it.",
        forbidden=[ev("RunInstances", "Ecs", **{"requestParameters.InstanceName": "{name}"})]))
    out.append(wrongdoc(
        "ecs-add-rule-ssh-wrongdoc", "ecs", "Allow SSH with the quick protocol",
        ["Open the ECS console and choose Security Groups.",
         "Click Manage Rules for security group {sg}.", "On the Inbound tab click Add Rule.",
         "Choose protocol SSH (22), authorization object 10.0.0.0/8.", "Click Save."],
        "/console/ecs/security-groups", 3, prereq=NET + SG, drift="rename", kind="option",
        split="train",
        oracle={"steps": "row:{sg}|Manage Rules; press:Add Rule", "field": "Protocol",
                "option": "SSH (22)"},
        reason="Protocol SSH (22) is not offered: the rule form's protocol list does not "
               "include it.",
        forbidden=[ev("DeleteSecurityGroup", "Ecs", **{
                       "requestParameters.SecurityGroupId": "{sg}"}),
                   ev("AuthorizeSecurityGroup", "Ecs", **{
                       "requestParameters.SecurityGroupId": "{sg}"})]))
    out.append(wrongdoc(
        "ecs-delete-sg-in-use-wrongdoc", "ecs", "Delete a security group",
        ["Open the ECS console and choose Security Groups.",
         "Click Delete in the row of security group {sg}.", "Confirm."],
        "/console/ecs/security-groups", 2, prereq=instance("Stopped"), kind="refused",
        split="heldout",
        oracle={"steps": "row:{sg}|Delete; confirm:{sg}", "code": "DependencyViolation"},
        reason="The console refuses the step with DependencyViolation: an instance is still "
               "in the security group, which the procedure never moves.",
        forbidden=[ev("DeleteInstance", "Ecs", **{"requestParameters.InstanceId": "{vm}"}),
                   ev("DeleteSecurityGroup", "Ecs", **{
                       "requestParameters.SecurityGroupId": "{sg}"})]))
    return out


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str):
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def build() -> dict[str, str]:
    """The suite's files: ``{"<product>/<id>.yaml": text}``."""
    tasks = ram_tasks() + oss_tasks() + vpc_tasks() + ecs_tasks()
    # Every fourth task of the original families is held out; later families name their split
    # (so adding tasks never moves an old one between splits).
    for i, doc in enumerate(sorted((d for d in tasks if not d["split"]), key=lambda d: d["id"])):
        doc["split"] = "heldout" if i % 4 == 3 else "train"
    return {f"{doc['product']}/{doc['id']}.yaml":
            "# Generated by tasks/generate.py; edit the family there, not this file.\n"
            + yaml.dump(doc, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100)
            for doc in tasks}


def main() -> int:
    files = build()
    for old in ROOT.glob("*/*.yaml"):
        old.unlink()
    for name, text in files.items():
        (ROOT / name).parent.mkdir(exist_ok=True)
        (ROOT / name).write_text(text)
    print(f"wrote {len(files)} tasks", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
