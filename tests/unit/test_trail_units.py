"""Unit tests of reward_service.actiontrail: the token bucket's timing, retry/backoff with a fake
call, scoping and ordering with a fake SDK. Nothing running."""
from __future__ import annotations

import math
import pickle
import random
import threading
import time
from email.utils import formatdate
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry

from consolerl.audit import AuditEvent
from consolerl.errors import CloudAPIError, ConfigError
from reward_service.actiontrail import (_CLOCK_OFFSETS, BucketRegistry, TokenBucket, TrailClient, TrailConfig,
                                        TrailResult, call_with_retry, episode_events,
                                        is_retryable)

ACCOUNT = "1000000000000001"
OTHER = "1000000000000002"


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


def throttled() -> CloudAPIError:
    return CloudAPIError("Throttling.User", "flow control", 400, "rid", "LookupEvents")


# --- token bucket -------------------------------------------------------------------------


def test_bucket_paces_at_rate_after_burst():
    clock = FakeClock()
    bucket = TokenBucket(rate=2.0, burst=1.0, clock=clock, sleep=clock.sleep)
    waits = [bucket.acquire() for _ in range(5)]
    assert waits == [0.0] + [pytest.approx(0.5)] * 4
    assert clock.now == pytest.approx(102.0)


def test_bucket_burst_then_rate_and_refill_is_capped():
    clock = FakeClock()
    bucket = TokenBucket(rate=4.0, burst=3.0, clock=clock, sleep=clock.sleep)
    assert [bucket.acquire() for _ in range(4)] == [0.0, 0.0, 0.0, pytest.approx(0.25)]
    clock.now += 60          # a long idle refills to the burst, not to 240 tokens
    assert [bucket.acquire() for _ in range(4)] == [0.0, 0.0, 0.0, pytest.approx(0.25)]


def test_bucket_reservations_queue_without_sleeping():
    clock = FakeClock()
    bucket = TokenBucket(rate=2.0, burst=1.0, clock=clock, sleep=clock.sleep)
    # Callers that arrive together get consecutive slots: 0, 0.5, 1.0, 1.5 s from now.
    assert [bucket.reserve() for _ in range(4)] == pytest.approx([0.0, 0.5, 1.0, 1.5])


def test_bucket_is_thread_safe_with_real_time():
    bucket = TokenBucket(rate=20.0, burst=1.0)
    stamps: list[float] = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(3):
            bucket.acquire()
            with lock:
                stamps.append(time.monotonic())

    t0 = time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(stamps) == 12
    # 12 tokens at 20/s with a burst of 1: the last is granted 11/20 s after the first.
    assert max(stamps) - t0 >= 11 / 20 - 0.02
    # No two grants closer than the rate allows (a little slack for scheduler noise).
    stamps.sort()
    assert min(b - a for a, b in zip(stamps, stamps[1:])) >= 0.05 - 0.02


def test_registry_shares_one_bucket_per_account_and_slowest_wins():
    reg = BucketRegistry()
    a = reg.get(ACCOUNT, 5.0, 2.0)
    assert reg.get(ACCOUNT, 2.0, 3.0) is a
    assert (a.rate, a.burst) == (2.0, 2.0)
    assert reg.get(OTHER, 5.0, 2.0) is not a


# --- retry / backoff ----------------------------------------------------------------------


@pytest.mark.parametrize("code,status,retry", [
    ("Throttling.User", 400, True), ("Throttling", 400, True), ("Throttling.Api", 429, True),
    ("ServiceUnavailable", 503, True), ("InternalError", 500, True), ("Whatever", 502, True),
    ("InvalidParameter", 400, False), ("InvalidAccessKeyId.NotFound", 404, False),
    ("Forbidden.RAM", 403, False)])
def test_is_retryable(code, status, retry):
    assert is_retryable(CloudAPIError(code, "m", status)) is retry


def test_retries_throttling_with_growing_jittered_backoff():
    cfg = TrailConfig(backoff_base_s=0.1, backoff_max_s=10.0, max_retries=5)
    outcomes = [throttled(), throttled(),
                CloudAPIError("ServiceUnavailable", "busy", 503), "ok"]
    calls, before, seen, slept = [], [], [], []

    def fn():
        calls.append(1)
        item = outcomes[len(calls) - 1]
        if isinstance(item, Exception):
            raise item
        return item

    result = call_with_retry(fn, cfg, before=lambda: before.append(1),
                             on_error=lambda exc, retry: seen.append((exc.code, retry)),
                             sleep=slept.append, rng=random.Random(7))
    assert result == "ok" and len(calls) == 4 and len(before) == 4
    assert seen == [("Throttling.User", True), ("Throttling.User", True),
                    ("ServiceUnavailable", True)]
    for n, s in enumerate(slept):
        d = 0.1 * 2 ** n
        assert d / 2 <= s <= d
    # Jitter: two seeds give different delays.
    other: list[float] = []
    outcomes[:] = [throttled(), "ok"]
    calls.clear()
    call_with_retry(fn, cfg, sleep=other.append, rng=random.Random(8))
    assert other[0] != slept[0]


def test_backoff_is_capped_and_last_error_propagates():
    cfg = TrailConfig(backoff_base_s=1.0, backoff_max_s=2.0, max_retries=4)
    slept: list[float] = []
    calls = []

    def fn():
        calls.append(1)
        raise throttled()

    with pytest.raises(CloudAPIError) as info:
        call_with_retry(fn, cfg, sleep=slept.append, rng=random.Random(0))
    assert info.value.code == "Throttling.User"
    assert len(calls) == 5 and len(slept) == 4
    assert all(s <= 2.0 for s in slept) and slept[-1] >= 1.0


def test_other_errors_propagate_at_once():
    slept: list[float] = []

    def fn():
        raise CloudAPIError("InvalidParameter", "StartTime", 400, "rid", "LookupEvents")

    with pytest.raises(CloudAPIError) as info:
        call_with_retry(fn, TrailConfig(), sleep=slept.append)
    assert info.value.code == "InvalidParameter" and slept == []


def test_config_validation_names_the_field():
    with pytest.raises(ConfigError, match="max_results"):
        TrailConfig(max_results=51)
    with pytest.raises(ConfigError, match="qps"):
        TrailConfig(qps=0)
    with pytest.raises(ConfigError, match="settle_s"):
        TrailConfig(settle_s=-1)


def test_config_and_result_pickle():
    cfg = TrailConfig(settle_s=600)
    assert pickle.loads(pickle.dumps(cfg)) == cfg
    res = TrailResult("pending", [AuditEvent.from_trail({"eventId": "e1"})], 1.5, 3)
    assert pickle.loads(pickle.dumps(res)) == res


# --- scoping and ordering with a fake SDK -------------------------------------------------


def ev(event_id: str, when: str, account: str = ACCOUNT, name: str = "CreateVpc") -> dict:
    return {"eventId": event_id, "eventTime": when, "eventName": name,
            "userIdentity": {"accountId": account}}


class FakeSdk:
    """Pages newest first, like LookupEvents' default direction; ``errors`` are raised first."""

    def __init__(self, pages: list[list[dict]], errors: list[CloudAPIError] = ()):
        self.pages = pages
        self.errors = list(errors)
        self.requests: list = []
        self.actiontrail = SimpleNamespace(lookup_events_with_options=None)
        self.config = SimpleNamespace(endpoint=f"fake-{id(self)}")
        self.clock_offset_s = 0.0          # the Date header it sends: its clock minus ours
        _CLOCK_OFFSETS[self.config.endpoint] = 0.0     # measured (tests that count queries)

    def call(self, fn, request, action=""):
        self.requests.append(request)
        if self.errors:
            raise self.errors.pop(0)
        index = int(request.next_token or 0)
        more = index + 1 < len(self.pages)
        return SimpleNamespace(events=self.pages[index], next_token=str(index + 1) if more else "")

    def call_with_headers(self, fn, request, action=""):
        body = self.call(fn, request, action)
        return body, {"date": formatdate(time.time() + self.clock_offset_s, usegmt=True)}


def test_windows_follow_the_clouds_clock_measured_from_its_date_header():
    """A cloud whose clock runs 5 minutes ahead: the first query measures it, and the
    window of events() (given in this machine's time) is sent shifted by it."""
    sdk = FakeSdk([[]])
    del _CLOCK_OFFSETS[sdk.config.endpoint]             # not measured yet
    sdk.clock_offset_s = 300.0
    client = fake_client(sdk)
    assert client.clock_offset_s is None
    start = 1_795_000_000.0
    client.events(start, start + 60)
    assert client.clock_offset_s == pytest.approx(300.0, abs=1.0)
    sent = sdk.requests[-1]
    # start + 300 s, in the cloud's time; the Date header has 1 s resolution, so the measured
    # offset (and the shifted start) is within a second of it
    assert sent.start_time in ("2026-11-18T11:11:39Z", "2026-11-18T11:11:40Z")
    sdk.clock_offset_s = 1.0                             # within the header's resolution
    client.events(start, start + 60)
    assert client.clock_offset_s == 0.0


def fake_client(sdk: FakeSdk, registry: CollectorRegistry | None = None, **cfg) -> TrailClient:
    config = TrailConfig(qps=1000, burst=10, backoff_base_s=0.001, backoff_max_s=0.002, **cfg)
    return TrailClient(lambda: sdk, config, registry, account_id=ACCOUNT,
                       buckets=BucketRegistry())


def test_events_pages_dedupes_orders_and_drops_other_accounts():
    pages = [[ev("e5", "2024-05-01T10:00:05Z"), ev("e4", "2024-05-01T10:00:04Z"),
              ev("x1", "2024-05-01T10:00:04Z", OTHER)],
             [ev("e4", "2024-05-01T10:00:04Z"), ev("e3", "2024-05-01T10:00:03Z"),
              ev("e2b", "2024-05-01T10:00:02Z"), ev("e2a", "2024-05-01T10:00:02Z")]]
    sdk = FakeSdk(pages, errors=[throttled()])
    registry = CollectorRegistry()
    client = fake_client(sdk, registry)
    events = client.events(1714557600.7, 1714557610.2, {"EventName": "CreateVpc"})
    assert [e.event_id for e in events] == ["e2a", "e2b", "e3", "e4", "e5"]
    first = sdk.requests[0]
    assert (first.start_time, first.end_time) == ("2024-05-01T10:00:00Z", "2024-05-01T10:00:11Z")
    assert first.max_results == "50"
    assert [(a.key, a.value) for a in first.lookup_attribute] == [("EventName", "CreateVpc")]
    assert registry.get_sample_value("consolerl_reward_trail_foreign_events_total") == 1
    assert registry.get_sample_value("consolerl_reward_trail_throttled_retries_total") == 1
    assert registry.get_sample_value("consolerl_reward_trail_queries_total",
                                     {"outcome": "ok"}) == 2
    assert registry.get_sample_value("consolerl_reward_trail_queries_total",
                                     {"outcome": "throttled"}) == 1


def test_events_rejects_bad_attributes():
    client = fake_client(FakeSdk([[]]))
    with pytest.raises(ConfigError, match="at most 2"):
        client.events(0, 1, [("EventName", "a"), ("User", "b"), ("EventRW", "Write")])
    with pytest.raises(ConfigError, match="allowed: EventName"):
        client.events(0, 1, {"eventName": "a"})


def test_wait_for_pending_is_not_an_error():
    sdk = FakeSdk([[ev("e1", "2024-05-01T10:00:05Z")]])
    registry = CollectorRegistry()
    client = fake_client(sdk, registry, settle_s=0.2, poll_s=0.05)
    result = client.wait_for(time.time(), lambda events: len(events) > 1)
    assert result.status == "pending" and [e.event_id for e in result.events] == ["e1"]
    assert 0.2 <= result.waited_s < 1.0 and result.queries == len(sdk.requests) >= 3
    assert registry.get_sample_value("consolerl_reward_trail_wait_seconds_count",
                                     {"status": "pending"}) == 1


def test_wait_for_window_starts_clock_skew_before_start():
    sdk = FakeSdk([[ev("e1", "2024-05-01T10:00:05Z")]])
    client = fake_client(sdk, clock_skew_s=60)
    start = 1714557605.0     # 2024-05-01T10:00:05Z
    result = client.wait_for(start, lambda events: True)
    assert result.status == "complete" and result.queries == 1
    assert sdk.requests[0].start_time == "2024-05-01T09:59:05Z"


def test_wait_for_a_start_ahead_of_this_clock_polls_from_now():
    # A caller whose clock runs ahead (within the service's allowance) reports a start after
    # now + clock_skew_s: the window must not start after it ends (that raised ConfigError).
    sdk = FakeSdk([[]])
    client = fake_client(sdk, clock_skew_s=5, settle_s=0.05, poll_s=0.01)
    before = time.time()
    result = client.wait_for(before + 120, lambda events: False)
    assert result.status == "pending" and result.queries >= 1
    for request in sdk.requests:
        assert request.start_time <= request.end_time
        assert request.start_time >= time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(before))


def test_oldest_start_keeps_the_whole_window_within_90_days():
    config = TrailConfig(clock_skew_s=60, settle_s=30)
    now = 1_800_000_000.25
    oldest = config.oldest_start(now)
    # The last poll, settle_s later, asks from floor(start - skew) to ceil(now + pad).
    first, last = math.floor(oldest - 60), math.ceil(now + 30 + 1.0)
    assert last - first <= 90 * 86_400
    assert now - oldest > 90 * 86_400 - 60 - 30 - 5


def test_episode_events_floors_start_and_filters_account():
    events = [ev("before", "2024-05-01T10:00:04Z"), ev("same-second", "2024-05-01T10:00:05Z"),
              ev("after", "2024-05-01T10:00:09Z"), ev("other", "2024-05-01T10:00:09Z", OTHER),
              ev("garbled", "yesterday")]
    kept = episode_events([AuditEvent.from_trail(e) for e in events], ACCOUNT, 1714557605.9)
    assert [e.event_id for e in kept] == ["same-second", "after"]
