"""The shipped configs load into the typed rollout config, and overrides apply."""
from __future__ import annotations

from pathlib import Path

import pytest

from consolerl.config import load_config
from consolerl.errors import ConfigError
from rollout_service.config import RolloutConfig

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.mark.parametrize("name", ["cpu.yaml", "gpu-cluster.yaml"])
def test_shipped_configs_load(name):
    config = load_config(RolloutConfig, CONFIGS / name)
    assert config.orchestrator.group_size >= 2
    assert config.policy.backend in ("transformers", "vllm")


def test_overrides_and_errors():
    config = load_config(RolloutConfig, CONFIGS / "cpu.yaml",
                         ["orchestrator.mode=sync", "agent.max_steps=5", "env.workers=4"])
    assert (config.orchestrator.mode, config.agent.max_steps, config.env.workers) == (
        "sync", 5, 4)
    with pytest.raises(ConfigError, match="OrchestratorConfig.mode"):
        load_config(RolloutConfig, CONFIGS / "cpu.yaml", ["orchestrator.mode=fast"])
    with pytest.raises(ConfigError, match="unknown field"):
        load_config(RolloutConfig, CONFIGS / "cpu.yaml", ["policy.gpu=1"])
