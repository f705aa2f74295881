"""Judges under structured output: the vote's JSON schema (one, :data:`VOTE_SCHEMA`, also what
the parser accepts) travels as ``response_format`` from the judge channel through the OpenAI
client, the project's chat API and the vLLM engine's sampling; ``structured: false`` falls
back to free text; a reply that is not a vote stays an invalid vote either way. No vLLM runs
here (one test builds vLLM's own SamplingParams in ``.venv-vllm`` where it exists)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import httpx
import jsonschema
import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from benchmarks.reward_validate import Scored, report
from cluster import judges as cluster_judges
from cluster.config import JobConfig
from cluster.judges import JudgeSection, judge_config, serves_structured, start_judges
from consolerl.config import load_config
from consolerl.tasks import TASKS_DIR, load_suite
from infra.llm import OpenAIChatClient
from reward_service.judges import (REASON_MAX_CHARS, RESPONSE_FORMAT, VOTE_MAX_CHARS,
                                   VOTE_SCHEMA, JudgeChannel, JudgeConfig, parse_vote)
from rollout_service.agent import Generation, SamplingParams
from rollout_service.chat_api import build_api
from rollout_service.policy import PolicyConfig, TransformersEngine
from rollout_service.vllm_engine import VllmEngine
from rollout_service.vllm_server import sampling_params

ROOT = Path(__file__).resolve().parents[2]
VOTE = '{"verdict": "failure", "reason": "the user was never created"}'
EPISODE = ("Create a user", "1. Open Users.\n2. Click Create User.", ["click(3)"],
           "heading Users")


def judge_over(handler, config: JudgeConfig) -> tuple[JudgeChannel, list[dict]]:
    """A one-judge channel whose OpenAI client posts to ``handler`` (bodies recorded)."""
    bodies: list[dict] = []

    def record(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return handler(request)

    client = OpenAIChatClient("http://judge.test/v1", "m", api_key_env=None,
                              transport=httpx.MockTransport(record))
    return JudgeChannel([client], config, registry=CollectorRegistry()), bodies


def answer(text: str):
    return lambda _request: httpx.Response(200, json={
        "choices": [{"message": {"role": "assistant", "content": text}}]})


def test_the_request_carries_the_votes_schema():
    channel, bodies = judge_over(answer(VOTE), JudgeConfig(k=1))
    verdict = channel.judge(*EPISODE)
    assert verdict.verdict == "failure"
    assert verdict.votes[0].reason == "the user was never created"
    (body,) = bodies
    assert body["response_format"] == RESPONSE_FORMAT
    assert body["response_format"]["type"] == "json_schema"
    assert body["response_format"]["json_schema"]["schema"] == VOTE_SCHEMA
    assert body["messages"][-1]["content"].endswith('"verdict": "success" or "failure"}')


def test_free_text_when_structured_is_off():
    channel, bodies = judge_over(answer(f"Looks unfinished.\n{VOTE}"),
                                 JudgeConfig(k=1, structured=False))
    assert channel.judge(*EPISODE).verdict == "failure"
    assert "response_format" not in bodies[0]
    assert set(bodies[0]) == {"model", "messages", "temperature", "max_tokens"}


def test_clients_without_response_format_still_vote():
    class Plain:                                 # a ChatClient that takes messages only
        def complete(self, messages):
            return VOTE

    assert JudgeChannel([Plain()], JudgeConfig(k=1)).judge(*EPISODE).verdict == "failure"


@pytest.mark.parametrize("reply,why", [
    ('{"verdict": "success", "reason": "the user was cr', "does not end with a JSON object"),
    ('{"verdict": "succ', "does not end with a JSON object"),
    ("", "does not end with a JSON object"),
    ('{"verdict": "maybe", "reason": "unsure"}', "verdict must be"),
    ('{"verdict": "success", "reason": ""}', "reason must be a non-empty string"),
    ('{"verdict": "success"}', "reason must be a non-empty string"),
])
def test_structured_replies_that_are_not_votes_stay_invalid(reply, why):
    """Structured output cut by max_tokens (or a server that ignored the schema) is counted
    as today: an invalid vote, an ``invalid_reply`` call, no verdict."""
    channel, bodies = judge_over(answer(reply), JudgeConfig(k=1))
    verdict = channel.judge(*EPISODE)
    assert "response_format" in bodies[0]
    assert verdict.verdict == "undetermined"
    assert verdict.votes[0].verdict == "invalid" and why in verdict.votes[0].reason
    calls = channel.metrics.calls
    assert calls.labels("invalid_reply")._value.get() == 1
    assert calls.labels("ok")._value.get() == 0


@pytest.mark.parametrize("obj", [
    {"verdict": "success", "reason": "done"}, {"verdict": "failure", "reason": "x"},
    {"verdict": "success"}, {"reason": "x"}, {"verdict": "yes", "reason": "x"},
    {"verdict": "failure", "reason": ""}, {"verdict": "failure", "reason": 3},
    {"verdict": ["success"], "reason": "x"},
])
def test_the_parser_accepts_what_the_schema_allows(obj):
    try:
        jsonschema.validate(obj, VOTE_SCHEMA)
        allowed = True
    except jsonschema.ValidationError:
        allowed = False
    assert (parse_vote("j", json.dumps(obj)).verdict != "invalid") == allowed


# ---- the project's chat API -------------------------------------------------------------------
class Router:
    """Records the sampling the API asks for; answers with one token."""

    def __init__(self):
        self.sampling: list[SamplingParams] = []

    async def generate(self, prompt, sampling):
        self.sampling.append(sampling)
        return Generation((7,), (0.0,), 3, "stop")


class Tokenizer:
    def apply_chat_template(self, messages):
        return [1, 2, 3]

    def decode(self, ids, skip_special_tokens=True):
        return VOTE


def chat(structured_outputs: bool) -> tuple[TestClient, Router]:
    router = Router()
    return TestClient(build_api(router, Tokenizer(), "judge",
                                structured_outputs=structured_outputs)), router


def post(client: TestClient, **extra) -> httpx.Response:
    return client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "judge this"}], "max_tokens": 32, **extra})


def test_chat_api_passes_the_schema_to_the_engine():
    client, router = chat(True)
    r = post(client, response_format=RESPONSE_FORMAT, temperature=0.5)
    assert r.status_code == 200, r.text
    (sampling,) = router.sampling
    assert json.loads(sampling.json_schema) == VOTE_SCHEMA
    assert (sampling.max_tokens, sampling.temperature) == (32, 0.5)
    # text, or no response_format: plain sampling.
    assert post(client, response_format={"type": "text"}).status_code == 200
    assert post(client).status_code == 200
    assert [type(s) for s in router.sampling[1:]] == [SamplingParams, SamplingParams]


def test_chat_api_without_structured_engine_refuses_json_schema():
    client, router = chat(False)
    r = post(client, response_format=RESPONSE_FORMAT)
    assert r.status_code == 400
    assert r.json()["detail"].startswith("response_format: json_schema is not supported")
    assert router.sampling == []
    assert post(client, response_format={"type": "text"}).status_code == 200


@pytest.mark.parametrize("fmt,named", [
    ({"type": "json_object"}, "response_format.type"),
    ({"type": "regex"}, "response_format.type"),
    ({"type": "json_schema"}, "response_format.json_schema"),
])
def test_chat_api_refuses_other_formats_naming_the_field(fmt, named):
    client, router = chat(True)
    r = post(client, response_format=fmt)
    assert r.status_code == 400 and r.json()["detail"].startswith(named)
    assert router.sampling == []


def test_chat_api_refuses_a_malformed_json_schema_with_422():
    client, _ = chat(True)
    r = post(client, response_format={"type": "json_schema", "json_schema": {"name": "v"}})
    assert r.status_code == 422 and "response_format" in r.text


def test_judge_channel_through_the_chat_api():
    """The whole HTTP path: channel -> OpenAI client -> chat API -> engine sampling."""
    api, router = chat(True)

    def forward(request: httpx.Request) -> httpx.Response:
        r = api.post("/v1/chat/completions", content=request.content,
                     headers={"content-type": "application/json"})
        return httpx.Response(r.status_code, content=r.content,
                              headers={"content-type": "application/json"})

    channel, _ = judge_over(forward, JudgeConfig(k=3, consensus="majority"))
    assert channel.judge(*EPISODE).verdict == "failure"
    assert len(router.sampling) == 3
    assert all(json.loads(s.json_schema) == VOTE_SCHEMA for s in router.sampling)


# ---- the engines ------------------------------------------------------------------------------
def test_vllm_engine_sends_the_schema():
    engine = VllmEngine.__new__(VllmEngine)       # no vLLM process: the request is captured
    engine.busy_s, engine._in_flight = 0.0, 0
    engine._busy_lock = __import__("threading").Lock()
    sent: list[dict] = []

    def request(kind, prompt, s):
        sent.append(s)
        return {"token_ids": [5], "logprobs": [0.0], "version": 0, "finish_reason": "stop"}

    engine._request = request
    schema = json.dumps(VOTE_SCHEMA)
    engine.generate([1, 2], SamplingParams(16, 0.0, json_schema=schema))
    engine.generate([1, 2], SamplingParams(16, 0.0))
    assert sent[0]["json_schema"] == schema
    assert "json_schema" not in sent[1]


def test_the_longest_constrained_vote_fits_its_budget_and_parses():
    reason = VOTE_SCHEMA["properties"]["reason"]
    pattern = re.compile(reason["pattern"])
    longest = "~" * REASON_MAX_CHARS
    assert pattern.match(longest) and not pattern.match(longest + "~")
    # No quote, backslash or control character: nothing a reply would have to escape.
    for bad in ('say "done"', "a\\b", "line\nbreak", "caf\u00e9", ""):
        assert not pattern.match(bad), bad
    reply = json.dumps({"verdict": "failure", "reason": longest}, separators=(", ", ": "))
    assert len(reply) <= VOTE_MAX_CHARS
    assert parse_vote("j", reply).verdict == "failure"


class FakeStructured:
    def __init__(self, json=None, disable_any_whitespace=False):
        self.json = json
        self.disable_any_whitespace = disable_any_whitespace


class FakeSampling:
    def __init__(self, **kwargs):
        self.kwargs = kwargs


def test_vllm_sampling_params_carry_structured_outputs():
    schema = json.dumps(VOTE_SCHEMA)
    s = {"max_tokens": 16, "temperature": 0.0, "top_p": 1.0, "seed": 4}
    params = sampling_params({**s, "json_schema": schema}, (FakeSampling, FakeStructured))
    assert params.kwargs["structured_outputs"].json == schema
    # No free whitespace: a constrained reply's length is bounded by the schema.
    assert params.kwargs["structured_outputs"].disable_any_whitespace is True
    assert (params.kwargs["max_tokens"], params.kwargs["seed"]) == (16, 4)
    assert sampling_params(s, (FakeSampling, FakeStructured)).kwargs["structured_outputs"] \
        is None


@pytest.mark.slow
def test_vllms_own_sampling_params_take_the_schema():
    """With vLLM's classes (``.venv-vllm``; about 20 s to import vLLM)."""
    python = ROOT / ".venv-vllm" / "bin" / "python"
    if not python.exists():
        pytest.skip(".venv-vllm is not installed")
    code = ("import json, sys\nfrom rollout_service.vllm_server import sampling_params\n"
            "p = sampling_params({'max_tokens': 8, 'temperature': 0.0, 'json_schema': "
            "sys.argv[1]})\nimport xgrammar\ng = str(xgrammar.Grammar.from_json_schema("
            "sys.argv[1], any_whitespace=False))\n"
            "print(json.dumps([type(p).__module__, p.structured_outputs.json, "
            "p.max_tokens, p.structured_outputs.disable_any_whitespace, g]))\n")
    out = subprocess.run([str(python), "-c", code, json.dumps(VOTE_SCHEMA)], cwd=ROOT,
                         capture_output=True, text=True, timeout=180, check=True)
    module, schema, max_tokens, no_space, grammar = json.loads(
        out.stdout.strip().splitlines()[-1])
    assert module == "vllm.sampling_params" and max_tokens == 8 and no_space is True
    assert json.loads(schema) == VOTE_SCHEMA
    # vLLM's grammar backend keeps the reason's bound (the pattern carries the length; with
    # a pattern, maxLength alone would be dropped).
    assert f"{{1,{REASON_MAX_CHARS}}}" in grammar


def test_transformers_engine_refuses_a_schema():
    engine = TransformersEngine.__new__(TransformersEngine)    # no model needed to refuse
    engine._torch = None
    with pytest.raises(ValueError, match="json_schema"):
        engine.generate([1], SamplingParams(8, json_schema=json.dumps(VOTE_SCHEMA)))


# ---- the composition root and the benchmark ---------------------------------------------------
def test_a_served_judge_without_vllm_answers_free_text(monkeypatch):
    assert serves_structured(PolicyConfig(backend="vllm"))
    assert not serves_structured(PolicyConfig(backend="transformers"))
    monkeypatch.setattr(cluster_judges, "serve_judge",
                        lambda *a, **k: ("http://127.0.0.1:9", "judge", lambda: None))
    section = JudgeSection(enabled=True, endpoint="policy:tiny")
    assert section.structured
    off = load_config(JobConfig, None, ["reward.judges.structured=false"]).reward.judges
    assert not off.structured and not judge_config(off).structured
    channel, _ = start_judges(section, PolicyConfig(backend="transformers"))
    assert channel is not None and not channel.config.structured
    channel, _ = start_judges(section, PolicyConfig(backend="vllm"))
    assert channel is not None and channel.config.structured


def test_report_counts_valid_votes_and_their_accuracy():
    feasible = "ram-create-user-0"
    tasks = {t.id: t for t in load_suite(TASKS_DIR)}

    def row(label: str, votes: list[str]) -> Scored:
        return Scored(feasible, "x", label, False, "undetermined", "undetermined",
                      "undetermined", "none", 0.0, judge_votes=votes)

    r = report([row("success", ["success: ok", "invalid: reply does not end", "failure: no"]),
                row("failure", ["failure: no", "failure: no", "invalid: cut"]),
                row("failure", [])], tasks)
    assert r["judge_valid_rate"] == round(4 / 6, 4)
    assert r["judge_vote_accuracy"] == 0.75          # 3 of the 4 valid votes match the label
    assert "judge_accuracy" in r and "judge_votes" in r
    none = report([row("success", [])], tasks)
    assert none["judge_valid_rate"] is None and none["judge_vote_accuracy"] is None
