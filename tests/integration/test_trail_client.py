"""TrailClient against real local clouds: paging, the per-account QPS limit, late delivery,
account scoping. Each test uses its own account so the server's per-account limits and audit
logs do not mix between tests."""
from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from prometheus_client import CollectorRegistry

from infra.cloud import CloudClient, CloudConfig, Credentials
from reward_service.actiontrail import (BucketRegistry, TrailClient, TrailConfig,
                                        episode_events)
from tests.conftest import CloudServer, _server


@pytest.fixture(scope="module")
def limited_cloud(tmp_path_factory) -> Iterator[CloudServer]:
    """LookupEvents limited to 2 queries per second per account, like the real cloud."""
    yield from _server(tmp_path_factory, "trail-limited", ["--lookup-qps", "2"])


@pytest.fixture(scope="module")
def delayed_cloud(tmp_path_factory) -> Iterator[CloudServer]:
    """Events reach LookupEvents 2 s after the call."""
    yield from _server(tmp_path_factory, "trail-delayed", ["--delivery-delay", "2",
                                                           "--lookup-qps", "0"])


@pytest.fixture
def sdk(accounts):
    def make(server: CloudServer, index: int) -> CloudClient:
        a = accounts[index]
        return CloudClient(CloudConfig(endpoint=server.endpoint),
                           Credentials(a.access_key_id, a.access_key_secret))
    return make


def create_sg(client: CloudClient, name: str | None = None) -> str:
    return client.rpc("Ecs", "CreateSecurityGroup", {
        "RegionId": "cn-hangzhou",
        "SecurityGroupName": name or f"trail-{uuid.uuid4().hex[:8]}"})["SecurityGroupId"]


def created_ids(events) -> list[str]:
    return [e.response["SecurityGroupId"] for e in events
            if e.event_name == "CreateSecurityGroup" and not e.refused]


def sample(registry: CollectorRegistry, name: str, **labels) -> float:
    return registry.get_sample_value(name, labels or None) or 0.0


def test_pages_past_50_oldest_first_each_event_once(limited_cloud, sdk, accounts):
    c = sdk(limited_cloud, 2)
    t0 = time.time()
    made = [create_sg(c) for _ in range(120)]
    registry = CollectorRegistry()
    trail = TrailClient(c, TrailConfig(), registry, account_id=accounts[2].account_id,
                        buckets=BucketRegistry())
    measured = trail.clock_offset_s is not None
    events = trail.events(t0, time.time())
    assert created_ids(events) == made          # oldest first, in call order
    assert len({e.event_id for e in events}) == len(events)
    assert [e.event_time for e in events] == sorted(e.event_time for e in events)
    # 3 pages, plus one small query that measures the cloud's clock the first time.
    assert sample(registry, "consolerl_reward_trail_queries_total", outcome="ok") == \
        3 + (not measured)
    # The same through a LookupAttribute filter.
    filtered = trail.events(t0, time.time(), {"EventName": "CreateSecurityGroup"})
    assert created_ids(filtered) == made and len(filtered) == 120


def test_concurrent_queries_stay_under_the_account_limit(limited_cloud, sdk, accounts):
    account_id = accounts[3].account_id
    regs = [CollectorRegistry(), CollectorRegistry()]
    cfg = TrailConfig()                     # 2 qps, burst 1
    # Two clients for one account: the process-wide bucket registry makes them share a limit.
    clients = [TrailClient(lambda: sdk(limited_cloud, 3), cfg, reg, account_id=account_id)
               for reg in regs]
    create_sg(sdk(limited_cloud, 3))
    start = time.time() - 5
    barrier = threading.Barrier(6)

    def query(i: int):
        barrier.wait()
        return clients[i % 2].events(start, time.time())

    t0 = time.monotonic()
    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(query, range(6)))
    elapsed = time.monotonic() - t0
    assert all(len(created_ids(r)) == 1 for r in results)
    # 6 single-page queries at 2 per second: the last starts 2.5 s after the first.
    assert elapsed >= 2.5 - 0.05
    assert sum(sample(r, "consolerl_reward_trail_throttled_retries_total") for r in regs) == 0
    assert sum(sample(r, "consolerl_reward_trail_queries_total", outcome="ok")
               for r in regs) == 6


def test_throttling_from_the_cloud_is_retried_not_surfaced(limited_cloud, sdk, accounts):
    # A client that believes it may send 50 qps is throttled by the cloud's 2 qps and backs off.
    registry = CollectorRegistry()
    cfg = TrailConfig(qps=50, burst=10, backoff_base_s=0.2, backoff_max_s=1.0, max_retries=10)
    trail = TrailClient(lambda: sdk(limited_cloud, 4), cfg, registry,
                        account_id=accounts[4].account_id, buckets=BucketRegistry())
    start = time.time() - 5
    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(lambda _: trail.events(start, time.time()), range(6)))
    assert len(results) == 6
    assert sample(registry, "consolerl_reward_trail_throttled_retries_total") > 0
    assert sample(registry, "consolerl_reward_trail_queries_total", outcome="ok") == 6
    assert sample(registry, "consolerl_reward_trail_queries_total", outcome="error") == 0


def test_wait_for_completes_once_late_events_arrive(delayed_cloud, sdk, accounts):
    c = sdk(delayed_cloud, 2)
    account_id = accounts[2].account_id
    trail = TrailClient(c, TrailConfig(settle_s=10, poll_s=0.25), CollectorRegistry(),
                        account_id=account_id, buckets=BucketRegistry())
    started = time.time()
    sg = create_sg(c)
    assert sg not in created_ids(trail.events(started - 60, time.time() + 1))
    result = trail.wait_for(started, lambda events: sg in created_ids(events))
    assert result.status == "complete"
    assert 1.0 <= result.waited_s < 5.0 and result.queries >= 3
    assert sg in created_ids(episode_events(result.events, account_id, started))


def test_wait_for_short_settle_is_pending_not_failure(delayed_cloud, sdk, accounts):
    c = sdk(delayed_cloud, 3)
    registry = CollectorRegistry()
    trail = TrailClient(c, TrailConfig(settle_s=0.5, poll_s=0.2), registry,
                        account_id=accounts[3].account_id, buckets=BucketRegistry())
    started = time.time()
    sg = create_sg(c)
    result = trail.wait_for(started, lambda events: sg in created_ids(events))
    assert result.status == "pending"
    assert sg not in created_ids(result.events)
    assert 0.5 <= result.waited_s < 1.5 and result.queries >= 2
    assert sample(registry, "consolerl_reward_trail_wait_seconds_count", status="pending") == 1
    # A longer deadline on the same call site then sees it.
    assert trail.wait_for(started, lambda events: sg in created_ids(events),
                          deadline_s=10).status == "complete"


def test_other_accounts_events_never_appear(delayed_cloud, sdk, accounts):
    mine, theirs = sdk(delayed_cloud, 5), sdk(delayed_cloud, 6)
    t0 = time.time()
    my_sg, their_sg = create_sg(mine), create_sg(theirs)
    time.sleep(2.1)                          # past the delivery delay
    trail = TrailClient(mine, TrailConfig(), CollectorRegistry(),
                        account_id=accounts[5].account_id, buckets=BucketRegistry())
    events = trail.events(t0 - 1, time.time())
    assert created_ids(events) == [my_sg] and \
        their_sg not in json.dumps([e.to_json() for e in events])
    assert {e.account_id for e in events} == {accounts[5].account_id}
    # Defensive scoping: credentials of one account, account_id of another -> nothing passes.
    registry = CollectorRegistry()
    crossed = TrailClient(theirs, TrailConfig(), registry, account_id=accounts[5].account_id,
                          buckets=BucketRegistry())
    assert crossed.events(t0 - 1, time.time()) == []
    assert sample(registry, "consolerl_reward_trail_foreign_events_total") >= 1


def test_episode_events_drop_events_before_the_start(limited_cloud, sdk, accounts):
    c = sdk(limited_cloud, 7)
    account_id = accounts[7].account_id
    before = create_sg(c)
    time.sleep(1.05 - time.time() % 1)      # into the next second
    started = time.time()
    after = create_sg(c)
    trail = TrailClient(c, TrailConfig(), CollectorRegistry(), account_id=account_id,
                        buckets=BucketRegistry())
    window = trail.events(started - 60, time.time())
    assert created_ids(window) == [before, after]
    assert created_ids(episode_events(window, account_id, started)) == [after]
    assert episode_events(window, "someone-else", started) == []
