"""Fuzzing of the reward API, in process over ASGI: every operation of its OpenAPI document
(schemathesis), hostile but well-typed score requests whose rules run against a real
``python -m infra.console_sim`` process of this module's own, bodies JSON parsers choke on, and
a huge body. The properties and the counts: :mod:`tests.integration.fuzz_kit`."""
from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from consolerl.tasks import TASKS_DIR, load_suite
from reward_service.actiontrail import TrailConfig
from reward_service.service import RewardService, build_app as build_reward_app
from tests.integration.fuzz_kit import (REQUEST_S, Tally, anychar, fuzz, huge, schema_cases,
                                        text, values)
from tests.integration.fuzz_kit import fuzz_cloud  # noqa: F401 - the fixture

pytestmark = pytest.mark.timeout(240)


TASKS = load_suite(TASKS_DIR)


@pytest.fixture
def reward_app(fuzz_cloud, accounts):
    """A fresh app per test: a test client that ran the app's lifespan has shut its pool."""
    service = RewardService(TASKS, accounts, fuzz_cloud.endpoint,
                            TrailConfig(qps=50, settle_s=0.1, poll_s=0.05, clock_skew_s=5))
    return build_reward_app(service, max_concurrent_scores=4)



@pytest.mark.parametrize("n", [60])
def test_reward_api_schema(reward_app, n):
    """60 examples per operation (POST /v1/score, GET /metrics, GET /healthz)."""
    with schema_cases(reward_app, n, "reward_api_schema") as tally:
        assert tally.operations >= 3


def _placeholders(task) -> list[str]:
    return sorted(task.success.placeholders())


@pytest.mark.parametrize("n", [60])
def test_reward_api_hostile_scores(reward_app, accounts, n):
    """60 examples: score requests that pass the document (a real task and account, a recent
    window) with hostile placeholder values, actions, pages and answers; the rule runs
    against the cloud. A verdict, or a 422 naming the field: hostile values are the
    caller's, never the service's 5xx."""
    from fastapi.testclient import TestClient
    client = TestClient(reward_app, raise_server_exceptions=False)
    with Tally("reward_api_hostile") as tally:
        @fuzz(n)
        @given(task=st.sampled_from(TASKS), account=st.sampled_from(accounts[2:]),
               data=st.data(), ago=st.floats(0, 3600),
               env_error=st.one_of(st.none(), st.none(), st.none(), text.filter(bool)),
               actions=st.lists(values, max_size=5), page=st.one_of(text, huge),
               answer=st.one_of(st.none(), text))
        def run(task, account, data, ago, env_error, actions, page, answer):
            names = _placeholders(task)
            chosen = data.draw(st.dictionaries(st.sampled_from(names) if names else text,
                                               st.text(anychar, max_size=80) | st.sampled_from(
                                                   ["", "..", "i-x", "%", "*"]),
                                               max_size=len(names) + 1))
            now = time.time()
            body = {"task_id": task.id, "account_id": account.account_id,
                    "started_at": now - ago, "ended_at": now,
                    "values": {**{k: "x" for k in names}, **chosen},
                    "actions": actions, "final_observation": page, "answer": answer,
                    "env_error": env_error}
            started = time.perf_counter()
            response = client.post("/v1/score", json=body)
            tally.check(response.status_code, time.perf_counter() - started,
                        (task.id, body["values"]))
            assert response.status_code in (200, 422), response.text[:500]
        run()


@pytest.mark.parametrize("body", [
    b"[" * 100_000, b'{"task_id":' + b"[" * 900 + b"]" * 900 + b"}",
    b'{"started_at": ' + b"1" * 5000 + b"}", b'{"started_at": NaN, "ended_at": Infinity}',
    b'{"values": {"' + b"k" * 100_000 + b'": "v"}}', b"\xff\xfe", b"", b"null", b"1e999999",
    b'{"task_id": "\\ud800"}', b'{"task_id": "a", "task_id": "b"}'],
    ids=["deep", "nested-field", "huge-int", "nan", "huge-key", "not-utf8", "empty", "null",
         "huge-float", "surrogate", "duplicate"])
def test_reward_api_raw_bodies(reward_app, body):
    """Bodies JSON parsers choke on: a 4xx, in time, with a short answer."""
    from fastapi.testclient import TestClient
    client = TestClient(reward_app, raise_server_exceptions=False)
    started = time.perf_counter()
    response = client.post("/v1/score", content=body,
                           headers={"content-type": "application/json"})
    assert time.perf_counter() - started < REQUEST_S
    assert 400 <= response.status_code < 500, response.text[:300]
    assert len(response.content) < 5000, len(response.content)


def test_reward_api_refuses_a_huge_body_unread(reward_app):
    """A 64 MiB body (ten times the largest valid request: 500 actions of 10,000 characters
    and a 200,000-character page) is a 413, not parsed into memory first."""
    from fastapi.testclient import TestClient
    client = TestClient(reward_app, raise_server_exceptions=False)
    body = b'{"final_observation": "' + b"x" * (64 << 20) + b'"}'
    assert client.post("/v1/score", content=body,
                       headers={"content-type": "application/json"}).status_code == 413

