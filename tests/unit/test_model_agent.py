"""The agent settings that travel with a model folder: agent.json read back and validated, the
rule by which a config's agent section meets them (unnamed: the model's; named and equal: fine;
named and different: refused, naming the setting), what a model without the file runs with,
the jobs API's per-model agent, and the model ``make serve`` picks."""
from __future__ import annotations

import json
import os
import types
from dataclasses import replace
from pathlib import Path

import pytest

from cluster.builders import jobs_api_specs, served_models
from cluster.config import JobConfig, agent_named, served_agent
from cluster.jobs_api import JobsScheduler
from cluster.serve import newest_trained_model, pick_model
from consolerl.config import load_config
from consolerl.errors import ConfigError
from rollout_service.agent import MODEL_SETTINGS, AgentConfig
from rollout_service.models import (DEFAULT_NAME, agent_for_model, cache_dir,
                                    model_agent_settings, write_agent_settings)
from rollout_service.policy import PolicyConfig
from tests.conftest import run_async

TRAINED = AgentConfig(system_prompt="compact", page_view="compact", history_turns=2,
                      max_observation_chars=2300, max_prompt_tokens=1024, max_new_tokens=48)


def _model(folder: Path, agent: AgentConfig | None = TRAINED, mtime: float | None = None
           ) -> Path:
    """A model folder as a training stage leaves it (the weights' contents do not matter)."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"")
    if agent is not None:
        write_agent_settings(folder, agent)
    if mtime is not None:
        os.utime(folder, (mtime, mtime))
    return folder


# ---- agent.json ---------------------------------------------------------------------------------
def test_agent_json_round_trips_every_model_setting(tmp_path):
    folder = _model(tmp_path / "m")
    stored = json.loads((folder / "agent.json").read_text())
    assert set(stored) == {"format", *MODEL_SETTINGS} and stored["format"] == 1
    assert model_agent_settings(folder) == {n: getattr(TRAINED, n) for n in MODEL_SETTINGS}
    assert model_agent_settings(_model(tmp_path / "base", agent=None)) is None
    assert model_agent_settings(tmp_path / "nowhere") is None
    assert model_agent_settings("HuggingFaceTB/SmolLM2-135M-Instruct") is None


def test_a_setting_the_file_leaves_out_is_the_default(tmp_path):
    folder = tmp_path / "old"
    folder.mkdir()
    (folder / "agent.json").write_text(json.dumps({"format": 1, "history_turns": 2}))
    settings = model_agent_settings(folder)
    assert settings["history_turns"] == 2
    assert settings["page_view"] == AgentConfig().page_view == "full"


@pytest.mark.parametrize("content, names", [
    ("not json", "not a readable JSON"),
    ("[1, 2]", "must hold a JSON object"),
    (json.dumps({"history_turns": 2}), "'format'"),
    (json.dumps({"format": 2}), "'format'"),
    (json.dumps({"format": 1, "temperature": 0.5}), "'temperature'"),
    (json.dumps({"format": 1, "history_turns": "two"}), "history_turns"),
    (json.dumps({"format": 1, "max_prompt_tokens": 3}), "max_prompt_tokens"),
    (json.dumps({"format": 1, "page_view": "tiny"}), "page_view"),
    (json.dumps({"format": 1, "response": "grounded"}), "response"),
])
def test_a_bad_agent_json_names_the_file_and_the_key(tmp_path, content, names):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "agent.json").write_text(content)
    with pytest.raises(ConfigError) as err:
        model_agent_settings(folder)
    assert str(folder / "agent.json") in str(err.value) and names in str(err.value)


def test_the_grpo_final_model_keeps_the_runs_agent_settings(tmp_path, monkeypatch):
    import cluster.job as job
    start = _model(tmp_path / "sft")
    (start / "tokenizer.json").write_text("{}")

    def save(_workers, _engine, method, folder):      # rank 0 writes the weights
        assert method == "save_pretrained"
        Path(folder).mkdir()
        (Path(folder) / "config.json").write_text("{}")
        return None, []
    monkeypatch.setattr(job, "call_for_rank0", save)
    monkeypatch.setattr(job.ray, "get", lambda refs: refs)
    agent = AgentConfig(history_turns=1, page_view="compact")
    final = job._save_final([], None, str(start), tmp_path / "final", agent)
    assert model_agent_settings(final) == {n: getattr(agent, n) for n in MODEL_SETTINGS}
    assert (Path(final) / "tokenizer.json").exists()


# ---- the merge rule -----------------------------------------------------------------------------
SETTINGS = {n: getattr(TRAINED, n) for n in MODEL_SETTINGS}


def test_a_setting_the_config_does_not_name_takes_the_models():
    config = AgentConfig(max_steps=9, temperature=0.3, history_turns=4)
    merged = agent_for_model(config, frozenset(), SETTINGS, "m")
    assert {n: getattr(merged, n) for n in MODEL_SETTINGS} == SETTINGS
    assert (merged.max_steps, merged.temperature) == (9, 0.3)     # not model settings


def test_a_named_setting_equal_to_the_models_is_fine():
    config = AgentConfig(system_prompt="compact", history_turns=2)
    merged = agent_for_model(config, {"system_prompt", "history_turns"}, SETTINGS, "m")
    assert merged.history_turns == 2 and merged.page_view == "compact"


def test_a_named_setting_other_than_the_models_is_refused_naming_it():
    config = AgentConfig(history_turns=3)
    with pytest.raises(ConfigError) as err:
        agent_for_model(config, {"history_turns"}, SETTINGS, "runs/x/final")
    message = str(err.value)
    assert message.startswith("agent.history_turns:")
    assert "3" in message and "2" in message and "runs/x/final" in message
    # Named with the default value is still named: 4 is AgentConfig's default, the model's 2.
    with pytest.raises(ConfigError, match="agent.history_turns"):
        agent_for_model(AgentConfig(), {"history_turns"}, SETTINGS, "m")


def test_without_agent_json_the_config_holds():
    config = AgentConfig(history_turns=3)
    assert agent_for_model(config, {"history_turns"}, None, "m") is config


def test_named_is_what_the_yaml_and_the_overrides_state(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("agent:\n  max_steps: 5\n  history_turns: 4\npolicy:\n  model: default\n")
    assert agent_named(path) == {"history_turns"}            # max_steps: not a model setting
    assert agent_named(path, ["agent.page_view=full"]) == {"history_turns", "page_view"}
    assert agent_named(None) == frozenset()
    assert agent_named("configs/learning-check.yaml") >= {"system_prompt", "history_turns",
                                                          "max_observation_chars"}


# ---- evaluation and serving ---------------------------------------------------------------------
def test_served_agent_takes_the_trained_models_and_refuses_a_contradiction(tmp_path):
    config = load_config(JobConfig, "configs/learning-check.yaml")
    named = agent_named("configs/learning-check.yaml")
    own = str(_model(tmp_path / "own", agent=config.agent))    # trained with these settings
    assert served_agent(config, named, own) == config.agent
    turns = config.agent.history_turns
    other = str(_model(tmp_path / "other", agent=replace(config.agent, history_turns=turns + 1)))
    with pytest.raises(ConfigError, match=f"agent.history_turns: the config says {turns}, "
                                          f"the model {other} was trained with {turns + 1}"):
        served_agent(config, named, other)
    trained = str(_model(tmp_path / "final"))
    serve = load_config(JobConfig, "configs/serve.yaml")
    assert served_agent(serve, agent_named("configs/serve.yaml"), trained).max_prompt_tokens \
        == 1024                                              # serve.yaml names none of them
    overrides = ["agent.max_observation_chars=2500"]
    with pytest.raises(ConfigError, match="agent.max_observation_chars.*2500.*2300"):
        served_agent(load_config(JobConfig, "configs/serve.yaml", overrides),
                     agent_named("configs/serve.yaml", overrides), trained)


def test_a_model_without_agent_json_runs_as_today(tmp_path):
    base = str(_model(tmp_path / "base", agent=None))
    serve = load_config(JobConfig, "configs/serve.yaml")
    agent = served_agent(serve, agent_named("configs/serve.yaml"), base)
    # configs/serve.yaml's settings for such a model (base_model_agent)
    assert (agent.history_turns, agent.max_observation_chars, agent.max_prompt_tokens,
            agent.max_new_tokens, agent.system_prompt) == (3, 2500, 1536, 48, "full")
    overrides = ["agent.max_new_tokens=12"]                  # a stated setting holds over it
    agent = served_agent(load_config(JobConfig, "configs/serve.yaml", overrides),
                         agent_named("configs/serve.yaml", overrides), base)
    assert agent.max_new_tokens == 12 and agent.history_turns == 3
    with pytest.raises(ConfigError, match="base_model_agent.max_steps"):
        load_config(JobConfig, "configs/serve.yaml", ["base_model_agent.max_steps=3"])


def test_served_models_print_the_settings_and_refuse_at_start(tmp_path):
    trained = str(_model(tmp_path / "run" / "final"))
    serve = load_config(JobConfig, "configs/serve.yaml", [f"api.models={{ckpt: {tmp_path}/run}}"])
    named = agent_named("configs/serve.yaml")
    lines = served_models(serve, named, trained)
    assert lines[0].startswith(f"live: {trained}, trained with system_prompt=compact")
    assert "history_turns=2" in lines[0] and "agent.json" in lines[0]
    assert lines[1].startswith(f"ckpt: {trained}")          # the run folder's final model
    base = served_models(serve, named, str(cache_dir() / DEFAULT_NAME))
    assert "untrained base model" in base[0] and "inconclusive" in base[0]
    assert "history_turns=3" in base[0]
    with pytest.raises(ConfigError, match="agent.history_turns"):
        served_models(load_config(JobConfig, "configs/serve.yaml", ["agent.history_turns=3"]),
                      {"history_turns"}, trained)


def test_the_jobs_api_runs_each_model_with_its_settings(tmp_path):
    """The scheduler's agent for the live policy: a trained model's settings over the job's
    (max_new_tokens too), the job's sampling kept; a contradiction named in the config is
    refused at the first job; a model without agent.json runs with the job's config."""
    trained = str(_model(tmp_path / "final"))
    config = load_config(JobConfig, "configs/serve.yaml")
    policy = PolicyConfig(model=trained)
    scheduler_spec, _ = jobs_api_specs(config, policy, None,
                                       named=agent_named("configs/serve.yaml"))
    assert scheduler_spec.rollout.agent.history_turns == 3     # base_model_agent's
    job = AgentConfig(temperature=0.2, max_steps=7, max_new_tokens=32, history_turns=3)

    def scheduler(spec) -> JobsScheduler:
        fake = types.SimpleNamespace(spec=spec, settings={},
                                     side=types.SimpleNamespace(agent=lambda c: c))
        fake._settings = types.MethodType(JobsScheduler._settings, fake)
        return fake

    got = run_async(JobsScheduler.agent_for(scheduler(scheduler_spec), "live", job))
    assert {n: getattr(got, n) for n in MODEL_SETTINGS} == SETTINGS
    assert (got.temperature, got.max_steps, got.max_new_tokens) == (0.2, 7, 48)
    refused = jobs_api_specs(config, policy, None, named=frozenset({"history_turns"}))[0]
    with pytest.raises(ConfigError, match="agent.history_turns"):
        run_async(JobsScheduler.agent_for(scheduler(refused), "live", job))
    untrained = jobs_api_specs(config, PolicyConfig(model=str(_model(tmp_path / "b", None))),
                               None)[0]
    assert run_async(JobsScheduler.agent_for(scheduler(untrained), "live", job)) == job


# ---- the model make serve picks -----------------------------------------------------------------
def test_make_serve_picks_the_newest_trained_model(tmp_path):
    runs = tmp_path / "runs"
    _model(runs / "demo" / "sft", mtime=1_000)
    newest = _model(runs / "demo" / "final", mtime=3_000)
    _model(runs / "old" / "final", agent=None, mtime=9_000)    # no agent.json: not trained here
    _model(runs / "demo" / ".sft.sft-x", mtime=9_000)          # a stage's temporary folder
    _model(runs / "demo" / "final.tmp", mtime=9_000)
    (runs / "half").mkdir()
    write_agent_settings(runs / "half", TRAINED)               # agent.json without weights
    os.utime(runs / "half", (9_000, 9_000))
    assert newest_trained_model(runs) == newest
    assert pick_model("newest", runs, "default") == (str(newest),
                                                     f"the newest trained model under {runs}/")
    later = _model(runs / "learning" / "sft-src", mtime=5_000)
    assert newest_trained_model(runs) == later


def test_make_serve_serves_a_named_model_or_else_the_base_model(tmp_path):
    named = _model(tmp_path / "mine")
    assert pick_model(str(named), tmp_path, "default") == (str(named), "named")
    assert pick_model("", tmp_path, "default") == ("default", "policy.model")
    model, why = pick_model("newest", tmp_path / "empty", "default")
    assert model == "default" and "no trained model" in why and "base model" in why
    assert newest_trained_model(tmp_path / "missing") is None
