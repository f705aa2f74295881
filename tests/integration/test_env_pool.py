"""The env worker pool on a real Ray cluster (num_cpus=2), real Redis leases, real Chromium and
the local cloud: concurrent episodes on distinct accounts, a killed worker restarted by Ray with
its account free again within the lease TTL, health, drain."""
from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
import ray

from consolerl.types import EpisodeSpec
from env_workers.accounts import PoolConfig
from env_workers.driver import ScriptedDriver
from env_workers.leases import AccountPool
from env_workers.pool import EnvPool, EnvPoolConfig
from env_workers.worker import WorkerConfig
from infra.observability.discovery import PublishConfig, targets
from tests.conftest import CloudServer, _server, wait_for
from tests.integration.redis_server import RedisServer
from tests.conftest import run_async

TTL = 2.0


@pytest.fixture(scope="module")
def pool_cloud(tmp_path_factory) -> Iterator[CloudServer]:
    yield from _server(tmp_path_factory, "pool-cloud", ["--lookup-qps", "0"])


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory) -> Iterator[str]:
    server = RedisServer(tmp_path_factory.mktemp("pool-redis"))
    server.start()
    yield server.url
    server.stop()


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONWARNINGS": "ignore"}})
    yield
    ray.shutdown()


def _config(cloud: CloudServer, redis_url: str, workers: int) -> EnvPoolConfig:
    return EnvPoolConfig(workers=workers, worker=WorkerConfig(console_url=cloud.url),
                         metrics=PublishConfig(redis_url, run="test-env-pool"),
                         pool=PoolConfig(redis_url=redis_url, key_prefix="test:envpool",
                                         lease_ttl_s=TTL, acquire_timeout_s=20))


def test_pool_runs_episodes_restarts_a_killed_worker_and_drains(pool_cloud, redis_url,
                                                                ray_cluster):
    pool = EnvPool(_config(pool_cloud, redis_url, workers=2))
    leases = AccountPool.from_config(_config(pool_cloud, redis_url, 2).pool)
    try:
        starts = ray.get([a.start_episode.remote(EpisodeSpec("/console/ram/users"))
                          for a in pool.actors], timeout=120)
        assert all(s.env_error is None for s in starts), starts
        assert len({s.account_id for s in starts}) == 2           # never one account twice
        assert starts[1].fencing != starts[0].fencing
        assert leases.status().leased == 2

        # One worker goes through a flow with actions only, through Ray.
        actor = pool.actors[0]

        async def step(text: str):
            return await actor.step.remote(text)

        async def flow():
            d = ScriptedDriver(step, starts[0].observation)
            await d.click("link", "Create User")
            await d.fill("Logon Name", "from-the-pool")
            await d.click("button", "Create")
            return d.observation.url
        assert run_async(flow()).endswith("/console/ram/users/from-the-pool")

        # Kill the other worker mid-episode: Ray restarts it, its lease expires within the TTL.
        killed_account = starts[1].account_id
        ray.kill(pool.actors[1], no_restart=False)
        t0 = time.monotonic()
        wait_for(lambda: killed_account not in _leased(leases), timeout=TTL + 3)
        assert time.monotonic() - t0 <= TTL + 3
        wait_for(lambda: pool.health(timeout_s=5)[1]["up"], timeout=60, interval=1)
        again = ray.get(pool.actors[1].start_episode.remote(EpisodeSpec("/console/")), timeout=60)
        assert again.env_error is None and again.fencing > max(s.fencing for s in starts)

        health = pool.health()
        assert [h["up"] for h in health] == [True, True]
        assert all(h["in_episode"] for h in health)
        scraped = httpx.get(health[0]["metrics_url"], timeout=5).text
        assert 'consolerl_env_worker_steps_total{outcome="ok"} 3.0' in scraped
        assert "consolerl_env_pool_leases_acquired_total" in scraped
        assert "consolerl_env_worker_in_episode 1.0" in scraped
        # Every worker announced its endpoint for Prometheus (the restarted one again).
        import redis as redis_lib
        announced = targets(redis_lib.Redis.from_url(redis_url), "test-env-pool")
        by_name = {g["labels"]["name"]: g for g in announced}
        assert set(by_name) >= {"env-worker-0", "env-worker-1"}
        assert by_name["env-worker-0"]["targets"] == [
            health[0]["metrics_url"].removeprefix("http://").removesuffix("/metrics")]
        assert all(g["labels"]["component"] == "env_worker" for g in announced)
    finally:
        pool.drain()
    assert leases.status().leased == 0
    leases.close()


def _leased(pool: AccountPool) -> set[str]:
    return {a for a in pool.account_ids if _held(pool, a)}


def _held(pool: AccountPool, account_id: str) -> bool:
    return pool._redis.exists(f"{pool.config.key_prefix}:lease:{account_id}") == 1
