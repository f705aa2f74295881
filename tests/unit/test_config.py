"""consolerl.config: typed configs from YAML plus dotted overrides, errors naming the field."""
from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from typing import Annotated, Literal

import pytest

from consolerl.config import (AtLeast, AtMost, Between, Checked, Finite, Matches, NonEmpty,
                              OneOf, Regex, check_resources, load_config, to_dict)
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


@dataclass(frozen=True)
class Limits(Checked):
    count: Annotated[int, AtLeast(1)] = 2
    share: Annotated[float, Between(0, 1, low_open=True)] = 0.5
    mode: Literal["async", "sync"] = "async"
    kind: Annotated[str, OneOf(("a", "b"))] = "a"
    cap: Annotated[int, Between(1, 15)] | None = None
    temps: tuple[Annotated[float, AtMost(5)], ...] = (0.0,)
    name: Annotated[str, NonEmpty(trimmed=True)] = "x"
    pattern: Annotated[str, Regex()] = ""
    key: Annotated[str, Matches(r"[a-z]+")] = "k"
    offset: Annotated[float, Finite()] = 0.0
    on: bool = True


@dataclass(frozen=True)
class MoreLimits(Limits):
    config_name = "more"

    extra: Annotated[int, AtLeast(0)] = 0


@dataclass(frozen=True)
class LimitsRoot:
    limits: Limits = field(default_factory=Limits)


@pytest.mark.parametrize("kwargs, message", [
    ({"count": 0}, "Limits.count: must be an integer >= 1, got 0"),
    ({"count": True}, "Limits.count: must be an integer >= 1, got True"),
    ({"share": 2}, r"Limits.share: must be a number in \(0, 1\], got 2"),
    ({"share": 0}, r"Limits.share: must be a number in \(0, 1\], got 0"),
    ({"share": float("nan")}, r"Limits.share: must be a number in \(0, 1\], got nan"),
    ({"mode": "fast"}, "Limits.mode: must be one of async, sync, got 'fast'"),
    ({"kind": "c"}, "Limits.kind: must be one of a, b, got 'c'"),
    ({"cap": 16}, r"Limits.cap: must be an integer in 1\.\.15 or null, got 16"),
    ({"temps": (1.0, 6.0)}, r"Limits.temps\[1\]: must be a number <= 5, got 6.0"),
    ({"temps": 1.0}, "Limits.temps: must be a list, got 1.0"),
    ({"name": " x"}, "Limits.name: must be a non-empty string without surrounding spaces"),
    ({"pattern": "("}, "Limits.pattern: not a regular expression"),
    ({"key": "K1"}, r"Limits.key: must be a match of \[a-z\]\+, got 'K1'"),
    ({"offset": float("inf")}, "Limits.offset: must be a finite number, got inf"),
    ({"on": 1}, "Limits.on: must be true or false, got 1"),
])
def test_constraints_in_field_types_name_the_field_and_what_is_allowed(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        Limits(**kwargs)


def test_checked_configs_pickle_and_name_their_section():
    assert pickle.loads(pickle.dumps(Limits(cap=None, count=3))) == Limits(count=3)
    with pytest.raises(ConfigError, match="more.count: must be an integer >= 1"):
        MoreLimits(count=0)
    with pytest.raises(ConfigError, match="more.extra: must be an integer >= 0"):
        MoreLimits(extra=-1)


def test_checked_configs_from_yaml_name_the_file_field_and_class(tmp_path):
    assert load_config(LimitsRoot, None, ["limits.mode=sync", "limits.share=1e-1"]).limits == \
        Limits(mode="sync", share=0.1)
    with pytest.raises(ConfigError, match="config.limits: Limits.mode: must be one of async, "
                                          "sync, got 'fast'"):
        load_config(LimitsRoot, None, ["limits.mode=fast"])
    with pytest.raises(ConfigError, match="config.limits.count: must be an integer"):
        load_config(LimitsRoot, None, ["limits.count=many"])
