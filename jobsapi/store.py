"""Jobs, rollouts, events, artifacts and usage in Redis (``prefix`` keys; AOF makes them
survive a Redis restart, and nothing lives only in the API's memory, so they survive an API
restart too).

    {p}:job:{id}            the job (JSON)             {p}:job:{id}:spec     what to run (JSON)
    {p}:job:{id}:rollouts   hash rollout id -> JSON    {p}:job:{id}:events   stream (SSE ids)
    {p}:job:{id}:artifacts  hash artifact id -> reference (team, mime, blob key, size)
    {p}:team:{t}:jobs       zset of job ids by seq     {p}:active            set of live jobs
    {p}:team:{t}:active     the team's live jobs       {p}:team:{t}:queued   its queued jobs
    {p}:layout              the layout's version (indexes built, old jobs given retention)
    {p}:idem:{t}:{key}      idempotency key -> job     {p}:seq               job sequence
    {p}:usage:{t}:{day}     env-seconds that day (kept ``usage_keep_s`` past the day's end)
    {p}:expiry              zset: retention entries by when they are due (b: a job's
                            screenshots, r: its results; see .retention)
    {p}:storage             hash "{team}:blobs" | "{team}:redis" -> bytes kept
    {p}:wake                list: news for scheduler   {p}:scheduler         its heartbeat (TTL)
    {p}:training            set while a training run is active (TTL, :class:`TrainingBeacon`)
    {p}:inflight            hash <instance>/<episode> -> the lease of a scheduler's episode
    {p}:scheduler:{inst}    a scheduler instance's heartbeat (TTL; see the scheduler's sweep)

An artifact's bytes are in the blob store (:mod:`.blobs`; a local directory by default, OSS
in production) under ``{team}/{job id}/{artifact id}``; its id ``art_<hex>-<job id>`` names the
job whose hash holds its reference. (Artifacts written before the blob store, ``art_<hex>``,
are read from their old ``{p}:artifact:{id}`` hash.)

When a job finishes, its keys get the team's results TTL and its retention entries are
indexed (:mod:`.retention`; the sweep settles them). A write to a job's keys after that (a
late event) never makes a key without a TTL: events and rollouts are written only while the
job exists, and given its TTL; artifacts only while it runs.

Every change of a job goes through :meth:`JobStore.update_job` (an optimistic WATCH/MULTI
transaction), so the API (cancel) and the scheduler (progress) never overwrite each other;
the team indexes change in the same transaction as the state they index, and a submission
counts its team's queued jobs under WATCH, so concurrent submissions never pass the quota
together. When the layout key is missing (a Redis from before the indexes, or keys lost),
:meth:`JobStore.ensure_layout` rebuilds the indexes from the jobs (each job indexed by a Lua
script that reads its state, so a job changing meanwhile is never indexed wrongly).

What comes from outside and reaches Redis is checked against Redis' own domain first (the API
answers 422 naming the field): a stream id by :func:`stream_id` (Redis refuses one past 2^64
mid-stream, after the answer has begun), a key part (job, rollout, artifact ids, team names,
cursors) by :func:`key_part` (never the ``:`` separator or a glob character).
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.exceptions import WatchError
from redis.asyncio.retry import Retry

from consolerl.errors import ConsoleRLError

from .blobs import BlobConfig, BlobStore, BlobUnavailable, open_blobs
from .domain import (KEY_PART, KEY_PART_MAX_CHARS, STREAM_ID, STREAM_ID_MAX_CHARS, U64_MAX,
                     OutOfDomain, at_most, key_part, stream_id)
from .retention import RetentionConfig
from .schema import JOB_STATES, TERMINAL, Job, JobEvent, Rollout, event_data, may_move

log = logging.getLogger("jobsapi.store")
# The domain checks live in .domain; the API's parameter types import them from here.
__all__ = ["KEY_PART", "KEY_PART_MAX_CHARS", "STREAM_ID", "STREAM_ID_MAX_CHARS", "U64_MAX",
           "JobStore", "OutOfDomain", "QueueFull", "StoreConflict", "TrainingBeacon",
           "at_most",
           "body_hash", "day", "key_part", "stream_id"]


class StoreConflict(ConsoleRLError, ValueError):
    """An idempotency key reused with another body, or a refused state transition."""


class QueueFull(ConsoleRLError, ValueError):
    """A submission over the team's quota of queued jobs (the message says how many)."""


def body_hash(body: Any) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"))
                          .encode()).hexdigest()


def day(t: float | None = None) -> str:
    return time.strftime("%Y%m%d", time.gmtime(time.time() if t is None else t))


def _inflight(instance: str, episode_id: str) -> str:
    return f"{key_part(instance)}/{key_part(episode_id)}"


def _training_key(prefix: str) -> str:
    return f"{prefix}:training"


IDEMPOTENCY_S = 7 * 86400
# The reference of an artifact of a running job (KEYS[1] the job, no TTL yet): its bytes are
# counted for the job (field '#bytes', what the sweep subtracts) and the team (KEYS[3]). A
# finished job takes no more (0: the caller deletes the blob).
_PUT_REF = """
if redis.call('PTTL', KEYS[1]) ~= -1 then return 0 end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('HINCRBY', KEYS[2], '#bytes', ARGV[3])
redis.call('HINCRBY', KEYS[3], ARGV[4], ARGV[3])
return 1
"""
# A write to a key of a job (KEYS[1]) only while the job exists; once the job has its
# retention TTL, the key gets it too if it has none (it was made after the job finished).
_GUARD = """
local ttl = redis.call('PTTL', KEYS[1])
if ttl == -2 then return false end
local out = %s
if ttl > 0 and redis.call('PTTL', KEYS[2]) == -1 then redis.call('PEXPIRE', KEYS[2], ttl) end
return out
"""
_ADD_EVENT = _GUARD % "redis.call('XADD', KEYS[2], '*', 'type', ARGV[1], 'data', ARGV[2])"
_PUT_ROLLOUTS = _GUARD % "redis.call('HSET', KEYS[2], unpack(ARGV))"
# Settle a retention entry once (ZREM says who): subtract its bytes from the team's count
# (a count that reaches 0 goes), then drop the job's artifact references (b) or the job from
# its team's list (r).
_SETTLE = """
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then return 0 end
if redis.call('HINCRBY', KEYS[2], ARGV[2], -tonumber(ARGV[3])) <= 0 then
  redis.call('HDEL', KEYS[2], ARGV[2])
end
if ARGV[4] == 'b' then redis.call('DEL', KEYS[3]) else redis.call('ZREM', KEYS[3], ARGV[5]) end
return 1
"""


LAYOUT = b"2"              # 2: team indexes, retention (1: the layout before them)
_LIVE = [s for s in JOB_STATES if s not in TERMINAL]
# Index one job by its stored state, atomically (KEYS: the job, the live set, the team's
# live and queued sets; ARGV[1] the id): a job that is gone or finished leaves every index.
_INDEX_JOB = """
local raw = redis.call('GET', KEYS[1])
local state = raw and cjson.decode(raw)['state']
if %s then
  redis.call('SADD', KEYS[3], ARGV[1])
  if state == 'queued' then redis.call('SADD', KEYS[4], ARGV[1])
  else redis.call('SREM', KEYS[4], ARGV[1]) end
  return 1
end
redis.call('SREM', KEYS[2], ARGV[1])
redis.call('SREM', KEYS[3], ARGV[1])
redis.call('SREM', KEYS[4], ARGV[1])
return 0
""" % " or ".join(f"state == '{state}'" for state in _LIVE)
# An idempotency key taken by a submission the quota then refused goes (if still its own).
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class JobStore:
    def __init__(self, url: str, prefix: str = "consolerl:api", retries: int = 12,
                 blobs: BlobConfig | BlobStore | None = None,
                 retention: RetentionConfig | None = None,
                 clock: Callable[[], float] = time.time):
        """``retries``: how often a command is retried on a lost connection, with exponential
        backoff from 0.1 s up to 2 s (12 retries wait about 17 s in all: choose it to outlast a
        Redis restart). ``blobs``: where artifacts' bytes go, a :class:`~.blobs.BlobConfig`
        (opened on first use, in the process that uses it) or a store (default: the default
        config's local directory). ``retention``: how long finished jobs are kept (default:
        :class:`~.retention.RetentionConfig`'s). ``clock``: the time of day (the day a usage
        counter belongs to, when a retention entry is due); TTLs are Redis's own."""
        self.url = url
        self.p = prefix
        self.retries = retries
        self.retention = retention if retention is not None else RetentionConfig()
        self.clock = clock
        self._layout_ok = False
        self._layout_lock: asyncio.Lock | None = None
        self.blob_config = blobs if isinstance(blobs, BlobConfig) else \
            (BlobConfig() if blobs is None else None)
        self._blobs: BlobStore | None = None if self.blob_config is not None else blobs
        self._redis: aioredis.Redis | None = None

    @property
    def redis(self) -> aioredis.Redis:
        """The client, made on first use in the process that uses it (the store pickles to a
        Ray actor or Serve replica without one). Commands are retried across a Redis restart
        (AOF brings the data back) instead of failing a request or losing a write."""
        if self._redis is None:
            self._redis = aioredis.Redis.from_url(
                self.url, decode_responses=False, socket_timeout=10, health_check_interval=5,
                retry=Retry(ExponentialBackoff(cap=2.0, base=0.05), self.retries),
                retry_on_error=[RedisConnectionError, RedisTimeoutError])
        return self._redis

    @property
    def blobs(self) -> BlobStore:
        if self._blobs is None:
            assert self.blob_config is not None
            self._blobs = open_blobs(self.blob_config)
        return self._blobs

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_redis": None, "_layout_ok": False, "_layout_lock": None,
                "_blobs": self._blobs if self.blob_config is None else None}

    async def close(self) -> None:
        self._layout_lock = None                 # bound to this event loop, as the client
        if self._redis is not None:
            await self._redis.aclose()
            self._redis = None

    async def ping(self) -> bool:
        return bool(await self.redis.ping())

    # ---- jobs -----------------------------------------------------------------------------------
    def _k(self, *parts: str) -> str:
        return ":".join((self.p, *parts))

    async def new_job_id(self) -> str:
        return f"job_{secrets.token_hex(8)}"

    def _idem(self, team: str, key: str) -> str:
        return self._k("idem", team, hashlib.sha256(key.encode()).hexdigest())

    def _team_index(self, team: str) -> tuple[str, str]:
        """The team's sets of live and of queued jobs."""
        return self._k("team", team, "active"), self._k("team", team, "queued")

    async def create_job(self, job: Job, spec: dict[str, Any],
                         idempotency: tuple[str, str] | None = None,
                         max_queued: int | None = None) -> tuple[Job, bool]:
        """Store ``job`` with ``spec``; with ``idempotency`` (key, body hash): the job an
        earlier request with that key made (``created`` False), or :class:`StoreConflict`
        when that request had another body. ``max_queued``: :class:`QueueFull` when the team
        already has that many queued jobs (counted and created in one transaction; a known
        idempotency key returns its job whatever the count)."""
        mine = idem_key = None
        if idempotency is not None:
            key = idem_key = self._idem(job.team, idempotency[0])
            mine = json.dumps({"job": job.id, "body": idempotency[1]})
            # Remembered no longer than the team's results are kept.
            keep_s = min(IDEMPOTENCY_S, self.retention.for_team(job.team).results_s)
            if not await self.redis.set(key, mine, nx=True, px=max(1, int(keep_s * 1000))):
                held = json.loads(await self.redis.get(key) or mine)
                if held["body"] != idempotency[1]:
                    raise StoreConflict("this Idempotency-Key was used with another request body")
                earlier = await self.get_job(held["job"])
                if earlier is not None:
                    return earlier, False
                # The key was taken but the job not written (a crash between): write it now.
                job = job.model_copy(update={"id": held["job"]})
                mine = json.dumps(held)
        await self.ensure_layout()
        live, queued = self._team_index(job.team)
        seq = await self.redis.incr(self._k("seq"))
        while True:
            async with self.redis.pipeline(transaction=True) as pipe:
                try:
                    if max_queued is not None:
                        await pipe.watch(queued)
                        count = await pipe.scard(queued)
                        if count >= max_queued:
                            await pipe.reset()
                            if idem_key is not None:
                                await self.redis.eval(_RELEASE, 1, idem_key, mine)
                            raise QueueFull(f"your team has {count} queued jobs, its quota")
                    pipe.multi()
                    pipe.set(self._k("job", job.id), job.model_dump_json())
                    pipe.set(self._k("job", job.id, "spec"), json.dumps(spec))
                    pipe.zadd(self._k("team", job.team, "jobs"), {job.id: seq})
                    pipe.sadd(self._k("active"), job.id)
                    pipe.sadd(live, job.id)
                    if job.state == "queued":
                        pipe.sadd(queued, job.id)
                    await pipe.execute()
                    return job, True
                except WatchError:
                    continue

    async def job_json(self, job_id: str) -> bytes | None:
        return await self.redis.get(self._k("job", job_id))

    async def get_job(self, job_id: str) -> Job | None:
        raw = await self.redis.get(self._k("job", job_id))
        return None if raw is None else Job.model_validate_json(raw)

    async def job_spec(self, job_id: str) -> dict[str, Any]:
        raw = await self.redis.get(self._k("job", job_id, "spec"))
        return {} if raw is None else json.loads(raw)

    async def update_job(self, job_id: str, change: Callable[[Job], Job | None]) -> Job | None:
        """Apply ``change`` to the stored job atomically (``change`` returns the new job, or
        None to leave it). A change of ``state`` must be an allowed transition; the one that
        finishes the job starts its retention (in the same transaction)."""
        key = self._k("job", job_id)
        while True:
            async with self.redis.pipeline(transaction=True) as pipe:
                try:
                    await pipe.watch(key)
                    raw = await pipe.get(key)
                    if raw is None:
                        return None
                    job = Job.model_validate_json(raw)
                    new = change(job)
                    if new is None:
                        await pipe.unwatch()
                        return job
                    if new.state != job.state and not may_move(job.state, new.state):
                        raise StoreConflict(f"a {job.state} job cannot become {new.state}")
                    finishing = new.state in TERMINAL and job.state not in TERMINAL
                    if finishing:
                        sized = await self._results_bytes(pipe, job_id)
                    pipe.multi()
                    # KEEPTTL: a finished job's counts may still change; its TTL stays.
                    pipe.set(key, new.model_dump_json(), keepttl=True)
                    live, queued = self._team_index(job.team)
                    if job.state == "queued" and new.state != "queued":
                        pipe.srem(queued, job_id)
                    if new.state in TERMINAL:
                        pipe.srem(self._k("active"), job_id)
                        pipe.srem(live, job_id)
                    if finishing:
                        self._retire(pipe, new, sized)
                    await pipe.execute()
                    return new
                except WatchError:
                    continue

    def _job_keys(self, job_id: str) -> list[str]:
        """The keys of a job's results (what its results TTL covers)."""
        return [self._k("job", job_id), *(self._k("job", job_id, part)
                                          for part in ("spec", "rollouts", "events"))]

    async def _results_bytes(self, pipe: Any, job_id: str) -> int:
        """What the job's results take in Redis now (MEMORY USAGE, every element sampled);
        called under WATCH, before MULTI."""
        total = 0
        for key in self._job_keys(job_id):
            total += int(await pipe.execute_command("MEMORY", "USAGE", key, "SAMPLES", "0")
                         or 0)
        return total

    def _retire(self, pipe: Any, job: Job, results_bytes: int,
                since: float | None = None) -> None:
        """In a MULTI: the finished job's results TTL, and its retention entries (see
        :mod:`.retention`), counted from ``since`` (default now; a job that finished before
        retention existed: when it finished). Its artifact references outlive the
        screenshots' entry by an hour (the sweep deletes them with the blobs; the TTL is a
        backstop)."""
        kept = self.retention.for_team(job.team)
        now = self.clock()
        if since is not None:                # what is left of its time (1 ms: none)
            kept = replace(kept, results_s=max(0.001, since + kept.results_s - now),
                           screenshots_s=max(0.001, since + kept.screenshots_s - now))
        results_ms = max(1, int(kept.results_s * 1000))
        for key in self._job_keys(job.id):
            pipe.pexpire(key, results_ms)
        pipe.pexpire(self._k("job", job.id, "artifacts"), results_ms + 3_600_000)
        pipe.zadd(self._k("expiry"), {
            f"b:{job.team}:{job.id}": now + kept.screenshots_s,
            f"r:{job.team}:{job.id}:{results_bytes}": now + kept.results_s})
        if results_bytes:
            pipe.hincrby(self._k("storage"), f"{job.team}:redis", results_bytes)

    async def list_jobs(self, team: str, after: str | None, limit: int
                        ) -> tuple[list[Job], bool]:
        """The team's jobs, newest first; ``after``: the last id of the previous page."""
        key = self._k("team", team, "jobs")
        top = "+inf"
        if after:
            score = await self.redis.zscore(key, after)
            if score is None:
                return [], False
            top = f"({int(score)}"
        ids = await self.redis.zrevrangebyscore(key, top, "-inf", start=0, num=limit + 1)
        return await self._jobs(ids[:limit]), len(ids) > limit

    async def _jobs(self, ids: list[bytes]) -> list[Job]:
        """The jobs of ``ids`` that exist, in that order (MGET, a thousand at a time)."""
        out = []
        for i in range(0, len(ids), 1000):
            keys = [self._k("job", j.decode()) for j in ids[i:i + 1000]]
            out += [Job.model_validate_json(r) for r in await self.redis.mget(keys) if r]
        return out

    async def active_jobs(self) -> list[Job]:
        """Every live job (of every team: the scheduler's view)."""
        return await self._jobs(list(await self.redis.smembers(self._k("active"))))

    async def team_jobs(self, team: str) -> list[Job]:
        """The team's live jobs (its index: the cost does not grow with other teams' jobs)."""
        await self.ensure_layout()
        return await self._jobs(list(await self.redis.smembers(self._team_index(team)[0])))

    async def queued_count(self, team: str) -> int:
        await self.ensure_layout()
        return int(await self.redis.scard(self._team_index(team)[1]))

    # ---- the layout -----------------------------------------------------------------------------
    async def ensure_layout(self) -> None:
        """Bring a Redis whose layout key is missing (one from before the team indexes and
        retention, or keys lost) to this layout: build the team indexes, retire finished jobs
        that have no TTL, give old inline artifacts one. Idempotent and safe beside live
        traffic; once per process when the key is there."""
        if self._layout_ok:
            return
        if self._layout_lock is None:
            self._layout_lock = asyncio.Lock()
        async with self._layout_lock:            # this process's callers: one does it
            if self._layout_ok:
                return
            if await self.redis.get(self._k("layout")) != LAYOUT:
                started = time.monotonic()
                indexed = await self._rebuild_indexes()
                retired = await self._retire_old_jobs()
                await self.redis.set(self._k("layout"), LAYOUT)
                log.info("job store layout %s under %s: %d live jobs indexed, %d finished "
                         "jobs given retention (%.1f s)", LAYOUT.decode(), self.p, indexed,
                         retired, time.monotonic() - started)
            self._layout_ok = True

    async def _scan(self, pattern: str) -> list[bytes]:
        return [k async for k in self.redis.scan_iter(match=pattern, count=1000)]

    async def _rebuild_indexes(self) -> int:
        """Index every live job and check every member of every team index (stale ones go)."""
        todo = {job.id.encode(): job.team for job in await self.active_jobs()}
        for key in await self._scan(self._k("team", "*", "active")) + \
                await self._scan(self._k("team", "*", "queued")):
            team = key.decode()[len(self._k("team")) + 1:].rsplit(":", 1)[0]
            for member in await self.redis.smembers(key):
                todo.setdefault(member, team)
        missing = [j for j in await self.redis.smembers(self._k("active")) if j not in todo]
        for job_id in missing:                   # in the live set, but no job: let it go
            await self.redis.srem(self._k("active"), job_id)
        indexed = 0
        items = list(todo.items())
        for i in range(0, len(items), 500):
            async with self.redis.pipeline(transaction=False) as pipe:
                for job_id, team in items[i:i + 500]:
                    live, queued = self._team_index(team)
                    pipe.eval(_INDEX_JOB, 4, self._k("job", job_id.decode()),
                              self._k("active"), live, queued, job_id)
                indexed += sum(await pipe.execute())
        return indexed

    async def _retire_old_jobs(self) -> int:
        """Finished jobs with no TTL (finished before retention) get it now; old inline
        artifacts get their team's screenshot time; a team list's ids of jobs gone go."""
        retired = 0
        for key in await self._scan(self._k("team", "*", "jobs")):
            for raw in await self.redis.zrange(key, 0, -1):
                job_id = raw.decode()
                job_key = self._k("job", job_id)
                async with self.redis.pipeline(transaction=True) as pipe:
                    try:
                        await pipe.watch(job_key)
                        found = await pipe.get(job_key)
                        if found is None:
                            await pipe.reset()
                            await self.redis.zrem(key, raw)
                            continue
                        job = Job.model_validate_json(found)
                        if job.state not in TERMINAL or await pipe.pttl(job_key) != -1:
                            continue
                        sized = await self._results_bytes(pipe, job_id)
                        pipe.multi()
                        self._retire(pipe, job, sized, since=job.finished_at or job.created_at)
                        await pipe.execute()
                        retired += 1
                    except WatchError:
                        continue             # another process retired it meanwhile
        for key in await self._scan(self._k("artifact", "*")):
            team = await self.redis.hget(key, "team")
            if team is not None and await self.redis.ttl(key) == -1:
                kept = self.retention.for_team(team.decode()).screenshots_s
                await self.redis.pexpire(key, max(1, int(kept * 1000)))
        return retired

    async def owns(self, team: str, job_id: str) -> bool:
        return await self.redis.zscore(self._k("team", team, "jobs"), job_id) is not None

    # ---- rollouts -------------------------------------------------------------------------------
    async def put_rollout(self, rollout: Rollout) -> None:
        await self.put_rollouts([rollout])

    async def put_rollouts(self, rollouts: list[Rollout]) -> None:
        """Store the rollouts (of one job; nothing when the job no longer exists)."""
        for i in range(0, len(rollouts), 500):          # Lua's unpack() takes ~8000 values
            chunk, job_id = rollouts[i:i + 500], rollouts[0].job_id
            await self.redis.eval(_PUT_ROLLOUTS, 2, self._k("job", job_id),
                                  self._k("job", job_id, "rollouts"),
                                  *(x for r in chunk for x in (r.id, r.model_dump_json())))

    async def get_rollout(self, job_id: str, rollout_id: str) -> Rollout | None:
        raw = await self.redis.hget(self._k("job", job_id, "rollouts"), rollout_id)
        return None if raw is None else Rollout.model_validate_json(raw)

    async def rollouts(self, job_id: str) -> list[Rollout]:
        raw = await self.redis.hgetall(self._k("job", job_id, "rollouts"))
        return sorted((Rollout.model_validate_json(v) for v in raw.values()),
                      key=lambda r: r.id)

    # ---- events ---------------------------------------------------------------------------------
    async def add_event(self, job_id: str, event: JobEvent) -> str | None:
        """Append ``event`` to the job's stream; its id (the SSE ``id``), or None when the job
        no longer exists."""
        eid = await self.redis.eval(_ADD_EVENT, 2, self._k("job", job_id),
                                    self._k("job", job_id, "events"), event.kind,
                                    json.dumps(event_data(event)))
        return None if eid is None else eid.decode()

    async def read_events(self, job_id: str, after: str, block_ms: int, count: int = 200
                          ) -> list[tuple[str, str, str]]:
        """Events after ``after`` (a stream id; "0" for all): (id, type, JSON data).
        :class:`OutOfDomain` for an ``after`` Redis would refuse (checked before Redis is)."""
        key = self._k("job", job_id, "events")
        got = await self.redis.xread({key: stream_id(after)}, count=count, block=block_ms or None)
        out = []
        for _, entries in got or []:
            for eid, fields in entries:
                out.append((eid.decode(), fields[b"type"].decode(), fields[b"data"].decode()))
        return out

    # ---- artifacts and usage --------------------------------------------------------------------
    @staticmethod
    def blob_folder(team: str, job_id: str) -> str:
        """The blob store folder of a job's artifacts."""
        return f"{team}/{job_id}"

    async def put_artifact(self, team: str, job_id: str, mime: str, data: bytes
                           ) -> str | None:
        """Keep ``data`` as an artifact of the job; its id, or None when it was not kept (the
        blob store is unreachable, logged; or the job no longer exists): a step without its
        screenshot, never a failed episode."""
        aid = f"art_{secrets.token_hex(8)}-{job_id}"
        key = f"{self.blob_folder(team, job_id)}/{aid}"
        try:
            await asyncio.to_thread(self.blobs.put, key, data, mime)
        except BlobUnavailable as exc:
            log.warning("artifact of job %s not kept: %s", job_id, exc)
            return None
        ref = json.dumps({"team": team, "mime": mime, "key": key, "size": len(data)})
        kept = await self.redis.eval(_PUT_REF, 3, self._k("job", job_id),
                                     self._k("job", job_id, "artifacts"), self._k("storage"),
                                     aid, ref, len(data), f"{team}:blobs")
        if not kept:
            await asyncio.to_thread(self.blobs.delete, [key])
            return None
        return aid

    async def get_artifact(self, team: str, artifact_id: str) -> tuple[str, bytes] | None:
        """(mime, bytes) of an artifact of ``team``; None for another team's (never a hint that
        it exists) and for one no longer kept."""
        _, sep, job_id = artifact_id.partition("-")
        if not sep or not job_id:             # written before the blob store: bytes inline
            got = await self.redis.hgetall(self._k("artifact", artifact_id))
            if not got or got.get(b"team", b"").decode() != team:
                return None
            return got[b"mime"].decode(), got[b"data"]
        raw = await self.redis.hget(self._k("job", key_part(job_id), "artifacts"), artifact_id)
        ref = json.loads(raw) if raw is not None else None
        if ref is None or ref["team"] != team:
            return None
        data = await asyncio.to_thread(self.blobs.get, ref["key"])
        return None if data is None else (ref["mime"], data)

    async def add_usage(self, team: str, env_seconds: float) -> None:
        """Count ``env_seconds`` on the team's counter of the day (UTC), which is kept
        ``retention.usage_keep_s`` past the day's end."""
        now = self.clock()
        key = self._k("usage", team, day(now))
        left_s = 86400 - now % 86400 + self.retention.usage_keep_s
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.incrbyfloat(key, env_seconds)
            pipe.pexpire(key, max(1, int(left_s * 1000)))
            await pipe.execute()

    async def usage_today(self, team: str) -> float:
        raw = await self.redis.get(self._k("usage", team, day(self.clock())))
        return float(raw or 0.0)

    # ---- retention ------------------------------------------------------------------------------
    async def sweep(self, now: float, limit: int) -> list[str]:
        """Settle up to ``limit`` retention entries due by ``now`` (see :mod:`.retention`):
        the kinds settled (``screenshots``, ``results``). A job's screenshots go from the blob
        store before their entry is settled, so a failure (BlobUnavailable) leaves it due."""
        due = await self.redis.zrangebyscore(self._k("expiry"), "-inf", now, start=0,
                                             num=limit)
        settled = []
        for raw in due:
            member = raw.decode()
            kind, team, job_id, *rest = member.split(":")
            if kind == "b":
                refs = self._k("job", job_id, "artifacts")
                size = int(await self.redis.hget(refs, "#bytes") or 0)
                await asyncio.to_thread(self.blobs.delete_prefix,
                                        self.blob_folder(team, job_id))
                done = await self.redis.eval(_SETTLE, 3, self._k("expiry"),
                                             self._k("storage"), refs, member,
                                             f"{team}:blobs", size, "b", job_id)
                if done:
                    settled.append("screenshots")
            else:
                done = await self.redis.eval(_SETTLE, 3, self._k("expiry"),
                                             self._k("storage"), self._k("team", team, "jobs"),
                                             member, f"{team}:redis", int(rest[0] if rest else 0),
                                             "r", job_id)
                if done:
                    settled.append("results")
        return settled

    async def storage_bytes(self) -> dict[tuple[str, str], int]:
        """(team, kind) -> bytes kept (kind ``blobs`` or ``redis``; see :mod:`.retention`)."""
        raw = await self.redis.hgetall(self._k("storage"))
        out = {}
        for field_, value in raw.items():
            team, _, kind = field_.decode().rpartition(":")
            out[(team, kind)] = int(value)
        return out

    # ---- the scheduler ---------------------------------------------------------------------------
    async def wake(self, job_id: str) -> None:
        """Tell the scheduler there is news (a new job, a cancel) without waiting for a tick."""
        key = self._k("wake")
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.rpush(key, job_id)
            pipe.ltrim(key, -100, -1)
            await pipe.execute()

    async def wait_wake(self, timeout_s: float) -> None:
        await self.redis.blpop([self._k("wake")], timeout=timeout_s)

    async def scheduler_beat(self, ttl_s: float) -> None:
        await self.redis.set(self._k("scheduler"), str(time.time()), px=int(ttl_s * 1000))

    async def scheduler_alive(self) -> bool:
        return bool(await self.redis.exists(self._k("scheduler")))

    # ---- training's share -----------------------------------------------------------------------
    async def training_active(self) -> bool:
        """Whether a training run is active (its :class:`TrainingBeacon` keeps the key alive
        while it runs)."""
        return bool(await self.redis.exists(_training_key(self.p)))

    # ---- what a scheduler's episodes hold (its successor sweeps what a dead one left) -----------
    async def instance_beat(self, instance: str, ttl_s: float) -> None:
        """Scheduler ``instance`` is alive for ``ttl_s`` more (the global heartbeat too)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.set(self._k("scheduler", key_part(instance)), str(time.time()),
                     px=int(ttl_s * 1000))
            pipe.set(self._k("scheduler"), str(time.time()), px=int(ttl_s * 1000))
            await pipe.execute()

    async def instance_alive(self, instance: str) -> bool:
        return bool(await self.redis.exists(self._k("scheduler", key_part(instance))))

    async def instance_gone(self, instance: str) -> None:
        """A scheduler that stopped cleanly: its successor need not wait for its TTL."""
        await self.redis.delete(self._k("scheduler", key_part(instance)))

    async def record_episode(self, instance: str, episode_id: str, record: dict[str, Any]
                             ) -> None:
        """Write, before the episode provisions anything, that ``instance`` runs it under
        ``record`` (its lease: account, fencing number; job and rollout)."""
        await self.redis.hset(self._k("inflight"), _inflight(instance, episode_id),
                              json.dumps(record))

    async def episode_records(self) -> list[tuple[str, str, dict[str, Any]]]:
        """Every recorded episode: (instance, episode id, record)."""
        out = []
        for field, raw in (await self.redis.hgetall(self._k("inflight"))).items():
            instance, _, episode = field.decode().partition("/")
            out.append((instance, episode, json.loads(raw)))
        return out

    async def drop_episode(self, instance: str, episode_id: str) -> None:
        """The episode is over (its resources destroyed or left in its account's record, its
        lease released)."""
        await self.redis.hdel(self._k("inflight"), _inflight(instance, episode_id))


class TrainingBeacon:
    """While a training run is active it keeps the store's training key (``prefix`` as the
    :class:`JobStore`'s) alive in Redis, with a TTL of ``ttl_s`` renewed every third of it:
    the jobs scheduler then keeps to its share of the env workers. When the run ends
    (:meth:`stop`) or its process dies, the key goes and API jobs get the whole pool.

    A thread with a synchronous client: the training loop that owns it is not async."""

    def __init__(self, redis_url: str, prefix: str, ttl_s: float = 15.0):
        if not ttl_s > 0:
            raise ValueError(f"TrainingBeacon.ttl_s: must be > 0 (got {ttl_s!r})")
        self.key, self.ttl_s = _training_key(prefix), ttl_s
        self.redis = redis.Redis.from_url(redis_url, socket_timeout=5)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="training-beacon")

    def start(self) -> TrainingBeacon:
        self._thread.start()
        return self

    def _run(self) -> None:
        while True:
            try:
                self.redis.set(self.key, "1", px=int(self.ttl_s * 1000))
            except redis.RedisError:
                pass                     # Redis restarting: the next beat sets it again
            if self._stop.wait(self.ttl_s / 3):
                break

    def stop(self) -> None:
        """Stop renewing and remove the key (idempotent)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        try:
            self.redis.delete(self.key)
        except redis.RedisError:
            pass                         # Redis gone: the key expires by itself
        self.redis.close()
