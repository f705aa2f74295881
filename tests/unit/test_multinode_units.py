"""Multi-node logic without a cluster: where the services are advertised, which Ray options
each actor kind is started with (the resources named in its config, always), and how the
orchestrator copes with an env worker lost with its node."""
from __future__ import annotations

import pytest

from cluster.addresses import advertise, is_loopback, loopback_left, services_host
from cluster.config import JobConfig
from consolerl.config import load_config


def _config(*overrides: str) -> JobConfig:
    return load_config(JobConfig, "configs/smoke.yaml", list(overrides))


# ---- addresses ----------------------------------------------------------------------------------

@pytest.mark.parametrize("host, loopback", [
    ("127.0.0.1", True), ("127.0.1.1", True), ("localhost", True), ("::1", True),
    ("[::1]", True), ("10.0.0.5", False), ("redis.svc", False), ("", False), (None, False)])
def test_loopback_hosts(host, loopback):
    assert is_loopback(host) is loopback


def test_services_host_is_loopback_embedded_and_the_node_ip_on_a_cluster(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert services_host(_config().run, "10.0.0.5") == "127.0.0.1"
    assert services_host(_config("run.ray_address=10.0.0.1:6380").run, "10.0.0.5") == "10.0.0.5"
    monkeypatch.setenv("RAY_ADDRESS", "http://10.0.0.1:8265")          # ray job submit
    assert services_host(_config().run, "10.0.0.5") == "10.0.0.5"
    assert services_host(_config("run.services_host=svc.local").run, "10.0.0.5") == "svc.local"


def test_advertise_moves_the_services_this_job_starts():
    config = advertise(_config(), "10.0.0.5")
    assert config.stream.url == "redis://10.0.0.5:6391/0"
    assert config.cloud.endpoint == "10.0.0.5:18090"
    assert config.env.worker.console_url == "http://10.0.0.5:18090"
    assert loopback_left(config) == []
    # What every component is built from carries the advertised addresses.
    from cluster.builders import rollout_parts
    parts = rollout_parts(config)
    assert parts.env_pool.pool.redis_url == "redis://10.0.0.5:6391/0"
    assert parts.env_pool.worker.console_url == "http://10.0.0.5:18090"
    assert parts.endpoint == "10.0.0.5:18090"


def test_advertise_keeps_a_password_and_leaves_external_services_alone():
    config = advertise(_config("stream.url=redis://:pw@127.0.0.1:6391/2"), "10.0.0.5")
    assert config.stream.url == "redis://:pw@10.0.0.5:6391/2"
    # Not started by the job: never rewritten (a loopback one is reported instead).
    config = advertise(_config("run.redis=false", "cloud.local=false"), "10.0.0.5")
    assert config.stream.url == "redis://127.0.0.1:6391/0"
    assert config.cloud.endpoint == "127.0.0.1:18090"
    assert [x.split()[0] for x in loopback_left(config)] == ["stream.url",
                                                            "env.worker.console_url"]
    external = _config("stream.url=redis://redis.svc:6380/0", "cloud.endpoint=cloud.svc:80",
                       "env.worker.console_url=http://cloud.svc:80")
    assert advertise(external, "10.0.0.5") == external
    # A console elsewhere than the local cloud's port is not the local cloud's.
    other = advertise(_config("env.worker.console_url=http://127.0.0.1:9999"), "10.0.0.5")
    assert other.env.worker.console_url == "http://127.0.0.1:9999"
    # Loopback: nothing moves.
    assert advertise(_config(), "127.0.0.1") == _config()


def test_loopback_left_never_shows_a_password():
    left = loopback_left(_config("stream.url=redis://:s3cret@127.0.0.1:6391/0"))
    assert left and not any("s3cret" in x for x in left)
