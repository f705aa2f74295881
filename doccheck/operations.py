"""What a drafted task needs to know about the cloud API beyond the inventory: which console
pages stand for which kind of resource (the Resource META type a procedure's "select the
security group" needs), which action undoes which (the forbidden contrary events), how an
operation's effect is read back through the SDK (the end-state checks), and how each
prerequisite type is declared with the resources it depends on.

The tables name real API actions of ECS, VPC, RAM and OSS; a unit test checks each against the
local cloud's action registry, so a table entry that the cloud does not have fails a test.
"""
from __future__ import annotations

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
