"""Fuzzing of the policy API, in process over ASGI: every operation of its OpenAPI document
(schemathesis), and the chat template of any message text.

The policy API runs on its real tokenizer (the default model's: the chat template is part of
the surface) with a fake engine: the tiny random model would generate up to ``max_tokens`` =
8,192 tokens per request, too slow for a fuzz test. The properties and the counts:
:mod:`tests.integration.fuzz_kit`."""
from __future__ import annotations

import time

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tests.integration.fuzz_kit import Tally, fuzz, schema_cases

pytestmark = pytest.mark.timeout(240)


class FakeEngine:
    """Echoes the prompt's last few ids (at most ``max_tokens``, at most 4): real ids of the
    real tokenizer, no model."""

    version = 0
    busy_s = 0.0

    def generate(self, prompt_ids, sampling):
        from rollout_service.agent import Generation
        ids = tuple(prompt_ids[-min(sampling.max_tokens, 4):])
        return Generation(ids, tuple(-1.0 for _ in ids), self.version, "length")

    def update_weights(self, version, state_dict):
        return 0.0


@pytest.fixture(scope="module")
def tokenizer():
    from rollout_service.models import HFChatTokenizer, default_model
    return HFChatTokenizer(default_model(progress=False))


@pytest.fixture(scope="module")
def policy_app(tokenizer):
    from rollout_service.chat_api import build_api
    from rollout_service.policy import PolicyConfig, PolicyRouter, PolicyServer
    router = PolicyRouter([PolicyServer(PolicyConfig(), engine=FakeEngine())])
    return build_api(router, tokenizer, "fuzz", max_prompt_tokens=2048)


@pytest.mark.parametrize("n", [60])
def test_policy_api_schema(policy_app, n):
    """60 examples per operation (POST /v1/chat/completions, GET /v1/models, GET /metrics)."""
    with schema_cases(policy_app, n, "policy_api_schema") as tally:
        assert tally.operations >= 3


CONTROL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_start|>system\n", "<|", "|>",
           "im_end", "\ud800", "\udfff", "\x00", "\ufeff", "\u202e"]


@pytest.mark.parametrize("n", [100])
def test_chat_template_of_any_text(tokenizer, n):
    """100 examples: the chat template of message contents made of control strings, their
    halves, lone surrogates (page text from a browser can hold one) and any text: ids, every
    time, and within the prompt-size bound."""
    with Tally("chat_template") as tally:
        @fuzz(n)
        @given(contents=st.lists(st.lists(st.one_of(st.sampled_from(CONTROL), st.text(
            st.characters(codec=None, exclude_categories=()), max_size=12)), max_size=12).map(
            "".join), min_size=1, max_size=3))
        @example(contents=["\ud800"])
        @example(contents=["<|im_end|>\udfff"])
        def run(contents):
            messages = [{"role": ("user", "assistant", "system")[i % 3], "content": c}
                        for i, c in enumerate(contents)]
            started = time.perf_counter()
            ids = tokenizer.apply_chat_template(messages)
            tally.check(200, time.perf_counter() - started, contents)
            assert ids and all(isinstance(i, int) for i in ids)
        run()
