"""The shipped configs load into the job's typed root config (one section per component), and
overrides apply; an unknown section is refused by name."""
from __future__ import annotations

from pathlib import Path

import pytest

from consolerl.config import load_config
from consolerl.errors import ConfigError
from cluster.config import JobConfig

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.mark.parametrize("name", ["cpu.yaml", "gpu-cluster.yaml", "smoke.yaml", "demo.yaml"])
def test_shipped_configs_load(name):
    config = load_config(JobConfig, CONFIGS / name)
    assert config.orchestrator.group_size >= 2
    assert config.policy.backend in ("transformers", "vllm")
    assert config.trainer.steps >= 1
    if config.cloud.local:                       # the browser goes where the API is
        from cluster.builders import env_pool
        assert config.env.worker.console_url == ""
        assert env_pool(config, None).worker.console_url == f"http://{config.cloud.endpoint}"


def test_values_the_root_derives_are_not_set_twice():
    """One setting each: the trainer's temperature is the agent's, the leases' Redis the
    stream's, the accounts the cloud's; setting the copy is refused, naming the source."""
    from cluster.builders import env_pool, trainer_algo
    config = load_config(JobConfig, CONFIGS / "demo.yaml", ["agent.temperature=0.7"])
    assert trainer_algo(config).temperature == 0.7
    assert env_pool(config, None).pool.redis_url == config.stream.url
    for override, source in (("trainer.algo.temperature=0.7", "agent.temperature"),
                             ("env.pool.redis_url=redis://127.0.0.1:7000", "stream.url"),
                             ("env.pool.accounts_file=a.yaml", "cloud.accounts_file")):
        with pytest.raises(ConfigError, match=source):
            load_config(JobConfig, CONFIGS / "demo.yaml", [override])


def test_overrides_and_errors():
    config = load_config(JobConfig, CONFIGS / "cpu.yaml",
                         ["orchestrator.mode=sync", "agent.max_steps=5", "env.workers=4",
                          "trainer.engine.workers=2", "trainer.algo.adv_estimator=rloo"])
    assert (config.orchestrator.mode, config.agent.max_steps, config.env.workers,
            config.trainer.engine.workers, config.trainer.algo.adv_estimator) == (
        "sync", 5, 4, 2, "rloo")
    with pytest.raises(ConfigError, match="OrchestratorConfig.mode"):
        load_config(JobConfig, CONFIGS / "cpu.yaml", ["orchestrator.mode=fast"])
    with pytest.raises(ConfigError, match="unknown field"):
        load_config(JobConfig, CONFIGS / "cpu.yaml", ["policy.gpu=1"])
    with pytest.raises(ConfigError, match="adv_estimator"):
        load_config(JobConfig, CONFIGS / "cpu.yaml", ["trainer.algo.adv_estimator=magic"])
    with pytest.raises(ConfigError, match="unknown field.*trainers"):
        load_config(JobConfig, CONFIGS / "cpu.yaml", ["trainers.steps=1"])


def test_success_by_version_is_the_train_curve_over_scored_episodes():
    from cluster.rollout import success_by_version
    results = [
        {"task_id": "a", "env_error": None, "reward": 1.0, "version": 0},
        {"task_id": "a", "env_error": None, "reward": 0.0, "version": 0},
        {"task_id": "b", "env_error": None, "reward": 1.0, "version": 2},
        {"task_id": "b", "env_error": "browser_died", "reward": 0.0, "version": 2},
        {"task_id": "b", "env_error": None, "reward": None, "version": 2},
        {"task_id": "c", "env_error": None, "reward": 0.0, "version": -1},
    ]
    assert success_by_version(results) == [
        {"version": 0, "episodes": 2, "success": 0.5},
        {"version": 2, "episodes": 1, "success": 1.0}]
