"""POST /v1/score against the local cloud: a console action scores 1, bad requests get clear
4xx answers, an env_error is not trainable, and no secret is in a response."""
from __future__ import annotations

import re
import time
from collections.abc import Iterator

import httpx
import pytest
from fastapi.testclient import TestClient

from infra.provisioning.tasks import parse_task
from reward_service.actiontrail import TrailConfig
from reward_service.service import RewardService, build_app
from tests.conftest import CloudServer, _server

TASK = parse_task({
    "schema": 1, "id": "ram-create-http", "product": "ram", "title": "Create a RAM user",
    "procedure": "1. Create user {user_name}.\n", "start_page": "/console/ram/users",
    "split": "train", "difficulty": 1, "parameters": {"user_name": "u-{episode}"},
    "success": {"required_events": [{"event": "CreateUser", "service": "Ram",
                                     "where": {"requestParameters.UserName": "{user_name}"}}]},
}, "inline")


@pytest.fixture(scope="module")
def http_cloud(tmp_path_factory) -> Iterator[CloudServer]:
    yield from _server(tmp_path_factory, "reward-http", ["--lookup-qps", "0"])


@pytest.fixture
def api(http_cloud, accounts) -> TestClient:
    service = RewardService([TASK], accounts, http_cloud.endpoint,
                            TrailConfig(qps=50, settle_s=10, poll_s=0.25, clock_skew_s=5))
    return TestClient(build_app(service))


def test_a_console_action_scores_one(api, http_cloud, accounts):
    account = accounts[0]
    started = time.time()
    with httpx.Client(base_url=http_cloud.url, follow_redirects=False) as web:
        web.post("/console/signin", data={"login_name": account.login_name,
                                          "password": account.password})
        page = web.get("/console/ram/users/create").text
        form = {k: re.search(rf'name="{k}" value="([^"]+)"', page)[1]
                for k in ("_csrf", "_form_token")}
        web.post("/console/ram/users/create", data={**form, "UserName": "u-http01"})
    r = api.post("/v1/score", json={"task_id": TASK.id, "account_id": account.account_id,
                                    "started_at": started, "ended_at": time.time(),
                                    "values": {"user_name": "u-http01"}})
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["reward"], body["verdict"], body["decided_by"], body["trainable"]) == (
        1.0, "success", "rule", True)
    assert body["evidence"]
    for secret in (account.password, account.access_key_secret):
        assert secret not in r.text


@pytest.mark.parametrize("payload,status,fragment", [
    ({}, 422, "task_id"),
    ({"task_id": "ram-create-http", "account_id": "x", "started_at": 1, "ended_at": 2}, 422,
     "account_id"),
    ({"task_id": "no-such-task", "account_id": "1000000000000001", "started_at": 1,
      "ended_at": 2}, 404, "unknown task_id"),
    ({"task_id": "ram-create-http", "account_id": "9999999999999999", "started_at": 1,
      "ended_at": 2}, 404, "unknown account_id"),
    ({"task_id": "ram-create-http", "account_id": "1000000000000001", "started_at": -5,
      "ended_at": 2}, 422, "started_at"),
])
def test_bad_requests_get_clear_errors(api, payload, status, fragment):
    r = api.post("/v1/score", json=payload)
    assert r.status_code == status and fragment in r.text


def test_an_env_error_is_not_trainable(api, accounts):
    r = api.post("/v1/score", json={"task_id": TASK.id, "account_id": accounts[1].account_id,
                                    "started_at": time.time(), "ended_at": time.time(),
                                    "env_error": "browser_crashed: gone"})
    body = r.json()
    assert r.status_code == 200 and body["decided_by"] == "env_error"
    assert body["trainable"] is False and body["reward"] == 0.0


def test_the_ray_actor_scores(http_cloud, accounts):
    import ray

    from reward_service.service import RewardActor
    service = RewardService([TASK], accounts, http_cloud.endpoint,
                            TrailConfig(qps=50, settle_s=5, poll_s=0.25, clock_skew_s=5))
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        actor = RewardActor.remote(service)
        now = time.time()
        results = ray.get([actor.score.remote({
            "task_id": TASK.id, "account_id": accounts[2].account_id, "started_at": now,
            "ended_at": now, "env_error": f"timeout {i}"}) for i in range(8)], timeout=60)
        assert [r.decided_by for r in results] == ["env_error"] * 8
        nothing = ray.get(actor.score.remote({
            "task_id": TASK.id, "account_id": accounts[2].account_id,
            "started_at": now, "ended_at": now, "values": {"user_name": "u-none"}}), timeout=60)
        assert nothing.verdict == "failure" and nothing.reward == 0.0
    finally:
        ray.shutdown()
