"""Checkpoints on a tmp dir with a tiny model and AdamW: exact round trips (a restored optimizer
continues identically), tied weights stored once, retention, the ``latest`` commit pointer,
leftovers of a crashed save, and corrupt checkpoints refused by name."""
from __future__ import annotations

import json
import pickle

import pytest
import torch
from safetensors import safe_open

from consolerl.errors import ConfigError, ConsoleRLError
from trainer.checkpoint import (Checkpoint, CheckpointConfig, CheckpointCorrupt,
                                CheckpointManager)


class Tiny(torch.nn.Module):
    """Embedding, one hidden layer and an output head tied to the embedding."""

    def __init__(self, tied: bool = True):
        super().__init__()
        self.embed = torch.nn.Embedding(11, 4)
        self.hidden = torch.nn.Linear(4, 4)
        self.head = torch.nn.Linear(4, 11, bias=False)
        if tied:
            self.head.weight = self.embed.weight

    def forward(self, ids_BT: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.hidden(self.embed(ids_BT))))


def train_step(model: Tiny, optim: torch.optim.Optimizer, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    ids_BT = torch.randint(0, 11, (2, 5), generator=g)
    logits_BTV = model(ids_BT)
    loss = torch.nn.functional.cross_entropy(logits_BTV.reshape(-1, 11), ids_BT.reshape(-1))
    optim.zero_grad()
    loss.backward()
    optim.step()


def trained(seed: int = 0) -> tuple[Tiny, torch.optim.AdamW]:
    torch.manual_seed(seed)
    model = Tiny()
    optim = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.01)
    for i in range(3):
        train_step(model, optim, i)
    return model, optim


def manager(tmp_path, **kw) -> CheckpointManager:
    return CheckpointManager(CheckpointConfig(dir=str(tmp_path / "ckpt"), **kw))


def save_tiny(m: CheckpointManager, step: int, **state) -> None:
    m.save(step, step, {"w": torch.full((2,), float(step))}, None, state)


def test_round_trip_restores_tensors_optimizer_and_state(tmp_path):
    model, optim = trained()
    m = manager(tmp_path)
    assert m.latest() is None
    state = {"trained_groups": ["g1", "g2"], "unacked": ["1-0"], "metrics": {"loss": 0.5}}
    path = m.save(12, 7, model.state_dict(), optim.state_dict(), state, extra={"note": "x"})
    assert path == tmp_path / "ckpt" / "step-000012"
    assert sorted(p.name for p in path.iterdir()) == ["model.safetensors", "optimizer.pt",
                                                      "state.json"]

    ckpt = m.latest()
    assert isinstance(ckpt, Checkpoint)
    assert (ckpt.step, ckpt.version, ckpt.path) == (12, 7, path)
    assert ckpt.trainer_state == state and ckpt.extra == {"note": "x"}
    assert ckpt.created_at > 0
    assert list(ckpt.model_state) == list(model.state_dict())
    for key, value in model.state_dict().items():
        assert ckpt.model_state[key].dtype == value.dtype
        assert torch.equal(ckpt.model_state[key], value)

    # A fresh model and optimizer continue exactly like the originals.
    torch.manual_seed(99)
    model2 = Tiny()
    optim2 = torch.optim.AdamW(model2.parameters(), lr=0.05, weight_decay=0.01)
    model2.load_state_dict(ckpt.model_state)
    optim2.load_state_dict(ckpt.optimizer_state)
    train_step(model, optim, 3)
    train_step(model2, optim2, 3)
    for (k, a), b in zip(model.state_dict().items(), model2.state_dict().values()):
        assert torch.equal(a, b), k


def test_tied_weights_are_stored_once_and_come_back_tied(tmp_path):
    model, optim = trained()
    state_dict = model.state_dict()
    assert state_dict["head.weight"].data_ptr() == state_dict["embed.weight"].data_ptr()
    m = manager(tmp_path)
    path = m.save(1, 1, state_dict, optim.state_dict(), {})
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        stored = set(f.keys())
    assert stored == {"embed.weight", "hidden.weight", "hidden.bias"}
    assert json.loads((path / "state.json").read_text())["aliases"] == {
        "head.weight": "embed.weight"}

    ckpt = m.load(path)
    assert set(ckpt.model_state) == set(state_dict)
    assert ckpt.model_state["head.weight"] is ckpt.model_state["embed.weight"]
    fresh = Tiny()
    fresh.load_state_dict(ckpt.model_state)
    assert fresh.head.weight is fresh.embed.weight
    assert torch.equal(fresh.head.weight, model.head.weight)


def test_views_that_only_overlap_are_stored_as_copies(tmp_path):
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    state = {"top": base[:1], "bottom": base[1:], "t": base.t(), "bf16": base.bfloat16(),
             "empty": torch.zeros(0)}
    m = manager(tmp_path)
    ckpt = m.load(m.save(1, 0, state, None, {}))
    assert ckpt.optimizer_state is None
    for key, value in state.items():
        assert ckpt.model_state[key].dtype == value.dtype
        assert torch.equal(ckpt.model_state[key], value), key
    assert ckpt.model_state["top"].data_ptr() != ckpt.model_state["bottom"].data_ptr()


def test_keep_two_retention_and_the_latest_pointer(tmp_path):
    m = manager(tmp_path, keep=2, every_steps=2)
    for step in (2, 4, 6, 8):
        save_tiny(m, step, n=step)
    root = tmp_path / "ckpt"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-000006", "step-000008"]
    assert (root / "latest").read_text() == "step-000008\n"
    assert m.checkpoints() == [root / "step-000006", root / "step-000008"]
    ckpt = m.latest()
    assert ckpt.step == 8 and ckpt.trainer_state == {"n": 8}
    assert torch.equal(ckpt.model_state["w"], torch.full((2,), 8.0))
    assert [m.should_save(s) for s in (0, 1, 2, 3, 4)] == [False, False, True, False, True]


def test_crash_leftovers_are_ignored_then_cleaned(tmp_path):
    m = manager(tmp_path, keep=3)
    save_tiny(m, 1)
    root = tmp_path / "ckpt"
    # A save that crashed half-way (temp folder), and one that crashed after its rename but
    # before the pointer moved (uncommitted step folder), and a half-written pointer.
    half = root / ".tmp-step-000002-dead"
    half.mkdir()
    (half / "model.safetensors").write_bytes(b"\x00" * 10)
    uncommitted = root / "step-000003"
    uncommitted.mkdir()
    (uncommitted / "state.json").write_text("{")
    (root / ".latest.tmp-dead").write_text("step-0000")

    assert m.latest().step == 1
    assert m.checkpoints() == [root / "step-000001"]

    save_tiny(m, 2)
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-000001", "step-000002"]
    assert m.latest().step == 2


def test_saving_a_step_again_replaces_it(tmp_path):
    m = manager(tmp_path)
    save_tiny(m, 1)
    save_tiny(m, 2, first=True)
    m.save(2, 5, {"w": torch.ones(3)}, None, {"first": False})
    ckpt = m.latest()
    assert (ckpt.version, ckpt.trainer_state) == (5, {"first": False})
    assert torch.equal(ckpt.model_state["w"], torch.ones(3))
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [
        "latest", "step-000001", "step-000002"]


@pytest.mark.parametrize("damage,reason", [
    (lambda p: (p / "state.json").write_text("{not json"), "state.json is not valid JSON"),
    (lambda p: (p / "state.json").unlink(), "state.json is missing"),
    (lambda p: (p / "model.safetensors").unlink(), "model.safetensors is missing"),
    (lambda p: (p / "optimizer.pt").unlink(), "optimizer.pt is missing"),
    (lambda p: (p / "model.safetensors").write_bytes(b"garbage"), "model.safetensors has 7"),
    (lambda p: (p / "optimizer.pt").write_bytes(
        b"x" * (p / "optimizer.pt").stat().st_size), "optimizer.pt: "),
    (lambda p: (p / "state.json").write_text(json.dumps({"format": 99})), "not format 1"),
])
def test_a_corrupt_latest_checkpoint_is_an_error_naming_its_path(tmp_path, damage, reason):
    model, optim = trained()
    m = manager(tmp_path)
    m.save(1, 1, model.state_dict(), optim.state_dict(), {})
    path = m.save(2, 2, model.state_dict(), optim.state_dict(), {})
    damage(path)
    with pytest.raises(CheckpointCorrupt, match=reason) as caught:
        m.latest()
    assert str(path) in str(caught.value)
    # No silent fallback; the operator can load the previous one explicitly.
    assert m.load(m.checkpoints()[-2]).step == 1


def test_a_latest_pointer_to_a_missing_folder_is_an_error(tmp_path):
    m = manager(tmp_path)
    save_tiny(m, 1)
    (tmp_path / "ckpt" / "latest").write_text("step-000009\n")
    with pytest.raises(CheckpointCorrupt, match="step-000009 is corrupt: the folder does not"):
        m.latest()
    (tmp_path / "ckpt" / "latest").write_text("../elsewhere\n")
    with pytest.raises(CheckpointCorrupt, match="not a step-NNNNNN folder"):
        m.latest()


def test_errors_are_typed_and_picklable():
    err = CheckpointCorrupt("/x/step-000001", "state.json is missing")
    again = pickle.loads(pickle.dumps(err))
    assert isinstance(again, ConsoleRLError) and isinstance(again, RuntimeError)
    assert str(again) == str(err)


def test_bad_input_is_refused_before_anything_is_written(tmp_path):
    m = manager(tmp_path)
    with pytest.raises(ConfigError, match="trainer_state"):
        m.save(1, 1, {"w": torch.ones(1)}, None, {"ids": {"a", "b"}})
    with pytest.raises(ConfigError, match="model_state"):
        m.save(1, 1, {"w": [1.0]}, None, {})
    with pytest.raises(ConfigError, match="'step'"):
        m.save(-1, 1, {"w": torch.ones(1)}, None, {})
    assert not (tmp_path / "ckpt").exists() or not any((tmp_path / "ckpt").iterdir())


@pytest.mark.parametrize("kw,field", [
    ({"dir": ""}, "CheckpointConfig.dir"),
    ({"every_steps": 0}, "CheckpointConfig.every_steps"),
    ({"keep": 0}, "CheckpointConfig.keep"),
    ({"keep": True}, "CheckpointConfig.keep"),
])
def test_bad_config_names_the_field(kw, field):
    with pytest.raises(ConfigError, match=field):
        CheckpointConfig(**kw)
