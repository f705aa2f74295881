"""Resources round-trip through the official SDK clients, in both signature modes."""
from __future__ import annotations

import uuid

import oss2
import pytest
from alibabacloud_ecs20140526 import models as ecs
from alibabacloud_ram20150501 import models as ram
from alibabacloud_vpc20160428 import models as vpcm

from consolerl.errors import CloudAPIError
from tests.conftest import wait_for

REGION = "cn-hangzhou"
IMAGE = "ubuntu_22_04_x64_20G_alibase_20240710.vhd"
SIGNATURES = ["v3", "v2"]


def _uid() -> str:
    return uuid.uuid4().hex[:8]


def make_network(c, cidr: str = "192.168.0.0/16") -> tuple[str, str]:
    vpc = c.call(c.vpc.create_vpc_with_options, vpcm.CreateVpcRequest(
        region_id=REGION, cidr_block=cidr, vpc_name=f"vpc-{_uid()}"))
    wait_for(lambda: c.call(c.vpc.describe_vpcs_with_options, vpcm.DescribeVpcsRequest(
        region_id=REGION, vpc_id=vpc.vpc_id)).vpcs.vpc[0].status == "Available")
    vsw = c.call(c.vpc.create_vswitch_with_options, vpcm.CreateVSwitchRequest(
        region_id=REGION, vpc_id=vpc.vpc_id, zone_id="cn-hangzhou-h",
        cidr_block=cidr.replace("0.0/16", "1.0/24"), v_switch_name=f"vsw-{_uid()}"))
    wait_for(lambda: c.call(c.vpc.describe_vswitches_with_options, vpcm.DescribeVSwitchesRequest(
        region_id=REGION, v_switch_id=vsw.v_switch_id)).v_switches.v_switch[0].status == "Available")
    return vpc.vpc_id, vsw.v_switch_id


def make_sg(c, vpc_id: str, name: str | None = None) -> str:
    return c.call(c.ecs.create_security_group_with_options, ecs.CreateSecurityGroupRequest(
        region_id=REGION, vpc_id=vpc_id, security_group_name=name or f"sg-{_uid()}",
        description="web tier")).security_group_id


def expect_error(code: str, fn, *args, status: int | None = None) -> CloudAPIError:
    with pytest.raises(CloudAPIError) as info:
        fn(*args)
    assert info.value.code == code, info.value
    if status is not None:
        assert info.value.status == status
    return info.value


@pytest.mark.parametrize("sig", SIGNATURES)
def test_vpc_and_vswitch_round_trip(make_client, sig):
    c = make_client(0, sig)
    vpc_id, vsw_id = make_network(c, "10.0.0.0/16" if sig == "v3" else "172.16.0.0/16")
    assert vpc_id.startswith("vpc-bp") and len(vpc_id) == len("vpc-") + 20
    assert vsw_id.startswith("vsw-") and vsw_id[4:].isalnum() and vsw_id[4:].islower()
    vpcs = c.call(c.vpc.describe_vpcs_with_options, vpcm.DescribeVpcsRequest(
        region_id=REGION, vpc_id=vpc_id))
    assert vpcs.total_count == 1
    assert vpcs.vpcs.vpc[0].v_switch_ids.v_switch_id == [vsw_id]
    # A VPC with a vSwitch cannot be deleted.
    err = expect_error("DependencyViolation.VSwitch", c.call, c.vpc.delete_vpc_with_options,
                       vpcm.DeleteVpcRequest(region_id=REGION, vpc_id=vpc_id))
    assert err.status == 400
    expect_error("InvalidCidrBlock.Overlapped", c.call, c.vpc.create_vswitch_with_options,
                 vpcm.CreateVSwitchRequest(region_id=REGION, vpc_id=vpc_id, zone_id="cn-hangzhou-i",
                                           cidr_block=vpcs.vpcs.vpc[0].cidr_block.replace(
                                               "0.0/16", "1.0/24")))
    c.call(c.vpc.delete_vswitch_with_options, vpcm.DeleteVSwitchRequest(v_switch_id=vsw_id))
    c.call(c.vpc.delete_vpc_with_options, vpcm.DeleteVpcRequest(vpc_id=vpc_id))
    expect_error("InvalidVpcId.NotFound", c.call, c.vpc.delete_vpc_with_options,
                 vpcm.DeleteVpcRequest(vpc_id=vpc_id), status=404)


@pytest.mark.parametrize("sig", SIGNATURES)
def test_security_group_rules_round_trip(make_client, sig):
    c = make_client(0, sig)
    vpc_id, _ = make_network(c)
    sg_id = make_sg(c, vpc_id, "web-sg")
    assert sg_id.startswith("sg-bp") and len(sg_id) == 23
    c.call(c.ecs.authorize_security_group_with_options, ecs.AuthorizeSecurityGroupRequest(
        region_id=REGION, security_group_id=sg_id, permissions=[
            ecs.AuthorizeSecurityGroupRequestPermissions(
                ip_protocol="tcp", port_range="22/22", source_cidr_ip="10.0.0.0/8", priority="10",
                policy="accept", description="ssh"),
            ecs.AuthorizeSecurityGroupRequestPermissions(
                ip_protocol="ICMP", port_range="-1/-1", source_cidr_ip="0.0.0.0/0")]))
    c.call(c.ecs.authorize_security_group_egress_with_options,
           ecs.AuthorizeSecurityGroupEgressRequest(
               region_id=REGION, security_group_id=sg_id, permissions=[
                   ecs.AuthorizeSecurityGroupEgressRequestPermissions(
                       ip_protocol="TCP", port_range="443/443", dest_cidr_ip="0.0.0.0/0")]))
    attr = c.call(c.ecs.describe_security_group_attribute_with_options,
                  ecs.DescribeSecurityGroupAttributeRequest(region_id=REGION,
                                                            security_group_id=sg_id))
    rules = attr.permissions.permission
    assert {(r.direction, r.ip_protocol, r.port_range) for r in rules} == {
        ("ingress", "TCP", "22/22"), ("ingress", "ICMP", "-1/-1"), ("egress", "TCP", "443/443")}
    ssh = next(r for r in rules if r.port_range == "22/22")
    assert ssh.priority == "10" and ssh.policy == "Accept" and ssh.source_cidr_ip == "10.0.0.0/8"
    assert ssh.security_group_rule_id.startswith("sgr-")
    expect_error("InvalidPermission.Duplicate", c.call, c.ecs.authorize_security_group_with_options,
                 ecs.AuthorizeSecurityGroupRequest(region_id=REGION, security_group_id=sg_id,
                                                   ip_protocol="TCP", port_range="22/22",
                                                   source_cidr_ip="10.0.0.0/8", priority="10"))
    expect_error("InvalidPortRange.Malformed", c.call, c.ecs.authorize_security_group_with_options,
                 ecs.AuthorizeSecurityGroupRequest(region_id=REGION, security_group_id=sg_id,
                                                   ip_protocol="TCP", port_range="0/70000",
                                                   source_cidr_ip="10.0.0.0/8"))
    c.call(c.ecs.revoke_security_group_with_options, ecs.RevokeSecurityGroupRequest(
        region_id=REGION, security_group_id=sg_id, security_group_rule_id=[ssh.security_group_rule_id]))
    listed = c.call(c.ecs.describe_security_groups_with_options, ecs.DescribeSecurityGroupsRequest(
        region_id=REGION, vpc_id=vpc_id))
    assert listed.total_count == 1
    group = listed.security_groups.security_group[0]
    assert (group.security_group_id, group.security_group_name, group.rule_count) == (sg_id, "web-sg", 2)
    c.call(c.ecs.delete_security_group_with_options, ecs.DeleteSecurityGroupRequest(
        region_id=REGION, security_group_id=sg_id))
    expect_error("InvalidSecurityGroupId.NotFound", c.call,
                 c.ecs.delete_security_group_with_options,
                 ecs.DeleteSecurityGroupRequest(region_id=REGION, security_group_id=sg_id), status=404)


def _status(c, instance_id: str) -> str:
    out = c.call(c.ecs.describe_instances_with_options, ecs.DescribeInstancesRequest(
        region_id=REGION, instance_ids=f'["{instance_id}"]'))
    return out.instances.instance[0].status


@pytest.mark.parametrize("sig", SIGNATURES)
def test_instance_lifecycle(make_client, sig):
    c = make_client(1, sig)
    vpc_id, vsw_id = make_network(c)
    sg_id = make_sg(c, vpc_id)
    run = c.call(c.ecs.run_instances_with_options, ecs.RunInstancesRequest(
        region_id=REGION, image_id=IMAGE, instance_type="ecs.g7.large", v_switch_id=vsw_id,
        security_group_id=sg_id, instance_name="web", amount=2, unique_suffix=True,
        password="Str0ng!Pass", tag=[ecs.RunInstancesRequestTag(key="team", value="docs")]))
    ids = run.instance_id_sets.instance_id_set
    assert len(ids) == 2 and all(i.startswith("i-bp") and len(i) == 22 for i in ids)
    assert _status(c, ids[0]) == "Pending"
    wait_for(lambda: _status(c, ids[0]) == "Running")
    listed = c.call(c.ecs.describe_instances_with_options, ecs.DescribeInstancesRequest(
        region_id=REGION, v_switch_id=vsw_id, page_size=1, page_number=2))
    assert listed.total_count == 2 and listed.page_size == 1 and listed.page_number == 2
    assert len(listed.instances.instance) == 1
    inst = c.call(c.ecs.describe_instances_with_options, ecs.DescribeInstancesRequest(
        region_id=REGION, instance_ids=f'["{ids[0]}"]')).instances.instance[0]
    assert inst.instance_name == "web001" and inst.vpc_attributes.vpc_id == vpc_id
    assert inst.security_group_ids.security_group_id == [sg_id]
    assert [(t.tag_key, t.tag_value) for t in inst.tags.tag] == [("team", "docs")]
    # A running instance cannot be deleted without Force, nor started again.
    expect_error("IncorrectInstanceStatus", c.call, c.ecs.delete_instance_with_options,
                 ecs.DeleteInstanceRequest(instance_id=ids[0]), status=403)
    expect_error("IncorrectInstanceStatus", c.call, c.ecs.start_instance_with_options,
                 ecs.StartInstanceRequest(instance_id=ids[0]))
    # The security group is in use.
    expect_error("DependencyViolation", c.call, c.ecs.delete_security_group_with_options,
                 ecs.DeleteSecurityGroupRequest(region_id=REGION, security_group_id=sg_id))
    c.call(c.ecs.stop_instance_with_options, ecs.StopInstanceRequest(instance_id=ids[0]))
    assert _status(c, ids[0]) == "Stopping"
    wait_for(lambda: _status(c, ids[0]) == "Stopped")
    c.call(c.ecs.start_instance_with_options, ecs.StartInstanceRequest(instance_id=ids[0]))
    assert _status(c, ids[0]) == "Starting"
    wait_for(lambda: _status(c, ids[0]) == "Running")
    c.call(c.ecs.reboot_instance_with_options, ecs.RebootInstanceRequest(instance_id=ids[0]))
    wait_for(lambda: _status(c, ids[0]) == "Running")
    c.call(c.ecs.modify_instance_attribute_with_options, ecs.ModifyInstanceAttributeRequest(
        instance_id=ids[0], instance_name="api-server", description="renamed"))
    c.call(c.ecs.tag_resources_with_options, ecs.TagResourcesRequest(
        region_id=REGION, resource_type="instance", resource_id=[ids[0]],
        tag=[ecs.TagResourcesRequestTag(key="env", value="test")]))
    inst = c.call(c.ecs.describe_instances_with_options, ecs.DescribeInstancesRequest(
        region_id=REGION, instance_name="api-*")).instances.instance
    assert [i.instance_id for i in inst] == [ids[0]]
    assert {(t.tag_key, t.tag_value) for t in inst[0].tags.tag} == {("team", "docs"), ("env", "test")}
    c.call(c.ecs.delete_instance_with_options, ecs.DeleteInstanceRequest(instance_id=ids[0], force=True))
    c.call(c.ecs.stop_instance_with_options, ecs.StopInstanceRequest(instance_id=ids[1]))
    wait_for(lambda: _status(c, ids[1]) == "Stopped")
    c.call(c.ecs.delete_instance_with_options, ecs.DeleteInstanceRequest(instance_id=ids[1]))
    expect_error("InvalidInstanceId.NotFound", c.call, c.ecs.start_instance_with_options,
                 ecs.StartInstanceRequest(instance_id=ids[1]), status=404)
    c.call(c.ecs.delete_security_group_with_options, ecs.DeleteSecurityGroupRequest(
        region_id=REGION, security_group_id=sg_id))


def test_create_instance_is_stopped_and_validates(make_client):
    c = make_client(1)
    vpc_id, vsw_id = make_network(c)
    sg_id = make_sg(c, vpc_id)
    other_vpc, _ = make_network(c, "10.0.0.0/16")
    foreign_sg = make_sg(c, other_vpc)
    req = dict(region_id=REGION, image_id=IMAGE, instance_type="ecs.c7.large", v_switch_id=vsw_id)
    expect_error("InvalidSecurityGroupId.NotVpc", c.call, c.ecs.create_instance_with_options,
                 ecs.CreateInstanceRequest(**req, security_group_id=foreign_sg))
    expect_error("InvalidInstanceType.ValueNotSupported", c.call, c.ecs.create_instance_with_options,
                 ecs.CreateInstanceRequest(**{**req, "instance_type": "ecs.nope"}, security_group_id=sg_id))
    expect_error("InvalidImageId.NotFound", c.call, c.ecs.create_instance_with_options,
                 ecs.CreateInstanceRequest(**{**req, "image_id": "windows_95"}, security_group_id=sg_id))
    expect_error("InvalidPassword.Malformed", c.call, c.ecs.create_instance_with_options,
                 ecs.CreateInstanceRequest(**req, security_group_id=sg_id, password="short"))
    expect_error("DryRunOperation", c.call, c.ecs.create_instance_with_options,
                 ecs.CreateInstanceRequest(**req, security_group_id=sg_id, dry_run=True))
    created = c.call(c.ecs.create_instance_with_options, ecs.CreateInstanceRequest(
        **req, security_group_id=sg_id, client_token="tok-1"))
    again = c.call(c.ecs.create_instance_with_options, ecs.CreateInstanceRequest(
        **req, security_group_id=sg_id, client_token="tok-1"))
    assert again.instance_id == created.instance_id  # ClientToken makes it idempotent
    wait_for(lambda: _status(c, created.instance_id) == "Stopped")
    c.call(c.ecs.delete_instance_with_options, ecs.DeleteInstanceRequest(instance_id=created.instance_id))


@pytest.mark.parametrize("sig", SIGNATURES)
def test_ram_user_round_trip(make_client, sig):
    c = make_client(2, sig)
    name = f"dev-{_uid()}"
    user = c.call(c.ram.create_user_with_options, ram.CreateUserRequest(
        user_name=name, display_name="Dev User", email="dev@example.com")).user
    assert user.user_name == name and user.display_name == "Dev User" and len(user.user_id) == 16
    expect_error("EntityAlreadyExists.User", c.call, c.ram.create_user_with_options,
                 ram.CreateUserRequest(user_name=name), status=409)
    expect_error("InvalidParameter.UserName.InvalidChars", c.call, c.ram.create_user_with_options,
                 ram.CreateUserRequest(user_name="bad name!"))
    got = c.call(c.ram.get_user_with_options, ram.GetUserRequest(user_name=name)).user
    assert got.email == "dev@example.com"
    updated = c.call(c.ram.update_user_with_options, ram.UpdateUserRequest(
        user_name=name, new_user_name=name + "-x", new_comments="moved")).user
    assert updated.user_name == name + "-x" and updated.comments == "moved"
    expect_error("EntityNotExist.User", c.call, c.ram.get_user_with_options,
                 ram.GetUserRequest(user_name=name), status=404)
    name += "-x"
    c.call(c.ram.attach_policy_to_user_with_options, ram.AttachPolicyToUserRequest(
        policy_type="System", policy_name="ReadOnlyAccess", user_name=name))
    expect_error("EntityNotExist.Policy", c.call, c.ram.attach_policy_to_user_with_options,
                 ram.AttachPolicyToUserRequest(policy_type="System", policy_name="NoSuchPolicy",
                                               user_name=name), status=404)
    policies = c.call(c.ram.list_policies_for_user_with_options,
                      ram.ListPoliciesForUserRequest(user_name=name)).policies.policy
    assert [(p.policy_name, p.policy_type) for p in policies] == [("ReadOnlyAccess", "System")]
    expect_error("DeleteConflict.User.Policy", c.call, c.ram.delete_user_with_options,
                 ram.DeleteUserRequest(user_name=name))
    c.call(c.ram.detach_policy_from_user_with_options, ram.DetachPolicyFromUserRequest(
        policy_type="System", policy_name="ReadOnlyAccess", user_name=name))
    c.call(c.ram.delete_user_with_options, ram.DeleteUserRequest(user_name=name))


def test_ram_list_users_pages_with_marker(make_client):
    c = make_client(3)
    names = sorted(f"page-{i:02d}-{_uid()}" for i in range(5))
    for n in names:
        c.call(c.ram.create_user_with_options, ram.CreateUserRequest(user_name=n))
    seen, marker = [], None
    while True:
        out = c.call(c.ram.list_users_with_options, ram.ListUsersRequest(max_items=2, marker=marker))
        seen += [u.user_name for u in out.users.user]
        if not out.is_truncated:
            break
        marker = out.marker
    assert [n for n in seen if n.startswith("page-")] == names
    for n in names:
        c.call(c.ram.delete_user_with_options, ram.DeleteUserRequest(user_name=n))


def test_oss_buckets_round_trip(make_client):
    alice, bob = make_client(0), make_client(1)
    name = f"docs-{_uid()}"
    bucket = alice.oss_bucket(name)
    bucket.create_bucket(oss2.BUCKET_ACL_PRIVATE)
    assert bucket.get_bucket_acl().acl == "private"
    bucket.put_bucket_acl(oss2.BUCKET_ACL_PUBLIC_READ)
    info = bucket.get_bucket_info()
    assert (info.name, info.acl.grant, info.storage_class) == (name, "public-read", "Standard")
    assert name in [b.name for b in alice.oss_service().list_buckets().buckets]
    assert name not in [b.name for b in bob.oss_service().list_buckets().buckets]
    with pytest.raises(oss2.exceptions.ServerError) as info_:
        bob.oss_bucket(name).create_bucket()
    assert (info_.value.status, info_.value.code) == (409, "BucketAlreadyExists")
    with pytest.raises(oss2.exceptions.ServerError) as info_:
        bob.oss_bucket(name).delete_bucket()
    assert (info_.value.status, info_.value.code) == (403, "AccessDenied")
    bucket.delete_bucket()
    with pytest.raises(oss2.exceptions.NoSuchBucket):
        bucket.get_bucket_info()


def test_account_isolation(make_client):
    alice, bob = make_client(0), make_client(1)
    vpc_id, _ = make_network(alice)
    sg_id = make_sg(alice, vpc_id)
    bob_groups = bob.call(bob.ecs.describe_security_groups_with_options,
                          ecs.DescribeSecurityGroupsRequest(region_id=REGION, page_size=50))
    assert sg_id not in [g.security_group_id for g in bob_groups.security_groups.security_group]
    bob_vpcs = bob.call(bob.vpc.describe_vpcs_with_options,
                        vpcm.DescribeVpcsRequest(region_id=REGION, page_size=50))
    assert vpc_id not in [v.vpc_id for v in bob_vpcs.vpcs.vpc]
    expect_error("InvalidSecurityGroupId.NotFound", bob.call, bob.ecs.delete_security_group_with_options,
                 ecs.DeleteSecurityGroupRequest(region_id=REGION, security_group_id=sg_id))
    expect_error("InvalidVpcId.NotFound", bob.call, bob.vpc.delete_vpc_with_options,
                 vpcm.DeleteVpcRequest(vpc_id=vpc_id))
    # Bob's failed attempts are in Bob's audit log, not Alice's.
    from alibabacloud_actiontrail20200706 import models as at
    attr = [at.LookupEventsRequestLookupAttribute(key="ResourceName", value=sg_id)]
    alice_events = alice.call(alice.actiontrail.lookup_events_with_options,
                              at.LookupEventsRequest(lookup_attribute=attr)).events
    bob_events = bob.call(bob.actiontrail.lookup_events_with_options,
                          at.LookupEventsRequest(lookup_attribute=attr)).events
    assert [e["eventName"] for e in alice_events] == ["CreateSecurityGroup"]
    assert [(e["eventName"], e["errorCode"]) for e in bob_events] == [
        ("DeleteSecurityGroup", "InvalidSecurityGroupId.NotFound")]
    assert all(e["userIdentity"]["accountId"] == "1000000000000002" for e in bob_events)


def test_region_is_optional_for_instance_actions_in_any_region(make_client):
    c = make_client(5)
    vpc = c.rpc("Vpc", "CreateVpc", {"RegionId": "cn-shanghai", "CidrBlock": "10.0.0.0/16"})
    wait_for(lambda: c.rpc("Vpc", "DescribeVpcs", {"RegionId": "cn-shanghai", "VpcId": vpc["VpcId"]})[
        "Vpcs"]["Vpc"][0]["Status"] == "Available")
    vsw = c.rpc("Vpc", "CreateVSwitch", {"RegionId": "cn-shanghai", "VpcId": vpc["VpcId"],
                                         "ZoneId": "cn-shanghai-e", "CidrBlock": "10.0.1.0/24"})
    sg = c.rpc("Ecs", "CreateSecurityGroup", {"RegionId": "cn-shanghai", "VpcId": vpc["VpcId"]})
    run = c.rpc("Ecs", "RunInstances", {"RegionId": "cn-shanghai", "ImageId": IMAGE,
                                        "InstanceType": "ecs.g7.large",
                                        "VSwitchId": vsw["VSwitchId"],
                                        "SecurityGroupId": sg["SecurityGroupId"]})
    instance_id = run["InstanceIdSets"]["InstanceIdSet"][0]
    assert instance_id.startswith("i-uf")   # Shanghai's id infix
    wait_for(lambda: _status_in(c, "cn-shanghai", instance_id) == "Running")
    c.rpc("Ecs", "StopInstance", {"InstanceId": instance_id})   # no RegionId
    assert _status_in(c, "cn-shanghai", instance_id) == "Stopping"
    # Not visible from another region.
    assert c.rpc("Ecs", "DescribeInstances", {"RegionId": "cn-hangzhou",
                                              "InstanceIds": f'["{instance_id}"]'})["TotalCount"] == 0
    from alibabacloud_actiontrail20200706 import models as at
    events = c.call(c.actiontrail.lookup_events_with_options, at.LookupEventsRequest(
        lookup_attribute=[at.LookupEventsRequestLookupAttribute(key="EventName", value="StopInstance")]
    )).events
    assert events[0]["acsRegion"] == "cn-shanghai"


def _status_in(c, region: str, instance_id: str) -> str:
    return c.rpc("Ecs", "DescribeInstances", {"RegionId": region, "InstanceIds": f'["{instance_id}"]'})[
        "Instances"]["Instance"][0]["Status"]


def test_describe_security_groups_counts_member_instances(make_client):
    c = make_client(7)
    vpc_id, vsw_id = make_network(c)
    used, empty = make_sg(c, vpc_id), make_sg(c, vpc_id)
    c.rpc("Ecs", "RunInstances", {"RegionId": REGION, "ImageId": IMAGE, "InstanceType": "ecs.g7.large",
                                  "VSwitchId": vsw_id, "SecurityGroupId": used, "Amount": "3"})
    groups = c.rpc("Ecs", "DescribeSecurityGroups", {"RegionId": REGION, "VpcId": vpc_id})
    counts = {g["SecurityGroupId"]: g["EcsCount"] for g in groups["SecurityGroups"]["SecurityGroup"]}
    assert counts == {used: 3, empty: 0}
