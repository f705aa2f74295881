"""The account pool: exclusive, expiring, fenced leases on cloud accounts, kept in Redis.

Redis keys, all under ``<prefix>`` (one Redis instance, not Cluster: the scripts touch keys
they compute themselves):

- ``lease:<account_id>`` a random token with a TTL (``SET NX PX``); it exists while leased;
- ``fencing`` the last fencing number granted; every lease takes a higher one, atomically with
  its ``SET``;
- ``fence`` a hash account_id -> fencing number of that account's newest lease;
- ``last_leased`` a sorted set, so the least recently leased free account is handed out;
- ``free`` a sorted set of the accounts neither leased nor quarantined (score: -1 for one a
  dead holder left resources in, else when it was last leased), ``held`` a sorted set of the
  leased ones by when their lease lapses, and ``index`` the mark that both were built: an
  acquire takes the lowest ``free`` member and moves lapsed ``held`` ones back, so it costs
  O(log N) whatever the number of accounts (scanning every account's key took ~5 ms a call
  at 1,000 accounts, and Redis runs one script at a time); the index is built from the
  pool's accounts when an acquire finds it missing or made for other accounts (a new
  prefix, a changed account list, or Redis lost its data);
- ``waiters`` a sorted set of waiter tickets in arrival order (score from ``waiter_seq``), and
  ``waiter:<ticket>`` a liveness key each waiter refreshes as it polls;
- ``signin_failures`` a hash of consecutive sign-in failures, ``quarantined`` a set.

No password or AccessKey secret is ever written to Redis or put in a :class:`Lease`: a holder
resolves the :class:`Account` with :meth:`AccountPool.account`.

Fairness: waiters are served first come, first served. A waiter joins the queue on its first
attempt; the waiter at rank ``r`` (0 = oldest live waiter) may take an account only while more
than ``r`` accounts are free, so nobody overtakes an older waiter. A waiter that gives up
removes its ticket; one that dies stops refreshing its liveness key, and the next attempt of
any waiter prunes it, so a dead waiter blocks the queue at most ``waiter_ttl_s``.

Fencing: fencing numbers increase strictly across the pool. A resource that a holder writes
to can remember the highest number it has seen and refuse an older one, which stops a holder
whose lease silently expired (a long GC pause, a partition) from acting after a new holder.
A lease's number is ``max(last + 1, Redis TIME in microseconds)``, so they stay increasing
even when Redis loses its data (no AOF, a hard kill, FLUSHALL) and the counter restarts from
nothing: a new lease is still fenced above every earlier one, provided the Redis host's clock
has not gone back past the moment the earlier number was granted (a clock stepped back, or a
failover to a host whose clock lags, could break that). The numbers (~1.8e15 now) stay exact
below 2**53 (Lua numbers are doubles) until about the year 2255. A holder whose lease Redis
forgot learns it at its next renewal (:class:`LeaseLost`, saying that Redis lost the pool's
state).
"""
from __future__ import annotations

import asyncio
import hashlib
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import redis
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from consolerl.errors import ConfigError, ConsoleRLError
from env_workers.accounts import PoolConfig, load_pool_accounts
from consolerl.accounts import Account


class PoolError(ConsoleRLError):
    """Base class of the account pool's errors."""


class NoAccountAvailable(PoolError, TimeoutError):
    """No account became free for ``holder`` within ``timeout_s``; ``detail`` is the pool's
    state at that moment."""

    def __init__(self, holder: str, timeout_s: float, detail: str = ""):
        super().__init__(f"no account became free for holder {holder!r} within "
                         f"{timeout_s:g} s{' (' + detail + ')' if detail else ''}")
        self.holder, self.timeout_s, self.detail = holder, timeout_s, detail

    def __reduce__(self):
        return (type(self), (self.holder, self.timeout_s, self.detail))


class LeaseLost(PoolError, RuntimeError):
    """The lease expired or was taken over; its holder must stop using the account."""

    def __init__(self, account_id: str, fencing: int, reason: str = "expired or taken over"):
        super().__init__(f"lease on account {account_id} (fencing {fencing}) lost: {reason}")
        self.account_id, self.fencing, self.reason = account_id, fencing, reason

    def __reduce__(self):
        return (type(self), (self.account_id, self.fencing, self.reason))


class UnknownAccount(PoolError, LookupError):
    """The account id is not one of the pool's accounts."""


class PoolUnavailable(PoolError, ConnectionError):
    """Redis could not be reached or answered with an error."""


@dataclass(frozen=True)
class Lease:
    """One holder's exclusive use of one account until ``renewed_at + ttl_s`` (wall clock).

    ``token`` proves ownership to Redis (hidden from ``repr``); ``fencing`` increases
    strictly with every lease the pool grants.
    """

    account_id: str
    login_name: str
    token: str = field(repr=False)
    fencing: int
    holder: str
    acquired_at: float
    ttl_s: float
    renewed_at: float = 0.0

    @property
    def expires_at(self) -> float:
        """When the lease lapses unless renewed (this process's clock; an estimate)."""
        return max(self.acquired_at, self.renewed_at) + self.ttl_s


@dataclass(frozen=True)
class PoolStatus:
    """Counts of the pool's accounts. ``leased`` and ``quarantined`` may overlap (an account
    quarantined while leased); ``free`` counts accounts that are neither."""

    total: int
    leased: int
    free: int
    quarantined: int
    waiters: int


# Shared by the scripts: put ``id`` (not leased) back among the free accounts, unless it is
# quarantined; an account a dead holder left resources in goes first (score -1), the others
# least recently leased first.
_FREE_ADD = """
local function free_add(prefix, id)
  if redis.call('SISMEMBER', prefix .. ':quarantined', id) == 1 then return end
  local score = tonumber(redis.call('ZSCORE', prefix .. ':last_leased', id) or '0')
  if redis.call('SCARD', prefix .. ':episodes:' .. id) > 0 then score = -1 end
  redis.call('ZADD', prefix .. ':free', score, id)
end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
"""

# -1: the index (free, held) is not built for these accounts (a new prefix, other accounts,
# or Redis lost its data): the caller builds it with _INDEX and tries again. Otherwise false
# (wait) or {account_id, fencing}.
_ACQUIRE = _FREE_ADD + """
if redis.replicate_commands then redis.replicate_commands() end  -- TIME before writes (Redis < 5)
local prefix, ticket, token = ARGV[1], ARGV[2], ARGV[3]
local ttl_ms, waiter_ttl_ms = tonumber(ARGV[4]), tonumber(ARGV[5])
if redis.call('GET', prefix .. ':index') ~= ARGV[6] then return -1 end
local now = now_ms()
-- Leases that lapsed unreleased (a dead holder): their accounts are free again.
for _, id in ipairs(redis.call('ZRANGEBYSCORE', prefix .. ':held', '-inf', now,
                               'LIMIT', 0, 64)) do
  local pttl = redis.call('PTTL', prefix .. ':lease:' .. id)
  if pttl == -2 then
    redis.call('ZREM', prefix .. ':held', id)
    free_add(prefix, id)
  else
    redis.call('ZADD', prefix .. ':held', now + math.max(pttl, 1000), id)
  end
end
local queue = prefix .. ':waiters'
for _, t in ipairs(redis.call('ZRANGE', queue, 0, -1)) do
  if t ~= ticket and redis.call('EXISTS', prefix .. ':waiter:' .. t) == 0 then
    redis.call('ZREM', queue, t)
  end
end
local rank = redis.call('ZRANK', queue, ticket)
if not rank then
  redis.call('ZADD', queue, redis.call('INCR', prefix .. ':waiter_seq'), ticket)
  rank = redis.call('ZRANK', queue, ticket)
end
redis.call('SET', prefix .. ':waiter:' .. ticket, '1', 'PX', waiter_ttl_ms)
if rank >= redis.call('ZCARD', prefix .. ':free') then
  -- Too few free: look at every held one (a lease key deleted or expired early by hand is
  -- found here; when the pool is really exhausted this is the old full scan, once a poll).
  for _, id in ipairs(redis.call('ZRANGE', prefix .. ':held', 0, -1)) do
    if redis.call('EXISTS', prefix .. ':lease:' .. id) == 0 then
      redis.call('ZREM', prefix .. ':held', id)
      free_add(prefix, id)
    end
  end
  if rank >= redis.call('ZCARD', prefix .. ':free') then return false end
end
local best = nil
while true do
  local first = redis.call('ZRANGE', prefix .. ':free', 0, 0)[1]
  if not first then return false end
  redis.call('ZREM', prefix .. ':free', first)
  local pttl = redis.call('PTTL', prefix .. ':lease:' .. first)
  if pttl ~= -2 then                                 -- leased after all: held, not free
    redis.call('ZADD', prefix .. ':held', now + math.max(pttl, 1000), first)
  elseif redis.call('SISMEMBER', prefix .. ':quarantined', first) == 0 then
    best = first
    break
  end
end
redis.call('SET', prefix .. ':lease:' .. best, token, 'PX', ttl_ms)
redis.call('ZADD', prefix .. ':held', now + ttl_ms, best)
-- Never below the clock (microseconds; exact as a double until ~2255): a Redis that lost the
-- counter still fences above the numbers it granted before.
local t = redis.call('TIME')
local fencing = math.max(redis.call('INCR', prefix .. ':fencing'),
                         tonumber(t[1]) * 1000000 + tonumber(t[2]))
local digits = string.format('%.0f', fencing)
redis.call('SET', prefix .. ':fencing', digits)
redis.call('HSET', prefix .. ':fence', best, digits)
redis.call('ZADD', prefix .. ':last_leased', digits, best)
redis.call('ZREM', queue, ticket)
redis.call('DEL', prefix .. ':waiter:' .. ticket)
return {best, fencing}
"""

# (Re)builds the index from the pool's accounts (ARGV[3..]; ARGV[2] their digest) and the
# lease keys, the truth: each leased account in ``held`` (by its lease's expiry), each other
# one not quarantined in ``free``. Once per prefix, account list and Redis lifetime (an
# acquire that finds no index for its digest asks for it); a second caller finds it built.
_INDEX = _FREE_ADD + """
if redis.replicate_commands then redis.replicate_commands() end
local prefix = ARGV[1]
if redis.call('GET', prefix .. ':index') == ARGV[2] then return 0 end
redis.call('DEL', prefix .. ':free', prefix .. ':held')
local now = now_ms()
for i = 3, #ARGV do
  local pttl = redis.call('PTTL', prefix .. ':lease:' .. ARGV[i])
  if pttl == -2 then
    free_add(prefix, ARGV[i])
  else
    redis.call('ZADD', prefix .. ':held', now + math.max(pttl, 1000), ARGV[i])
  end
end
redis.call('SET', prefix .. ':index', ARGV[2])
return 1
"""

_LEAVE_QUEUE = """
redis.call('ZREM', KEYS[1], ARGV[1])
return redis.call('DEL', KEYS[2])
"""

# 1: renewed; 0: expired; -1: a newer lease took the account; -2: Redis has no record of a
# lease this new on the account, so it lost its data (restarted empty, flushed).
_RENEW = _FREE_ADD + """
if redis.replicate_commands then redis.replicate_commands() end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('ZADD', KEYS[3], now_ms() + tonumber(ARGV[2]), ARGV[3])
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
local newest, mine = tonumber(redis.call('HGET', KEYS[2], ARGV[3]) or '0'), tonumber(ARGV[4])
if newest < mine then return -2 end
if newest > mine then return -1 end
return 0
"""
_RENEW_LOST = {0: "expired (not renewed within its TTL)",
               -1: "taken over: the account was leased again",
               -2: "Redis lost the pool's state (restarted without persistence, or flushed)"}

_RELEASE = _FREE_ADD + """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('ZREM', ARGV[2] .. ':held', ARGV[3])
  free_add(ARGV[2], ARGV[3])
  return 1
end
return 0
"""

# The lease granted with fencing number ARGV[3] on account ARGV[2] ends now when it is still the
# account's newest and live (its holder died, and its token with it): 1; else 0 (taken over,
# expired, or released) and nothing changes.
_RECLAIM = _FREE_ADD + """
local prefix, id = ARGV[1], ARGV[2]
if redis.call('HGET', prefix .. ':fence', id) ~= ARGV[3] then return 0 end
if redis.call('DEL', prefix .. ':lease:' .. id) == 0 then return 0 end
redis.call('ZREM', prefix .. ':held', id)
free_add(prefix, id)
return 1
"""

# An account back from quarantine is free again (unless it is leased).
_REFREE = _FREE_ADD + """
if redis.call('EXISTS', ARGV[1] .. ':lease:' .. ARGV[2]) == 0 then free_add(ARGV[1], ARGV[2]) end
return 1
"""

_SIGNIN_FAILURE = """
local n = redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
if n >= tonumber(ARGV[2]) then redis.call('SADD', KEYS[2], ARGV[1]) end
return n
"""

_STATUS = """
local prefix = ARGV[1]
local leased, quarantined, free, waiters = 0, 0, 0, 0
for i = 2, #ARGV do
  local l = redis.call('EXISTS', prefix .. ':lease:' .. ARGV[i]) == 1
  local q = redis.call('SISMEMBER', prefix .. ':quarantined', ARGV[i]) == 1
  if l then leased = leased + 1 end
  if q then quarantined = quarantined + 1 end
  if not l and not q then free = free + 1 end
end
for _, t in ipairs(redis.call('ZRANGE', prefix .. ':waiters', 0, -1)) do
  if redis.call('EXISTS', prefix .. ':waiter:' .. t) == 1 then waiters = waiters + 1 end
end
return {leased, quarantined, free, waiters}
"""


class _Metrics:
    def __init__(self, registry: CollectorRegistry):
        self.wait = Histogram(
            "consolerl_env_pool_acquire_wait_seconds", "Time spent waiting for an account.",
            ["outcome"], registry=registry,
            buckets=(0.005, 0.05, 0.25, 1, 5, 15, 60, 180, 600, float("inf")))
        self.acquired = Counter("consolerl_env_pool_leases_acquired_total",
                                "Leases granted.", registry=registry)
        self.released = Counter("consolerl_env_pool_leases_released_total",
                                "Releases; outcome=stale when the lease had already "
                                "lapsed, reclaimed when a dead holder's lease was ended "
                                "(reclaim).",
                                ["outcome"], registry=registry)
        self.lost = Counter("consolerl_env_pool_leases_lost_total",
                            "Renewals that found the lease expired or taken over.",
                            registry=registry)
        self.quarantined = Gauge("consolerl_env_pool_quarantined_accounts",
                                 "Accounts quarantined after repeated sign-in failures.",
                                 registry=registry)


class AccountPool:
    """Leases on a fixed set of accounts, shared through Redis by any number of processes.

    Thread-safe (redis-py's client is). Every pool that shares a Redis and ``key_prefix``
    must be built from the same accounts. ``registry`` receives this pool's metrics (a new
    registry by default, so several pools in one process do not collide).
    """

    def __init__(self, accounts: Sequence[Account], config: PoolConfig, *,
                 client: redis.Redis | None = None,
                 registry: CollectorRegistry | None = None):
        if not accounts:
            raise ConfigError("account pool: 'accounts' must hold at least one account")
        self._accounts = {a.account_id: a for a in accounts}
        if len(self._accounts) != len(accounts):
            raise ConfigError("account pool: 'accounts' has duplicate account_id values")
        if client is None and not config.redis_url:
            raise ConfigError("account pool: field 'redis_url' is required")
        self.config = config
        self._owns_client = client is None
        self._redis = client if client is not None else redis.Redis.from_url(
            config.redis_url, decode_responses=True, socket_timeout=5,
            socket_connect_timeout=5, health_check_interval=30)
        self._ids = list(self._accounts)
        self._digest = hashlib.sha256("\n".join(sorted(self._ids)).encode()).hexdigest()[:16]
        self._p = config.key_prefix
        self._acquire = self._redis.register_script(_ACQUIRE)
        self._leave = self._redis.register_script(_LEAVE_QUEUE)
        self._renew = self._redis.register_script(_RENEW)
        self._release = self._redis.register_script(_RELEASE)
        self._index = self._redis.register_script(_INDEX)
        self._refree = self._redis.register_script(_REFREE)
        self._reclaim = self._redis.register_script(_RECLAIM)
        self._signin_failure = self._redis.register_script(_SIGNIN_FAILURE)
        self._status = self._redis.register_script(_STATUS)
        self.registry = registry if registry is not None else CollectorRegistry()
        self._metrics = _Metrics(self.registry)

    # ---- episodes that may have left resources (a write-ahead record for clean-up) -------------
    def episode_begun(self, account_id: str, episode_id: str) -> None:
        """Record, before it creates anything, that ``episode_id`` may leave resources in
        ``account_id``. If its holder dies before :meth:`episode_cleaned`, the next holder of
        the account finds it in :meth:`unfinished_episodes` and destroys what is left; such
        accounts are leased before the others, so that happens soon."""
        self._redis.sadd(f"{self._p}:episodes:{account_id}", episode_id)

    def episode_cleaned(self, account_id: str, episode_id: str) -> None:
        self._redis.srem(f"{self._p}:episodes:{account_id}", episode_id)

    def unfinished_episodes(self, account_id: str) -> list[str]:
        """Episodes in ``account_id`` whose clean-up never finished (their holder died)."""
        return sorted(self._redis.smembers(f"{self._p}:episodes:{account_id}"))

    @classmethod
    def from_config(cls, config: PoolConfig, *,
                    registry: CollectorRegistry | None = None) -> AccountPool:
        """A pool of the accounts from ``config.accounts_source``."""
        return cls(load_pool_accounts(config), config, registry=registry)

    def close(self) -> None:
        if self._owns_client:
            self._redis.close()

    # -- accounts ---------------------------------------------------------------------------

    @property
    def account_ids(self) -> list[str]:
        return list(self._ids)

    def account(self, account_id: str) -> Account:
        """The full account (with its secrets) of a lease's ``account_id``."""
        try:
            return self._accounts[account_id]
        except KeyError:
            raise UnknownAccount(f"account {account_id!r} is not in this pool "
                                 f"({len(self._ids)} accounts)") from None

    # -- leases -----------------------------------------------------------------------------

    def acquire(self, holder: str, timeout_s: float | None = None) -> Lease:
        """Wait (first come, first served) up to ``timeout_s`` (default
        ``config.acquire_timeout_s``; 0 tries once) for a free account and lease it.

        Raises :class:`NoAccountAvailable` on timeout, :class:`PoolUnavailable` when Redis fails.
        """
        wait = _Wait(self, holder, timeout_s)
        try:
            while True:
                lease = wait.attempt()
                if lease is not None:
                    return lease
                time.sleep(wait.pause())
        finally:
            wait.leave()

    async def acquire_async(self, holder: str, timeout_s: float | None = None) -> Lease:
        """:meth:`acquire` for asyncio: Redis calls run in a thread, waits are
        ``asyncio.sleep``. Cancelling it leaves the queue and leaks no lease."""
        wait = _Wait(self, holder, timeout_s)
        try:
            while True:
                attempt = asyncio.ensure_future(asyncio.to_thread(wait.attempt))
                try:
                    lease = await asyncio.shield(attempt)
                except asyncio.CancelledError:
                    # The thread may still win an account nobody will use: give it back.
                    attempt.add_done_callback(self._release_orphan)
                    raise
                if lease is not None:
                    return lease
                await asyncio.sleep(wait.pause())
        finally:
            wait.leave()

    def _release_orphan(self, attempt: asyncio.Future[Lease | None]) -> None:
        if not attempt.cancelled() and attempt.exception() is None and attempt.result():
            self.release(attempt.result())

    def renew(self, lease: Lease) -> Lease:
        """Extend the lease to a full TTL from now (a heartbeat). Raises :class:`LeaseLost`
        when it expired or another holder has the account now."""
        with self._errors():
            code = int(self._renew(keys=[self._lease_key(lease.account_id), f"{self._p}:fence",
                                         f"{self._p}:held"],
                                   args=[lease.token, _ms(lease.ttl_s), lease.account_id,
                                         lease.fencing]))
        if code != 1:
            self._metrics.lost.inc()
            raise LeaseLost(lease.account_id, lease.fencing,
                            _RENEW_LOST.get(code, f"renewal answered {code}"))
        return replace(lease, renewed_at=time.time())

    def release(self, lease: Lease) -> bool:
        """Give the account back. False (and nothing changed) when the lease had already
        lapsed, whoever holds the account now."""
        with self._errors():
            ok = bool(self._release(keys=[self._lease_key(lease.account_id)],
                                    args=[lease.token, self._p, lease.account_id]))
        self._metrics.released.labels("released" if ok else "stale").inc()
        return ok

    def reclaim(self, account_id: str, fencing: int) -> bool:
        """End the lease granted with ``fencing`` on ``account_id`` now, for a holder known to
        be dead (whose token died with it), instead of at its TTL. True when that lease was
        still the account's newest and live; a lease since taken over, expired or released is
        left alone (False). The account's write-ahead record of episodes stays: its next holder
        (accounts with one are leased first) destroys what the dead holder left."""
        self.account(account_id)
        with self._errors():
            ok = bool(self._reclaim(args=[self._p, account_id, str(int(fencing))]))
        if ok:
            self._metrics.released.labels("reclaimed").inc()
        return ok

    def holds(self, lease: Lease) -> bool:
        """Whether ``lease`` is still the account's live lease."""
        with self._errors():
            return self._redis.get(self._lease_key(lease.account_id)) == lease.token

    def current_fencing(self, account_id: str) -> int:
        """The fencing number of the account's newest lease (0 if never leased)."""
        self.account(account_id)
        with self._errors():
            return int(self._redis.hget(f"{self._p}:fence", account_id) or 0)

    # -- quarantine -------------------------------------------------------------------------

    def report_signin_failure(self, account_id: str) -> bool:
        """Count a failed console sign-in; True when the account is (now) quarantined."""
        self.account(account_id)
        with self._errors():
            failures = int(self._signin_failure(
                keys=[f"{self._p}:signin_failures", f"{self._p}:quarantined"],
                args=[account_id, self.config.quarantine_threshold]))
        self._update_quarantine_gauge()
        return failures >= self.config.quarantine_threshold

    def report_signin_success(self, account_id: str) -> None:
        """Reset the account's consecutive-failure count (it stays quarantined if it was)."""
        self.account(account_id)
        with self._errors():
            self._redis.hdel(f"{self._p}:signin_failures", account_id)

    def quarantined(self) -> list[str]:
        """Ids of this pool's quarantined accounts, sorted."""
        with self._errors():
            members = self._redis.smembers(f"{self._p}:quarantined")
        return sorted(set(members) & set(self._ids))

    def unquarantine(self, account_id: str) -> None:
        """Put the account back in service with a clean failure count."""
        self.account(account_id)
        with self._errors(), self._redis.pipeline(transaction=True) as pipe:
            pipe.srem(f"{self._p}:quarantined", account_id)
            pipe.hdel(f"{self._p}:signin_failures", account_id)
            pipe.execute()
            self._refree(args=[self._p, account_id])
        self._update_quarantine_gauge()

    def status(self) -> PoolStatus:
        """Counts of total, leased, free and quarantined accounts, and live waiters."""
        with self._errors():
            leased, quarantined, free, waiters = self._status(args=[self._p, *self._ids])
        self._metrics.quarantined.set(quarantined)
        return PoolStatus(len(self._ids), leased, free, quarantined, waiters)

    # -- internals --------------------------------------------------------------------------

    def _lease_key(self, account_id: str) -> str:
        return f"{self._p}:lease:{account_id}"

    def _update_quarantine_gauge(self) -> None:
        self._metrics.quarantined.set(len(self.quarantined()))

    @contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except redis.RedisError as exc:
            # The message is redis-py's (host, port, error kind); it carries no credentials.
            raise PoolUnavailable(f"account pool: Redis failed: {exc}") from None


class _Wait:
    """One caller's wait for an account: its ticket in the queue and its deadline."""

    def __init__(self, pool: AccountPool, holder: str, timeout_s: float | None):
        if not isinstance(holder, str) or not holder.strip():
            raise ConfigError("acquire: 'holder' must be a non-empty string naming the caller")
        timeout = pool.config.acquire_timeout_s if timeout_s is None else timeout_s
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0:
            raise ConfigError(f"acquire: 'timeout_s' must be a number >= 0, got {timeout_s!r}")
        self.pool, self.holder, self.timeout_s = pool, holder, float(timeout)
        self.ticket = secrets.token_hex(8)
        self.started = time.monotonic()
        self.deadline = self.started + self.timeout_s

    def attempt(self) -> Lease | None:
        pool, config = self.pool, self.pool.config
        token = secrets.token_hex(16)
        with pool._errors():
            args = [pool._p, self.ticket, token, _ms(config.lease_ttl_s),
                    _ms(config.waiter_ttl_s), pool._digest]
            won = pool._acquire(args=args)
            if won == -1:                   # no index yet (or Redis lost it): build, retry
                pool._index(args=[pool._p, pool._digest, *pool._ids])
                won = pool._acquire(args=args)
        if not won or won == -1:
            return None
        account_id, fencing = won[0], int(won[1])
        pool._metrics.acquired.inc()
        pool._metrics.wait.labels("acquired").observe(time.monotonic() - self.started)
        return Lease(account_id, pool._accounts[account_id].login_name, token, fencing,
                     self.holder, time.time(), config.lease_ttl_s, time.time())

    def pause(self) -> float:
        """Seconds to sleep before the next attempt; raises when the deadline has passed."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            self.pool._metrics.wait.labels("timeout").observe(time.monotonic() - self.started)
            self.leave()  # first, so the pool state in the message does not count this waiter
            s = self.pool.status()
            raise NoAccountAvailable(self.holder, self.timeout_s,
                                     f"{s.total} accounts: {s.leased} leased, {s.quarantined} "
                                     f"quarantined, {s.waiters} waiting")
        return min(self.pool.config.poll_interval_s, left)

    def leave(self) -> None:
        pool = self.pool
        try:
            pool._leave(keys=[f"{pool._p}:waiters", f"{pool._p}:waiter:{self.ticket}"],
                        args=[self.ticket])
        except redis.RedisError:
            pass  # the ticket's liveness key expires by itself; the queue prunes it


class Heartbeat:
    """Renews a lease every ``interval_s`` on a daemon thread while an episode runs.

    Use as a context manager (or ``start()`` / ``stop()``). When the lease is lost (renewal
    refused, or Redis unreachable until the lease's TTL ran out) it stops, records
    ``lost_at`` (wall clock) and ``error``, and calls ``on_lost(error)`` from its thread.
    ``check()`` raises the :class:`LeaseLost` so an episode can stop before acting.
    Stop it before releasing the lease (leaving the ``with`` block does), or its next renewal
    would count a lost lease.
    """

    def __init__(self, pool: AccountPool, lease: Lease, interval_s: float | None = None,
                 on_lost: Callable[[LeaseLost], None] | None = None):
        self._pool = pool
        self._lease = lease
        self._interval = pool.config.heartbeat_s if interval_s is None else interval_s
        if isinstance(self._interval, bool) or not 0 < self._interval < lease.ttl_s:
            raise ConfigError(f"heartbeat: 'interval_s' must be > 0 and below the lease TTL "
                              f"({lease.ttl_s:g} s), got {interval_s!r}")
        self._on_lost = on_lost
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"lease-heartbeat-{lease.account_id}")
        self.lost_at: float | None = None
        self.error: LeaseLost | None = None

    @property
    def lease(self) -> Lease:
        """The lease as last renewed."""
        return self._lease

    @property
    def lost(self) -> bool:
        return self.error is not None

    def check(self) -> Lease:
        """The current lease, or :class:`LeaseLost` if it was lost."""
        if self.error is not None:
            raise self.error
        return self._lease

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def __enter__(self) -> Heartbeat:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _run(self) -> None:
        # Monotonic deadline of the lease as Redis sees it, at the latest.
        expires = time.monotonic() + self._lease.ttl_s - (time.time() - self._lease.renewed_at)
        while not self._stop.wait(self._interval):
            sent = time.monotonic()
            try:
                self._lease = self._pool.renew(self._lease)
                expires = sent + self._lease.ttl_s
            except LeaseLost as exc:
                return self._mark_lost(exc)
            except PoolUnavailable as exc:
                if time.monotonic() >= expires:
                    return self._mark_lost(LeaseLost(self._lease.account_id, self._lease.fencing,
                                                     f"could not renew before the TTL ran out "
                                                     f"({exc})"))

    def _mark_lost(self, error: LeaseLost) -> None:
        self.lost_at = time.time()
        self.error = error
        if self._on_lost is not None:
            self._on_lost(error)


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))
