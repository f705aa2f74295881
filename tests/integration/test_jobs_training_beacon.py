"""The training beacon against a real Redis: while a training run is active its key exists and
is renewed past its TTL, it goes when the run stops (or, its process dead, when the TTL runs
out), and the jobs scheduler sees training active and inactive through the JobStore."""
from __future__ import annotations

import time

import pytest

from jobsapi.auth import TeamQuota
from jobsapi.scheduler import JobScheduler, SchedulerConfig
from jobsapi.store import JobStore, TrainingBeacon
from tests.conftest import run_async

PREFIX = "t:beacon"


@pytest.fixture
def store(redis_server):
    redis_server.client().flushall()
    return JobStore(redis_server.url, PREFIX)


def training_active(store: JobStore) -> bool:
    async def go() -> bool:
        try:
            return await store.training_active()
        finally:
            await store.close()
    return run_async(go())


def scheduler_limit(store: JobStore, workers: int) -> int:
    sched = JobScheduler(SchedulerConfig(share_during_training=0.5), store, None,
                         [f"w{i}" for i in range(workers)], {}, None,
                         lambda team: TeamQuota())

    async def go() -> int:
        try:
            return await sched.limit()
        finally:
            await store.close()
    return run_async(go())


def the_key(redis_server) -> list[bytes]:
    return redis_server.client().keys(f"{PREFIX}:*")


def test_the_key_lives_while_training_runs_and_goes_when_it_stops(store, redis_server):
    assert not training_active(store) and scheduler_limit(store, 4) == 4
    beacon = TrainingBeacon(redis_server.url, PREFIX, ttl_s=0.6).start()
    try:
        time.sleep(0.1)
        keys = the_key(redis_server)
        assert len(keys) == 1, keys                      # one key, the store's
        assert training_active(store) and scheduler_limit(store, 4) == 2
        # Renewed: three TTLs later it is still there, with a fresh TTL.
        time.sleep(1.8)
        assert training_active(store)
        ttl_ms = redis_server.client().pttl(keys[0])
        assert 0 < ttl_ms <= 600, ttl_ms
    finally:
        beacon.stop()
    assert the_key(redis_server) == []                   # gone at once on stop
    assert not training_active(store) and scheduler_limit(store, 4) == 4
    beacon.stop()                                        # stopping twice is harmless


def test_a_dead_run_lets_the_key_expire(store, redis_server):
    """A training process that dies never calls stop: the key expires within its TTL."""
    beacon = TrainingBeacon(redis_server.url, PREFIX, ttl_s=0.6).start()
    time.sleep(0.1)
    beacon._stop.set()                  # the thread stops beating, as in a dead process
    beacon._thread.join(2)
    assert training_active(store)
    time.sleep(0.8)
    assert not training_active(store) and the_key(redis_server) == []
    beacon.stop()


def test_bad_ttl_is_refused(redis_server):
    with pytest.raises(ValueError, match="ttl_s"):
        TrainingBeacon(redis_server.url, PREFIX, ttl_s=0)
