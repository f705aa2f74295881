"""Drafted tasks validated against the real local cloud: each parses, its prerequisites
provision and destroy, and an API twin doing the documented operation through the official
SDKs satisfies its rule in the real audit log; a rule the twin cannot satisfy is reported as a
drafting error."""
from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator

import pytest

from infra.cloud import CloudClient, CloudConfig, Credentials
from doccheck.draft import draft_task
from doccheck.validate import validate_draft
from tests import docs_fixture as fx
from tests.conftest import CloudServer, _server


@pytest.fixture(scope="module")
def twin_cloud(tmp_path_factory) -> Iterator[CloudServer]:
    """A cloud of this module's own: fast transitions, no LookupEvents limit."""
    yield from _server(tmp_path_factory, "twin-cloud", ["--transition", "0.2",
                                                       "--network-ready", "0.1",
                                                       "--lookup-qps", "0"])


def draft(proc, inventory=None) -> dict:
    d = draft_task(proc, (), inventory or fx.inventory(), task_id="draft-twin")
    assert d.task is not None, d.reason
    return d.task


def check(task, twin_cloud, account):
    return validate_draft(task, account=account, endpoint=twin_cloud.endpoint, settle_s=10,
                          ready_timeout_s=30)


def nothing_of(episode: str, twin_cloud, account) -> bool:
    c = CloudClient(CloudConfig(endpoint=twin_cloud.endpoint),
                    Credentials(account.access_key_id, account.access_key_secret))
    users = c.rpc("Ram", "ListUsers", {"MaxItems": "1000"})["Users"]["User"]
    vpcs = c.rpc("Vpc", "DescribeVpcs", {"RegionId": "cn-hangzhou", "PageSize": "50"})
    names = [u["UserName"] for u in users] + [v["VpcName"] for v in vpcs["Vpcs"]["Vpc"]]
    return not [n for n in names if episode in n]


@pytest.mark.parametrize("make", [fx.ram_create_user, fx.vpc_create, fx.ecs_add_rule,
                                  fx.oss_set_acl], ids=["ram", "vpc", "ecs", "oss"])
def test_drafted_tasks_are_valid(make, twin_cloud, accounts):
    account = accounts[0]
    v = check(draft(make()), twin_cloud, account)
    assert v.valid, v
    assert (v.parsed, v.provisioned, v.destroyed, v.twin_satisfied) == (True,) * 4
    assert v.calls and nothing_of(v.episode_id, twin_cloud, account)


def test_a_rule_the_twin_cannot_satisfy_is_a_drafting_error(twin_cloud, accounts):
    task = draft(fx.ram_create_user())
    # A read-back no creation can meet: the call succeeds, the rule still fails.
    bad = copy.deepcopy(task)
    bad["success"]["end_state"][0]["expect"]["User.DisplayName"] = "Someone Else"
    v = check(bad, twin_cloud, accounts[1])
    assert v.parsed and v.provisioned and v.destroyed and not v.twin_satisfied
    assert not v.valid and len(v.problems) == 1
    assert v.problems[0].startswith("drafting error: the API twin did the operation")
    assert "User.DisplayName" in v.problems[0]
    assert nothing_of(v.episode_id, twin_cloud, accounts[1])


def test_an_option_value_the_cloud_does_not_accept_is_a_drafting_error(twin_cloud, accounts):
    # A crawl that did not record the options' values: the twin tries the label and its slug,
    # and the cloud accepts neither protocol.
    inv = fx.inventory()
    pages = tuple(dataclasses.replace(p, forms=tuple(dataclasses.replace(f, fields=tuple(
        dataclasses.replace(x, values=()) for x in f.fields)) for f in p.forms))
        for p in inv.pages)
    task = draft(fx.ecs_add_rule(), dataclasses.replace(inv, pages=pages))
    v = check(task, twin_cloud, accounts[2])
    assert v.provisioned and v.destroyed and not v.twin_satisfied
    assert v.problems[0].startswith("drafting error: the cloud refused the twin's "
                                    "Ecs:AuthorizeSecurityGroup")
    assert len(v.calls) >= 2                   # each choice was tried


def test_a_task_that_does_not_parse_is_reported_before_the_cloud(twin_cloud, accounts):
    task = draft(fx.ram_create_user())
    task["split"] = "sometimes"
    v = check(task, twin_cloud, accounts[0])
    assert (v.parsed, v.provisioned, v.valid) == (False, False, False)
    assert "split" in v.problems[0] and v.problems[0].startswith("drafting error")


def test_stop_an_instance_the_twin_stops(twin_cloud, accounts):
    v = check(draft(fx.ecs_stop_instance()), twin_cloud, accounts[3])
    assert v.valid, v


def test_an_llm_draft_passes_the_same_validation(twin_cloud, accounts):
    from doccheck.llm_draft import llm_draft
    from tests.docs_fixture import GOOD, PROSE, FakeChat, fenced
    fake = FakeChat([fenced({k: v for k, v in GOOD.items() if k != "oracle"})])
    try:
        d = llm_draft(PROSE, fx.inventory(), fake.client, task_id="llm-twin")
    finally:
        fake.close()
    assert d.task is not None, d.reason
    v = check(d.task, twin_cloud, accounts[4])
    assert v.valid, v
