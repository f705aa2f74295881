"""A judge served in the Ray cluster (``reward.judges.endpoint: policy:default``): a
PolicyServer replica of the default model (SmolLM2-135M, transformers on CPU) behind the
project's OpenAI-compatible chat API, called by the judge channel's OpenAI client. The small
model may vote or not; either way every judge's vote (parsed or invalid) comes back within the
episode's deadline and the calls are counted."""
from __future__ import annotations

import time

import httpx
import pytest
import ray
from prometheus_client import CollectorRegistry

from cluster.judges import JudgeSection, serve_judge, start_judges
from rollout_service.policy import PolicyConfig

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster():
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def test_a_policy_judge_votes_within_the_deadline(cluster):
    section = JudgeSection(enabled=True, endpoint="policy:default", k=2, timeout_s=90,
                           deadline_s=120, concurrency=2, retries=1, max_tokens=48,
                           temperatures=(0.0,), structured=False)   # transformers: free text
    registry = CollectorRegistry()
    channel, stop = start_judges(section, PolicyConfig(backend="transformers", device="cpu",
                                                       max_model_len=4096), None, registry)
    try:
        url = channel.clients[0].url.removesuffix("/v1/chat/completions")
        models = httpx.get(f"{url}/v1/models", timeout=10).json()
        assert models["data"][0]["id"] == "SmolLM2-135M-Instruct"
        started = time.monotonic()
        verdict = channel.judge("Create a RAM user", "1. Open RAM.\n2. Click Create User.",
                                ["click('a1')", "fill('a2', \"dev-1\")", "stop(\"done\")"],
                                "[a9] row dev-1", answer="done")
        elapsed = time.monotonic() - started
    finally:
        stop()
    assert elapsed < section.deadline_s + 5, elapsed
    assert len(verdict.votes) == 2
    assert all(v.verdict in ("success", "failure", "invalid") for v in verdict.votes)
    assert verdict.verdict in ("success", "failure", "undetermined")
    outcomes = {o: registry.get_sample_value("consolerl_reward_judge_calls_total",
                                             {"outcome": o}) for o in ("ok", "invalid_reply")}
    # The model answered (a vote or text that is not one): no transport failure, no timeout.
    assert sum(outcomes.values()) == 2, outcomes


def test_serve_judge_for_a_benchmark(cluster):
    url, name, stop = serve_judge("default", max_tokens=16)
    try:
        reply = httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
            "model": name, "messages": [{"role": "user", "content": "Say yes."}],
            "max_tokens": 8, "temperature": 0}).json()
        assert isinstance(reply["choices"][0]["message"]["content"], str)
    finally:
        stop()
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{url}/v1/models", timeout=2)
