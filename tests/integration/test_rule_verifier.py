"""The rule channel against the local cloud's audit log: late events, and agents that try to
get a reward without doing the task."""
from __future__ import annotations

import re
import time
from collections.abc import Iterator

import httpx
import pytest

from consolerl.tasks import parse_task
from reward_service.actiontrail import TrailClient, TrailConfig
from reward_service.verifier import RuleVerifier, record
from tests.conftest import CloudServer, _server
from tests.integration.console_kit import sign_in_http

TASK = parse_task({
    "schema": 1, "id": "ram-create-x", "product": "ram", "title": "Create a RAM user",
    "procedure": "1. Create user {user_name}.\n", "start_page": "/console/ram/users",
    "split": "train", "difficulty": 1, "parameters": {"user_name": "u-{episode}"},
    "success": {"required_events": [{"event": "CreateUser", "service": "Ram",
                                     "where": {"requestParameters.UserName": "{user_name}"}}],
                "forbidden_events": [{"event": "DeleteUser", "service": "Ram"}]},
}, "inline")


@pytest.fixture(scope="module")
def late_cloud(tmp_path_factory) -> Iterator[CloudServer]:
    """Audit events reach LookupEvents 2 s after they happen."""
    yield from _server(tmp_path_factory, "late-cloud", ["--delivery-delay", "2",
                                                       "--lookup-qps", "0"])


def console_create_user(server: CloudServer, account, name: str) -> None:
    """What an agent does in the browser, as the console's own form posts."""
    with httpx.Client(base_url=server.url, follow_redirects=False) as web:
        sign_in_http(web, account)
        page = web.get("/console/ram/users/create").text
        form = {k: re.search(rf'name="{k}" value="([^"]+)"', page)[1]
                for k in ("_csrf", "_form_token")}
        r = web.post("/console/ram/users/create", data={**form, "UserName": name})
        assert r.status_code == 303, r.text[:300]


def verifier(server: CloudServer, make_client, index: int, account, settle: float
             ) -> RuleVerifier:
    client = make_client(index, server=server)
    trail = TrailClient(lambda: make_client(index, server=server),
                        TrailConfig(qps=50, settle_s=settle, poll_s=0.25, clock_skew_s=5),
                        account_id=account.account_id)
    return RuleVerifier(trail, client, settle_s=settle, end_state_settle_s=0.5)


def test_late_events_are_waited_for_then_scored(late_cloud, make_client, accounts):
    account = accounts[0]
    started = time.time()
    console_create_user(late_cloud, account, "u-late01")
    episode = record(account.account_id, started, {"user_name": "u-late01"})
    t0 = time.monotonic()
    outcome = verifier(late_cloud, make_client, 0, account, settle=15).verify(TASK, episode)
    assert outcome.verdict == "success" and outcome.evidence
    assert time.monotonic() - t0 >= 1.0            # it had to wait for delivery


def test_past_the_deadline_it_is_pending_never_a_false_failure(late_cloud, make_client,
                                                               accounts):
    account = accounts[1]
    started = time.time()
    console_create_user(late_cloud, account, "u-late02")
    episode = record(account.account_id, started, {"user_name": "u-late02"})
    outcome = verifier(late_cloud, make_client, 1, account, settle=0.3).verify(TASK, episode)
    assert outcome.verdict == "undetermined" and "pending" in outcome.reasons[0]


@pytest.fixture(scope="module")
def fast_cloud(tmp_path_factory) -> Iterator[CloudServer]:
    yield from _server(tmp_path_factory, "verify-cloud", ["--lookup-qps", "0"])


def test_an_agent_that_did_nothing_gets_a_decisive_failure(fast_cloud, make_client, accounts):
    """Making the page say "success" is not an audit event: nothing happened, and once the log
    has caught up with the episode that is a failure, not a pending verdict."""
    account = accounts[2]
    episode = record(account.account_id, time.time(), {"user_name": "u-nothing"})
    time.sleep(1.1)
    outcome = verifier(fast_cloud, make_client, 2, account, settle=10).verify(TASK, episode)
    assert outcome.verdict == "failure" and "no successful CreateUser" in outcome.reasons[0]


def test_events_before_the_episode_or_in_another_account_do_not_count(fast_cloud, make_client,
                                                                       accounts):
    account, other = accounts[3], accounts[4]
    console_create_user(fast_cloud, account, "u-early")        # before the episode began
    console_create_user(fast_cloud, other, "u-other")          # the right name, wrong account
    time.sleep(1.1)
    started = time.time()
    time.sleep(1.1)
    for name in ("u-early", "u-other"):
        episode = record(account.account_id, started, {"user_name": name})
        outcome = verifier(fast_cloud, make_client, 3, account, settle=10).verify(TASK, episode)
        assert outcome.verdict == "failure", name


def test_api_calls_are_not_the_agents(fast_cloud, make_client, accounts):
    """The same write made with the account's AccessKey (not through the console) is not the
    agent's doing and earns nothing."""
    account = accounts[5]
    started = time.time()
    make_client(5, server=fast_cloud).rpc("Ram", "CreateUser", {"UserName": "u-api"})
    time.sleep(1.1)
    episode = record(account.account_id, started, {"user_name": "u-api"})
    outcome = verifier(fast_cloud, make_client, 5, account, settle=10).verify(TASK, episode)
    assert outcome.verdict == "failure"


def test_a_forbidden_event_is_counted(fast_cloud, make_client, accounts):
    account = accounts[6]
    started = time.time()
    console_create_user(fast_cloud, account, "u-forbid")
    with httpx.Client(base_url=fast_cloud.url, follow_redirects=False) as web:
        sign_in_http(web, account)
        csrf = re.search(r'name="_csrf" value="([^"]+)"', web.get("/console/ram/users").text)[1]
        web.post("/console/ram/users/u-forbid/delete", data={"_csrf": csrf})
    episode = record(account.account_id, started, {"user_name": "u-forbid"})
    outcome = verifier(fast_cloud, make_client, 6, account, settle=10).verify(TASK, episode)
    assert outcome.verdict == "failure" and outcome.forbidden_hits == 1
