"""skip_zero_advantage: the trainer sends the workers only rows with a non-zero advantage (the
token-mean's denominators stay the whole batch's), and nothing at all for a batch without one:
no forward, no backward, no optimizer step."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry

from consolerl.experience import Group, Sample, Turn
from trainer.config import TrainerConfig
from trainer.grpo import GRPOTrainer, TrainerMetrics


class _Worker:
    def __init__(self):
        self.calls = []
        self.step = SimpleNamespace(remote=self._step)

    def _step(self, shard, tokens, seqs):
        self.calls.append((shard.num_rows, tokens, seqs, list(shard.trajectory_ids)))
        return {"loss": 0.5, "grad_norm": 1.5, "tokens": float(shard.num_tokens())}


def _trainer(monkeypatch, workers: int, skip: bool = True) -> GRPOTrainer:
    monkeypatch.setattr("trainer.grpo.ray", SimpleNamespace(get=lambda refs: refs))
    t = GRPOTrainer.__new__(GRPOTrainer)
    t.config = TrainerConfig(skip_zero_advantage=skip)
    t.workers = [_Worker() for _ in range(workers)]
    t.pad_token_id, t.step, t.version = 0, 0, 0
    t.metrics = TrainerMetrics(CollectorRegistry())
    t.around_step = None
    return t


def _turn(n: int) -> Turn:
    return Turn(tuple(range(1, n + 1)), (7, 8), (-1.0, -1.0), (1, 1), 0, "", "")


MIXED = Group("mixed", "t", (Sample("a", (_turn(3), _turn(5)), 1.0), Sample("b", (_turn(4),), 0.0)))
SAME = Group("same", "t", (Sample("c", (_turn(2),), 0.0), Sample("d", (_turn(6), _turn(3)), 0.0)))


def test_only_signal_rows_reach_the_worker_with_the_whole_batch_denominators(monkeypatch):
    t = _trainer(monkeypatch, 1)
    out = t.train_step([MIXED, SAME])
    (rows, tokens, seqs, trajectories), = t.workers[0].calls
    assert rows == 3 and trajectories == ["a", "a", "b"]
    assert tokens == 12 and seqs == 6                      # all six rows' tokens and rows
    assert out["rows"] == 6 and out["rows_trained"] == 3 and out["grad_norm"] == 1.5


def test_a_batch_without_signal_runs_nothing(monkeypatch):
    t = _trainer(monkeypatch, 2)
    out = t.train_step([SAME])
    assert all(not w.calls for w in t.workers)
    assert out["rows_trained"] == 0 and out["grad_norm"] == 0.0 and out["loss"] == 0.0
    assert t.metrics.rows_skipped._value.get() == 3


def test_every_worker_gets_a_row(monkeypatch):
    one_signal = Group("one", "t", (Sample("a", (_turn(3),), 1.0), Sample("b", (), 0.0)))
    t = _trainer(monkeypatch, 2)
    t.train_step([one_signal, SAME])
    assert [w.calls[0][0] for w in t.workers] == [1, 1]   # the signal row plus one to fill


@pytest.mark.parametrize("skip", [False])
def test_skipping_off_trains_every_row(monkeypatch, skip):
    t = _trainer(monkeypatch, 1, skip=skip)
    t.train_step([MIXED, SAME])
    assert t.workers[0].calls[0][0] == 6


def test_generation_is_paused_around_a_step_with_rows_only(monkeypatch):
    import contextlib
    t = _trainer(monkeypatch, 1)
    entered = []

    @contextlib.contextmanager
    def around():
        entered.append("in")
        yield
        entered.append("out")
    t.around_step = around
    t.train_step([SAME])
    assert entered == []
    t.train_step([MIXED])
    assert entered == ["in", "out"]
