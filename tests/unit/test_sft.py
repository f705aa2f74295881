"""SFT: the loss mask covers exactly the action tokens (id-carrying and messages-only turns), the
end-of-turn token, malformed data named by line and field, batching, and a tiny-model run that
lowers the loss and writes a loadable folder (with the agent settings in its agent.json when
given). Also the export's pure parts: recorded prompts
equal the agent loop's, and the secret check."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from consolerl.errors import ConfigError
from consolerl.types import Observation, StepResult
from env_workers.actions import parse_action
from consolerl.accounts import Account
from consolerl.tasks import TASKS_DIR, load_suite
from rollout_service.agent import MODEL_SETTINGS, AgentConfig, AgentLoop, _Step
from rollout_service.models import (HFChatTokenizer, default_model, end_of_turn_id,
                                    model_agent_settings, tiny_model)
from tests.conftest import run_async
from cluster.export import parse_args
from datagen.export import (Recording, SecretLeak, account_secrets, build_record,
                            check_no_secrets, recording_policy)
from trainer.sft import (IGNORE, DataError, Example, SftConfig, build_sft_example,
                         load_examples, micro_batch_loss, plan_steps, train_sft)
from trainer.sft import main as sft_main

MESSAGES = [{"role": "system", "content": "You operate a console."},
            {"role": "user", "content": "TASK: Create a user\n[8] link \"Create User\"\n\n"
                                        "Your next action:"}]


@pytest.fixture(scope="module")
def tokenizer() -> HFChatTokenizer:
    return HFChatTokenizer(default_model())


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("tiny") / "model")


# ---- the loss mask -----------------------------------------------------------------------------
def test_end_of_turn_is_what_the_template_puts_after_an_assistant_message(tokenizer):
    eot = end_of_turn_id(tokenizer)
    assert tokenizer.decode([eot], skip_special_tokens=False) == "<|im_end|>"
    # The token the policy stops on: the default model's generation config ends on it (the
    # GGUF tokenizer's own eos_token, <|im_start|>, is not it).
    assert json.loads((default_model() / "generation_config.json").read_text())[
        "eos_token_id"] == eot


def test_id_carrying_turn_masks_every_prompt_token():
    ids, labels = build_sft_example({"prompt_ids": [5, 6, 7, 8], "response_ids": [40, 41, 2],
                                     "messages": "ignored when ids are given"}, tokenizer=None)
    assert ids == [5, 6, 7, 8, 40, 41, 2]
    assert labels == [IGNORE] * 4 + [40, 41, 2]


def test_messages_only_turn_is_the_chat_template_plus_the_action_and_end_of_turn(tokenizer):
    completion = 'fill(12, "Deploy \\"Bot\\"")'
    ids, labels = build_sft_example({"messages": MESSAGES, "completion": completion},
                                    tokenizer)
    prompt = tokenizer.apply_chat_template(MESSAGES, tokenize=True, add_generation_prompt=True)
    n = len(prompt)
    assert ids[:n] == prompt and labels[:n] == [IGNORE] * n
    response = ids[n:]
    assert labels[n:] == response and all(t != IGNORE for t in response)
    assert response[-1] == end_of_turn_id(tokenizer)
    # Decoded as the agent loop decodes a generation, it is the action, and the parser takes it.
    text = tokenizer.decode(response, skip_special_tokens=True)
    assert text == completion
    assert parse_action(text).to_text() == completion
    # The same ids as the whole conversation rendered by the template (up to its trailing "\n").
    full = tokenizer.apply_chat_template(MESSAGES + [{"role": "assistant",
                                                      "content": completion}],
                                         tokenize=True, add_generation_prompt=False)
    assert full[:len(ids)] == ids
    assert tokenizer.decode(full[len(ids):], skip_special_tokens=False) == "\n"


def test_id_and_messages_turns_agree_for_exported_data(tokenizer):
    completion = "click(8)"
    from_messages = build_sft_example({"messages": MESSAGES, "completion": completion},
                                      tokenizer)
    prompt = tokenizer.apply_chat_template(MESSAGES, tokenize=True, add_generation_prompt=True)
    from_ids = build_sft_example({"prompt_ids": prompt, "response_ids":
                                  tokenizer.encode(completion) + [end_of_turn_id(tokenizer)]},
                                 tokenizer)
    assert from_ids == from_messages


# ---- malformed data ----------------------------------------------------------------------------
GOOD = {"trajectory_id": "t", "task_id": "x", "turns": [
    {"prompt_ids": [1, 2, 3], "response_ids": [4, 2]}]}


@pytest.mark.parametrize("line, expected", [
    ("{not json", r"line 3: not valid JSON"),
    (json.dumps([1, 2]), r"line 3: must be a JSON object"),
    (json.dumps({"task_id": "x"}), r"line 3: field 'turns'"),
    (json.dumps({"turns": [{"prompt_ids": [1], "response_ids": [2]}], "reward": "high"}),
     r"line 3: field 'reward'"),
    (json.dumps({"turns": [GOOD["turns"][0], {"prompt_ids": [1, "a"], "response_ids": [2]}]}),
     r"line 3: turns\[1\]: field 'prompt_ids'"),
    (json.dumps({"turns": [{"prompt_ids": [1, 2]}]}), r"line 3: turns\[0\]: field 'response_ids'"),
    (json.dumps({"turns": [{"prompt_ids": [1], "response_ids": [True]}]}),
     r"line 3: turns\[0\]: field 'response_ids'"),
    (json.dumps({"turns": [{"messages": MESSAGES}]}), r"line 3: turns\[0\]: field 'completion'"),
    (json.dumps({"turns": [{"messages": MESSAGES + [{"role": "assistant", "content": "x"}],
                            "completion": "click(1)"}]}),
     r"line 3: turns\[0\]: field 'messages'.*assistant"),
    (json.dumps({"turns": [{"messages": [{"role": "boss", "content": "x"}],
                            "completion": "click(1)"}]}),
     r"line 3: turns\[0\]: field 'messages\[0\]'"),
    (json.dumps({"turns": [{"completion": "click(1)"}]}), r"line 3: turns\[0\]: field 'messages'"),
])
def test_malformed_lines_are_named_by_line_and_field(tmp_path, tokenizer, line, expected):
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps(GOOD) + "\n\n" + line + "\n" + json.dumps(GOOD) + "\n")
    with pytest.raises(DataError, match=expected) as info:
        load_examples(data, tokenizer, max_seq_len=4096)
    assert str(data) in str(info.value)
    assert isinstance(info.value, ValueError) and isinstance(info.value, ConfigError)


def test_bad_data_leaves_no_output_folder(tmp_path, tiny):
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps(GOOD) + "\n" + json.dumps({"turns": "none"}) + "\n")
    out = tmp_path / "models" / "sft"
    with pytest.raises(DataError, match=r"line 2: field 'turns'"):
        train_sft(SftConfig(data=str(data), out=str(out), model=str(tiny)))
    assert not out.exists()
    assert not (tmp_path / "models").exists() or not any((tmp_path / "models").iterdir())
    vocab = 10 ** 7
    data.write_text(json.dumps({"turns": [{"prompt_ids": [1, vocab], "response_ids": [2]}]}))
    with pytest.raises(DataError, match=r"line 1: turns\[0\]: a token id 10000000 is outside"):
        train_sft(SftConfig(data=str(data), out=str(out), model=str(tiny)))
    assert not out.exists() and not any(p.name.startswith(".sft") for p in tmp_path.rglob("*"))


def test_the_cli_reports_bad_data_by_line(tmp_path, capsys):
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps(GOOD) + "\n" + json.dumps(GOOD)[:-1] + "\n")
    assert sft_main(["--data", str(data), "--out", str(tmp_path / "m")]) == 2
    assert f"{data}: line 2: not valid JSON" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()


def test_teacher_mistakes_and_overlong_turns_are_skipped(tmp_path, tokenizer):
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"turns": [
        {"prompt_ids": [1, 2], "response_ids": [3, 2], "action_error": ""},
        {"prompt_ids": [1, 2], "response_ids": [3, 2], "action_error": "no element 99"},
        {"prompt_ids": list(range(1, 20)), "response_ids": [3, 2]}]}) + "\n")
    examples, stats = load_examples(data, tokenizer, max_seq_len=10)
    assert len(examples) == 1 and (examples[0].line, examples[0].turn) == (1, 0)
    assert stats == {"records": 1, "turns": 3, "skipped_action_error": 1, "skipped_too_long": 1}
    data.write_text(json.dumps({"turns": [{"prompt_ids": list(range(1, 20)),
                                           "response_ids": [3]}]}) + "\n")
    with pytest.raises(DataError, match="no trainable turn"):
        load_examples(data, tokenizer, max_seq_len=10)


# ---- batching and the loss ---------------------------------------------------------------------
def test_steps_respect_the_token_budgets_and_cover_each_epoch():
    lengths = [100, 700, 30, 450, 450, 1200, 64, 5, 300, 800]
    steps = plan_steps(lengths, max_tokens_per_batch=1000, micro_batch_tokens=600, epochs=2,
                       seed=3)
    for epoch in (0, 1):
        seen = sorted(i for e, micro in steps if e == epoch for g in micro for i in g)
        assert seen == list(range(len(lengths)))
    for _, micro in steps:
        batch = [i for g in micro for i in g]
        assert len(batch) == 1 or sum(lengths[i] for i in batch) <= 1000
        for group in micro:
            assert len(group) == 1 or len(group) * max(lengths[i] for i in group) <= 600
    assert plan_steps(lengths, 1000, 600, 2, seed=3) == steps


def test_micro_batch_loss_is_the_response_token_cross_entropy(tiny):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    a = Example([5, 6, 7, 8, 40, 41, 2], [IGNORE] * 4 + [40, 41, 2], 1, 0)
    b = Example([9, 10, 50, 2], [IGNORE] * 2 + [50, 2], 1, 1)
    kept, n = micro_batch_loss(model, [a, b], pad_id=2, device="cpu", keep_logits=True)
    full, m = micro_batch_loss(model, [a, b], pad_id=2, device="cpu", keep_logits=False)
    assert n == m == 5
    assert torch.allclose(kept, full, atol=1e-5)
    # Each row alone equals the model's own masked loss (mean over the response tokens).
    total = sum(model(input_ids=torch.tensor([e.input_ids]), labels=torch.tensor([e.labels])
                      ).loss * e.response_tokens for e in (a, b))
    assert torch.allclose(kept, total, atol=1e-4)


# ---- a tiny run --------------------------------------------------------------------------------
def _synthetic(path: Path, tokenizer) -> None:
    eot = end_of_turn_id(tokenizer)
    lines = []
    for n in range(8):
        messages = [{"role": "system", "content": "You operate a console."},
                    {"role": "user", "content": f"Open item {n}.\n[{n}] link \"Item {n}\""}]
        action = f"click({n})"
        turn = {"messages": messages, "completion": action}
        if n % 2:                      # half of them token-faithful, as the export writes them
            turn |= {"prompt_ids": tokenizer.apply_chat_template(messages),
                     "response_ids": tokenizer.encode(action) + [eot]}
        lines.append(json.dumps({"trajectory_id": f"t{n}", "task_id": "synthetic",
                                 "source": "oracle", "reward": 1.0, "turns": [turn]}))
    path.write_text("\n".join(lines) + "\n")


def test_tiny_sft_lowers_the_loss_and_writes_a_loadable_folder(tmp_path, tiny, tokenizer):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    data = tmp_path / "data.jsonl"
    _synthetic(data, tokenizer)
    out = tmp_path / "sft"
    summary = train_sft(SftConfig(data=str(data), out=str(out), model=str(tiny), epochs=6,
                                  lr=3e-3, max_tokens_per_batch=200, micro_batch_tokens=100))
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == summary["steps"] >= 12
    assert {"loss", "tokens", "response_tokens", "lr", "grad_norm"} <= set(metrics[0])
    first = sum(m["loss"] for m in metrics[:3]) / 3
    last = sum(m["loss"] for m in metrics[-3:]) / 3
    assert last < first - 1.0, (first, last)
    assert summary["records"] == summary["turns"] == summary["turns_trained"] == 8
    assert summary["tokens_trained"] == sum(m["response_tokens"] for m in metrics)
    assert summary["first_loss"] == metrics[0]["loss"] and summary["peak_rss_mb"] > 0
    assert json.loads((out / "sft_summary.json").read_text())["last_loss"] == summary["last_loss"]
    model = AutoModelForCausalLM.from_pretrained(out)
    assert AutoTokenizer.from_pretrained(out).apply_chat_template(
        MESSAGES, tokenize=False, add_generation_prompt=True).endswith("<|im_start|>assistant\n")
    eos = model.generation_config.eos_token_id
    assert 2 in (eos if isinstance(eos, list) else [eos])      # stops on <|im_end|>
    assert not any(p.name.startswith(".sft") for p in tmp_path.iterdir())
    with pytest.raises(ConfigError, match="exists"):
        train_sft(SftConfig(data=str(data), out=str(out), model=str(tiny), epochs=1))
    assert model_agent_settings(out) is None          # no agent given: no agent.json


def test_sft_keeps_the_agent_settings_in_the_model_folder(tmp_path, tiny, tokenizer):
    data = tmp_path / "data.jsonl"
    _synthetic(data, tokenizer)
    agent = AgentConfig(system_prompt="grounded", response="grounded", page_view="compact",
                        random_ids=True, history_turns=2, max_observation_chars=2300,
                        max_prompt_tokens=1024, max_new_tokens=48, max_steps=6)
    out = tmp_path / "sft"
    train_sft(SftConfig(data=str(data), out=str(out), model=str(tiny), epochs=1), agent)
    stored = json.loads((out / "agent.json").read_text())
    assert stored == {"format": 1, **{n: getattr(agent, n) for n in MODEL_SETTINGS}}
    assert "max_steps" not in stored                  # not a model setting
    assert model_agent_settings(out) == {n: getattr(agent, n) for n in MODEL_SETTINGS}
    assert model_agent_settings(out)["response"] == "grounded"


# ---- the export's pure parts -------------------------------------------------------------------
def _obs(n: int, text: str = "", error: str = "") -> Observation:
    return Observation(f"http://127.0.0.1:1/console/ram/users?p={n}", f"Page {n}",
                       text or f'[{n}] button "Next {n}"', last_action_error=error, step=n)


def test_recorded_turns_have_the_agent_loops_prompts(tokenizer):
    task = next(t for t in load_suite(TASKS_DIR) if t.id == "ram-create-user-0")
    config = AgentConfig(history_turns=2, max_prompt_tokens=700, max_observation_chars=6000,
                         min_observation_chars=200)
    sent = ["click(1)", "bogus output", "click(3)", "fill(4, \"x\")", 'stop("done")']

    async def step(text: str) -> StepResult:
        n = sent.index(text) + 1
        parsed = parse_action(text)
        action = parsed.to_text() if hasattr(parsed, "to_text") else ""
        error = "" if action else "unparsable"
        big = "row\n" * 3000 if n == 3 else ""             # a page the prompt must cut
        return StepResult(_obs(n, big, error), done=n == len(sent), action_text=action,
                          answer="done" if n == len(sent) else None)

    async def teacher(task, values, step_fn, observation):
        result = None
        for text in sent:
            result = await step_fn(text)
        return result

    recording = Recording()
    policy = recording_policy(config, recording, teacher=teacher)
    run_async(policy(task, {"user_name": "u1", "display_name": "D"}, step, _obs(0)))
    turns = recording.turns
    assert [t.action_text for t in turns] == ["click(1)", "", "click(3)", 'fill(4, "x")',
                                              'stop("done")']
    # The agent loop's history: canonical action, error only when the text did not parse,
    # the last history_turns of them.
    assert turns[2].history == (_Step("click(1)", ""), _Step("bogus output", "unparsable"))
    assert turns[4].history == (_Step("click(3)", ""), _Step('fill(4, "x")', ""))
    assert turns[3].observation.text.startswith("row\n")
    record = build_record(task, "solved", recording, tokenizer, config)
    loop = AgentLoop(None, tokenizer, config)
    procedure = task.procedure.replace("{user_name}", "u1").replace("{display_name}", "D")
    for turn, rec in zip(record["turns"], turns):
        assert turn["prompt_ids"] == loop.prompt_ids(task.title, procedure, list(rec.history),
                                                     rec.observation)
        assert tokenizer.apply_chat_template(turn["messages"]) == turn["prompt_ids"]
        assert tokenizer.decode(turn["response_ids"]) == turn["completion"]
    # The long page was cut to fit, and the messages are the cut ones.
    assert "more characters of the page omitted" in record["turns"][3]["messages"][1]["content"]
    assert len(record["turns"][3]["prompt_ids"]) <= 700
    assert record["turns"][1]["completion"] == "bogus output"
    assert record["turns"][1]["action_error"] == "unparsable"


def test_a_line_with_an_account_secret_is_refused_without_quoting_it():
    account = Account("1000000000000009", "zed", 'Pass"word-2026', "LTAI5tLocalZed00000001",
                      "LocalSecretZed00000000000000001")
    secrets = account_secrets([account])
    check_no_secrets(json.dumps({"text": "signed in as zed"}), secrets)
    for leaked in ("LocalSecretZed00000000000000001", 'Pass"word-2026'):
        line = json.dumps({"turns": [{"messages": [{"content": f"key {leaked}"}]}]})
        with pytest.raises(SecretLeak) as info:
            check_no_secrets(line, secrets)
        assert "zed" in str(info.value) and leaked not in str(info.value)


def test_export_cli_takes_the_prompt_settings_from_the_rollout_config(tmp_path):
    config = parse_args(["--out", str(tmp_path / "x.jsonl"), "--config", "configs/cpu.yaml",
                         "--history-turns", "2", "--split", "test"])
    assert (config.agent.history_turns, config.agent.max_prompt_tokens,
            config.agent.max_observation_chars, config.agent.max_steps) == (2, 3072, 6000, 12)
    assert config.split == "test"
    plain = parse_args(["--out", "x.jsonl"])
    assert (plain.agent.history_turns, plain.agent.max_prompt_tokens,
            plain.agent.max_observation_chars) == (4, 3072, 6000)
    with pytest.raises(SystemExit):
        parse_args(["--out", "x.jsonl", "--workers", "0"])


def test_the_jobs_sft_stage_trains_into_the_run_folder_and_logs_its_steps(tmp_path, tiny,
                                                                          tokenizer):
    from consolerl.config import load_config
    from cluster.config import JobConfig
    from cluster.job import sft_stage
    data = tmp_path / "data.jsonl"
    _synthetic(data, tokenizer)
    config = load_config(JobConfig, "configs/smoke.yaml",
                         ["sft.enabled=true", f"sft.data={data}", "sft.epochs=1"])
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text('{"stage": "grpo", "step": 1}\n')
    said: list[str] = []
    model = sft_stage(config, run_dir, str(tiny), progress=said.append)
    assert model == str(run_dir / "sft") and (run_dir / "sft" / "config.json").exists()
    # The run's agent settings travel with the model folder.
    assert model_agent_settings(model) == {n: getattr(config.agent, n) for n in MODEL_SETTINGS}
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[0] == {"stage": "grpo", "step": 1}
    assert [r["stage"] for r in rows[1:]] == ["sft"] * (len(rows) - 1) and len(rows) > 1
    assert all("loss" in r and "step" in r for r in rows[1:])
    assert sft_stage(config, run_dir, str(tiny), progress=said.append) == model   # resume
    assert said[-1].startswith("SFT: reusing")


def test_sft_with_train_layers_changes_only_the_top_layers(tmp_path, tiny, tokenizer):
    from transformers import AutoModelForCausalLM
    data = tmp_path / "data.jsonl"
    _synthetic(data, tokenizer)
    out = tmp_path / "sft"
    train_sft(SftConfig(data=str(data), out=str(out), model=str(tiny), epochs=1, lr=1e-2,
                        max_tokens_per_batch=200, micro_batch_tokens=100, train_layers=1))
    before = AutoModelForCausalLM.from_pretrained(tiny).state_dict()
    after = AutoModelForCausalLM.from_pretrained(out).state_dict()
    top = f"model.layers.{sum(1 for k in before if k.endswith('input_layernorm.weight')) - 1}."
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(k.startswith(top) or k == "model.norm.weight" for k in changed)
    with pytest.raises(ConfigError, match="SftConfig.train_layers"):
        SftConfig(data="d", out="o", train_layers=-1)
