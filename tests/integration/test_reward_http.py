"""POST /v1/score against the local cloud: a console action scores 1, bad requests get clear
4xx answers naming the field, an env_error is not trainable, a cloud that is down is a 503 (not
a 500) and one that refuses the service's call a 502, GET /metrics counts what happened, and
no secret is in a response."""
from __future__ import annotations

import re
import time
from collections.abc import Iterator

import httpx
import pytest
from fastapi.testclient import TestClient

from consolerl.errors import CloudAPIError
from consolerl.tasks import parse_task
from infra.cloud import CloudClient, CloudConfig, Credentials
from infra.local_cloud import free_port
from reward_service.actiontrail import TrailConfig
from reward_service.service import RewardService, build_app
from tests.conftest import CloudServer, _server
from tests.integration.console_kit import sign_in_http

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


def create_user_in_console(cloud: CloudServer, account, user_name: str) -> None:
    with httpx.Client(base_url=cloud.url, follow_redirects=False) as web:
        sign_in_http(web, account)
        page = web.get("/console/ram/users/create").text
        form = {k: re.search(rf'name="{k}" value="([^"]+)"', page)[1]
                for k in ("_csrf", "_form_token")}
        web.post("/console/ram/users/create", data={**form, "UserName": user_name})


def metric(text: str, sample: str) -> float:
    """The value of one sample line (``name{labels}``) of a Prometheus exposition; 0 if absent."""
    for line in text.splitlines():
        if line.startswith(sample + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_console_action_scores_one(api, http_cloud, accounts):
    account = accounts[0]
    started = time.time()
    create_user_in_console(http_cloud, account, "u-http01")
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
    ({"task_id": "ram-create-http", "account_id": "1000000000000001", "started_at": 20,
      "ended_at": 10}, 422, "ended_at must not be before started_at"),
    ({"task_id": "ram-create-http", "account_id": "1000000000000001",
      "started_at": 4_000_000_000, "ended_at": 4_000_000_001}, 422, "in the future"),
])
def test_bad_requests_get_clear_errors(api, payload, status, fragment):
    r = api.post("/v1/score", json=payload)
    assert r.status_code == status and fragment in r.text


def test_metrics_count_scores_errors_and_trail_queries(api, http_cloud, accounts):
    account = accounts[3]
    started = time.time()
    create_user_in_console(http_cloud, account, "u-http02")
    r = api.post("/v1/score", json={"task_id": TASK.id, "account_id": account.account_id,
                                    "started_at": started, "ended_at": time.time(),
                                    "values": {"user_name": "u-http02"}})
    assert r.status_code == 200 and r.json()["verdict"] == "success", r.text
    api.post("/v1/score", json={"task_id": "no-such-task", "account_id": account.account_id,
                                "started_at": 1, "ended_at": 2})
    m = api.get("/metrics")
    assert m.status_code == 200 and m.headers["content-type"].startswith("text/plain")
    text = m.text
    assert metric(text, 'consolerl_reward_scores_total{decided_by="rule",verdict="success"}') == 1
    assert metric(text, "consolerl_reward_score_seconds_count") == 1
    assert metric(text, "consolerl_reward_scores_in_flight") == 0
    assert metric(text, 'consolerl_reward_errors_total{kind="unknown_name"}') == 1
    assert metric(text, 'consolerl_reward_trail_queries_total{outcome="ok"}') >= 1
    for secret in (account.password, account.access_key_secret):
        assert secret not in text


def test_a_cloud_that_is_down_is_a_503_naming_the_call(accounts):
    service = RewardService([TASK], accounts, f"127.0.0.1:{free_port()}",
                            TrailConfig(qps=50, max_retries=1, backoff_base_s=0.01, settle_s=1,
                                        poll_s=0.1))
    api = TestClient(build_app(service), raise_server_exceptions=False)
    account = accounts[4]
    t0 = time.monotonic()
    r = api.post("/v1/score", json={"task_id": TASK.id, "account_id": account.account_id,
                                    "started_at": time.time() - 5, "ended_at": time.time(),
                                    "values": {"user_name": "u-down"}})
    assert time.monotonic() - t0 < 10
    assert r.status_code == 503, r.text
    detail = r.json()["detail"]
    assert (detail["error"], detail["action"]) == ("cloud_error", "LookupEvents")
    assert "did not answer LookupEvents" in detail["message"] and "Traceback" not in r.text
    for secret in (account.password, account.access_key_secret):
        assert secret not in r.text
    text = api.get("/metrics").text
    assert metric(text, 'consolerl_reward_errors_total{kind="cloud_error"}') == 1
    assert metric(text, "consolerl_reward_scores_in_flight") == 0


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


INFEASIBLE = parse_task({
    "schema": 1, "id": "ram-infeasible-http", "product": "ram", "title": "Create an AccessKey",
    # Claimed at once, before step 1 was done, with no pages sent and no inventory: the
    # evidence channel cannot check it (unchecked), so the judges decide.
    "procedure": "1. Open the RAM console and choose Users.\n"
                 "2. Click Create AccessKey on the Security tab.\n",
    "start_page": "/console/ram/users", "split": "train", "difficulty": 1,
    "expected": "infeasible", "infeasible_reason": "the console has no Security tab",
    "success": {"forbidden_events": [{"event": "DeleteUser", "service": "Ram"}]},
}, "inline")


def test_metrics_count_judge_votes_and_pending_episodes(http_cloud, accounts):
    from reward_service.judges import JudgeChannel

    class Judge:
        """Agrees with the infeasible report; cannot tell about anything else."""

        def complete(self, messages):
            if "Create an AccessKey" in messages[-1]["content"]:
                return '{"verdict": "success", "reason": "reported it infeasible"}'
            return "I cannot tell."

    service = RewardService([TASK, INFEASIBLE], accounts, http_cloud.endpoint,
                            TrailConfig(qps=50, settle_s=0.5, poll_s=0.1, clock_skew_s=5),
                            judges=JudgeChannel([Judge()]))
    api = TestClient(build_app(service))
    now = time.time()
    judged = api.post("/v1/score", json={
        "task_id": INFEASIBLE.id, "account_id": accounts[5].account_id, "started_at": now,
        "ended_at": now, "infeasible_reason": "there is no Security tab"}).json()
    assert (judged["verdict"], judged["decided_by"]) == ("success", "judges")
    assert judged["evidence_verdict"]["kind"] == "unchecked"
    # Nothing happened and the log has not caught up with the episode's end yet: pending,
    # and the judges cannot tell either.
    pending = api.post("/v1/score", json={
        "task_id": TASK.id, "account_id": accounts[6].account_id, "started_at": now,
        "ended_at": time.time(), "values": {"user_name": "u-late"}}).json()
    assert (pending["verdict"], pending["decided_by"]) == ("undetermined", "none")
    text = api.get("/metrics").text
    assert metric(text, 'consolerl_reward_judge_votes_total{verdict="success"}') == 3
    assert metric(text, 'consolerl_reward_judge_votes_total{verdict="invalid"}') == 3
    assert metric(text, 'consolerl_reward_judge_verdicts_total{verdict="success"}') == 1
    assert metric(text, 'consolerl_reward_judge_verdicts_total{verdict="undetermined"}') == 1
    assert metric(text, 'consolerl_reward_scores_total{decided_by="judges",verdict="success"}') == 1
    assert metric(text, 'consolerl_reward_undetermined_total{cause="pending"}') == 1
    assert metric(text, 'consolerl_reward_trail_wait_seconds_count{status="pending"}') == 1


# -- every user mistake is a 4xx naming its field; only an outage is a 503 ----------

def valid_request(account_id: str = "1000000000000001", **changes) -> dict:
    now = time.time()
    return {"task_id": TASK.id, "account_id": account_id, "started_at": now - 5,
            "ended_at": now, "values": {"user_name": "u-valid"}, **changes}


def field_locs(r) -> list[list]:
    return [e["loc"] for e in r.json()["detail"]]


@pytest.mark.parametrize("values", [{}, None, {"user": "u-typo"}])
def test_values_without_a_placeholder_the_rule_needs_is_a_422_naming_values(api, values):
    payload = valid_request(values=values)
    if values is None:
        del payload["values"]
    r = api.post("/v1/score", json=payload)
    assert r.status_code == 422, r.text
    assert field_locs(r) == [["body", "values"]]
    assert "{user_name}" in r.text


@pytest.mark.parametrize("change, field", [
    ({"started_at": True, "ended_at": True}, "started_at"),         # a bool is not a time
    ({"started_at": "1700000000"}, "started_at"),                    # nor is a string
    ({"ended_at": time.time() + 10**9}, "ended_at"),                 # ends far in the future
    ({"env_error": ""}, "env_error"),                                # "" says nothing
    ({"value": {"user_name": "u-typo"}}, "value"),                   # an unknown field
    ({"values": {"user_name": "u" * 5_000}}, "values"),
    ({"values": {"k" * 100: "v", "user_name": "u"}}, "values"),
    ({"actions": ["click('x')" * 2_000]}, "actions"),
])
def test_each_malformed_field_is_a_422_naming_it(api, change, field):
    r = api.post("/v1/score", json=valid_request(**change))
    assert r.status_code == 422, r.text
    assert field in {loc[1] for loc in field_locs(r)}, r.text


@pytest.mark.parametrize("started_at", [1e-300, 1.0, 86_400.0])
def test_a_start_older_than_the_audit_log_is_a_422_naming_started_at(api, started_at):
    # ActionTrail keeps (and LookupEvents spans) 90 days: the cloud would refuse the query.
    r = api.post("/v1/score", json=valid_request(started_at=started_at))
    assert r.status_code == 422, r.text
    assert field_locs(r) == [["body", "started_at"]] and "90 days" in r.text


def test_a_start_ahead_of_the_service_clock_within_the_allowance_is_scored(http_cloud, accounts):
    # The caller's clock runs 60 s ahead (FUTURE_SLACK_S allows 300), more than the trail's
    # clock_skew_s: the audit log cannot have caught up with the episode, so it is pending.
    service = RewardService([TASK], accounts, http_cloud.endpoint,
                            TrailConfig(qps=50, settle_s=0.5, poll_s=0.1, clock_skew_s=5))
    api = TestClient(build_app(service), raise_server_exceptions=False)
    ahead = time.time() + 60
    r = api.post("/v1/score", json=valid_request(accounts[7].account_id, started_at=ahead,
                                                 ended_at=ahead + 1))
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["verdict"], body["trainable"]) == ("undetermined", False)
    assert body["rule_verdict"]["pending"] is True


class RefusingClient:
    """Stands in for an account's SDK client: every call raises ``error``."""

    actiontrail = type("ActionTrail", (), {"lookup_events_with_options": None})()

    def __init__(self, error: CloudAPIError):
        self.error = error

    def call(self, *_args, **_kwargs):
        raise self.error


@pytest.mark.parametrize("code, status, http_status, kind", [
    ("Throttling.User", 400, 503, "cloud_error"),          # retries ran out: come back later
    ("ServiceUnavailable", 503, 503, "cloud_error"),
    ("InternalError", 500, 503, "cloud_error"),
    ("ConnectionError", 0, 503, "cloud_error"),            # no HTTP answer at all
    ("InvalidAccessKeyId.NotFound", 404, 502, "cloud_refused"),
    ("Forbidden.RAM", 403, 502, "cloud_refused"),
    ("InvalidParameter", 400, 502, "cloud_refused"),
])
def test_only_an_outage_is_a_503(accounts, code, status, http_status, kind):
    error = CloudAPIError(code, "refused", status, "req-1", "LookupEvents")
    service = RewardService([TASK], accounts, None,
                            TrailConfig(qps=50, max_retries=0, settle_s=1, poll_s=0.1),
                            client_factory=lambda _account: RefusingClient(error))
    api = TestClient(build_app(service), raise_server_exceptions=False)
    r = api.post("/v1/score", json=valid_request(accounts[0].account_id))
    assert r.status_code == http_status, r.text
    detail = r.json()["detail"]
    assert (detail["error"], detail["action"], detail["code"]) == (kind, "LookupEvents", code)
    assert metric(api.get("/metrics").text, f'consolerl_reward_errors_total{{kind="{kind}"}}') == 1


def test_credentials_the_cloud_refuses_are_a_502_naming_the_account(http_cloud, accounts):
    account = accounts[4]
    service = RewardService(
        [TASK], accounts, http_cloud.endpoint, TrailConfig(qps=50, settle_s=1, poll_s=0.1),
        client_factory=lambda a: CloudClient(CloudConfig(endpoint=http_cloud.endpoint),
                                             Credentials("LTAI5tNoSuchKey0000000", "x" * 30)))
    api = TestClient(build_app(service), raise_server_exceptions=False)
    r = api.post("/v1/score", json=valid_request(account.account_id))
    assert r.status_code == 502, r.text
    detail = r.json()["detail"]
    assert (detail["error"], detail["action"]) == ("cloud_refused", "LookupEvents")
    assert 400 <= detail["status"] < 500 and account.account_id in detail["message"]
    assert "retrying will not help" in detail["message"]
    for secret in (account.password, account.access_key_secret, "x" * 30):
        assert secret not in r.text
