"""Screenshots of the console for people to look at (``test-artifacts/screenshots``, not
committed): the sign-in page, an ECS instance list, the create-instance form and a
security-group rule form. The test checks each page is the styled console, not bare HTML."""
from __future__ import annotations

from pathlib import Path

from playwright.sync_api import expect

from tests.conftest import ROOT, wait_for

SHOTS = ROOT / "test-artifacts" / "screenshots"
ALICE = 0


def _shot(page, name: str) -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{name}.png"
    page.screenshot(path=path, full_page=True)
    assert path.stat().st_size > 10_000
    return path


def _styled(page) -> None:
    # The stylesheet applied: the console grey behind the page, the sign-in page's gradient.
    root, body = page.evaluate("[getComputedStyle(document.documentElement).backgroundColor, "
                               "getComputedStyle(document.body).backgroundImage]")
    assert root == "rgb(245, 246, 247)"
    assert "gradient" in body or page.locator(".topbar").count() == 1


def test_screenshots_of_the_console(console, api):
    client = api(ALICE)
    vpc = client.rpc("Vpc", "CreateVpc", {"RegionId": "cn-hangzhou", "VpcName": "prod-vpc",
                                          "CidrBlock": "172.16.0.0/12"})["VpcId"]
    wait_for(lambda: client.rpc("Vpc", "DescribeVpcs", {"RegionId": "cn-hangzhou"})
             ["Vpcs"]["Vpc"][0]["Status"] == "Available")
    vsw = client.rpc("Vpc", "CreateVSwitch", {"RegionId": "cn-hangzhou", "VpcId": vpc,
                                              "ZoneId": "cn-hangzhou-k", "VSwitchName": "prod-k",
                                              "CidrBlock": "172.16.8.0/24"})["VSwitchId"]
    wait_for(lambda: client.rpc("Vpc", "DescribeVSwitches", {"RegionId": "cn-hangzhou"})
             ["VSwitches"]["VSwitch"][0]["Status"] == "Available")
    sg = client.rpc("Ecs", "CreateSecurityGroup", {"RegionId": "cn-hangzhou", "VpcId": vpc,
                                                   "SecurityGroupName": "prod-web"})
    for name, itype in (("web-1", "ecs.g7.large"), ("web-2", "ecs.g7.large"),
                        ("db-1", "ecs.r7.large")):
        client.rpc("Ecs", "RunInstances", {
            "RegionId": "cn-hangzhou", "InstanceType": itype, "VSwitchId": vsw,
            "ImageId": "aliyun_3_x64_20G_alibase_20240819.vhd", "InstanceName": name,
            "SecurityGroupId": sg["SecurityGroupId"]})

    c = console(ALICE, sign_in=False)
    c.goto("/console/signin")
    _styled(c.page)
    _shot(c.page, "signin")
    c.sign_in()

    c.goto("/console/ecs/instances")
    expect(c.page.locator("#live")).not_to_have_attribute("data-transitional", "", timeout=8000)
    _styled(c.page)
    _shot(c.page, "ecs_instances")

    c.link("Create Instance").click()
    c.button("Next").click()
    c.page.get_by_label("ecs.g7.large").check()
    _shot(c.page, "create_instance_type")
    for _ in range(2):
        c.button("Next").click()
    c.pick("VPC", vpc)
    _shot(c.page, "create_instance_network")

    c.goto(f"/console/ecs/security-groups/{sg['SecurityGroupId']}/rules/create")
    c.field("Port Range").fill("443/443")
    c.field("Authorization Object").fill("0.0.0.0/0")
    _styled(c.page)
    _shot(c.page, "sg_rule_form")
