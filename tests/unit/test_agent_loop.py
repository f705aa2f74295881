"""The agent loop with a fake policy, a fake tokenizer and a fake env: prompts, history bound,
end reasons, and token fidelity (the trainer gets exactly the sampled ids)."""
from __future__ import annotations

from collections.abc import Sequence

import pytest

from consolerl.errors import ConfigError
from consolerl.types import EnvError, Observation, StepResult
from env_workers.actions import parse_action
from rollout_service.agent import AgentConfig, AgentLoop, Generation, SamplingParams
from tests.conftest import run_async

MERGES = {"cl": 300, "ck": 301, "op": 302}        # a tiny BPE: greedy merges on encode


class ByteTokenizer:
    """Bytes, plus a few merged pairs the encoder always prefers. The policy may sample the
    unmerged bytes instead: decode-then-encode then gives other ids."""

    eos = 256

    def encode(self, text: str) -> list[int]:
        data, ids, i = text.encode(), [], 0
        while i < len(data):
            pair = data[i:i + 2].decode(errors="ignore")
            if pair in MERGES:
                ids.append(MERGES[pair])
                i += 2
            else:
                ids.append(data[i])
                i += 1
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        rev = {v: k for k, v in MERGES.items()}
        out = b""
        for t in ids:
            if t == self.eos:
                continue
            out += rev[t].encode() if t in rev else bytes([t])
        return out.decode()

    def apply_chat_template(self, messages, *, tokenize=True, add_generation_prompt=True):
        text = "".join(f"<{m['role']}>{m['content']}\n" for m in messages)
        return self.encode(text + ("<assistant>" if add_generation_prompt else ""))


class ScriptedPolicy:
    """Samples the given outputs as raw bytes (never merged), logprob -0.5 each, version 7."""

    def __init__(self, outputs: list[str]):
        self.outputs = list(outputs)
        self.prompts: list[list[int]] = []
        self.sampling: list[SamplingParams] = []

    async def generate(self, prompt_ids, sampling, session=""):
        self.prompts.append(list(prompt_ids))
        self.sampling.append(sampling)
        text = self.outputs.pop(0)
        ids = tuple(text.encode()) + (ByteTokenizer.eos,)
        return Generation(ids, tuple(-0.5 for _ in ids), 7)


class FakeEnv:
    """Parses like the env worker; ``stop``/``report_infeasible`` end the episode."""

    def __init__(self, fail_at: int | None = None):
        self.steps = 0
        self.fail_at = fail_at
        self.seen: list[str] = []

    async def step(self, text: str) -> StepResult:
        self.steps += 1
        self.seen.append(text)
        obs = Observation(f"http://console/page{self.steps}", "Page", f"[{self.steps}] button "
                          f'"Next {self.steps}"', step=self.steps)
        if self.fail_at == self.steps:
            return StepResult(obs, done=True, env_error=EnvError("browser_crashed", "gone"))
        action = parse_action(text)
        if not hasattr(action, "to_text"):
            return StepResult(Observation(obs.url, obs.title, obs.text,
                                          last_action_error=str(action), step=self.steps))
        name = action.to_text().split("(")[0]
        return StepResult(obs, done=name in ("stop", "report_infeasible"),
                          answer=getattr(action, "answer", None) if name == "stop" else None,
                          infeasible=getattr(action, "reason", None)
                          if name == "report_infeasible" else None,
                          action_text=action.to_text())


START = Observation("http://console/start", "Start", '[1] button "Create"')


def run(outputs, config=None, env=None, **kw):
    policy = ScriptedPolicy(outputs)
    env = env or FakeEnv()
    loop = AgentLoop(policy, ByteTokenizer(), config or AgentConfig(max_prompt_tokens=4000))
    traj = run_async(loop.run("t-1", "Create a user", "1. Click Create.\n2. Stop.", START,
                                env.step, **kw))
    return traj, policy, env


def test_tokens_are_exactly_the_sampled_ones():
    traj, policy, _ = run(["I click.\nclick(1)", 'stop("done")'])
    assert traj.end_reason == "stop" and traj.answer == "done"
    tok = ByteTokenizer()
    first = traj.turns[0]
    sampled = tuple("I click.\nclick(1)".encode()) + (tok.eos,)
    assert first.response_ids == sampled
    assert first.logprobs == tuple(-0.5 for _ in sampled)
    assert first.loss_mask == (1,) * len(sampled)
    assert first.prompt_ids == tuple(policy.prompts[0])
    assert first.version == 7 and traj.versions == (7,)
    # The test can fail: re-encoding the decoded text merges "cl" and gives other ids.
    assert tuple(tok.encode(tok.decode(first.response_ids))) != first.response_ids[:-1]
    assert first.action_text == "click(1)"


def test_invalid_actions_are_turns_with_the_error_and_appear_in_history():
    traj, policy, env = run(["clack the button", 'stop("ok")'])
    assert traj.turns[0].action_text == "" and traj.turns[0].action_error
    second_prompt = ByteTokenizer().decode(policy.prompts[1])
    assert "LAST ACTION ERROR" in second_prompt and "clack the button" in second_prompt


def test_history_is_bounded():
    outputs = ["scroll(\"down\")" for _ in range(6)] + ['stop("x")']
    traj, policy, _ = run(outputs, AgentConfig(history_turns=2, max_prompt_tokens=4000))
    last_prompt = ByteTokenizer().decode(policy.prompts[-1])
    assert last_prompt.count('- scroll("down")') == 2
    assert len(traj.turns) == 7


@pytest.mark.parametrize("outputs,config,env,end", [
    (['report_infeasible("no such button")'], None, None, "report_infeasible"),
    (['scroll("down")'] * 3, AgentConfig(max_steps=3, max_prompt_tokens=4000), None,
     "max_steps"),
    (['scroll("down")'] * 3, None, FakeEnv(fail_at=2), "env_error"),
    (['scroll("down")'] * 9, AgentConfig(max_prompt_tokens=4000, max_episode_tokens=1500),
     None, "token_limit"),
])
def test_end_reasons(outputs, config, env, end):
    traj, _, _ = run(outputs, config, env)
    assert traj.end_reason == end
    if end == "report_infeasible":
        assert traj.infeasible == "no such button"
    if end == "env_error":
        assert traj.env_error.kind == "browser_crashed"


def test_a_long_page_is_cut_to_fit_the_prompt():
    huge = Observation("http://console/x", "X", "row " * 5000)
    policy = ScriptedPolicy(['stop("x")'])
    loop = AgentLoop(policy, ByteTokenizer(), AgentConfig(max_prompt_tokens=3000,
                                                          max_observation_chars=16000))
    traj = run_async(loop.run("t", "T", "1. Go.", huge, FakeEnv().step))
    assert len(policy.prompts[0]) <= 3000 and traj.end_reason == "stop"
    assert "more characters of the page omitted" in ByteTokenizer().decode(policy.prompts[0])


def test_seeds_make_sampling_reproducible_per_turn():
    _, policy, _ = run(['scroll("up")', 'stop("x")'], seed=5)
    assert [s.seed for s in policy.sampling] == [5000, 5001]


@pytest.mark.parametrize("kwargs", [dict(max_steps=0), dict(top_p=0), dict(temperature=-1),
                                    dict(min_observation_chars=9000)])
def test_bad_config_is_refused(kwargs):
    with pytest.raises(ConfigError, match="AgentConfig"):
        AgentConfig(**kwargs)
