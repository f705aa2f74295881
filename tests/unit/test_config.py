"""consolerl.config: typed configs from YAML plus dotted overrides, errors naming the field."""
from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from consolerl.config import check_resources, load_config, to_dict
from consolerl.errors import ConfigError
from rollout_service.agent import AgentConfig


@dataclass(frozen=True)
class Inner:
    name: str = "x"
    sizes: tuple[int, ...] = (1, 2)
    limit: float | None = None


@dataclass(frozen=True)
class Root:
    agent: AgentConfig = field(default_factory=AgentConfig)
    inner: Inner = field(default_factory=Inner)
    replicas: int = 1
    debug: bool = False


def test_yaml_then_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("agent: {max_steps: 7}\ninner: {name: a, sizes: [3, 4]}\nreplicas: 2\n")
    root = load_config(Root, path, ["agent.history_turns=1", "inner.limit=2.5", "debug=true"])
    assert root.agent.max_steps == 7 and root.agent.history_turns == 1
    assert root.inner == Inner("a", (3, 4), 2.5)
    assert root.replicas == 2 and root.debug is True
    assert to_dict(root)["inner"]["sizes"] == [3, 4]
    assert load_config(Root) == Root()


def test_exponent_numbers_without_a_dot_are_numbers(tmp_path):
    # PyYAML (YAML 1.1) reads 3e-4 as the string '3e-4'; a float field takes it as 0.0003.
    path = tmp_path / "c.yaml"
    path.write_text("inner: {limit: 1E2}\n")
    assert load_config(Root, path).inner.limit == 100.0
    assert load_config(Root, None, ["inner.limit=3e-4"]).inner.limit == pytest.approx(3e-4)
    assert load_config(Root, None, ["inner.limit=-2e+1"]).inner.limit == -20.0


@pytest.mark.parametrize("text,overrides,message", [
    ("agent: {max_stepz: 3}", [], "c.yaml.agent: unknown field(s) max_stepz"),
    ("replicas: two", [], "c.yaml.replicas: must be an integer"),
    ("replicas: 1e2", [], "c.yaml.replicas: must be an integer"),
    ("inner: {limit: 3e-4x}", [], "c.yaml.inner.limit: must be a number"),
    ("inner: {limit: nan}", [], "c.yaml.inner.limit: must be a number"),
    ("debug: 1", [], "c.yaml.debug: must be true or false"),
    ("inner: {sizes: 5}", [], "c.yaml.inner.sizes: must be a list"),
    ("agent: {max_steps: 0}", [], "AgentConfig.max_steps: must be an integer >= 1"),
    ("", ["agent.top_p=3"], "AgentConfig.top_p"),
    ("", ["replicas"], "expected dotted.key=value"),
    ("", ["replicas.x=1"], "c.yaml.replicas: must be an integer"),
    ("replicas: 2", ["replicas.x=1"], "not a section"),
    ("[1, 2]", [], "must hold a mapping"),
    ("a: [", [], "not valid YAML"),
])
def test_errors_name_the_field(tmp_path, text, overrides, message):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(Root, path, overrides)
    assert message in str(err.value)


@pytest.mark.parametrize("value, message", [
    ({"CPU": 1}, "'CPU' is not a custom resource name"),
    ({"memory": 1}, "'memory' is not a custom resource name"),
    ({"browser": 0}, "resources.browser: must be a number > 0"),
    ({"browser": True}, "resources.browser: must be a number > 0"),
    ({"browser": float("inf")}, "resources.browser: must be a number > 0"),
    ({"browser": 1.5}, "an amount above 1 must be a whole number"),
    ([1], "must be a mapping of resource name to amount"),
])
def test_custom_resources_are_checked(value, message):
    with pytest.raises(ConfigError) as err:
        check_resources("X.resources", value)
    assert message in str(err.value)


def test_custom_resources_reach_each_actor_config(tmp_path):
    """env, policy and trainer each name what their actors need; bad ones fail at load."""
    from cluster.builders import rollout_spec
    from cluster.config import JobConfig
    path = tmp_path / "c.yaml"
    path.write_text("env: {resources: {browser: 1}}\npolicy: {resources: {policy: 0.5}}\n"
                    "trainer: {engine: {resources: {trainer: 2}}}\n")
    config = load_config(JobConfig, path)
    assert rollout_spec(config, config.policy, None).env_pool.resources == {"browser": 1.0}
    assert config.policy.resources == {"policy": 0.5}
    assert config.trainer.engine.resources == {"trainer": 2.0}
    check_resources("ok", {"browser": 0.25, "policy": 3})
    for bad in ("env.resources={GPU: 1}", "policy.resources={policy: 0}",
                "trainer.engine.resources={trainer: 2.5}"):
        with pytest.raises(ConfigError):
            load_config(JobConfig, path, [bad])


@pytest.mark.parametrize("kwargs, message", [
    ({"transport": "nccl"}, r"WeightsConfig\.transport: must be one of collective, "
                            r"object_store, got 'nccl'"),
    ({"chunk_mib": 0}, r"WeightsConfig\.chunk_mib"),
    ({"timeout_s": 0}, r"WeightsConfig\.timeout_s: must be a number > 0, got 0"),
])
def test_weights_config_names_the_bad_field(kwargs, message):
    from trainer.config import WeightsConfig
    with pytest.raises(ConfigError, match=message):
        WeightsConfig(**kwargs)
    assert WeightsConfig().transport == "collective"
