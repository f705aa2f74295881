"""The training job's held-out states (cluster.job.heldout_states_stage): the oracle's
trajectories on the evaluation's tasks, through the SFT export's path, one episode per task,
kept on resume; and no training stage reads them: SFT and SRC train on their own files, and
the learning check's held-out tasks are none of the tasks SFT, SRC or GRPO see."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import cluster.job as job
from tests.conftest import in_thread
from cluster.config import JobConfig
from consolerl.config import load_config
from consolerl.tasks import TASKS_DIR, load_suite
from datagen.export import ExportConfig, select_tasks

LEARNING_CHECK = "configs/learning-check.yaml"


@pytest.fixture
def exports(monkeypatch) -> list[ExportConfig]:
    """run_export replaced: each call's config recorded, a one-line file written."""
    calls: list[ExportConfig] = []

    async def fake_export(config: ExportConfig) -> dict:
        calls.append(config)
        Path(config.out).write_text(json.dumps({"task_id": f"{config.split}-task"}) + "\n")
        return {"written": 1, "turns": 2, "tasks": 1, "wall_s": 0.1}
    monkeypatch.setattr(job, "run_export", fake_export)
    return calls


def _config(tmp_path: Path, *overrides: str) -> JobConfig:
    return load_config(JobConfig, LEARNING_CHECK, [f"run.dir={tmp_path}", *overrides])


def test_the_learning_check_records_the_eval_tasks_once_each_and_keeps_them_on_resume(
        tmp_path, exports):
    config = _config(tmp_path)
    assert config.eval.heldout_states
    said: list[str] = []
    out = in_thread(job.heldout_states_stage, config, tmp_path, "default",
                    progress=said.append)
    assert out == str(tmp_path / job.HELDOUT_STATES)
    (call,) = exports
    assert (call.out, call.split, call.tasks, call.episodes_per_task, call.model) == (
        out, config.eval.split, config.eval.tasks, 1, "default")
    assert call.agent == config.agent                    # the SFT export's agent settings
    assert call.lease_prefix == config.env.pool.key_prefix
    assert in_thread(job.heldout_states_stage, config, tmp_path, "default",
                     progress=said.append) == out
    assert len(exports) == 1 and said[-1].startswith("held-out states: reusing")
    assert not JobConfig().eval.heldout_states           # off unless a config asks for it


def test_sft_and_src_train_on_their_own_files_never_the_heldout_states(tmp_path, exports,
                                                                       monkeypatch):
    # Augmentation (its own tests: test_augment.py) would add sft-train.jsonl to what SFT
    # reads; here the question is only which exports each stage trains on.
    config = _config(tmp_path, "sft.augment_copies=0")
    in_thread(job.heldout_states_stage, config, tmp_path, "default", progress=lambda _: None)
    trained: list[str] = []

    def fake_train(sft, *_) -> dict:
        trained.append(sft.data)
        Path(sft.out).mkdir(parents=True, exist_ok=True)
        (Path(sft.out) / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
        (Path(sft.out) / "sft_summary.json").write_text("{}")
        return {"steps": 1, "first_loss": 1.0, "last_loss": 1.0, "wall_s": 0.1}

    collected = []

    async def fake_collection(collect, teacher, student, agent, tokenizer) -> dict:
        collected.append(collect)
        Path(collect.out).write_text('{"task_id": "train-task"}\n')
        return {k: 0 for k in ("attempts", "trajectories", "corrections", "archived",
                               "replay_fidelity", "wall_s")}

    class FakeServer:
        def __init__(self, _config):
            pass

        async def shutdown(self):
            pass
    monkeypatch.setattr(job, "train_sft", fake_train)
    monkeypatch.setattr(job, "run_collection", fake_collection)
    monkeypatch.setattr(job, "PolicyServer", FakeServer)
    monkeypatch.setattr(job, "HFChatTokenizer", lambda _path: None)
    monkeypatch.setattr(job, "ModelStudent", lambda *_: None)
    monkeypatch.setattr(job, "resolve_model", lambda m: m)
    sft_model = in_thread(job.sft_stage, config, tmp_path, "default", progress=lambda _: None)
    in_thread(job.src_stage, config, tmp_path, sft_model, progress=lambda _: None)
    held = str(tmp_path / job.HELDOUT_STATES)
    assert trained[0].startswith(str(tmp_path)) and trained[1] == str(tmp_path / "src-data.jsonl")
    assert held not in trained
    for data in trained:                          # not copied into what is trained on either
        assert "heldout-task" not in Path(data).read_text()
    assert "heldout-task" in Path(held).read_text()
    assert [c.split for c in exports] == [config.eval.split, "train"]
    assert [c.split for c in collected] == ["train"]


def test_the_learning_checks_heldout_tasks_are_none_of_its_training_tasks(tmp_path):
    config = _config(tmp_path)
    held = {t.id for t in select_tasks(ExportConfig(out="-", split=config.eval.split,
                                                    tasks=config.eval.tasks))}
    sft = {t.id for t in select_tasks(ExportConfig(out="-", split="train",
                                                   tasks=config.sft.tasks))}
    src = {t.id for t in select_tasks(ExportConfig(out="-", split="train",
                                                   tasks=config.src.tasks or config.sft.tasks))}
    orch = config.orchestrator
    grpo = {t.id for t in load_suite(Path(TASKS_DIR))
            if (orch.split == "all" or t.split == orch.split)
            and re.search(orch.task_filter, t.id)}
    assert held and sft and grpo
    assert not held & (sft | src | grpo)
