"""The transformers PolicyServer with a tiny random model (the default model's tokenizer):
sampling with log-probs and versions, in-place weight updates, routing, the agent loop on real
tokens, and the Ray actor."""
from __future__ import annotations

import asyncio

import pytest

torch = pytest.importorskip("torch")

from rollout_service.agent import AgentConfig, AgentLoop, SamplingParams  # noqa: E402
from rollout_service.models import HFChatTokenizer, tiny_model  # noqa: E402
from rollout_service.policy import (PolicyConfig, PolicyRouter, PolicyServer,  # noqa: E402
                                    TransformersEngine)
from consolerl.types import Observation, StepResult  # noqa: E402
from tests.conftest import run_async  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def engine(tiny):
    return TransformersEngine(tiny)


def test_generate_returns_ids_logprobs_and_version(engine, tiny):
    tok = HFChatTokenizer(tiny)
    prompt = tok.apply_chat_template([{"role": "user", "content": "click(3)"}])
    a = engine.generate(prompt, SamplingParams(12, 1.0, 1.0, seed=3))
    b = engine.generate(prompt, SamplingParams(12, 1.0, 1.0, seed=3))
    assert a == b                                  # seeded: reproducible
    assert 1 <= len(a.token_ids) == len(a.logprobs) <= 12
    assert all(lp <= 0 for lp in a.logprobs) and a.version == 0
    # The log-probs are the model's: recompute them with a forward pass.
    ids = torch.tensor([prompt + list(a.token_ids)])
    with torch.no_grad():
        logits = engine.model(input_ids=ids).logits[0].float()
    logp = torch.log_softmax(logits, -1)
    for i, (t, lp) in enumerate(zip(a.token_ids, a.logprobs)):
        assert abs(float(logp[len(prompt) - 1 + i, t]) - lp) < 1e-3
    greedy = engine.generate(prompt, SamplingParams(5, 0.0))
    assert greedy.token_ids == engine.generate(prompt, SamplingParams(5, 0.0)).token_ids


def test_update_weights_in_place_changes_the_next_generation(tiny):
    engine = TransformersEngine(tiny)
    prompt = [1, 2, 3, 4]
    before = engine.generate(prompt, SamplingParams(8, 0.0))
    perturbed = {k: v + 0.5 * torch.randn_like(v) for k, v in engine.model.state_dict().items()}
    seconds = engine.update_weights(5, perturbed)
    after = engine.generate(prompt, SamplingParams(8, 0.0))
    assert seconds >= 0 and after.version == 5 and before.version == 0
    assert after.logprobs != before.logprobs
    with pytest.raises(ValueError, match="unexpected"):
        engine.update_weights(6, {**perturbed, "extra.weight": torch.zeros(1)})
    assert engine.version == 5


def test_router_is_sticky_per_session_and_least_loaded(engine):
    servers = [PolicyServer(PolicyConfig(), engine=engine, name=f"p{i}") for i in range(2)]
    router = PolicyRouter(servers)

    async def go():
        return await asyncio.gather(*(router.generate([1, 2, 3], SamplingParams(2, 1.0),
                                                      session=f"s{i % 2}") for i in range(6)))
    gens = run_async(go())
    assert len(gens) == 6 and router.sticky.keys() == {"s0", "s1"}
    assert router.sticky["s0"] != router.sticky["s1"]
    assert router.load == [0, 0]
    text = run_async(servers[0].metrics()).decode()
    assert "consolerl_policy_generated_tokens_total" in text


def test_the_agent_loop_on_real_tokens(engine, tiny):
    tok = HFChatTokenizer(tiny)
    server = PolicyServer(PolicyConfig(), engine=engine)
    steps = []

    async def step(text):
        steps.append(text)
        return StepResult(Observation("http://c/x", "X", '[3] button "OK"',
                                      last_action_error="not an action", step=len(steps)))
    loop = AgentLoop(PolicyRouter([server]), tok, AgentConfig(max_steps=2, max_new_tokens=8,
                                              max_prompt_tokens=2048))
    traj = run_async(loop.run("t", "Title", "1. Do.", Observation("http://c", "C", "x"),
                                step, seed=1))
    assert traj.end_reason == "max_steps" and len(traj.turns) == 2
    for turn in traj.turns:
        assert tok.decode(turn.response_ids) == turn.response_text
        assert len(turn.response_ids) == len(turn.logprobs) == len(turn.loss_mask)
    assert steps == [t.response_text for t in traj.turns]


def test_the_openai_compatible_endpoint(engine, tiny):
    import threading

    import uvicorn
    from fastapi.testclient import TestClient

    from infra.local_cloud import free_port
    from tests.conftest import wait_for

    from infra.llm import OpenAIChatClient
    from rollout_service.chat_api import build_api

    router = PolicyRouter([PolicyServer(PolicyConfig(), engine=engine)])
    api = TestClient(build_api(router, HFChatTokenizer(tiny), "tiny", max_prompt_tokens=200))
    r = api.post("/v1/chat/completions", json={
        "model": "tiny", "messages": [{"role": "user", "content": "Judge this."}],
        "max_tokens": 5, "seed": 1})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert 1 <= body["usage"]["completion_tokens"] <= 5
    assert body["consolerl"]["weight_version"] == engine.version
    for payload, status, fragment in [
        ({"messages": []}, 422, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, 422, "role"),
        ({"messages": [{"role": "user", "content": "x"}], "temperature": -1}, 422,
         "temperature"),
        ({"messages": [{"role": "user", "content": "x" * 5000}]}, 400, "limit is 200"),
    ]:
        r = api.post("/v1/chat/completions", json=payload)
        assert r.status_code == status and fragment in r.text, r.text
    assert "consolerl_policy_api_requests_total" in api.get("/metrics").text

    # The judges' own OpenAI client talks to it over HTTP.
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(api.app, host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, timeout=20)
        client = OpenAIChatClient(f"http://127.0.0.1:{port}", "tiny", api_key_env=None,
                                  max_tokens=4)
        reply = client.complete([{"role": "user", "content": "Say success."}])
        assert isinstance(reply, str)
    finally:
        server.should_exit = True
        thread.join(10)
