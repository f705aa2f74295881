"""Oracle trajectories exported from real episodes (the system Chromium on the local cloud,
account leases in a real Redis, both started by the export), checked token by token against
the agent loop's prompts, then one epoch of SFT on them with the tiny model."""
from __future__ import annotations

import json

from env_workers.actions import parse_action
from consolerl.accounts import load_accounts
from infra.console_sim.config import DEFAULT_ACCOUNTS_FILE
from consolerl.resources import fill
from consolerl.tasks import TASKS_DIR, load_suite
from rollout_service.agent import AgentConfig, AgentLoop, _Step
from datagen.export import ExportConfig, run_export
from rollout_service.models import HFChatTokenizer, default_model, end_of_turn_id, tiny_model
from tests.conftest import run_async
from trainer.sft import SftConfig, train_sft

TASKS = ("ram-create-user-0", "ram-create-accesskey-wrongdoc")     # solved / infeasible, train


def test_export_oracle_trajectories_then_sft_on_them(tmp_path):
    agent = AgentConfig(history_turns=2, max_prompt_tokens=3072, max_observation_chars=6000)
    out = tmp_path / "data" / "oracle.jsonl"
    seen = {}
    summary = run_async(run_export(
        ExportConfig(out=str(out), tasks="^(" + "|".join(TASKS) + ")$", workers=2, agent=agent),
        on_record=lambda record, recording: seen.__setitem__(record["trajectory_id"],
                                                             recording)))
    assert summary["episodes"] == summary["written"] == 2, summary
    assert summary["statuses"] == {"solved": 1, "infeasible_reported": 1}
    assert [p.name for p in out.parent.iterdir()] == ["oracle.jsonl"]     # no temp file left

    text = out.read_text()
    for account in load_accounts(DEFAULT_ACCOUNTS_FILE):
        assert account.password not in text and account.access_key_secret not in text
    records = {r["task_id"]: r for r in map(json.loads, text.splitlines())}
    assert set(records) == set(TASKS)

    tokenizer = HFChatTokenizer(default_model())
    eot = end_of_turn_id(tokenizer)
    loop = AgentLoop(None, tokenizer, agent)
    tasks = {t.id: t for t in load_suite(TASKS_DIR) if t.id in TASKS}
    for task_id, record in records.items():
        assert record["source"] == "oracle" and record["reward"] == 1.0
        assert record["agent"]["history_turns"] == 2
        recording = seen[record["trajectory_id"]]
        task = tasks[task_id]
        procedure = fill(task.procedure, recording.values)
        assert len(record["turns"]) == len(recording.turns)
        history: list[_Step] = []
        for turn, recorded in zip(record["turns"], recording.turns):
            # The prompt is exactly what the policy sees on that page with that history.
            assert turn["prompt_ids"] == loop.prompt_ids(task.title, procedure, history[-2:],
                                                         recorded.observation)
            assert tokenizer.decode(turn["prompt_ids"], skip_special_tokens=False) == \
                tokenizer.tokenizer.apply_chat_template(turn["messages"], tokenize=False,
                                                        add_generation_prompt=True)
            assert recorded.observation.url in turn["messages"][1]["content"]
            # The response: the action's tokens, then <|im_end|>; decoded as the agent loop
            # decodes a generation, the env worker's parser takes it unchanged.
            assert turn["response_ids"][-1] == eot
            action = tokenizer.decode(turn["response_ids"], skip_special_tokens=True)
            assert action == turn["completion"] == parse_action(action).to_text()
            assert turn["action_error"] == ""
            history.append(_Step(turn["completion"], ""))
    assert records["ram-create-user-0"]["turns"][-1]["completion"].startswith("stop(")
    assert len(records["ram-create-user-0"]["turns"]) >= 3
    # The wrong document: the oracle opens the user's page (where the doc's Authentication
    # tab should be), then reports it infeasible naming what the page lacks.
    opened, report = records["ram-create-accesskey-wrongdoc"]["turns"]
    assert opened["completion"].startswith("click(")
    assert report["completion"].startswith("report_infeasible(")
    assert "Create AccessKey" in report["completion"]

    tiny = tiny_model(tmp_path / "tiny")
    result = train_sft(SftConfig(data=str(out), out=str(tmp_path / "sft"), model=str(tiny),
                                 epochs=1, max_tokens_per_batch=4096))
    turns = sum(len(r["turns"]) for r in records.values())
    assert result["records"] == 2 and result["turns_trained"] == turns
    assert result["tokens_trained"] == sum(len(t["response_ids"]) for r in records.values()
                                           for t in r["turns"])
    assert (tmp_path / "sft" / "model.safetensors").exists()
    assert (tmp_path / "sft" / "sft_summary.json").exists()
