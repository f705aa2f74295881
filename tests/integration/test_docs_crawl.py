"""The documentation crawler against the real local cloud in real Chromium, through an env
worker: what it records (pages, menu paths, controls and where they lead, form fields, the API
action of each submit read from the audit log), that the committed inventories are current
(a fresh crawl has their version), that the rename drift shows as renames, and that the crawl
leaves nothing behind in the account."""
from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from consolerl.accounts import Account
from infra.cloud import CloudClient, CloudConfig, Credentials
from doccheck.crawl import CrawlConfig, crawl
from doccheck.inventory import default_inventories, diff, load, page_by_menu
from doccheck.model import Inventory
from tests.conftest import CloudServer, _server
from tests.conftest import run_async as run

CRAWL_ACCOUNT = 5          # an account no other test of this module's cloud uses


@pytest.fixture(scope="module")
def crawl_cloud(tmp_path_factory) -> Iterator[CloudServer]:
    yield from _server(tmp_path_factory, "crawl-cloud", ["--transition", "0.3",
                                                        "--network-ready", "0.1",
                                                        "--lookup-qps", "0"])


def _crawl(cloud: CloudServer, account: Account, drift: str,
           registry: CollectorRegistry | None = None) -> Inventory:
    return run(crawl(cloud.url, account, drift=drift, registry=registry,
                     config=CrawlConfig(trail_qps=50.0, max_seconds=400)))


@pytest.fixture(scope="module")
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture(scope="module")
def plain(crawl_cloud, accounts, registry) -> Inventory:
    return _crawl(crawl_cloud, accounts[CRAWL_ACCOUNT], "", registry)


def _client(cloud: CloudServer, account: Account) -> CloudClient:
    return CloudClient(CloudConfig(endpoint=cloud.endpoint),
                       Credentials(account.access_key_id, account.access_key_secret))


def test_users_page_leads_to_the_create_form_and_its_action(plain):
    users = page_by_menu(plain, ("RAM", "Users"))
    assert users is not None and users.pattern == "/console/ram/users"
    assert users.title == "Users" and users.product == "ram"
    assert "Logon Name" in users.columns
    create = next(c for c in users.controls if c.label == "Create User")
    assert create.where == "toolbar" and create.target == "page:/console/ram/users/create"
    form_page = plain.page("/console/ram/users/create")
    form = form_page.forms[0]
    logon = next(f for f in form.fields if f.label == "Logon Name")
    assert logon.required and logon.kind == "text" and logon.name == "UserName"
    assert form.submit == "Create" and form.cancel == "Cancel"
    assert form.action == "Ram:CreateUser"
    # what the submit sent, from the audit event: what the crawl typed is "{}"
    assert dict(form.sends) == {"UserName": "{}", "DisplayName": "{}"}
    grant = plain.page("/console/ram/users/{}/grant").forms[0]
    assert ("PolicyType", "System") in grant.sends and ("UserName", "{}") in grant.sends
    delete = next(c for c in users.controls if c.label == "Delete" and c.where == "row")
    assert delete.danger and delete.target == "dialog:Delete"
    assert delete.action == "Ram:DeleteUser"
    ok = next(c for c in users.controls if c.where == "dialog:Delete" and c.label == "OK")
    assert ok.target == "post:/console/ram/users/{}/delete" and ok.action == "Ram:DeleteUser"
    assert ok.sends == (("UserName", "{}"),)


def test_detail_pages_forms_and_actions_across_products(plain):
    instance = plain.page("/console/ecs/instances/{}")
    by_label = {c.label: c for c in instance.controls if c.where == "page"}
    assert by_label["Start"].action == "Ecs:StartInstance"
    assert by_label["Stop"].target == "dialog:Stop" and by_label["Stop"].action == \
        "Ecs:StopInstance"
    assert by_label["Rename"].target == "page:/console/ecs/instances/{}/rename"
    wizard = plain.page("/console/ecs/instances/create").forms[0]
    assert wizard.action == "Ecs:RunInstances" and len(wizard.steps) > 1
    assert wizard.next_label == "Next" and wizard.submit == "Create Instance"
    image = next(f for f in wizard.fields if f.name == "ImageId")
    assert image.kind == "radio" and image.label == "Image" and "Ubuntu 22.04 64-bit" in \
        image.options
    acl = plain.page("/console/oss/buckets/{}/acl").forms[0]
    assert acl.action == "Oss:PutBucketAcl" and acl.title == "ACL of {}"
    assert set(next(f for f in acl.fields if f.name == "Acl").options) >= {"Private",
                                                                           "Public Read"}
    group = plain.page("/console/ecs/security-groups/{}")
    assert group.tabs == ("Inbound", "Outbound")
    assert plain.page("/console/ecs/security-groups/{}/rules/create?direction=egress").forms[
        0].action == "Ecs:AuthorizeSecurityGroupEgress"
    assert page_by_menu(plain, ("VPC", "vSwitches")).pattern == "/console/vpc/vswitches"
    assert all(p.pattern.startswith("/console/") for p in plain.pages)
    assert not any("signout" in c.target or "signin" in c.target
                   for p in plain.pages for c in p.controls)


def test_the_crawl_leaves_nothing_behind(plain, crawl_cloud, accounts, registry):
    client = _client(crawl_cloud, accounts[CRAWL_ACCOUNT])
    users = client.rpc("Ram", "ListUsers", {"MaxItems": "1000"})["Users"]["User"]
    assert users == []
    assert client.rpc("Vpc", "DescribeVpcs", {"RegionId": "cn-hangzhou"})["TotalCount"] == 0
    assert client.rpc("Ecs", "DescribeInstances", {"RegionId": "cn-hangzhou"})[
        "TotalCount"] == 0
    assert client.rpc("Ecs", "DescribeSecurityGroups", {"RegionId": "cn-hangzhou"})[
        "TotalCount"] == 0
    assert [b.name for b in __import__("oss2").BucketIterator(client.oss_service())] == []
    assert registry.get_sample_value("consolerl_docs_crawl_leftovers") == 0
    assert registry.get_sample_value("consolerl_docs_crawl_pages_total", {"drift": ""}) >= 20
    assert plain.crawl_s > 0


def test_the_committed_inventory_is_current(plain):
    committed = load(default_inventories()[""])
    assert diff(committed, plain) == []
    assert plain.version == committed.version


def test_committed_rename_inventory_reports_renames():
    files = default_inventories()
    changes = diff(load(files[""]), load(files["rename"]))
    got = {(c.kind, c.page, c.what, c.old, c.new) for c in changes}
    assert ("renamed", "/console/ram/users", "control", "Create User", "Add User") in got
    assert ("renamed", "/console/ram/users/create", "field", "Logon Name", "Username") in got
    assert ("renamed", "/console/ram/users", "menu", "RAM > Users", "RAM > Identities") in got
    assert not [c for c in changes if c.kind in ("added", "removed") and c.what == "page"]


@pytest.mark.slow
def test_a_fresh_rename_crawl_matches_the_committed_one(crawl_cloud, accounts):
    renamed = _crawl(crawl_cloud, accounts[CRAWL_ACCOUNT], "rename")
    users = renamed.page("/console/ram/users")
    labels = {c.label for c in users.controls}
    assert "Add User" in labels and "Create User" not in labels
    assert renamed.page("/console/ram/users/create").forms[0].action == "Ram:CreateUser"
    assert renamed.version == load(default_inventories()["rename"]).version


@pytest.mark.slow
@pytest.mark.parametrize("drift", ["more_menu", "wizard", "nav"])
def test_a_fresh_crawl_of_each_other_drift_matches_the_committed_one(crawl_cloud, accounts,
                                                                       drift):
    fresh = _crawl(crawl_cloud, accounts[CRAWL_ACCOUNT], drift)
    committed = load(default_inventories()[drift])
    assert diff(committed, fresh) == [] and fresh.version == committed.version
