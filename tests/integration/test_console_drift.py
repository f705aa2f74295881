"""UI drift: each kind changes what the browser sees, and a flow that follows the drifted UI
still succeeds (and is audited like any console change)."""
from __future__ import annotations

import re

import oss2
import pytest
from playwright.sync_api import expect

from tests.integration.console_kit import console_writes

FRANK = 5


def _make_bucket(api, name: str) -> None:
    api(FRANK).oss_bucket(name).create_bucket()


def _buckets(api) -> list[str]:
    return [b.name for b in oss2.BucketIterator(api(FRANK).oss_service())]


def test_no_drift_by_default(console):
    c = console(FRANK)
    c.goto("/console/ram/users")
    expect(c.link("Create User")).to_be_visible()
    expect(c.page.get_by_role("button", name="More")).to_have_count(0)
    expect(c.page.locator("details.nav-group")).to_have_count(0)


def test_rename_drift_renames_labels_and_the_flow_follows_them(console, api):
    c = console(FRANK, drift="rename")
    c.goto("/console/ecs/instances")
    expect(c.link("Launch Instance")).to_be_visible()
    expect(c.link("Create Instance")).to_have_count(0)
    expect(c.page.get_by_role("navigation", name="Elastic Compute Service")
           .get_by_role("link", name="Instance List")).to_be_visible()

    c.goto("/console/ram/users")
    expect(c.page.get_by_role("heading", name="Identities")).to_be_visible()
    c.link("Add User").click()
    c.field("Username").fill("renamed-ui-user")
    c.click_and_wait(c.button("Confirm and Create"))
    assert c.page.url.endswith("/console/ram/users/renamed-ui-user")
    c.page.locator(".page-actions").get_by_role("button", name="Release").click()
    c.confirm(ok_name="Confirm")
    assert "renamed-ui-user" not in [u["UserName"] for u in api(FRANK).rpc(
        "Ram", "ListUsers", {})["Users"]["User"]]


def test_more_menu_drift_hides_actions_in_a_menu(console, api):
    _make_bucket(api, "frank-more-menu")
    c = console(FRANK, drift="more_menu")
    c.goto("/console/oss/buckets")
    row = c.row("frank-more-menu")
    expect(row.get_by_role("link", name="Manage")).to_be_visible()
    expect(row.get_by_role("button", name="Delete")).to_be_hidden()
    row.get_by_role("button", name="More").click()
    menu = row.get_by_role("menu")
    expect(menu).to_be_visible()
    menu.get_by_role("menuitem", name="Delete").click()
    c.confirm()
    assert "frank-more-menu" not in _buckets(api)


def test_extra_confirm_drift_asks_for_the_id(console, api):
    _make_bucket(api, "frank-extra-confirm")
    c = console(FRANK, drift="extra_confirm")
    c.goto("/console/oss/buckets")
    c.row("frank-extra-confirm").get_by_role("button", name="Delete").click()
    dialog = c.page.get_by_role("dialog")
    ok = dialog.get_by_role("button", name="OK")
    expect(ok).to_be_disabled()
    dialog.get_by_label(re.compile("To confirm, type")).fill("wrong-name")
    expect(ok).to_be_disabled()
    c.confirm(typed="frank-extra-confirm")
    assert "frank-extra-confirm" not in _buckets(api)


def test_extra_confirm_is_enforced_by_the_server_too(console, api):
    """A request that skips the dialog's typed confirmation changes nothing."""
    _make_bucket(api, "frank-server-check")
    c = console(FRANK, drift="extra_confirm")
    c.goto("/console/oss/buckets")
    csrf = c.page.locator("input[name=_csrf]").first.get_attribute("value")
    with c.page.expect_navigation():
        c.page.evaluate("""([csrf]) => {
        const f = document.createElement('form'); f.method = 'post';
            f.action = '/console/oss/buckets/frank-server-check/delete';
            f.innerHTML = `<input name=_csrf value="${csrf}"><input name=confirm value="nope">`;
            document.body.appendChild(f); f.submit(); }""", [csrf])
    assert "Confirmation failed" in c.alert()
    assert "frank-server-check" in _buckets(api)


def test_wizard_drift_splits_a_one_page_form(console, api):
    c = console(FRANK, drift="wizard")
    c.goto("/console/ecs/security-groups/create")
    expect(c.page.get_by_role("list", name="Steps")).to_be_visible()
    expect(c.button("Create")).to_be_hidden()
    expect(c.field("Description")).to_be_hidden()
    c.field("Security Group Name").fill("wizard-sg")
    c.button("Next").click()
    c.field("Description").fill("made through the two-step form")
    c.click_and_wait(c.button("Create"))
    sg_id = re.search(r"sg-\w+", c.page.url)[0]
    groups = api(FRANK).rpc("Ecs", "DescribeSecurityGroups", {"RegionId": "cn-hangzhou"}
                            )["SecurityGroups"]["SecurityGroup"]
    assert [(g["SecurityGroupId"], g["Description"]) for g in groups
            if g["SecurityGroupName"] == "wizard-sg"] == [(sg_id, "made through the two-step form")]


def test_nav_drift_regroups_the_left_navigation(console):
    c = console(FRANK, drift="nav")
    c.goto("/console/ecs/instances")
    nav = c.page.get_by_role("navigation", name="Elastic Compute Service")
    link = nav.get_by_role("link", name="Security Groups")
    expect(link).to_be_hidden()
    nav.get_by_text("Network & Security").click()
    link.click()
    expect(c.page.get_by_role("heading", level=1)).to_have_text("Security Groups")


def test_all_drift_kinds_together_still_let_a_flow_finish(console, api):
    c = console(FRANK, drift="all")
    c.goto("/console/ram/users/create")
    c.field("Username").fill("all-drift-user")
    c.button("Continue").click()
    c.click_and_wait(c.button("Confirm and Create"))
    c.page.locator(".page-actions").get_by_role("button", name="More").click()
    c.page.get_by_role("menuitem", name="Release").click()
    c.confirm(ok_name="Confirm", typed="all-drift-user")
    assert "deleted" in c.toast()
    writes = console_writes(api(FRANK), c.account)
    assert writes[-2:] == [("CreateUser", ""), ("DeleteUser", "")]


@pytest.mark.parametrize("drift", ["bogus", "rename,teleport"])
def test_unknown_drift_is_refused_at_sign_in(console, drift):
    c = console(FRANK, sign_in=False)
    response = c.page.goto(f"{c.base}/console/signin?drift={drift}")
    assert response.status == 400
    assert "unknown drift kind" in c.alert()
