"""The GRPO loop's time budget: no step starts that the last step's duration says would end
past the deadline, and the last trained step is still published and checkpointed (the loop
with its collect / train / publish / checkpoint / ack replaced by recorders)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry

from consolerl.errors import ConfigError
from trainer.checkpoint import CheckpointConfig, CheckpointManager
from trainer.config import TrainerConfig
from trainer.grpo import GRPOTrainer, NoExperienceError, TrainerMetrics
from trainer.failures import explain_no_experience


class _Clock:
    """time.monotonic for trainer.grpo: moves only when a step trains."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    c = _Clock()
    monkeypatch.setattr("trainer.grpo.time", SimpleNamespace(monotonic=c.monotonic,
                                                             time=lambda: 0.0))
    return c


def _trainer(clock: _Clock, step_s: float, publish_every: int = 1, every_steps: int = 1,
             tmp_path=None) -> tuple[GRPOTrainer, list[tuple]]:
    calls: list[tuple] = []
    t = GRPOTrainer.__new__(GRPOTrainer)
    t.config = TrainerConfig(publish_every=publish_every,
                             checkpoint=CheckpointConfig(every_steps=every_steps))
    t.checkpoints = CheckpointManager(t.config.checkpoint)
    t.step = t.version = 0
    t.trained, t.unacked, t.history = set(), [], []
    t.run_dir = tmp_path
    t.metrics = TrainerMetrics(CollectorRegistry())
    t.while_waiting = None
    n = iter(range(10**6))

    def collect(deadline, budget=None):
        i = next(n)
        return [SimpleNamespace(group=SimpleNamespace(group_id=f"g{i}"), entry_id=f"e{i}",
                                redelivered=False)]

    def train_step(groups):
        clock.now += step_s
        calls.append(("train", t.step + 1))
        return {"step": t.step + 1}

    def publish(version):
        calls.append(("publish", version))
        return 0.0

    def checkpoint():
        calls.append(("checkpoint", t.step))
        return 0.0

    def ack():
        calls.append(("ack", list(t.unacked)))
        t.unacked = []

    t.collect, t.train_step, t.publish, t.checkpoint, t.ack = (collect, train_step, publish,
                                                               checkpoint, ack)
    return t, calls


def test_budget_stops_before_a_step_that_would_overrun(clock, tmp_path):
    t, calls = _trainer(clock, 200, tmp_path=tmp_path)
    history = t.run(100, deadline=clock.now + 500)
    # Step 1 starts at 0 (nothing known), step 2 at 200 (ends at 400 < 500), step 3 would end
    # at 600.
    assert len(history) == 2 and t.step == 2 and t.stopped_by == "time_budget"
    assert ("publish", 2) in calls and ("checkpoint", 2) in calls
    assert calls[-1] == ("ack", ["e1"])


def test_budget_stop_between_publishes_still_publishes_and_checkpoints(clock, tmp_path):
    t, calls = _trainer(clock, 200, publish_every=5, every_steps=5, tmp_path=tmp_path)
    t.run(100, deadline=clock.now + 500)
    assert t.step == 2 and t.version == 1
    assert calls[-3:] == [("publish", 1), ("checkpoint", 2), ("ack", ["e0", "e1"])]
    assert all(c[0] != "checkpoint" for c in calls[:-2])   # none before the stop


def test_no_deadline_runs_all_steps(clock, tmp_path):
    t, calls = _trainer(clock, 200, publish_every=2, every_steps=2, tmp_path=tmp_path)
    t.run(3)
    assert t.step == 3 and t.stopped_by == "steps" and t.version == 2
    assert [c for c in calls if c[0] == "checkpoint"] == [("checkpoint", 2), ("checkpoint", 3)]


class _Consumer:
    """The stream as the real ``collect`` sees it: ``reads`` groups, then nothing, each read
    waiting ``wait_s`` (a blocking XREADGROUP)."""

    def __init__(self, clock: _Clock, reads: int, wait_s: float = 10.0) -> None:
        self.clock, self.left, self.wait_s, self.n = clock, reads, wait_s, 0

    def read(self, count):
        self.clock.now += self.wait_s
        if not self.left:
            return []
        self.left -= 1
        self.n += 1
        return [SimpleNamespace(group=SimpleNamespace(group_id=f"g{self.n}"),
                                entry_id=f"e{self.n}", redelivered=False)]


def _real_collect(t: GRPOTrainer, consumer: _Consumer, groups_per_step: int) -> None:
    t.consumer, t.groups_per_step = consumer, groups_per_step
    t.collect = GRPOTrainer.collect.__get__(t)


def test_waiting_past_the_budget_stops_the_run_instead_of_hanging(clock, tmp_path):
    # Two groups arrive, then none (the rollouts are slower than the budget): the run stops
    # at the budget with what it trained, not after read_timeout_s with an error.
    t, calls = _trainer(clock, 100, tmp_path=tmp_path)
    _real_collect(t, _Consumer(clock, reads=2), groups_per_step=1)
    start = clock.now
    history = t.run(100, deadline=start + 1000)
    assert len(history) == 2 and t.step == 2 and t.stopped_by == "time_budget"
    assert start + 1000 < clock.now < start + 1000 + 20          # not read_timeout_s (1800)
    assert calls[-3:] == [("publish", 2), ("checkpoint", 2), ("ack", ["e2"])]


def test_budget_passing_with_part_of_a_step_trains_what_was_read(clock, tmp_path):
    # groups_per_step 2, one group read when the budget passes: it is trained (a smaller
    # step) and acknowledged, not left pending in the stream.
    t, calls = _trainer(clock, 100, tmp_path=tmp_path)
    _real_collect(t, _Consumer(clock, reads=1), groups_per_step=2)
    trained = []
    train_step = t.train_step
    t.train_step = lambda groups: (trained.append([g.group_id for g in groups]),
                                   train_step(groups))[1]
    t.run(100, deadline=clock.now + 500)
    assert trained == [["g1"]] and t.step == 1 and t.stopped_by == "time_budget"
    assert calls[-1] == ("ack", ["e1"])


def test_negative_budget_is_a_config_error():
    with pytest.raises(ConfigError, match="time_budget_s"):
        TrainerConfig(time_budget_s=-1)


def test_no_group_within_read_timeout_is_a_named_error(clock, tmp_path):
    # No time budget and nothing arrives: collect gives up after read_timeout_s with an error
    # naming the setting (main turns it into a message, not a traceback).
    t, calls = _trainer(clock, 100, tmp_path=tmp_path)
    _real_collect(t, _Consumer(clock, reads=0, wait_s=10.0), groups_per_step=1)
    start = clock.now
    with pytest.raises(NoExperienceError, match=r"0 of 1 groups within 1800 s "
                                                r"\(trainer.read_timeout_s\)"):
        t.run(3)
    assert start + 1800 < clock.now <= start + 1800 + 20 and t.step == 0 and calls == []


def _summary(pushed=0, dropped=0, abandoned=0, episodes=0):
    return {"error": "the experience stream gave 0 of 1 groups within 1800 s "
                     "(trainer.read_timeout_s)",
            "rollout": {"episodes": episodes, "env_errors": 0, "groups_pushed": pushed,
                        "groups_dropped_uniform": dropped, "groups_abandoned": abandoned}}


def test_the_explanation_says_why_nothing_was_pushed():
    uniform = explain_no_experience(_summary(dropped=12, episodes=51))
    assert uniform.startswith("the experience stream gave 0 of 1 groups")
    assert "51 episodes" in uniform and "12 dropped as uniform" in uniform
    assert "drop_uniform_groups" in uniform
    assert "max_env_retries" in explain_no_experience(_summary(abandoned=3, episodes=20))
    assert "read_timeout_s or add env workers" in explain_no_experience(_summary(episodes=2))
    bare = {"error": "x"}                   # the job failed before the rollouts reported
    assert explain_no_experience(bare) == "x"
