"""Every JSON field that takes a float refuses NaN and Infinity with a 422 naming the field
(Python's JSON parser accepts both literals, and NaN slips past range checks: NaN < 0 and
NaN > 5 are both false). One test per request model of the HTTP APIs: the policy API, the
reward API, the jobs API."""
from __future__ import annotations

import math

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from reward_service.service import ScoreRequest
from rollout_service.chat_api import ChatRequest, build_api
from jobsapi.schema import JobCreate, Sampling

NON_FINITE = [math.nan, math.inf, -math.inf]
MESSAGES = [{"role": "user", "content": "hi"}]


def _field_errors(model, data) -> list[tuple]:
    with pytest.raises(ValidationError) as info:
        model.model_validate(data)
    return [e["loc"] for e in info.value.errors()]


@pytest.mark.parametrize("value", NON_FINITE)
@pytest.mark.parametrize("field", ["temperature", "top_p"])
def test_policy_api_sampling(field, value):
    assert (field,) in _field_errors(ChatRequest, {"messages": MESSAGES, field: value})


@pytest.mark.parametrize("value", NON_FINITE)
@pytest.mark.parametrize("field", ["started_at", "ended_at"])
def test_reward_api_times(field, value):
    data = {"task_id": "ram-create-user-0", "account_id": "1000000001",
            "started_at": 1.7e9, "ended_at": 1.7e9 + 5, field: value}
    assert (field,) in _field_errors(ScoreRequest, data)


@pytest.mark.parametrize("value", NON_FINITE)
def test_jobs_api_floats(value):
    assert ("temperature",) in _field_errors(Sampling, {"temperature": value})
    job = {"tasks": {"ids": ["ram-create-user-0"]}, "deadline_s": value}
    assert ("deadline_s",) in _field_errors(JobCreate, job)


def test_policy_api_answers_422_for_a_nan_literal():
    class Never:
        async def generate(self, *_args):          # never reached: validation comes first
            raise AssertionError("generate called")

    class Tokenizer:
        def apply_chat_template(self, _messages):
            raise AssertionError("tokenised")

    client = TestClient(build_api(Never(), Tokenizer(), "m"))
    body = '{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}'
    r = client.post("/v1/chat/completions", content=body,
                    headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["body", "temperature"]


def test_a_422_does_not_echo_the_input():
    """A 422 names the field; it does not send a megabyte of the caller's input back."""
    client = TestClient(build_api(None, None, "m"))
    huge = "x" * 1_000_000
    r = client.post("/v1/chat/completions",
                    json={"messages": [{"role": "user", "content": huge}]})
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["body", "messages", 0, "content"]
    assert len(r.content) < 2_000


def test_an_oversized_request_is_refused_before_tokenising():
    """Within every field limit, 200 messages could carry 40 MB; a request that cannot fit the
    token limit is refused from its size alone, without tokenising it."""
    class Tokenizer:
        calls = 0

        def apply_chat_template(self, _messages):
            Tokenizer.calls += 1
            raise AssertionError("tokenised")

    client = TestClient(build_api(None, Tokenizer(), "m", max_prompt_tokens=1000))
    messages = [{"role": "user", "content": "x" * 20_000}] * 2          # 40,000 > 32,000
    r = client.post("/v1/chat/completions", json={"messages": messages})
    assert r.status_code == 400 and "40000 characters" in r.json()["detail"]
    assert Tokenizer.calls == 0
