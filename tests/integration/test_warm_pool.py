"""WarmPool against a real local cloud: it fills to K, a take is an instant hit and the pool
refills, an empty pool provisions on demand, stop destroys what nobody took, and a template
that cannot be provisioned does not hold up the others."""
from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from consolerl.errors import ConfigError
from infra.cloud import CloudClient, CloudConfig, Credentials
from consolerl.resources import parse_resources
from infra.provisioning.sdk import ProvisionError, SdkProvisioner
from infra.provisioning.warm_pool import WarmPool, WarmPoolClosed
from tests.conftest import CloudServer, _server, wait_for

NET = parse_resources([
    {"id": "net", "type": "vpc", "properties": {"name": "pool-{episode}"}},
    {"id": "sw", "type": "vswitch", "properties": {"vpc": "${net}", "zone": "cn-hangzhou-j",
                                                   "cidr_block": "192.168.7.0/24"}},
    {"id": "sg", "type": "security_group", "properties": {"vpc": "${net}"}},
])
USER = parse_resources([{"id": "dev", "type": "ram_user", "properties": {
    "name": "dev-{team}-{episode}", "policies": ["ReadOnlyAccess"]}}])
BROKEN = parse_resources([
    {"id": "net", "type": "vpc", "properties": {}},
    {"id": "sw", "type": "vswitch", "properties": {"vpc": "${net}", "zone": "cn-hangzhou-j",
                                                   "cidr_block": "10.1.0.0/24"}},  # not in VPC
])


@pytest.fixture(scope="module")
def pool_cloud(tmp_path_factory) -> Iterator[CloudServer]:
    yield from _server(tmp_path_factory, "pool-cloud", ["--transition", "0.2",
                                                       "--network-ready", "0.1",
                                                       "--lookup-qps", "0"])


@pytest.fixture
def provisioner(pool_cloud, accounts) -> SdkProvisioner:
    account = accounts[0]

    def client() -> CloudClient:
        return CloudClient(CloudConfig(endpoint=pool_cloud.endpoint),
                           Credentials(account.access_key_id, account.access_key_secret))
    return SdkProvisioner(client, ready_timeout_s=20, poll_s=0.05)


class Episodes:
    """Fresh episode ids that the test can check for leftovers afterwards."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self._lock = threading.Lock()

    def __call__(self) -> str:
        with self._lock:
            self.ids.append(secrets.token_hex(4))
            return self.ids[-1]


@pytest.fixture
def make_pool(provisioner) -> Iterator:
    pools: list[tuple[WarmPool, Episodes]] = []

    def make(templates, k, **kwargs) -> tuple[WarmPool, Episodes]:
        episodes = Episodes()
        pool = WarmPool(provisioner, templates, k, values_for=lambda t, ep: {"team": "qa"},
                        registry=CollectorRegistry(), new_episode_id=episodes, **kwargs)
        pools.append((pool, episodes))
        return pool, episodes
    yield make
    for pool, episodes in pools:
        pool.stop()
        for ep in episodes.ids:                 # taken sets are the test's to clean up
            provisioner.destroy(ep)
            assert provisioner.leftovers(ep) == []


def sample(pool: WarmPool, name: str, labels: dict[str, str]) -> float:
    return pool.registry.get_sample_value(name, labels) or 0.0


def test_the_pool_fills_a_take_is_a_hit_and_it_refills(make_pool, provisioner):
    pool, episodes = make_pool({"net": NET, "user": USER}, 2)
    pool.start()
    wait_for(lambda: pool.ready_count("net") == 2 and pool.ready_count("user") == 2, 15)
    assert sample(pool, "consolerl_warm_pool_ready_sets", {"template": "net"}) == 2

    started = time.perf_counter()
    got = pool.take("net", timeout_s=5)
    assert time.perf_counter() - started < 0.1       # no cloud call on a hit
    assert sample(pool, "consolerl_warm_pool_takes_total",
                  {"template": "net", "outcome": "hit"}) == 1
    c = provisioner.client
    vsw = c.rpc("Vpc", "DescribeVSwitches", {"RegionId": "cn-hangzhou",
                                             "VSwitchId": got.id_of("sw")})["VSwitches"]
    assert vsw["VSwitch"][0]["Status"] == "Available"        # ready, not just created
    user = pool.take("user")
    assert user.id_of("dev") == f"dev-qa-{user.episode_id}"  # values_for filled {team}
    wait_for(lambda: pool.ready_count("net") == 2 and pool.ready_count("user") == 2, 15)
    assert len(episodes.ids) == 6
    assert sample(pool, "consolerl_warm_pool_provision_seconds_count", {"template": "net"}) == 3

    unused = pool.stop()
    assert sorted(unused) == sorted(set(episodes.ids) - {got.episode_id, user.episode_id})
    for ep in unused:
        assert provisioner.leftovers(ep) == []
    assert provisioner.leftovers(got.episode_id) != []          # the taker's until it is done
    with pytest.raises(WarmPoolClosed):
        pool.take("net")


def test_an_empty_pool_provisions_on_demand(make_pool, provisioner):
    pool, episodes = make_pool({"net": NET, "user": USER}, 1)     # never started: empty
    got = pool.take("user", timeout_s=10)
    assert provisioner.client.rpc("Ram", "GetUser", {"UserName": got.id_of("dev")})["User"]
    assert sample(pool, "consolerl_warm_pool_takes_total",
                  {"template": "user", "outcome": "miss"}) == 1
    with pytest.raises(ConfigError, match="unknown template 'db'; declared: net, user"):
        pool.take("db")
    # A take that gives up leaves its set to the pool instead of wasting it.
    with pytest.raises(TimeoutError):           # WarmPoolTimeout is one
        pool.take("net", timeout_s=0.01)
    wait_for(lambda: pool.ready_count("net") == 1, 10)
    assert pool.take("net").episode_id == episodes.ids[-1]


def test_a_failing_template_does_not_break_the_others(make_pool, provisioner):
    pool, episodes = make_pool({"broken": BROKEN, "user": USER}, 1, backoff_s=0.1,
                               max_backoff_s=0.2)
    pool.start()
    wait_for(lambda: pool.ready_count("user") == 1, 10)
    wait_for(lambda: sample(pool, "consolerl_warm_pool_provision_failures_total",
                            {"template": "broken", "kind": "refill"}) >= 3, 10)
    assert pool.ready_count("broken") == 0
    taken = pool.take("user")
    assert taken.id_of("dev").startswith("dev-qa-")
    wait_for(lambda: pool.ready_count("user") == 1, 10)       # refilling still works
    with pytest.raises(ProvisionError, match="InvalidCidrBlock"):
        pool.take("broken", timeout_s=10)
    unused = pool.stop()
    failed = set(episodes.ids) - set(unused) - {taken.episode_id}
    assert len(failed) >= 4
    for ep in failed:                        # failed provisionings cleaned up after themselves
        assert provisioner.leftovers(ep) == []


def test_bad_arguments_are_refused(provisioner):
    for kwargs, match in [({"k": -1}, "WarmPool.k"), ({"k": 1, "workers": 0}, "workers"),
                          ({"k": 1, "backoff_s": 0}, "backoff_s")]:
        with pytest.raises(ConfigError, match=match):
            WarmPool(provisioner, {"net": NET}, **kwargs)
    with pytest.raises(ConfigError, match="list of ResourceSpec"):
        WarmPool(provisioner, {"net": [{"id": "net", "type": "vpc"}]}, 1)
