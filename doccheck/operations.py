"""What a drafted task needs to know about the cloud API beyond the inventory: which console
pages stand for which kind of resource (the Resource META type a procedure's "select the
security group" needs), which action undoes which (the forbidden contrary events), how an
operation's effect is read back through the SDK (the end-state checks), and how each
prerequisite type is declared with the resources it depends on.

The tables name real API actions of ECS, VPC, RAM and OSS; a unit test checks each against the
local cloud's action registry, so a table entry that the cloud does not have fails a test.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

# A console path collection -> (Resource META type, the API parameter that names one).
# ``/console/ecs/security-groups/{}/rules/create`` acts on the security group in ``{}``.
RESOURCE_PAGES: dict[str, tuple[str, str]] = {
    "/console/ecs/instances/{}": ("instance", "InstanceId"),
    "/console/ecs/security-groups/{}": ("security_group", "SecurityGroupId"),
    "/console/vpc/vpcs/{}": ("vpc", "VpcId"),
    "/console/vpc/vswitches/{}": ("vswitch", "VSwitchId"),
    "/console/ram/users/{}": ("ram_user", "UserName"),
    "/console/oss/buckets/{}": ("oss_bucket", "BucketName"),
}
# A form field whose options are resources of a type (the VPC select of a vSwitch form).
RESOURCE_FIELDS: dict[str, str] = {
    "VpcId": "vpc", "VSwitchId": "vswitch", "SecurityGroupId": "security_group",
    "InstanceId": "instance",
}
# An API parameter that names one resource of a type (the path's and the selects' together).
ID_PARAMS: dict[str, str] = {**RESOURCE_FIELDS, **{param: rtype for rtype, param in
                                                   RESOURCE_PAGES.values()}}
# How a resource type is spoken of in documentation and in a task's procedure text.
RESOURCE_WORDS: dict[str, tuple[str, ...]] = {
    "vpc": ("vpc",), "vswitch": ("vswitch", "v-switch", "subnet"),
    "security_group": ("security group",), "security_group_rule": ("security group rule",),
    "instance": ("instance",), "ram_user": ("ram user", "user"), "oss_bucket": ("bucket",),
}
RESOURCE_NOUN: dict[str, str] = {
    "vpc": "VPC", "vswitch": "vSwitch", "security_group": "security group",
    "security_group_rule": "security group rule", "instance": "instance",
    "ram_user": "RAM user", "oss_bucket": "bucket",
}

# The action that undoes an operation (or destroys what it acts on): a required event's
# contrary is forbidden. Keyed by Service:Action.
CONTRARY: dict[str, tuple[str, ...]] = {
    "Ram:CreateUser": ("DeleteUser",),
    "Ram:AttachPolicyToUser": ("DetachPolicyFromUser", "DeleteUser"),
    "Ram:DetachPolicyFromUser": ("AttachPolicyToUser", "DeleteUser"),
    "Ram:UpdateUser": ("DeleteUser",),
    "Vpc:CreateVpc": ("DeleteVpc",),
    "Vpc:CreateVSwitch": ("DeleteVSwitch",),
    "Ecs:CreateSecurityGroup": ("DeleteSecurityGroup",),
    "Ecs:AuthorizeSecurityGroup": ("RevokeSecurityGroup", "DeleteSecurityGroup"),
    "Ecs:AuthorizeSecurityGroupEgress": ("RevokeSecurityGroupEgress", "DeleteSecurityGroup"),
    "Ecs:RevokeSecurityGroup": ("AuthorizeSecurityGroup", "DeleteSecurityGroup"),
    "Ecs:RevokeSecurityGroupEgress": ("AuthorizeSecurityGroupEgress", "DeleteSecurityGroup"),
    "Ecs:RunInstances": ("DeleteInstance",),
    "Ecs:StartInstance": ("StopInstance", "DeleteInstance"),
    "Ecs:StopInstance": ("StartInstance", "DeleteInstance"),
    "Ecs:RebootInstance": ("StopInstance", "DeleteInstance"),
    "Ecs:ModifyInstanceAttribute": ("DeleteInstance",),
    "Oss:PutBucket": ("DeleteBucket",),
    "Oss:PutBucketAcl": ("DeleteBucket",),
}
# What a create operation's response calls the new resource (for references to it).
CREATED_ID: dict[str, str] = {
    "Vpc:CreateVpc": "VpcId", "Vpc:CreateVSwitch": "VSwitchId",
    "Ecs:CreateSecurityGroup": "SecurityGroupId",
}
# Operations that need their resource in a state (a prerequisite property).
NEEDS: dict[str, dict[str, object]] = {
    "Ecs:StartInstance": {"status": "Stopped"},
    "Ecs:DeleteInstance": {"status": "Stopped"},
    "Ecs:StopInstance": {"status": "Running"},
    "Ecs:RebootInstance": {"status": "Running"},
}


@dataclass(frozen=True)
class ReadBack:
    """An end-state check of an operation: ``action`` (a Describe/Get/List of ``service``)
    with ``params`` (its parameter -> the operation's parameter whose value it takes, or a
    literal ``=value``), and ``expect`` (a response path -> the operation's parameter, or
    ``=value``); or ``expect_error`` (the resource is gone). An expectation whose parameter
    the operation does not name is left out; a check whose params cannot all be filled is
    left out."""

    action: str
    params: tuple[tuple[str, str], ...]
    expect: tuple[tuple[str, str], ...] = ()
    expect_error: str = ""
    region: bool = False           # also send RegionId


def _rb(action: str, params: dict[str, str], expect: dict[str, str] | None = None,
        expect_error: str = "", region: bool = False) -> ReadBack:
    return ReadBack(action, tuple(params.items()), tuple((expect or {}).items()), expect_error,
                    region)


_INSTANCE = {"InstanceIds": "[\"{InstanceId}\"]"}
READBACK: dict[str, ReadBack] = {
    "Ram:CreateUser": _rb("GetUser", {"UserName": "UserName"},
                          {"User.UserName": "UserName", "User.DisplayName": "DisplayName"}),
    "Ram:DeleteUser": _rb("GetUser", {"UserName": "UserName"},
                          expect_error="EntityNotExist.User"),
    "Ram:AttachPolicyToUser": _rb("ListPoliciesForUser", {"UserName": "UserName"},
                                  {"Policies.Policy.0.PolicyName": "PolicyName"}),
    "Ram:DetachPolicyFromUser": _rb("ListPoliciesForUser", {"UserName": "UserName"},
                                    {"Policies.Policy": "=[]"}),
    "Oss:PutBucket": _rb("GetBucketInfo", {"BucketName": "BucketName"},
                         {"Bucket.Name": "BucketName", "Bucket.Acl": "Acl",
                          "Bucket.StorageClass": "StorageClass"}),
    "Oss:PutBucketAcl": _rb("GetBucketAcl", {"BucketName": "BucketName"}, {"Acl": "Acl"}),
    "Oss:DeleteBucket": _rb("GetBucketInfo", {"BucketName": "BucketName"},
                            expect_error="NoSuchBucket"),
    "Ecs:StartInstance": _rb("DescribeInstances", _INSTANCE,
                             {"Instances.Instance.0.Status": "=Running"}, region=True),
    "Ecs:StopInstance": _rb("DescribeInstances", _INSTANCE,
                            {"Instances.Instance.0.Status": "=Stopped"}, region=True),
    "Ecs:ModifyInstanceAttribute": _rb("DescribeInstances", _INSTANCE,
                                       {"Instances.Instance.0.InstanceName": "InstanceName"},
                                       region=True),
    "Ecs:DeleteInstance": _rb("DescribeInstances", _INSTANCE, {"TotalCount": "=0"},
                              region=True),
    "Ecs:DeleteSecurityGroup": _rb("DescribeSecurityGroupAttribute",
                                   {"SecurityGroupId": "SecurityGroupId"},
                                   expect_error="InvalidSecurityGroupId.NotFound", region=True),
    "Ecs:AuthorizeSecurityGroup": _rb(
        "DescribeSecurityGroupAttribute", {"SecurityGroupId": "SecurityGroupId"},
        {"Permissions.Permission.0.IpProtocol": "IpProtocol",
         "Permissions.Permission.0.PortRange": "PortRange",
         "Permissions.Permission.0.SourceCidrIp": "SourceCidrIp"}, region=True),
    "Vpc:DeleteVpc": _rb("DescribeVpcs", {"VpcId": "VpcId"}, {"TotalCount": "=0"}, region=True),
    "Vpc:DeleteVSwitch": _rb("DescribeVSwitches", {"VSwitchId": "VSwitchId"},
                             {"TotalCount": "=0"}, region=True),
}


# What an action acts on, where its name does not say it: the security group "rule" actions.
ACTS_ON: dict[str, str] = {
    "AuthorizeSecurityGroup": "security group rule", "AuthorizeSecurityGroupEgress":
    "security group rule", "RevokeSecurityGroup": "security group rule",
    "RevokeSecurityGroupEgress": "security group rule", "PutBucketAcl": "bucket acl",
    "AttachPolicyToUser": "policy user", "DetachPolicyFromUser": "policy user",
}
# Actions that take something away, and those that start or stop a resource (by verb).
REMOVING_VERBS = frozenset({"Delete", "Revoke", "Detach", "Release", "Remove", "Unassociate",
                            "Disassociate"})
LIFECYCLE_VERBS = frozenset({"Start", "Stop", "Reboot"})
# The resources documentation names as what a procedure acts on (the head of its title's
# object: "Delete a **vSwitch**", "Remove a system **policy** from ..."), as they appear in
# action names, lower case.
RESOURCE_HEADS = frozenset({"instance", "group", "rule", "vpc", "vswitch", "eip", "bucket",
                            "user", "policy", "acl", "route", "disk", "snapshot", "image"})


def action_verb(action: str) -> str:
    """The verb an API action's name starts with (``DeleteVSwitch`` -> ``Delete``)."""
    name = action.split(":", 1)[-1]
    m = re.match(r"[A-Z][a-z]+", name)
    return m.group(0) if m else ""


def acts_on(action: str) -> str:
    """What an API action acts on, lower case without spaces (``DeleteVSwitch`` ->
    ``vswitch``, ``RevokeSecurityGroup`` -> ``securitygrouprule``)."""
    name = action.split(":", 1)[-1]
    return ACTS_ON.get(name, name[len(action_verb(name)):]).replace(" ", "").lower()


_REMOVING_WORDS = frozenset({"delete", "remove", "release", "revoke", "detach", "unbind",
                             "disassociate", "unassign"})
_LIFECYCLE_WORDS = frozenset({"start", "stop", "restart", "reboot"})
_LIFECYCLE_ACTION = {"start": "Start", "stop": "Stop", "restart": "Reboot", "reboot": "Reboot"}
_OBJECT_END = frozenset({"from", "of", "on", "in", "for", "to", "with", "by", "that", "using",
                         "via", "at", "under", "and", "or", "as"})


def _title_object(title: str) -> tuple[str, str]:
    """The verb a procedure's title starts with and the head of its object, lower case
    ("Remove a system policy from a RAM user" -> ("remove", "policy")); the head is "" where
    the object is not a resource the console has ("Allow ping requests")."""
    words = [w.strip("`*\"'()[],.:").lower() for w in title.split()]
    words = [w for w in words if w]
    if words[:2] == ["how", "to"]:
        words = words[2:]
    if not words:
        return "", ""
    verb, obj = words[0], []
    for w in words[1:]:
        if w in _OBJECT_END:
            break
        obj.append(w)
    head = obj[-1] if obj else ""
    for singular in (head, head[:-1] if head.endswith("s") else "",
                     head[:-3] + "y" if head.endswith("ies") else ""):
        if singular in RESOURCE_HEADS:
            return verb, singular
    return verb, ""


def title_misfit(title: str, action: str) -> str:
    """Why the API ``action`` is not the operation a procedure titled ``title`` does ("" when
    nothing says it is not): a removal caused by a procedure that does not remove (or the
    reverse), a start or stop by one that does not start or stop, or an action on another
    resource than the one the title names ("Delete a vSwitch" is not ``DeleteVpc``). A title
    of two verbs ("Find a RAM user and delete it") fits an action either fits."""
    first, *more = re.split(r"\s+and\s+(?=[a-z]+\s+(?:it|them|the|a|an|its)\b)", title)
    why = _misfit(first, action)
    for part in more if why else ():
        verb, head = _title_object(part)
        if not head:        # "... and delete it": the first part's object
            part = f"{verb} {' '.join(first.split()[1:])}"
        if not _misfit(part, action):
            return ""
    return why


def _misfit(title: str, action: str) -> str:
    verb, head = _title_object(title)
    if not verb or not action:
        return ""
    doing = action_verb(action)
    if (verb in _REMOVING_WORDS) != (doing in REMOVING_VERBS):
        return (f"the title says {verb!r}, but {action} "
                + ("removes" if doing in REMOVING_VERBS else "does not remove"))
    if doing in LIFECYCLE_VERBS and verb not in _LIFECYCLE_WORDS:
        return f"the title says {verb!r}, but {action} starts or stops a resource"
    if doing in LIFECYCLE_VERBS and _LIFECYCLE_ACTION[verb] != doing:
        return f"the title says {verb!r}, but {action} does not"
    if head and head not in acts_on(action):
        return f"the title acts on a {head}, but {action} does not"
    return ""


@dataclass(frozen=True)
class Declaration:
    """How a prerequisite of one type is declared: its id in the task, its properties (names
    carry ``{episode}``) and the types it refers to (property -> type)."""

    id: str
    properties: dict[str, object] = field(default_factory=dict)
    refs: tuple[tuple[str, str], ...] = ()


DECLARATIONS: dict[str, Declaration] = {
    "vpc": Declaration("net", {"name": "net-{episode}", "cidr_block": "192.168.0.0/16"}),
    "vswitch": Declaration("sw", {"zone": "cn-hangzhou-h", "cidr_block": "192.168.1.0/24",
                                  "name": "sw-{episode}"}, (("vpc", "vpc"),)),
    "security_group": Declaration("sg", {"name": "sg-{episode}"}, (("vpc", "vpc"),)),
    "security_group_rule": Declaration("rule", {}, (("security_group", "security_group"),)),
    "instance": Declaration("vm", {"name": "vm-{episode}", "status": "Running"},
                            (("vswitch", "vswitch"), ("security_group", "security_group"))),
    "ram_user": Declaration("dev", {"name": "dev-{episode}"}),
    "oss_bucket": Declaration("b", {"name": "data-{episode}"}),
}
