"""Settings each valid alone that together train something else than they say: refused before
a training job starts, naming both fields (cluster.config.check_training)."""
from __future__ import annotations

import pytest

from cluster.config import JobConfig, check_training
from consolerl.config import load_config
from consolerl.errors import ConfigError


@pytest.mark.parametrize("overrides,fields", [
    (["agent.temperature=0"], ("agent.temperature", "trainer.algo")),
    (["agent.top_p=0.9"], ("agent.top_p", "trainer.algo")),
    (["orchestrator.group_size=1"], ("orchestrator.group_size",
                                     "trainer.algo.adv_estimator")),
    (["trainer.algo.kl_coef=0.01"], ("trainer.algo.kl_coef",)),
    (["orchestrator.mode=sync", "trainer.publish_every=2"], ("orchestrator.mode",
                                                              "trainer.publish_every")),
])
def test_traps_are_errors_naming_both_fields(overrides, fields):
    config = load_config(JobConfig, "configs/demo.yaml", overrides)
    with pytest.raises(ConfigError) as err:
        check_training(config)
    assert all(f in str(err.value) for f in fields), str(err.value)


@pytest.mark.parametrize("path", ["configs/demo.yaml", "configs/smoke.yaml", "configs/cpu.yaml",
                                  "configs/learning-check.yaml", "configs/gpu-cluster.yaml"])
def test_shipped_training_configs_pass(path):
    check_training(load_config(JobConfig, path))


def test_a_groupless_estimator_may_use_groups_of_one():
    check_training(load_config(JobConfig, "configs/demo.yaml", [
        "orchestrator.group_size=1", "trainer.algo.adv_estimator=reinforce_plus_plus"]))


def test_the_job_refuses_a_trap_before_starting_anything(tmp_path):
    from cluster.job import main
    assert main(["--config", "configs/demo.yaml", "--run-dir", str(tmp_path / "run"),
                 "agent.top_p=0.5"]) == 2
    assert not (tmp_path / "run").exists()
