"""Bad input on console forms gets the API's own error, on the field, and creates nothing; a
form submitted twice creates one resource."""
from __future__ import annotations

import re

import oss2
import pytest
from playwright.sync_api import expect

from consolerl.errors import CloudAPIError
from tests.integration.console_kit import console_writes

GRACE = 6
REGION = "cn-hangzhou"


def api_message(client, product: str, action: str, params: dict[str, str]) -> tuple[str, str]:
    """What the API answers for the same input: (code, message)."""
    with pytest.raises(CloudAPIError) as err:
        client.rpc(product, action, params)
    return err.value.code, err.value.message


def _submit_expecting_error(c, button: str, field_label: str | None, code: str, message: str):
    with c.page.expect_navigation() as nav:
        c.button(button).click()
    assert nav.value.status == 400
    alert = c.page.locator("#form-error")
    expect(alert).to_contain_text(code)
    expect(alert).to_contain_text(message)
    if field_label is not None:
        field = c.field(field_label)
        expect(field).to_have_attribute("aria-invalid", "true")
        described = field.get_attribute("aria-describedby").split()
        error_text = c.page.locator(f"#{described[-1]}").inner_text()
        assert error_text == message


def _users(client) -> list[str]:
    return [u["UserName"] for u in client.rpc("Ram", "ListUsers", {})["Users"]["User"]]


@pytest.mark.parametrize("name", ["", "x" * 65, "bad name!", "dup-user"],
                         ids=["empty", "too-long", "illegal-chars", "duplicate"])
def test_ram_user_form_errors_match_the_api(console, api, name):
    client = api(GRACE)
    if name == "dup-user" and "dup-user" not in _users(client):
        client.rpc("Ram", "CreateUser", {"UserName": "dup-user"})
    before = _users(client)
    code, message = api_message(client, "Ram", "CreateUser", {"UserName": name} if name else {})
    c = console(GRACE)
    c.goto("/console/ram/users/create")
    c.field("Logon Name").fill(name)
    c.field("Display Name").fill("Kept Value")
    _submit_expecting_error(c, "Create", "Logon Name", code, message)
    expect(c.field("Display Name")).to_have_value("Kept Value")   # the form keeps its input
    assert _users(client) == before
    assert console_writes(client, c.account)[-1] == ("CreateUser", code)


@pytest.mark.parametrize("path,label,value,product,action,params", [
    ("/console/ecs/security-groups/create", "Security Group Name", "9lives", "Ecs",
     "CreateSecurityGroup", {"RegionId": REGION, "SecurityGroupName": "9lives"}),
    ("/console/vpc/vpcs/create", "IPv4 CIDR Block", "10.0.0.0/33", "Vpc", "CreateVpc",
     {"RegionId": REGION, "CidrBlock": "10.0.0.0/33"}),
    ("/console/vpc/vpcs/create", "VPC Name", "n" * 129, "Vpc", "CreateVpc",
     {"RegionId": REGION, "VpcName": "n" * 129}),
], ids=["sg-name-illegal", "vpc-cidr-malformed", "vpc-name-too-long"])
def test_network_form_errors_match_the_api(console, api, path, label, value, product, action,
                                           params):
    client = api(GRACE)
    code, message = api_message(client, product, action, params)
    c = console(GRACE)
    c.goto(path)
    c.field(label).fill(value)
    _submit_expecting_error(c, "Create", label, code, message)
    assert client.rpc("Vpc", "DescribeVpcs", {"RegionId": REGION})["TotalCount"] == 0
    assert client.rpc("Ecs", "DescribeSecurityGroups", {"RegionId": REGION})["TotalCount"] == 0


def test_bucket_name_rules_and_a_name_taken_by_another_account(console, api):
    client, other = api(GRACE), api(0)
    other.oss_bucket("taken-by-alice").create_bucket()
    c = console(GRACE)
    # oss2 refuses an illegal name before sending it; the console gets the server's answer.
    c.goto("/console/oss/buckets/create")
    c.field("Bucket Name").fill("Bad_Bucket")
    _submit_expecting_error(c, "OK", "Bucket Name", "InvalidBucketName",
                            "The specified bucket is not valid: a bucket name is 3 to 63 "
                            "characters of lowercase letters, digits and hyphens, and starts "
                            "and ends with a letter or digit.")
    with pytest.raises(oss2.exceptions.ServerError) as err:
        client.oss_bucket("taken-by-alice").create_bucket()
    c.goto("/console/oss/buckets/create")
    c.field("Bucket Name").fill("taken-by-alice")
    _submit_expecting_error(c, "OK", "Bucket Name", err.value.code, err.value.message)
    assert list(oss2.BucketIterator(client.oss_service())) == []


def test_rule_form_rejects_a_bad_port_range(console, api):
    client = api(GRACE)
    sg = client.rpc("Ecs", "CreateSecurityGroup", {"RegionId": "cn-beijing"})["SecurityGroupId"]
    params = {"RegionId": "cn-beijing", "SecurityGroupId": sg, "IpProtocol": "TCP",
              "PortRange": "70000/1", "SourceCidrIp": "0.0.0.0/0"}
    code, message = api_message(client, "Ecs", "AuthorizeSecurityGroup", params)
    c = console(GRACE)
    c.switch_region("cn-beijing")
    c.goto(f"/console/ecs/security-groups/{sg}/rules/create")
    c.field("Port Range").fill("70000/1")
    c.field("Authorization Object").fill("0.0.0.0/0")
    _submit_expecting_error(c, "Save", "Port Range", code, message)
    rules = client.rpc("Ecs", "DescribeSecurityGroupAttribute",
                       {"RegionId": "cn-beijing", "SecurityGroupId": sg})["Permissions"]
    assert rules["Permission"] == []


def test_instance_wizard_reopens_the_step_with_the_error(console, api):
    c = console(GRACE)
    c.goto("/console/ecs/instances/create")
    for _ in range(5):
        c.button("Next").click()
    c.field("Instance Name").fill("no-type-chosen")
    with c.page.expect_navigation():
        c.button("Create Instance").click()
    expect(c.page.locator("#form-error")).to_contain_text("MissingParameter")
    expect(c.page.locator("#form-error")).to_contain_text('"InstanceType"')
    # The step holding the field with the error is the one shown.
    expect(c.page.get_by_role("group", name="Instance Type").first).to_be_visible()
    expect(c.page.locator("[aria-current=step]")).to_contain_text("Instance Type")
    assert api(GRACE).rpc("Ecs", "DescribeInstances", {"RegionId": REGION})["TotalCount"] == 0


def test_submit_button_is_disabled_in_flight_and_a_second_submit_creates_nothing(console, api):
    client = api(GRACE)
    c = console(GRACE)
    c.goto("/console/ram/users/create")
    c.field("Logon Name").fill("in-flight-user")
    # The page reports from inside the flight through console messages (scripts cannot be
    # evaluated in a page whose navigation is pending).
    logs: list[str] = []
    c.page.on("console", lambda m: logs.append(m.text))
    c.page.evaluate("""() => {
        const form = document.querySelector('form.form');
        window.addEventListener('submit', (ev) => console.log('submit prevented=' + ev.defaultPrevented));
        form.addEventListener('submit', () => setTimeout(() => {
            const button = form.querySelector('[data-submit]');
            console.log('in flight disabled=' + button.disabled + ' busy=' + form.getAttribute('aria-busy'));
            form.requestSubmit();   // a second submit while the first is pending
        }, 50), { once: true });
    }""")
    held = []
    c.page.route("**/console/ram/users/create", lambda route: held.append(route)
                 if route.request.method == "POST" else route.continue_())
    c.button("Create").click(no_wait_after=True)
    while len(logs) < 3:
        c.page.wait_for_timeout(20)
    assert logs[:3] == ["submit prevented=false", "in flight disabled=true busy=true",
                        "submit prevented=true"]
    assert len(held) == 1
    with c.page.expect_navigation():
        held[0].continue_()
    assert c.page.url.endswith("/console/ram/users/in-flight-user")
    assert _users(client).count("in-flight-user") == 1


def test_the_same_form_posted_twice_creates_one_resource(console, api):
    """Two POSTs of one rendered form (a double click that got through, a retry): the second
    creates nothing and lands where the first did."""
    client = api(GRACE)
    c = console(GRACE)
    c.switch_region("cn-shanghai")   # away from the other tests' region
    c.goto("/console/vpc/vpcs/create")
    form = {n: c.page.locator(f"input[name={n}]").first.get_attribute("value")
            for n in ("_csrf", "_form_token")}
    form.update({"VpcName": "twice-vpc", "CidrBlock": "172.16.0.0/16", "Description": ""})
    url = c.base + "/console/vpc/vpcs/create"
    first = c.page.request.post(url, form=form, max_redirects=0)
    second = c.page.request.post(url, form=form, max_redirects=0)
    assert first.status == second.status == 303
    assert first.headers["location"] == second.headers["location"]
    vpcs = client.rpc("Vpc", "DescribeVpcs", {"RegionId": "cn-shanghai"})["Vpcs"]["Vpc"]
    assert [v["VpcName"] for v in vpcs] == ["twice-vpc"]
    c.goto(second.headers["location"].replace(c.base, ""))
    assert "already submitted" in c.toast()
    assert re.search(r"vpc-\w+", c.page.url)
