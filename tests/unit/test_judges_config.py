"""``reward.judges``: the config section of the reward service's LLM judges, its validation
(a ConfigError naming the field), and what the composition root builds from it."""
from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from cluster.config import JobConfig, RewardSection
from cluster.judges import JudgeSection, build_judge_channel, judge_config, start_judges
from consolerl.config import load_config
from consolerl.errors import ConfigError
from reward_service.fusion import RewardConfig, fuse
from reward_service.judges import JudgeChannel, JudgeConfig

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_the_section_is_off_by_default_and_reward_stays_a_reward_config():
    config = load_config(JobConfig, None, [])
    assert isinstance(config.reward, RewardSection) and isinstance(config.reward, RewardConfig)
    assert config.reward.judges == JudgeSection() and not config.reward.judges.active
    # fuse takes the section as it is.
    assert fuse("success", None, None, None, config.reward).verdict == "undetermined"
    from cluster.builders import rollout_spec
    assert rollout_spec(config, config.policy, None).judges is None


def test_overrides_reach_the_section():
    config = load_config(JobConfig, CONFIGS / "cpu.yaml", [
        "reward.judges.enabled=true", "reward.judges.endpoint=https://llm.example:8443/v1",
        "reward.judges.model=qwen", "reward.judges.api_key_env=JUDGE_KEY", "reward.judges.k=5",
        "reward.judges.consensus=majority", "reward.judges.temperatures=[0.0, 0.3, 0.5, 0.7, 1.0]",
        "reward.judges.deadline_s=20", "reward.judges.timeout_s=5", "reward.judges.concurrency=4",
        "reward.judges.audit_fraction=0.1", "reward.success_reward=2"])
    judges = config.reward.judges
    assert (judges.k, judges.consensus, judges.temperatures[-1], judges.concurrency,
            config.reward.success_reward) == (5, "majority", 1.0, 4, 2)
    assert judges.active and judges.remote and not judges.policy_model
    cfg = judge_config(judges)
    assert (cfg.k, cfg.deadline_s, cfg.timeout_s, cfg.concurrency, cfg.retries,
            cfg.audit_fraction) == (5, 20, 5, 4, 2, 0.1)


def test_the_section_is_the_channels_config():
    """One set of fields: every JudgeConfig setting is the section's, and reaches the channel
    (only the endpoint's own settings stay behind)."""
    config = load_config(JobConfig, None, ["reward.judges.max_trajectory_chars=5000",
                                           "reward.judges.system_prompts=[a, b]"])
    judges = config.reward.judges
    assert isinstance(judges, JudgeConfig)
    cfg = judge_config(judges)
    assert type(cfg) is JudgeConfig and cfg.max_trajectory_chars == 5000
    assert cfg.system_prompts == ("a", "b") and cfg.timeout_s == judges.timeout_s == 30
    with pytest.raises(ConfigError, match=r"reward\.judges\.max_trajectory_chars"):
        load_config(JobConfig, None, ["reward.judges.max_trajectory_chars=10"])


@pytest.mark.parametrize("overrides, field", [
    (["reward.judges.enabled=true", "reward.judges.endpoint=\"\""], "reward.judges.endpoint"),
    (["reward.judges.endpoint=ftp://x"], "reward.judges.endpoint"),
    (["reward.judges.endpoint=policy:"], "reward.judges.endpoint"),
    (["reward.judges.enabled=true", "reward.judges.endpoint=http://h:1"], "reward.judges.model"),
    (["reward.judges.api_key_env=NOT A NAME"], "reward.judges.api_key_env"),
    (["reward.judges.k=0"], "reward.judges.k"),
    (["reward.judges.consensus=plurality"], "reward.judges.consensus"),
    (["reward.judges.min_valid=4"], "reward.judges.min_valid"),
    (["reward.judges.timeout_s=0"], "reward.judges.timeout_s"),
    (["reward.judges.deadline_s=-1"], "reward.judges.deadline_s"),
    (["reward.judges.timeout_s=90", "reward.judges.deadline_s=60"], "reward.judges.timeout_s"),
    (["reward.judges.concurrency=0"], "reward.judges.concurrency"),
    (["reward.judges.retries=-1"], "reward.judges.retries"),
    (["reward.judges.max_tokens=0"], "reward.judges.max_tokens"),
    (["reward.judges.max_tokens=64"], "reward.judges.max_tokens"),
    (["reward.judges.temperatures=[0.1, 0.2]"], "reward.judges.temperatures"),
    (["reward.judges.temperatures=[9]"], "reward.judges.temperatures"),
    (["reward.judges.audit_fraction=1.5"], "reward.judges.audit_fraction"),
    (["reward.judges.enabled=maybe"], "reward.judges.enabled"),
    (["reward.judges.nope=1"], "nope"),
])
def test_errors_name_the_field(overrides, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_config(JobConfig, CONFIGS / "cpu.yaml", overrides)


def test_a_short_reply_budget_is_fine_for_free_text_only():
    """Under structured output a budget below the longest vote would cut votes short."""
    config = load_config(JobConfig, CONFIGS / "cpu.yaml",
                         ["reward.judges.max_tokens=64", "reward.judges.structured=false"])
    assert config.reward.judges.max_tokens == 64


def test_api_key_env_empty_is_none():
    assert JudgeSection(api_key_env="").api_key_env is None


def test_a_remote_channel_is_built_with_its_metrics(monkeypatch):
    monkeypatch.setenv("CONSOLERL_TEST_JUDGE_KEY", "sk-test")
    section = JudgeSection(enabled=True, endpoint="http://127.0.0.1:9/v1", model="m", k=3,
                           api_key_env="CONSOLERL_TEST_JUDGE_KEY", temperatures=(0.0, 0.5, 1.0),
                           concurrency=2, deadline_s=1.0, timeout_s=0.5)
    registry = CollectorRegistry()
    channel = build_judge_channel(section, registry)
    assert isinstance(channel, JudgeChannel) and channel.config.concurrency == 2
    assert registry.get_sample_value("consolerl_reward_judge_calls_total",
                                     {"outcome": "ok"}) == 0
    assert [c.temperature for c in channel.clients] == [0.0, 0.5, 1.0]
    assert "sk-test" not in repr(channel.clients)
    # Nothing listens on port 9: undetermined within the deadline, never an exception.
    verdict = channel.judge("t", "p", ["click('a1')"], "page", answer="ok")
    assert verdict.verdict == "undetermined"
    assert build_judge_channel(JudgeSection(), registry) is None
    assert start_judges(JudgeSection())[0] is None


def test_a_missing_key_fails_when_built(monkeypatch):
    monkeypatch.delenv("CONSOLERL_TEST_JUDGE_KEY", raising=False)
    section = JudgeSection(enabled=True, endpoint="http://127.0.0.1:9", model="m",
                           api_key_env="CONSOLERL_TEST_JUDGE_KEY")
    with pytest.raises(ConfigError, match="CONSOLERL_TEST_JUDGE_KEY"):
        build_judge_channel(section)


def test_a_policy_endpoint_needs_its_served_url():
    section = JudgeSection(enabled=True, endpoint="policy:default")
    assert section.policy_model == "default" and not section.remote
    with pytest.raises(ConfigError, match="serve_judge"):
        build_judge_channel(section)
    channel = build_judge_channel(section, base_url="http://127.0.0.1:9", model="smol")
    assert channel.clients[0].model == "smol"


@pytest.mark.parametrize("name, endpoint", [("cpu.yaml", "policy:default"),
                                            ("serve.yaml", "policy:default"),
                                            ("gpu-cluster.yaml", "https://")])
def test_shipped_configs_carry_the_section_off_and_ready(name, endpoint):
    config = load_config(JobConfig, CONFIGS / name)
    assert not config.reward.judges.active
    assert config.reward.judges.endpoint.startswith(endpoint)
    on = load_config(JobConfig, CONFIGS / name, ["reward.judges.enabled=true"])
    assert on.reward.judges.active
