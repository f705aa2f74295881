"""The LLM-judge channel and the fusion, without network: scripted chat clients stand in for
the judges (canned replies, endpoint errors, slow endpoints)."""
from __future__ import annotations

import json
import pickle
import threading
import time
from collections.abc import Mapping, Sequence

import pytest

from consolerl.errors import ConfigError
from consolerl.types import EnvError
from infra.llm import ChatError
from reward_service.fusion import RewardConfig, fuse, rule_outcome_from
from consolerl.rewards import RewardResult, RuleOutcome
from reward_service.judges import (JudgeChannel, JudgeConfig, consensus, parse_vote,
    render_trajectory)
from consolerl.rewards import JudgeVerdict, JudgeVote
from reward_service.rules import RuleVerdict

S = '{"verdict": "success", "reason": "user created"}'
F = '{"verdict": "failure", "reason": "no user"}'


class Scripted:
    """A ChatClient that answers from a script: a string, or an exception to raise."""

    def __init__(self, reply: str | BaseException, delay_s: float = 0.0):
        self.reply, self.delay_s = reply, delay_s
        self.calls: list[list[dict[str, str]]] = []
        self._lock = threading.Lock()

    def complete(self, messages: Sequence[Mapping[str, str]]) -> str:
        with self._lock:
            self.calls.append([dict(m) for m in messages])
        if self.delay_s:
            time.sleep(self.delay_s)
        if isinstance(self.reply, BaseException):
            raise self.reply
        return self.reply


def _judge(channel: JudgeChannel, **kw) -> JudgeVerdict:
    args = dict(task_title="Create a RAM user", procedure="1. Open RAM.\n2. Create user.",
                actions=["click('a1')", "fill('a2', \"dev-1\")", "stop(\"done\")"],
                final_observation_text="[a9] row dev-1", answer="done", infeasible_reason=None)
    args.update(kw)
    return channel.judge(**args)


# ---- parsing -----------------------------------------------------------------------------------
@pytest.mark.parametrize("reply, verdict, reason_part", [
    (S, "success", "user created"),
    ("I looked at the page.\nThe user exists.\n" + S, "success", "user created"),
    ("Reasoning...\n```json\n" + F + "\n```\n", "failure", "no user"),
    ("```\n" + S + "\n```", "success", "user created"),
    (F + "\nOn reflection:\n" + S, "success", "user created"),                # last one wins
    (S + "\n\n" + F + "   \n", "failure", "no user"),
    ('{"verdict": "success", "reason": "ok", "confidence": 0.9}', "success", "ok"),
    ('{"verdict": "success", "reason": "has {braces} inside", "x": {"y": [1, {}]}}',
     "success", "braces"),
    ("x" * 50_000 + "\n" + S, "success", "user created"),                    # long but allowed
    (S + "\nThat is my verdict.", "invalid", "does not end"),                # prose after
    ('{"verdict": "Success", "reason": "ok"}', "invalid", "verdict must be"),
    ('{"verdict": "pass", "reason": "ok"}', "invalid", "verdict must be"),
    ('{"verdict": "success"}', "invalid", "reason"),
    ('{"verdict": "success", "reason": "  "}', "invalid", "reason"),
    ('{"verdict": "success", "reason": 3}', "invalid", "reason"),
    ("success", "invalid", "does not end"),
    ("", "invalid", "does not end"),
    ('["success"]', "invalid", "does not end"),
    ('{"verdict": "success", "reason": "ok"', "invalid", "does not end"),
    ("{not json}", "invalid", "does not end"),
    ("y" * 70_000 + S, "invalid", "longer than"),                           # huge reply
    ("{" * 20_000 + S + "}", "invalid", "does not end"),                    # pathological
    (None, "invalid", "not text"),
])
def test_parse_vote(reply, verdict, reason_part):
    started = time.monotonic()
    vote = parse_vote("j", reply)
    assert (vote.judge, vote.verdict) == ("j", verdict)
    assert reason_part in vote.reason
    assert time.monotonic() - started < 1.0


def test_parse_vote_truncates_long_reason():
    vote = parse_vote("j", json.dumps({"verdict": "failure", "reason": "r" * 3000}),
                      JudgeConfig(max_reason_chars=100))
    assert vote.verdict == "failure" and len(vote.reason) <= 100
    # the final object must fit in max_json_chars (a judge is asked for one sentence)
    vote = parse_vote("j", json.dumps({"verdict": "failure", "reason": "r" * 5000}))
    assert vote.verdict == "invalid" and "at most 4000 chars" in vote.reason


# ---- consensus ---------------------------------------------------------------------------------
def _votes(*verdicts: str) -> list[JudgeVote]:
    return [JudgeVote(f"j{i}", v, "r") for i, v in enumerate(verdicts)]


@pytest.mark.parametrize("rule, votes, expected", [
    # k = 1 (quorum 1)
    ("unanimous", ["success"], "success"),
    ("unanimous", ["failure"], "failure"),
    ("unanimous", ["invalid"], "undetermined"),
    ("majority", ["success"], "success"),
    # k = 3 (quorum 2)
    ("unanimous", ["success", "success", "success"], "success"),
    ("unanimous", ["success", "success", "invalid"], "success"),
    ("unanimous", ["success", "failure", "success"], "undetermined"),
    ("unanimous", ["success", "invalid", "invalid"], "undetermined"),
    ("unanimous", ["failure", "failure", "invalid"], "failure"),
    ("majority", ["success", "failure", "success"], "success"),
    ("majority", ["failure", "failure", "success"], "failure"),
    ("majority", ["success", "failure", "invalid"], "undetermined"),           # tie
    ("majority", ["success", "invalid", "invalid"], "undetermined"),           # no quorum
    # k = 5 (quorum 3)
    ("unanimous", ["success"] * 5, "success"),
    ("unanimous", ["success", "success", "success", "invalid", "invalid"], "success"),
    ("unanimous", ["success", "success", "invalid", "invalid", "invalid"], "undetermined"),
    ("unanimous", ["success"] * 4 + ["failure"], "undetermined"),
    ("majority", ["success"] * 3 + ["failure"] * 2, "success"),
    ("majority", ["success", "failure", "failure", "invalid", "invalid"], "failure"),
    ("majority", ["success", "success", "failure", "failure", "invalid"], "undetermined"),
    ("majority", ["success", "failure", "invalid", "invalid", "invalid"], "undetermined"),
])
def test_consensus(rule, votes, expected):
    verdict = consensus(_votes(*votes), JudgeConfig(k=len(votes), consensus=rule))
    assert verdict.verdict == expected
    assert len(verdict.votes) == len(votes)
    assert verdict.reason


def test_min_valid_overrides_quorum():
    votes = _votes("success", "invalid", "invalid")
    assert consensus(votes, JudgeConfig(k=3)).verdict == "undetermined"
    assert consensus(votes, JudgeConfig(k=3, min_valid=1)).verdict == "success"


@pytest.mark.parametrize("kw, field", [
    (dict(k=0), "k"), (dict(k=2.0), "k"), (dict(consensus="any"), "consensus"),
    (dict(k=3, min_valid=4), "min_valid"), (dict(system_prompts=()), "system_prompts"),
    (dict(system_prompts=("",)), "system_prompts"), (dict(deadline_s=0), "deadline_s"),
    (dict(max_trajectory_chars=10), "max_trajectory_chars"),
])
def test_judge_config_rejects(kw, field):
    with pytest.raises(ConfigError, match=f"JudgeConfig.{field}"):
        JudgeConfig(**kw)


# ---- the channel -------------------------------------------------------------------------------
@pytest.mark.parametrize("replies, rule, expected", [
    ([S], "unanimous", "success"),
    ([ChatError("HTTP 500")], "unanimous", "undetermined"),
    ([S, S, ChatError("boom")], "unanimous", "success"),
    ([S, F, S], "unanimous", "undetermined"),
    ([S, F, S], "majority", "success"),
    ([S, "no idea", ChatError("down")], "majority", "undetermined"),
    ([F, F, RuntimeError("bug in client"), "garbage", S], "majority", "failure"),
    ([F, RuntimeError("bug in client"), "garbage", S, ChatError("x")], "majority",
     "undetermined"),
    ([F, F, F, ChatError("x"), "garbage"], "unanimous", "failure"),
    ([S, S, F, TimeoutError(), S], "majority", "success"),
])
def test_channel_verdicts(replies, rule, expected):
    clients = [Scripted(r) for r in replies]
    verdict = _judge(JudgeChannel(clients, JudgeConfig(k=len(clients), consensus=rule)))
    assert verdict.verdict == expected
    assert [v.judge for v in verdict.votes] == [f"judge-{i}" for i in range(len(clients))]
    for reply, vote in zip(replies, verdict.votes):
        if isinstance(reply, BaseException):
            assert vote.verdict == "invalid" and "error" in vote.reason
    assert all(len(c.calls) == 1 for c in clients)


def test_judges_get_distinct_prompts_and_one_client_serves_k():
    client = Scripted(S)
    verdict = _judge(JudgeChannel([client], JudgeConfig(k=3)))
    assert verdict.verdict == "success" and len(client.calls) == 3
    systems = {call[0]["content"] for call in client.calls}
    assert len(systems) == 3                                  # not clones
    user = client.calls[0][1]["content"]
    assert "Create a RAM user" in user and '"verdict"' in user
    with pytest.raises(ConfigError, match="JudgeChannel.clients"):
        JudgeChannel([client, client], JudgeConfig(k=3))


def test_infeasible_task_prompt_carries_reference_and_report():
    client = Scripted(S)
    _judge(JudgeChannel([client], JudgeConfig(k=1)), answer=None,
           infeasible_reason="there is no Advanced tab", expected="infeasible",
           reference_reason="the Advanced tab was removed")
    user = client.calls[0][1]["content"]
    assert "report_infeasible: there is no Advanced tab" in user
    assert "the Advanced tab was removed" in user and "NOT to work" in user
    with pytest.raises(ConfigError, match="expected"):
        _judge(JudgeChannel([client], JudgeConfig(k=1)), expected="maybe")


@pytest.mark.parametrize("k", [3, 5])
def test_judges_run_concurrently(k):
    clients = [Scripted(S, delay_s=0.3) for _ in range(k)]
    started = time.monotonic()
    verdict = _judge(JudgeChannel(clients, JudgeConfig(k=k)))
    elapsed = time.monotonic() - started
    assert verdict.verdict == "success"
    assert elapsed < 0.3 * k * 0.6, elapsed


def test_deadline_turns_slow_judges_into_abstentions():
    clients = [Scripted(S), Scripted(S), Scripted(F, delay_s=1.0)]
    started = time.monotonic()
    verdict = _judge(JudgeChannel(clients, JudgeConfig(k=3, deadline_s=0.2)))
    assert time.monotonic() - started < 0.8
    assert verdict.verdict == "success"
    assert verdict.votes[2].verdict == "invalid" and "no answer" in verdict.votes[2].reason


# ---- rendering ---------------------------------------------------------------------------------
def test_render_is_deterministic_and_complete():
    args = ("Create a RAM user", "1. Open RAM.", ["click('a1')", "stop(\"ok\")"],
            "[a9] row dev-1", "ok", None, 4000)
    a, b = render_trajectory(*args), render_trajectory(*args)
    assert a == b
    for part in ("TASK: Create a RAM user", "1. Open RAM.", "1. click('a1')",
                 "2. stop(\"ok\")", "stop with answer: ok", "[a9] row dev-1"):
        assert part in a
    assert "report_infeasible: gone" in render_trajectory(*args[:4], None, "gone", 4000)
    assert "no answer" in render_trajectory(*args[:4], None, None, 4000)


def test_render_truncates_observation_from_the_middle():
    page = "HEAD-MARK " + "x" * 50_000 + " TAIL-MARK"
    text = render_trajectory("t", "p", ["click('a1')"], page, "ok", None, 3000)
    assert len(text) <= 3000
    assert "HEAD-MARK" in text and "TAIL-MARK" in text and "characters omitted" in text
    assert text == render_trajectory("t", "p", ["click('a1')"], page, "ok", None, 3000)


@pytest.mark.parametrize("max_chars", [400, 1000, 5000])
def test_render_respects_budget_with_everything_long(max_chars):
    actions = [f"fill('a{i}', \"{'v' * 40}\")" for i in range(500)]
    text = render_trajectory("T" * 1000, "P" * 20_000, actions, "O" * 20_000, "A" * 5000,
                             None, max_chars)
    assert len(text) <= max_chars
    assert text.startswith("TASK:")


def test_render_keeps_first_and_last_actions():
    actions = [f"click('a{i}')" for i in range(1, 401)]
    text = render_trajectory("t", "p", actions, "page", "ok", None, 4000)
    assert "1. click('a1')" in text and "400. click('a400')" in text
    assert "actions omitted" in text and "ACTIONS (400)" in text


def test_render_rejects_tiny_budget():
    with pytest.raises(ConfigError, match="max_chars"):
        render_trajectory("t", "p", [], "", None, None, 10)


# ---- fusion ------------------------------------------------------------------------------------
def _jv(verdict: str) -> JudgeVerdict:
    return JudgeVerdict(verdict, (JudgeVote("judge-0", "invalid" if verdict == "undetermined"
                                            else verdict, "r"),), f"judges said {verdict}")


RS = RuleOutcome("success", ("ev-1", "ev-2"))
RF = RuleOutcome("failure", (), ("no successful CreateUser",))
RU = RuleOutcome("undetermined", ("ev-1",))
ERR = EnvError("browser_crashed", "target closed")


@pytest.mark.parametrize("expected, rule, judges, env, want", [
    # (reward, trainable, verdict, decided_by)
    ("success", RS, None, ERR, (0.0, False, "failure", "env_error")),
    ("success", RS, _jv("success"), ERR, (0.0, False, "failure", "env_error")),
    ("success", None, None, ERR, (0.0, False, "failure", "env_error")),
    ("success", RS, None, None, (1.0, True, "success", "rule")),
    ("success", RS, _jv("failure"), None, (1.0, True, "success", "rule")),
    ("success", RF, _jv("success"), None, (0.0, True, "failure", "rule")),
    ("success", RF, None, None, (0.0, True, "failure", "rule")),
    ("success", RU, _jv("success"), None, (1.0, True, "success", "judges")),
    ("success", RU, _jv("failure"), None, (0.0, True, "failure", "judges")),
    ("success", RU, _jv("undetermined"), None, (0.0, False, "undetermined", "none")),
    ("success", RU, None, None, (0.0, False, "undetermined", "none")),
    ("success", None, _jv("success"), None, (1.0, True, "success", "judges")),
    ("success", None, None, None, (0.0, False, "undetermined", "none")),
    # infeasible-documentation tasks: a rule pass proves nothing; the judges read the report
    ("infeasible", RS, _jv("success"), None, (1.0, True, "success", "judges")),
    ("infeasible", RS, _jv("failure"), None, (0.0, True, "failure", "judges")),
    ("infeasible", RS, None, None, (0.0, False, "undetermined", "none")),
    ("infeasible", None, _jv("success"), None, (1.0, True, "success", "judges")),
    ("infeasible", RF, _jv("success"), None, (0.0, True, "failure", "rule")),
    ("infeasible", RU, _jv("undetermined"), None, (0.0, False, "undetermined", "none")),
    ("infeasible", None, None, ERR, (0.0, False, "failure", "env_error")),
])
def test_fuse(expected, rule, judges, env, want):
    result = fuse(expected, rule, judges, env, RewardConfig())
    assert (result.reward, result.trainable, result.verdict, result.decided_by) == want
    assert result.rule_verdict is rule and result.judge_verdict is judges   # both recorded
    assert result.evidence == (rule.evidence if rule else ())
    assert result.reasons
    assert result.env_error is env


def test_forbidden_penalty_on_top_with_floor():
    hit = RuleOutcome("failure", (), ("forbidden DeleteUser happened (3x)",), forbidden_hits=3)
    result = fuse("success", hit, None, None, RewardConfig())
    assert result.reward == pytest.approx(-0.3) and result.trainable
    assert any("forbidden" in r for r in result.reasons)
    floored = fuse("success", RuleOutcome("failure", forbidden_hits=50), None, None,
                   RewardConfig(min_reward=-0.5))
    assert floored.reward == pytest.approx(-0.5)
    # judged success on an infeasible task, but the agent deleted something on the way
    side = RuleOutcome("undetermined", forbidden_hits=1)
    assert fuse("infeasible", side, _jv("success"), None).reward == pytest.approx(0.9)
    # not trainable -> no penalty bookkeeping; env errors always 0
    assert fuse("success", side, None, None).reward == 0.0
    assert fuse("success", hit, None, ERR).reward == 0.0


def test_undetermined_can_be_made_trainable():
    cfg = RewardConfig(undetermined_trainable=True, undetermined_reward=0.2)
    result = fuse("success", RU, _jv("undetermined"), None, cfg)
    assert (result.reward, result.trainable, result.verdict) == (0.2, True, "undetermined")


def test_custom_rewards():
    cfg = RewardConfig(success_reward=2.0, failure_reward=-1.0, min_reward=-2.0)
    assert fuse("success", RS, None, None, cfg).reward == 2.0
    assert fuse("success", RF, None, None, cfg).reward == -1.0


@pytest.mark.parametrize("passed, decisive, verdict", [
    (True, True, "success"), (False, True, "failure"),
    (True, False, "undetermined"), (False, False, "undetermined"),
])
def test_rule_outcome_from(passed, decisive, verdict):
    rv = RuleVerdict(passed, ["why"] if not passed else [], ["ev-1", "ev-2"])
    out = rule_outcome_from(rv, decisive=decisive, forbidden_hits=2)
    assert out == RuleOutcome(verdict, ("ev-1", "ev-2"), tuple(rv.reasons), 2)


@pytest.mark.parametrize("call, field", [
    (lambda: fuse("maybe", None, None, None), "task_expected"),
    (lambda: RuleOutcome("passed"), "RuleOutcome.verdict"),
    (lambda: RuleOutcome("failure", forbidden_hits=-1), "forbidden_hits"),
    (lambda: RewardConfig(forbidden_penalty=0.1), "forbidden_penalty"),
    (lambda: RewardConfig(min_reward=0.5), "min_reward"),
    (lambda: RewardConfig(undetermined_trainable="yes"), "undetermined_trainable"),
])
def test_bad_inputs_name_the_field(call, field):
    with pytest.raises(ConfigError, match=field):
        call()


def test_reward_result_pickles():
    judges = consensus(_votes("success", "invalid", "success"), JudgeConfig(k=3))
    for result in (fuse("success", RU, judges, None),
                   fuse("success", RS, judges, ERR),
                   fuse("infeasible", None, None, None)):
        copy = pickle.loads(pickle.dumps(result))
        assert copy == result and isinstance(copy, RewardResult)
    with pytest.raises(AttributeError):
        result.reward = 2.0      # frozen
