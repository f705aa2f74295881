"""End to end in real headless Chromium: one create and one delete flow per product, done in
the console the way a user does them; then the official ActionTrail SDK must show exactly
those write events, as console operations, and the product SDKs the resulting state."""
from __future__ import annotations

import re

import oss2
import pytest
from playwright.sync_api import expect

from consolerl.errors import CloudAPIError
from tests.conftest import wait_for
from tests.integration.console_kit import audit_events, console_writes

REGION = "cn-hangzhou"


def _network(client, name: str) -> tuple[str, str]:
    """A VPC and vSwitch made through the API (prerequisites, audited as ApiCall)."""
    vpc = client.rpc("Vpc", "CreateVpc", {"RegionId": REGION, "VpcName": name,
                                          "CidrBlock": "192.168.0.0/16"})["VpcId"]
    wait_for(lambda: client.rpc("Vpc", "DescribeVpcs", {"RegionId": REGION, "VpcId": vpc}
                                )["Vpcs"]["Vpc"][0]["Status"] == "Available")
    vsw = client.rpc("Vpc", "CreateVSwitch", {"RegionId": REGION, "VpcId": vpc,
                                              "ZoneId": "cn-hangzhou-i", "VSwitchName": name,
                                              "CidrBlock": "192.168.3.0/24"})["VSwitchId"]
    return vpc, vsw


def test_vpc_create_and_delete_with_dependency_error_on_page(console, api):
    c, client = console(2), api(2)
    c.goto("/console/vpc/vpcs")
    c.link("Create VPC").click()
    c.field("VPC Name").fill("shop-vpc")
    c.field("IPv4 CIDR Block").fill("10.8.0.0/16")
    c.click_and_wait(c.button("Create"))
    assert "created" in c.toast()
    vpc_id = re.search(r"vpc-\w+", c.page.url)[0]
    # The new VPC is Pending, then Available without a reload.
    expect(c.page.locator("#live .detail-header")).to_contain_text("Available", timeout=5000)

    c.link("Create vSwitch").first.click()
    expect(c.field("VPC")).to_have_value(vpc_id)
    c.field("vSwitch Name").fill("shop-a")
    c.field("Zone").select_option("cn-hangzhou-j")
    c.field("IPv4 CIDR Block").fill("10.8.1.0/24")
    c.click_and_wait(c.button("Create"))
    vsw_id = re.search(r"vsw-\w+", c.toast())[0]
    expect(c.row(vsw_id)).to_contain_text("Available", timeout=5000)

    # Deleting the VPC first fails with the API's dependency error, shown on the page.
    c.page.locator(".page-actions").get_by_role("button", name="Delete").click()
    c.confirm()
    assert "DependencyViolation.VSwitch" in c.alert()
    assert client.rpc("Vpc", "DescribeVpcs", {"RegionId": REGION})["TotalCount"] == 1

    c.row(vsw_id).get_by_role("button", name="Delete").click()
    c.confirm()
    assert f"vSwitch {vsw_id} deleted" in c.toast()
    c.page.locator(".page-actions").get_by_role("button", name="Delete").click()
    c.confirm()
    assert c.page.url.endswith("/console/vpc/vpcs")
    assert f"VPC {vpc_id} deleted" in c.toast()

    assert client.rpc("Vpc", "DescribeVpcs", {"RegionId": REGION})["TotalCount"] == 0
    assert console_writes(client, c.account) == [
        ("CreateVpc", ""), ("CreateVSwitch", ""), ("DeleteVpc", "DependencyViolation.VSwitch"),
        ("DeleteVSwitch", ""), ("DeleteVpc", "")]
    # The console's host first (then the browser's own user agent).
    assert {e["userAgent"].split()[0] for e in audit_events(client)
            if e["eventType"] == "ConsoleOperation"} == {"vpc.console.aliyun.com"}


def test_ecs_security_group_and_instance_lifecycle(console, api):
    c, client = console(1), api(1)
    vpc, vsw = _network(client, "app-net")

    # Security group with an inbound and an outbound rule; the outbound one is deleted again.
    c.goto("/console/ecs/security-groups")
    c.link("Create Security Group").click()
    c.field("Security Group Name").fill("app-sg")
    c.pick("Network (VPC)", vpc)
    c.click_and_wait(c.button("Create"))
    sg_id = re.search(r"sg-\w+", c.page.url)[0]
    c.link("Add Rule").click()
    c.field("Port Range").fill("22/22")
    c.field("Authorization Object").fill("10.0.0.0/8")
    c.click_and_wait(c.button("Save"))
    assert "Rule added" in c.toast()
    c.page.get_by_role("tab", name=re.compile("Outbound")).click()
    c.page.get_by_role("tabpanel").get_by_role("link", name="Add Rule").click()
    c.field("Protocol").select_option("UDP")
    c.field("Port Range").fill("53/53")
    c.field("Authorization Object").fill("0.0.0.0/0")
    c.click_and_wait(c.button("Save"))
    panel = c.page.get_by_role("tabpanel")
    expect(panel).to_contain_text("53/53")
    panel.get_by_role("row").filter(has_text="53/53").get_by_role("button", name="Delete").click()
    c.confirm()
    rules = client.rpc("Ecs", "DescribeSecurityGroupAttribute",
                       {"RegionId": REGION, "SecurityGroupId": sg_id})["Permissions"]["Permission"]
    assert [(r["Direction"], r["PortRange"], r["SourceCidrIp"]) for r in rules] == [
        ("ingress", "22/22", "10.0.0.0/8")]

    # The create-instance wizard, step by step.
    c.goto("/console/ecs/instances")
    c.link("Create Instance").click()
    c.field("Zone").select_option("cn-hangzhou-i")
    c.button("Next").click()
    c.page.get_by_label("ecs.c7.large").check()
    c.button("Next").click()
    c.page.get_by_label("Debian 12.6 64-bit").check()
    c.button("Next").click()
    c.pick("VPC", vpc)
    c.pick("vSwitch", vsw)
    c.button("Next").click()
    c.pick("Security Group", sg_id)
    c.button("Next").click()
    c.field("Instance Name").fill("app-1")
    c.click_and_wait(c.button("Create Instance"))
    instance_id = re.search(r"i-\w+", c.toast())[0]
    row = c.row(instance_id)
    expect(row).to_contain_text("Pending")
    expect(row).to_contain_text("Running", timeout=8000)   # the list refreshes itself

    # Stop (confirmed), rename, release.
    expect(row.get_by_role("button", name="Delete")).to_be_disabled()
    row.get_by_role("button", name="Stop").click()
    c.confirm()
    expect(c.row(instance_id)).to_contain_text("Stopped", timeout=8000)
    c.row(instance_id).get_by_role("link", name="Manage").click()
    c.page.locator(".page-actions").get_by_role("link", name="Rename").click()
    c.field("Instance Name").fill("app-1-renamed")
    c.click_and_wait(c.button("Save"))
    inst = client.rpc("Ecs", "DescribeInstances", {"RegionId": REGION})["Instances"]["Instance"]
    assert [(i["InstanceId"], i["InstanceName"], i["Status"], i["InstanceType"], i["ImageId"],
             i["VpcAttributes"]["VSwitchId"]) for i in inst] == [
        (instance_id, "app-1-renamed", "Stopped", "ecs.c7.large",
         "debian_12_6_x64_20G_alibase_20240711.vhd", vsw)]
    c.page.locator(".page-actions").get_by_role("button", name="Delete").click()
    c.confirm()
    assert f"Instance {instance_id} was released" in c.toast()

    c.goto(f"/console/ecs/security-groups/{sg_id}")
    c.page.locator(".page-actions").get_by_role("button", name="Delete").click()
    c.confirm()
    assert client.rpc("Ecs", "DescribeInstances", {"RegionId": REGION})["TotalCount"] == 0
    assert client.rpc("Ecs", "DescribeSecurityGroups", {"RegionId": REGION})["TotalCount"] == 0
    assert console_writes(client, c.account) == [
        ("CreateSecurityGroup", ""), ("AuthorizeSecurityGroup", ""),
        ("AuthorizeSecurityGroupEgress", ""), ("RevokeSecurityGroupEgress", ""),
        ("RunInstances", ""), ("StopInstance", ""), ("ModifyInstanceAttribute", ""),
        ("DeleteInstance", ""), ("DeleteSecurityGroup", "")]
    events = audit_events(client)
    assert {e["userAgent"].split()[0] for e in events
            if e["eventType"] == "ConsoleOperation"} == {"ecs.console.aliyun.com"}
    run = next(e for e in events if e["eventName"] == "RunInstances")
    assert run["resourceName"] == instance_id and run["acsRegion"] == REGION


def test_ram_user_create_grant_and_delete(console, api):
    c, client = console(3), api(3)
    c.goto("/console/ram/users")
    c.link("Create User").click()
    c.field("Logon Name").fill("deploy-bot")
    c.field("Display Name").fill("Deploy Bot")
    c.click_and_wait(c.button("Create"))
    assert c.page.url.endswith("/console/ram/users/deploy-bot")
    c.page.locator(".page-actions").get_by_role("link", name="Add Permissions").click()
    c.page.get_by_label("AliyunECSReadOnlyAccess").check()
    c.click_and_wait(c.button("OK"))
    expect(c.row("AliyunECSReadOnlyAccess")).to_be_visible()
    assert client.rpc("Ram", "ListPoliciesForUser", {"UserName": "deploy-bot"}
                      )["Policies"]["Policy"][0]["PolicyName"] == "AliyunECSReadOnlyAccess"

    # The API refuses to delete a user that still holds a policy; the page says why.
    c.page.locator(".page-actions").get_by_role("button", name="Delete").click()
    c.confirm()
    assert "DeleteConflict.User.Policy" in c.alert()
    c.row("AliyunECSReadOnlyAccess").get_by_role("button", name="Remove").click()
    c.confirm()
    c.page.locator(".page-actions").get_by_role("button", name="Delete").click()
    c.confirm()
    assert "User deploy-bot deleted" in c.toast()

    with pytest.raises(CloudAPIError) as err:
        client.rpc("Ram", "GetUser", {"UserName": "deploy-bot"})
    assert err.value.code == "EntityNotExist.User"
    assert console_writes(client, c.account) == [
        ("CreateUser", ""), ("AttachPolicyToUser", ""),
        ("DeleteUser", "DeleteConflict.User.Policy"), ("DetachPolicyFromUser", ""),
        ("DeleteUser", "")]


def test_oss_bucket_create_acl_and_delete(console, api):
    c, client = console(4), api(4)
    c.goto("/console/oss/buckets")
    c.link("Create Bucket").click()
    c.field("Bucket Name").fill("erin-assets-2026")
    c.page.get_by_label("IA").check()
    c.page.get_by_label("Public Read", exact=True).check()
    c.click_and_wait(c.button("OK"))
    assert c.page.url.endswith("/console/oss/buckets/erin-assets-2026")
    bucket = client.oss_bucket("erin-assets-2026")
    assert bucket.get_bucket_acl().acl == oss2.BUCKET_ACL_PUBLIC_READ
    assert bucket.get_bucket_info().storage_class == "IA"

    c.page.locator(".page-actions").get_by_role("link", name="Change ACL").click()
    expect(c.page.get_by_label("Public Read", exact=True)).to_be_checked()
    c.page.get_by_label("Private", exact=True).check()
    c.click_and_wait(c.button("Save"))
    assert bucket.get_bucket_acl().acl == oss2.BUCKET_ACL_PRIVATE

    c.page.locator(".page-actions").get_by_role("button", name="Delete").click()
    c.confirm()
    assert [b.name for b in oss2.BucketIterator(client.oss_service())] == []
    assert console_writes(client, c.account) == [
        ("PutBucket", ""), ("PutBucketAcl", ""), ("DeleteBucket", "")]
    assert {e["userAgent"].split()[0] for e in audit_events(client)
            if e["eventType"] == "ConsoleOperation"} == {"oss.console.aliyun.com"}
