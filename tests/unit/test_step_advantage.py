"""Step-level advantages (GiGPO) on constructed trajectories: page states keyed so that equal
states match, anchor grouping, hand-computed step advantages, ``step_advantage_weight`` 0
giving exactly the episode advantages, and a group uniform in reward that carries step signal
(pushed by the orchestrator, rows trained by the trainer) only with the setting on."""
from __future__ import annotations

import json
import math
import zlib
from types import SimpleNamespace

import pytest
import torch
from prometheus_client import CollectorRegistry

from consolerl.errors import ConfigError
from consolerl.experience import (Group, Sample, Trajectory, Turn, decode_group, encode_group,
                                  keep_pages, page_seen, sample_of, state_key, turn_states)
from consolerl.step_advantage import has_step_signal, step_advantages, step_returns
from rollout_service.orchestrator import OrchestratorConfig
from tests.unit.test_orchestrator_units import orchestrator
from tests.conftest import run_async
from trainer.algo import AlgoConfig, build_batch, trajectory_advantages
from trainer.config import TrainerConfig
from trainer.grpo import GRPOTrainer, TrainerMetrics, rows_to_train

R2 = 1 / math.sqrt(2)        # a step group of two unequal returns, normalised: -+1/sqrt(2)


def _turn(prompt: int = 3) -> Turn:
    return Turn(tuple(range(1, prompt + 1)), (7, 8), (-1.0, -1.0), (1, 1), 0, "", "")


def _sample(tid: str, reward: float, states: str) -> Sample:
    """A sample with one turn per character of ``states`` (its state key; "-": unknown)."""
    keys = tuple("" if c == "-" else c for c in states)
    return Sample(tid, tuple(_turn() for _ in keys), reward, states=keys)


def _group(gid: str, *samples: Sample) -> Group:
    return Group(gid, "task", samples)


# ---- page states ---------------------------------------------------------------------------

PAGE = ('alice\nID 1234567\nmain:\n # Instance i-bp5uo7w6g51i0c\n'
        ' [12] button "Stop"\n created 2026-11-01T10:00:00Z\n see [13]Details')


def test_equal_states_get_equal_keys_whatever_the_ids_times_account_and_numbering():
    other = (PAGE.replace("alice", "bob").replace("1234567", "7654321")
             .replace("i-bp5uo7w6g51i0c", "i-zz9uo7w6g51i0q").replace("2026-11-01", "2026-12-24")
             .replace("[12]", "[40]").replace("[13]", "[3]"))
    url = "http://c/console/ecs/instances/i-bp5uo7w6g51i0c"
    assert state_key(page_seen(url, PAGE)) == state_key(
        page_seen(url.replace("bp5uo7w6g51i0c", "zz9uo7w6g51i0q"), other))
    # A different control, or another URL, is another state.
    assert state_key(page_seen(url, PAGE)) != state_key(
        page_seen(url, PAGE.replace('"Stop"', '"Start"')))
    assert state_key(page_seen(url, PAGE)) != state_key(page_seen(url + "/edit", PAGE))


def test_turn_states_are_the_pages_before_each_turn_even_of_a_long_trajectory():
    short = Trajectory("t", "task", (_turn(),) * 2, "stop",
                       pages=(page_seen("u", "a"), page_seen("u", "b"), page_seen("u", "c")))
    assert turn_states(short) == (state_key(page_seen("u", "a")), state_key(page_seen("u", "b")))
    assert turn_states(Trajectory("t", "task", (_turn(),), "stop")) == ("",)
    # 70 turns: keep_pages keeps the first 16 pages and the last 48 (the final one included).
    pages = [page_seen("u", f"page {i}") for i in range(71)]
    long = Trajectory("t", "task", (_turn(),) * 70, "stop", pages=keep_pages(pages))
    states = turn_states(long)
    expected = [state_key(p) for p in pages[:70]]
    assert len(states) == 70
    assert states[:16] == tuple(expected[:16]) and states[16:23] == ("",) * 7
    assert states[23:] == tuple(expected[23:])


def test_samples_carry_states_only_when_asked_and_old_records_still_read():
    traj = Trajectory("t", "task", (_turn(),), "stop",
                      pages=(page_seen("u", "a"), page_seen("u", "b")))
    assert sample_of(traj, 1.0).states == ()
    sample = sample_of(traj, 1.0, states=True)
    assert sample.states == (state_key(page_seen("u", "a")),)
    group = Group("g", "task", (sample,))
    assert decode_group(encode_group(group)) == group
    body = json.loads(zlib.decompress(encode_group(group)["data"]))
    del body["samples"][0]["states"]                       # written before states existed
    old = decode_group({"data": zlib.compress(json.dumps(body).encode())})
    assert old.samples[0].states == () and old.samples[0].turns == sample.turns


# ---- step groups and step advantages -----------------------------------------------------------

def test_turns_from_one_state_form_a_step_group_across_and_within_episodes():
    # a: x y x z; b: x z; c: w (w alone, - unknown)
    out = step_advantages([_sample("a", 1.0, "xyxz"), _sample("b", 1.0, "xz"),
                           _sample("c", 1.0, "w-")], gamma=0.9)
    assert sorted(out.group_sizes) == [2, 3]               # x: a0 a2 b0; z: a3 b1
    assert out.turns == 8
    assert [len(row) for row in out.per_sample] == [4, 2, 2]
    assert out.per_sample[2] == (0.0, 0.0)                 # a state of one turn; unknown
    assert out.per_sample[0][1] == 0.0                     # y: alone


def test_step_advantages_hand_computed():
    # Both succeed; b skips a's detour through y. gamma 0.5: a's returns 0.25 0.5 1,
    # b's 0.5 1. Step group x: {0.25, 0.5}: mean 0.375, unbiased std 0.125*sqrt(2);
    # y alone; z: {1, 1} equal.
    a, b = _sample("a", 1.0, "xyz"), _sample("b", 1.0, "xz")
    assert step_returns(3, 1.0, 0.5) == [0.25, 0.5, 1.0]
    out = step_advantages([a, b], gamma=0.5, epsilon=1e-12)
    assert out.group_sizes == (2, 2) and out.turns == 5 and out.nonzero == 2
    assert out.per_sample[0] == pytest.approx((-R2, 0.0, 0.0), abs=1e-9)
    assert out.per_sample[1] == pytest.approx((R2, 0.0), abs=1e-9)
    raw = step_advantages([a, b], gamma=0.5, norm_by_std=False)
    assert raw.per_sample == ((-0.125, 0.0, 0.0), (0.125, 0.0))
    # Rewards differ and both pass through x: returns 0.25 (a) and -1 (c), mean -0.375.
    c = _sample("c", -1.0, "x")
    mixed = step_advantages([a, c], gamma=0.5, norm_by_std=False)
    assert mixed.per_sample == ((0.625, 0.0, 0.0), (-0.625,))


def test_equal_returns_give_exact_zeros_and_bad_input_is_named():
    same = [_sample(t, 0.3, "xyz") for t in "abc"]
    out = step_advantages(same, gamma=0.7)
    assert out.nonzero == 0 and all(v == 0.0 for row in out.per_sample for v in row)
    assert not has_step_signal(same, 0.7)
    with pytest.raises(ConfigError, match="trajectory 'a' has 1 states for 2 turns"):
        step_advantages([Sample("a", (_turn(), _turn()), 1.0, states=("x",))], gamma=0.9)
    with pytest.raises(ConfigError, match="gamma"):
        step_advantages(same, gamma=0.0)


@pytest.mark.parametrize("field, value", [("step_advantage_weight", -0.5),
                                          ("step_gamma", 0.0), ("step_gamma", 1.5)])
def test_config_rejects_bad_step_settings_naming_the_field(field, value):
    with pytest.raises(ConfigError, match=field):
        AlgoConfig(**{field: value})


# ---- the training batch ----------------------------------------------------------------------

GROUPS = [_group("g1", _sample("a", 1.0, "xyz"), _sample("b", 0.0, "xz")),
          _group("g2", _sample("c", 1.0, "xyz"), _sample("d", 1.0, "xz"))]


def test_weight_zero_gives_exactly_the_episode_advantages():
    expected = trajectory_advantages([1.0, 0.0, 1.0, 1.0], ["g1", "g1", "g2", "g2"],
                                     AlgoConfig())
    per_row = expected.repeat_interleave(torch.tensor([3, 2, 3, 2])).unsqueeze(-1)
    today = build_batch(GROUPS, 0, AlgoConfig())
    off = build_batch(GROUPS, 0, AlgoConfig(step_advantage_weight=0.0, step_gamma=0.5))
    assert torch.equal(today.advantages_BR, off.advantages_BR)
    assert torch.equal(today.advantages_BR, per_row * today.response_mask_BR)


def test_turn_advantage_is_episode_plus_weighted_step():
    cfg = AlgoConfig(step_advantage_weight=0.5, step_gamma=0.5)
    on = build_batch(GROUPS, 0, cfg).advantages_BR[:, 0]
    episode = build_batch(GROUPS, 0, AlgoConfig()).advantages_BR[:, 0]
    # g1: returns a 0.25 0.5 1, b 0 0; x {0.25, 0}, z {1, 0}: a above b in both.
    # g2: as in the hand-computed example: only x differs, d (the short path) above c.
    step = torch.tensor([R2, 0, R2, -R2, -R2, -R2, 0, 0, R2, 0])
    torch.testing.assert_close(on, episode + 0.5 * step, atol=1e-5, rtol=0)


# ---- a uniform group with step signal --------------------------------------------------------

def test_uniform_group_with_divergent_paths_trains_only_with_the_setting_on():
    uniform = [_group("u", _sample("c", 1.0, "xyz"), _sample("d", 1.0, "xz"))]
    off = TrainerConfig()
    on = TrainerConfig(algo=AlgoConfig(step_advantage_weight=1.0))
    assert rows_to_train(build_batch(uniform, 0, off.algo), off) is None
    trained = rows_to_train(build_batch(uniform, 0, on.algo), on)
    assert trained is not None and trained.trajectory_ids == ["c", "d"]   # the x turns


def _paged_orchestrator(step_gamma):
    """Groups of two that both succeed; episode 0 goes x -> y -> z, episode 1 x -> z."""
    orch, stream, _ = orchestrator(OrchestratorConfig(group_size=2, max_staleness=5),
                                   lambda n, i: 1.0)
    orch.step_gamma = step_gamma
    plain = orch.episode

    async def episode(worker, task, trajectory_id, seed):
        out = await plain(worker, task, trajectory_id, seed)
        path = "xyzE" if trajectory_id.endswith("-0") else "xzE"
        turns = (out.trajectory.turns[0],) * (len(path) - 1)
        out.trajectory = Trajectory(trajectory_id, task.id, turns, "stop", answer="done",
                                    pages=tuple(page_seen("u", p) for p in path))
        return out
    orch.episode = episode
    return orch, stream


def test_orchestrator_keeps_a_uniform_group_with_step_signal_only_when_on():
    orch, stream = _paged_orchestrator(None)
    summary = run_async(orch.run(max_groups=2))
    assert stream.pushed == [] and summary["groups_dropped_uniform"] == 2
    orch, stream = _paged_orchestrator(0.95)
    summary = run_async(orch.run(max_groups=2))
    assert summary["groups_pushed"] == 2 and summary["groups_dropped_uniform"] == 0
    assert orch.metrics.step_signal_groups._value.get() == 2
    x = state_key(page_seen("u", "x"))
    for g in stream.pushed:
        assert [s.states[0] for s in g.samples] == [x, x]
        assert [len(s.states) for s in sorted(g.samples, key=lambda s: s.trajectory_id)] \
            == [3, 2]


def test_orchestrator_still_drops_a_uniform_group_without_step_signal():
    orch, stream, _ = orchestrator(OrchestratorConfig(group_size=2, max_staleness=5),
                                   lambda n, i: 1.0)
    orch.step_gamma = 0.95             # one turn each, no pages: nothing to compare
    summary = run_async(orch.run(max_groups=2))
    assert stream.pushed == [] and summary["groups_dropped_uniform"] == 2


def test_trainer_reports_step_groups(monkeypatch):
    monkeypatch.setattr("trainer.grpo.ray", SimpleNamespace(get=lambda refs: refs))
    worker = SimpleNamespace(step=SimpleNamespace(
        remote=lambda shard, tokens, seqs: {"loss": 0.1, "grad_norm": 1.0,
                                            "tokens": float(shard.num_tokens())}))
    t = GRPOTrainer.__new__(GRPOTrainer)
    t.config = TrainerConfig(algo=AlgoConfig(step_advantage_weight=1.0, step_gamma=0.5))
    t.workers, t.pad_token_id, t.step, t.version = [worker], 0, 0, 0
    t.metrics, t.around_step, t._warned_no_states = TrainerMetrics(CollectorRegistry()), None, False
    out = t.train_step(GROUPS)
    # g1: x {a0, b0}, z {a2, b1}; g2: x {c0, d0}, z {c2, d1} (equal returns).
    assert out["step_groups"] == 4 and out["step_group_turns"] == 8
    assert out["step_signal_share"] == pytest.approx(6 / 10)
    assert t.metrics.step_groups._value.get() == 4
    assert t.metrics.step_signal._value.get() == pytest.approx(0.6)
    t.config = TrainerConfig()
    assert "step_groups" not in t.train_step(GROUPS)
