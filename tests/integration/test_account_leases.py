"""The account pool against a real redis-server: exclusivity, fencing, FIFO waiting, expiry of
crashed holders, quarantine, and that no secret reaches Redis, a Lease or the metrics."""
from __future__ import annotations

import asyncio
import pickle
import random
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from prometheus_client import generate_latest

from consolerl.errors import ConfigError, ConsoleRLError
from env_workers.accounts import PoolConfig, environment_accounts, secrets_file_accounts
from env_workers.leases import (AccountPool, Heartbeat, Lease, LeaseLost, NoAccountAvailable,
                                PoolStatus, PoolUnavailable, UnknownAccount, _Wait)
from consolerl.accounts import Account
from tests.conftest import ROOT, run_async, wait_for
from tests.integration.redis_server import RedisServer

FAST = dict(lease_ttl_s=10.0, poll_interval_s=0.01, waiter_ttl_s=1.0)


@pytest.fixture(scope="module")
def rclient(redis_server: RedisServer) -> Iterator[redis.Redis]:
    with redis_server.client() as client:
        yield client


@pytest.fixture
def make_pool(redis_server: RedisServer, accounts: list[Account]):
    """``make_pool(n, **config)``: a pool of the first ``n`` accounts under a fresh prefix."""
    pools: list[AccountPool] = []

    def make(n: int = 2, **overrides) -> AccountPool:
        overrides.setdefault("key_prefix", f"test:{secrets.token_hex(4)}")
        pool = AccountPool(accounts[:n], PoolConfig(redis_url=redis_server.url,
                                                    **{**FAST, **overrides}))
        pools.append(pool)
        return pool
    yield make
    for pool in pools:
        pool.close()


def lease_value(client: redis.Redis, pool: AccountPool, account_id: str) -> str | None:
    return client.get(f"{pool.config.key_prefix}:lease:{account_id}")


# -- basics ---------------------------------------------------------------------------------

def test_acquire_release_and_resolve_account(make_pool, accounts):
    pool = make_pool(2)
    first = pool.acquire("w1", timeout_s=0)
    second = pool.acquire("w2", timeout_s=0)
    assert {first.account_id, second.account_id} == {accounts[0].account_id,
                                                     accounts[1].account_id}
    assert second.fencing > first.fencing
    by_id = {a.account_id: a for a in accounts}
    assert pool.account(first.account_id) == by_id[first.account_id]
    assert pool.current_fencing(second.account_id) == second.fencing
    assert pool.status() == PoolStatus(total=2, leased=2, free=0, quarantined=0, waiters=0)
    assert pool.release(first) and not pool.release(first)
    assert pool.status().free == 1
    with pytest.raises(UnknownAccount, match="not in this pool"):
        pool.account("999999999")


def test_lease_and_errors_pickle_and_repr_hides_secrets(make_pool, accounts):
    pool = make_pool(1)
    lease = pool.acquire("worker-7", timeout_s=0)
    assert pickle.loads(pickle.dumps(lease)) == lease
    text = repr(lease)
    assert lease.token not in text and "worker-7" in text
    for account in accounts:
        assert account.password not in text and account.access_key_secret not in text
    for error in (LeaseLost(lease.account_id, lease.fencing, "gone"),
                  NoAccountAvailable("w", 1.5, "1 accounts: 1 leased")):
        again = pickle.loads(pickle.dumps(error))
        assert type(again) is type(error) and str(again) == str(error)
        assert isinstance(again, ConsoleRLError)


def test_stale_holder_cannot_release_or_renew(make_pool, rclient):
    pool = make_pool(1)
    old = pool.acquire("slow-worker", timeout_s=0)
    # The old holder stalls past its TTL (simulated: the key expires now); another takes over.
    rclient.pexpire(f"{pool.config.key_prefix}:lease:{old.account_id}", 1)
    new = pool.acquire("fresh-worker", timeout_s=2)
    assert new.account_id == old.account_id and new.fencing > old.fencing
    ttl_before = rclient.pttl(f"{pool.config.key_prefix}:lease:{new.account_id}")

    with pytest.raises(LeaseLost, match=f"fencing {old.fencing}"):
        pool.renew(old)
    assert pool.release(old) is False
    assert lease_value(rclient, pool, new.account_id) == new.token
    assert rclient.pttl(f"{pool.config.key_prefix}:lease:{new.account_id}") <= ttl_before
    assert pool.holds(new) and not pool.holds(old)
    assert pool.renew(new).renewed_at >= new.renewed_at
    assert pool.release(new) is True
    assert pool.registry.get_sample_value("consolerl_env_pool_leases_lost_total") == 1
    assert pool.registry.get_sample_value("consolerl_env_pool_leases_released_total",
                                          {"outcome": "stale"}) == 1


# -- random interleavings ------------------------------------------------------------------

HOLDERS = ("h0", "h1", "h2")


@pytest.mark.parametrize("n_accounts", [1, 2])
def test_random_interleavings_keep_one_holder_and_increasing_fencing(redis_server, rclient,
                                                                      accounts, n_accounts):
    # One account makes take-overs (expire, then another holder acquires) frequent; two
    # accounts check that acquire hands out exactly the free ones.
    ids = [a.account_id for a in accounts[:n_accounts]]

    class LeaseMachine(RuleBasedStateMachine):
        """Model: ``owner[account]`` is the lease Redis should hold; holders may crash
        (stop renewing) and come back later with their stale lease."""

        def __init__(self) -> None:
            super().__init__()
            config = PoolConfig(redis_url=redis_server.url, **FAST,
                                key_prefix=f"hyp:{secrets.token_hex(4)}")
            self.pool = AccountPool(accounts[:n_accounts], config, client=rclient)
            self.owner: dict[str, Lease | None] = dict.fromkeys(ids)
            self.held: dict[str, Lease] = {}
            self.crashed: list[Lease] = []
            self.granted: list[Lease] = []

        def key(self, account_id: str) -> str:
            return f"{self.pool.config.key_prefix}:lease:{account_id}"

        @rule(holder=st.sampled_from(HOLDERS))
        def acquire(self, holder: str) -> None:
            if holder in self.held:
                return
            free = [a for a, lease in self.owner.items() if lease is None]
            try:
                lease = self.pool.acquire(holder, timeout_s=0)
            except NoAccountAvailable:
                assert not free, "an account was free but acquire timed out"
                return
            assert lease.account_id in free, "granted an account that another holder has"
            assert all(lease.fencing > g.fencing for g in self.granted)
            self.owner[lease.account_id] = self.held[holder] = lease
            self.granted.append(lease)

        @rule(holder=st.sampled_from(HOLDERS))
        def renew(self, holder: str) -> None:
            lease = self.held.get(holder)
            if lease is None:
                return
            if self.owner[lease.account_id] is lease:
                self.owner[lease.account_id] = self.held[holder] = self.pool.renew(lease)
            else:
                try:
                    self.pool.renew(lease)
                    raise AssertionError("a stale lease was renewed")
                except LeaseLost:
                    del self.held[holder]

        @rule(holder=st.sampled_from(HOLDERS))
        def release(self, holder: str) -> None:
            lease = self.held.pop(holder, None)
            if lease is None:
                return
            current = self.owner[lease.account_id] is lease
            assert self.pool.release(lease) is current
            if current:
                self.owner[lease.account_id] = None

        @rule(holder=st.sampled_from(HOLDERS))
        def crash(self, holder: str) -> None:
            lease = self.held.pop(holder, None)
            if lease is not None:
                self.crashed.append(lease)

        @rule(index=st.integers(0, len(ids) - 1), real_ttl=st.booleans())
        def expire(self, index: int, real_ttl: bool) -> None:
            account_id = ids[index]
            if real_ttl:  # let Redis expire it for real
                rclient.pexpire(self.key(account_id), 1)
                time.sleep(0.003)
            else:
                rclient.delete(self.key(account_id))
            self.owner[account_id] = None

        @rule()
        def crashed_holders_wake_up(self) -> None:
            for lease in self.crashed:
                if self.owner[lease.account_id] is lease:
                    continue  # not stale yet: it would legitimately still hold the account
                before = rclient.get(self.key(lease.account_id))
                assert self.pool.release(lease) is False
                try:
                    self.pool.renew(lease)
                    raise AssertionError("a crashed holder renewed a stale lease")
                except LeaseLost:
                    pass
                assert rclient.get(self.key(lease.account_id)) == before

        @invariant()
        def redis_matches_model(self) -> None:
            for account_id in ids:
                value = rclient.get(self.key(account_id))
                lease = self.owner[account_id]
                assert value == (lease.token if lease else None)
                live = [g for g in self.granted if g.account_id == account_id
                        and g.token == value]
                assert len(live) <= 1
                if live:  # the live lease is the account's newest
                    newest = max(g.fencing for g in self.granted if g.account_id == account_id)
                    assert live[0].fencing == newest == self.pool.current_fencing(account_id)

        def teardown(self) -> None:
            for lease in self.held.values():
                self.pool.release(lease)

    run_state_machine_as_test(LeaseMachine, settings=settings(
        max_examples=40, stateful_step_count=30, deadline=None,
        suppress_health_check=[HealthCheck.too_slow]))


def test_concurrent_holders_never_overlap(make_pool):
    pool = make_pool(3)
    occupant: dict[str, str] = {}
    fencings: list[int] = []
    lock = threading.Lock()
    errors: list[str] = []

    def worker(name: str) -> None:
        for _ in range(12):
            lease = pool.acquire(name, timeout_s=10)
            with lock:
                if lease.account_id in occupant:
                    errors.append(f"{name} and {occupant[lease.account_id]} "
                                  f"both hold {lease.account_id}")
                occupant[lease.account_id] = name
                fencings.append(lease.fencing)
            time.sleep(random.uniform(0, 0.004))
            with lock:
                occupant.pop(lease.account_id, None)
            assert pool.release(lease)

    threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(7)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    assert len(fencings) == 7 * 12 and len(set(fencings)) == len(fencings)
    assert pool.status().leased == 0 and pool.status().waiters == 0


# -- crashes, heartbeats --------------------------------------------------------------------

HOLDER_SCRIPT = """
import sys, time
from env_workers.accounts import PoolConfig, local_cloud_accounts
from env_workers.leases import AccountPool, Heartbeat
config = PoolConfig(redis_url=sys.argv[1], key_prefix=sys.argv[2], lease_ttl_s=1.0,
                    heartbeat_interval_s=0.2)
pool = AccountPool(local_cloud_accounts()[:1], config)
lease = pool.acquire("doomed-worker", timeout_s=10)
Heartbeat(pool, lease).start()
print(lease.account_id, lease.fencing, flush=True)
time.sleep(120)
"""


def test_killed_holder_frees_its_account_within_the_ttl(make_pool, redis_server):
    pool = make_pool(1, lease_ttl_s=1.0)
    proc = subprocess.Popen([sys.executable, "-c", HOLDER_SCRIPT, redis_server.url,
                             pool.config.key_prefix], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        account_id, fencing = proc.stdout.readline().split()
        time.sleep(1.5)  # longer than the TTL: only the child's heartbeat keeps it leased
        assert pool.status().leased == 1
        with pytest.raises(NoAccountAvailable):
            pool.acquire("parent", timeout_s=0)
        proc.send_signal(signal.SIGKILL)
        proc.wait(5)
        killed = time.monotonic()
        lease = pool.acquire("parent", timeout_s=5)
        waited = time.monotonic() - killed
    finally:
        proc.kill()
        proc.wait()
    assert lease.account_id == account_id and lease.fencing > int(fencing)
    assert waited <= 1.0 + 0.3, f"account came free after {waited:.2f} s, TTL is 1 s"


def test_heartbeat_renews_and_records_loss(make_pool, rclient):
    pool = make_pool(1, lease_ttl_s=0.5)
    lost: list[LeaseLost] = []
    lease = pool.acquire("w", timeout_s=0)
    with Heartbeat(pool, lease, interval_s=0.1, on_lost=lost.append) as beat:
        time.sleep(0.9)
        assert pool.holds(lease) and beat.check().renewed_at > lease.renewed_at
        rclient.delete(f"{pool.config.key_prefix}:lease:{lease.account_id}")
        wait_for(lambda: beat.lost, timeout=2)
        assert beat.lost_at is not None and lost and lost[0] is beat.error
        with pytest.raises(LeaseLost):
            beat.check()


# -- Redis losing its data ------------------------------------------------------------------

@pytest.mark.parametrize("loss", ["killed_without_persistence", "flushall"])
def test_fencing_stays_monotonic_when_redis_loses_its_data(accounts, tmp_path, loss):
    # A redis-server without AOF or snapshots restarts empty after a hard kill (FLUSHALL
    # empties one in place): the pool's counter is gone, yet a new lease must still be fenced
    # above every lease granted before, and the old holder must learn its lease is gone.
    server = RedisServer(tmp_path / "volatile", persistent=False).start()
    pool = AccountPool(accounts[:1], PoolConfig(redis_url=server.url, **FAST))
    try:
        granted = []
        for i in range(5):
            granted.append(pool.acquire(f"early-{i}", timeout_s=0))
            assert pool.release(granted[-1])
        old = pool.acquire("old-holder", timeout_s=0)
        granted.append(old)
        with Heartbeat(pool, old, interval_s=0.05) as beat:
            if loss == "flushall":
                with server.client() as client:
                    client.flushall()
            else:
                server.proc.send_signal(signal.SIGKILL)
                server.proc.wait(5)
                server.start()   # same port, nothing on disk: an empty Redis
                with server.client() as client:
                    assert client.dbsize() == 0
            wait_for(lambda: beat.lost, timeout=5)
            assert "lost the pool's state" in str(beat.error)
        new = wait_for(lambda: _try_acquire(pool, "new-holder"), timeout=5)
        assert new.account_id == old.account_id
        assert new.fencing > max(g.fencing for g in granted)
        assert pool.current_fencing(new.account_id) == new.fencing
        with pytest.raises(LeaseLost, match=f"fencing {old.fencing}"):
            pool.renew(old)
        assert pool.release(old) is False and pool.holds(new)
        # The numbers keep increasing after the loss, and stay exact integers below 2**53
        # (Lua numbers are doubles).
        assert pool.release(new)
        after = pool.acquire("later", timeout_s=0)
        assert new.fencing < after.fencing < 2 ** 53
    finally:
        pool.close()
        server.stop()


def _try_acquire(pool: AccountPool, holder: str) -> Lease | None:
    try:
        return pool.acquire(holder, timeout_s=0)
    except PoolUnavailable:   # the client's connection from before the restart
        return None


# -- fairness -------------------------------------------------------------------------------

def test_waiters_are_served_in_arrival_order(make_pool):
    pool = make_pool(1)
    first = pool.acquire("holder", timeout_s=0)
    served: list[str] = []

    def wait_turn(name: str) -> None:
        lease = pool.acquire(name, timeout_s=10)
        served.append(name)
        time.sleep(0.02)
        pool.release(lease)

    names = [f"waiter-{i}" for i in range(5)]
    threads = []
    for i, name in enumerate(names):
        threads.append(threading.Thread(target=wait_turn, args=(name,)))
        threads[-1].start()
        wait_for(lambda: pool.status().waiters == i + 1, timeout=5, interval=0.005)
    pool.release(first)
    for t in threads:
        t.join(10)
    assert served == names


def test_waiter_times_out_with_a_typed_error_and_leaves_the_queue(make_pool):
    pool = make_pool(1)
    pool.acquire("holder", timeout_s=0)
    started = time.monotonic()
    with pytest.raises(NoAccountAvailable) as caught:
        pool.acquire("latecomer", timeout_s=0.3)
    assert time.monotonic() - started >= 0.3
    assert isinstance(caught.value, TimeoutError) and isinstance(caught.value, ConsoleRLError)
    assert "'latecomer'" in str(caught.value) and "0.3 s" in str(caught.value)
    assert "1 leased" in str(caught.value) and "0 waiting" in str(caught.value)
    assert pool.status().waiters == 0
    assert pool.registry.get_sample_value("consolerl_env_pool_acquire_wait_seconds_count",
                                          {"outcome": "timeout"}) == 1


def test_dead_waiter_does_not_block_the_queue(make_pool):
    pool = make_pool(1, waiter_ttl_s=0.4)
    lease = pool.acquire("holder", timeout_s=0)
    # A waiter that joins the queue and dies without leaving (no more polls).
    assert _Wait(pool, "ghost", 10).attempt() is None
    assert pool.status().waiters == 1
    pool.release(lease)
    started = time.monotonic()
    pool.acquire("live", timeout_s=3)
    assert time.monotonic() - started < 0.4 + 0.3


def test_acquire_async_and_cancel_leaves_queue(make_pool):
    pool = make_pool(1)

    async def scenario() -> None:
        lease = await pool.acquire_async("async-worker", timeout_s=1)
        waiter = asyncio.ensure_future(pool.acquire_async("cancelled", timeout_s=10))
        await asyncio.sleep(0.1)
        assert pool.status().waiters == 1
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert pool.status().waiters == 0
        assert pool.release(lease)
        assert (await pool.acquire_async("next", timeout_s=1)).fencing > lease.fencing

    run_async(scenario())


# -- quarantine -----------------------------------------------------------------------------

def test_quarantine_after_repeated_signin_failures(make_pool, accounts):
    pool = make_pool(2, quarantine_threshold=3)
    bad, good = accounts[0].account_id, accounts[1].account_id
    assert not pool.report_signin_failure(bad)
    assert not pool.report_signin_failure(bad)
    pool.report_signin_success(bad)  # failures must be consecutive
    assert not pool.report_signin_failure(bad)
    assert not pool.report_signin_failure(bad)
    assert pool.report_signin_failure(bad)
    assert pool.quarantined() == [bad]
    assert pool.status() == PoolStatus(total=2, leased=0, free=1, quarantined=1, waiters=0)
    assert pool.registry.get_sample_value("consolerl_env_pool_quarantined_accounts") == 1

    assert pool.acquire("a", timeout_s=0).account_id == good
    with pytest.raises(NoAccountAvailable, match="1 quarantined"):
        pool.acquire("b", timeout_s=0.1)
    pool.unquarantine(bad)
    assert pool.quarantined() == []
    assert pool.acquire("b", timeout_s=0).account_id == bad
    assert not pool.report_signin_failure(bad)  # count restarted from zero
    assert pool.registry.get_sample_value("consolerl_env_pool_quarantined_accounts") == 0
    with pytest.raises(UnknownAccount):
        pool.report_signin_failure("123456789")


# -- secrets --------------------------------------------------------------------------------

def dump_redis(client: redis.Redis) -> str:
    """Every key and value in the database, as text."""
    parts: list[str] = []
    for key in client.scan_iter(count=500):
        kind = client.type(key)
        value = {"string": lambda: client.get(key), "hash": lambda: client.hgetall(key),
                 "set": lambda: client.smembers(key),
                 "zset": lambda: client.zrange(key, 0, -1, withscores=True),
                 "list": lambda: client.lrange(key, 0, -1),
                 "stream": lambda: client.xrange(key)}.get(kind, lambda: "")()
        parts.append(f"{key} {kind} {value}")
    return "\n".join(parts)


def test_no_secret_in_redis_leases_errors_or_metrics(make_pool, rclient, accounts):
    pool = make_pool(len(accounts))
    leases = [pool.acquire(f"worker-{i}", timeout_s=0) for i in range(len(accounts))]
    with Heartbeat(pool, leases[0], interval_s=0.05):
        time.sleep(0.15)
    with pytest.raises(NoAccountAvailable) as caught:
        pool.acquire("one-too-many", timeout_s=0.05)
    for _ in range(3):
        pool.report_signin_failure(leases[1].account_id)
    for lease in leases:
        pool.release(lease)
    pool.status()

    everything = "\n".join([dump_redis(rclient), *map(repr, leases), str(caught.value),
                            generate_latest(pool.registry).decode()])
    assert accounts[0].account_id in everything  # the dump did see this test's keys
    for account in accounts:
        assert account.password not in everything
        assert account.access_key_secret not in everything


# -- config and account sources ----------------------------------------------------------

@pytest.mark.parametrize("overrides, field", [
    ({"lease_ttl_s": 0}, "lease_ttl_s"),
    ({"lease_ttl_s": 2, "heartbeat_interval_s": 1.5}, "heartbeat_interval_s"),
    ({"quarantine_threshold": 0}, "quarantine_threshold"),
    ({"accounts_source": "vault"}, "accounts_source"),
    ({"accounts_source": "file"}, "accounts_file"),
    ({"key_prefix": "has space"}, "key_prefix"),
    ({"redis_url": "http://127.0.0.1:7000"}, "redis_url"),
    ({"redis_url": "redis://127.0.0.1:6379/0"}, "redis_url"),
    ({"redis_url": "redis://localhost"}, "redis_url"),
])
def test_bad_pool_config_names_the_field(overrides, field):
    with pytest.raises(ConfigError, match=field):
        PoolConfig(**{"redis_url": "redis://127.0.0.1:7000/0", **overrides})


def test_config_from_mapping_and_defaults():
    config = PoolConfig.from_mapping({"redis_url": "redis://:RedisPw-123@127.0.0.1:7000/0"})
    assert "RedisPw-123" not in repr(config)
    assert config.lease_ttl_s == 60 and config.quarantine_threshold == 3
    assert config.heartbeat_s == 20
    with pytest.raises(ConfigError, match="unknown field.*'ttl'"):
        PoolConfig.from_mapping({"redis_url": "redis://127.0.0.1:7000/0", "ttl": 5})


def test_accounts_from_environment_and_secrets_file(tmp_path):
    yaml_text = ('- {account_id: "2000000000000001", login_name: ops, password: "Hunter2-pass",'
                 ' access_key_id: LTAI5tRealKey0001, access_key_secret: RealSecret0000000000001}\n')
    path = tmp_path / "accounts.yaml"
    path.write_text(yaml_text)
    assert environment_accounts({"CONSOLERL_ACCOUNTS_FILE": str(path)})[0].login_name == "ops"
    assert environment_accounts({"CONSOLERL_ACCOUNTS_YAML": yaml_text})[0].account_id == \
        "2000000000000001"
    with pytest.raises(ConfigError, match="CONSOLERL_ACCOUNTS_FILE"):
        environment_accounts({})
    path.write_text('- account_id: "1"\n  password: "Hunter2-pass" : broken\n')
    with pytest.raises(ConfigError, match="not valid YAML at line 2") as caught:
        secrets_file_accounts(path)
    assert "Hunter2" not in str(caught.value)


# -- the free index (an acquire no longer scans every account) ---------------------

def test_the_index_follows_the_account_list_redis_losing_it_and_quarantine(
        make_pool, rclient, redis_server, accounts):
    prefix = f"test:{secrets.token_hex(4)}"
    small = make_pool(2, key_prefix=prefix)
    a = small.acquire("w0", timeout_s=0)
    b = small.acquire("w1", timeout_s=0)
    with pytest.raises(NoAccountAvailable):
        small.acquire("w2", timeout_s=0)
    # The operator adds an account: pools built from the new list (same prefix) rebuild the
    # index and lease the new one, while the held two stay held.
    grown = make_pool(3, key_prefix=prefix)
    c = grown.acquire("w2", timeout_s=0)
    assert c.account_id == accounts[2].account_id
    assert {a.account_id, b.account_id, c.account_id} == {x.account_id for x in accounts[:3]}
    assert grown.release(c) and grown.release(a)
    # Redis loses everything: the next acquire rebuilds the index from the lease keys.
    rclient.flushall()
    got = {grown.acquire(f"x{i}", timeout_s=0).account_id for i in range(3)}
    assert got == {x.account_id for x in accounts[:3]}
    # Quarantined accounts leave the free set; unquarantined ones come back.
    fresh = make_pool(2, quarantine_threshold=1)
    lease = fresh.acquire("w", timeout_s=0)
    assert fresh.report_signin_failure(lease.account_id)
    fresh.release(lease)
    other = fresh.acquire("w", timeout_s=0)
    assert other.account_id != lease.account_id
    with pytest.raises(NoAccountAvailable):
        fresh.acquire("v", timeout_s=0)
    fresh.unquarantine(lease.account_id)
    assert fresh.acquire("v", timeout_s=0).account_id == lease.account_id


def test_a_dead_holders_lapsed_lease_frees_its_account_first(make_pool, rclient):
    pool = make_pool(3, lease_ttl_s=0.3)
    dead = pool.acquire("dead", timeout_s=0)
    pool.episode_begun(dead.account_id, "ep-1")   # it may have left resources behind
    others = [pool.acquire(f"w{i}", timeout_s=0) for i in range(2)]
    for lease in others:
        pool.release(lease)
    time.sleep(0.5)                                # the dead holder never renews
    # Its account is taken first (resources to clean up), not the least recently leased.
    assert pool.acquire("next", timeout_s=1).account_id == dead.account_id


def test_a_dead_holders_lease_is_reclaimed_by_its_fencing_number(make_pool, rclient):
    """A successor that knows a dead holder's lease (account and fencing number, not its
    token) ends it at once; the account comes first, for its orphans to be destroyed. A lease
    taken over or released since is never touched."""
    pool = make_pool(3, lease_ttl_s=60)
    dead = pool.acquire("dead", timeout_s=0)
    pool.episode_begun(dead.account_id, "ep-2")
    assert not pool.reclaim(dead.account_id, dead.fencing - 1)     # not its newest lease
    assert pool.holds(dead)
    assert pool.reclaim(dead.account_id, dead.fencing)
    assert not pool.holds(dead) and lease_value(rclient, pool, dead.account_id) is None
    assert not pool.reclaim(dead.account_id, dead.fencing)         # once
    again = pool.acquire("next", timeout_s=0)
    assert again.account_id == dead.account_id                     # orphans first
    assert not pool.reclaim(dead.account_id, dead.fencing)         # the new lease stays
    assert pool.holds(again)
    with pytest.raises(LeaseLost):
        pool.renew(dead)                   # a holder that was not dead after all learns it
    assert 'outcome="reclaimed"' in generate_latest(pool.registry).decode()
