"""Jobs, rollouts, events, artifacts and usage in Redis (``prefix`` keys; AOF makes them
survive a Redis restart, and nothing lives only in the API's memory, so they survive an API
restart too).

    {p}:job:{id}            the job (JSON)             {p}:job:{id}:spec     what to run (JSON)
    {p}:job:{id}:rollouts   hash rollout id -> JSON    {p}:job:{id}:events   stream (SSE ids)
    {p}:team:{t}:jobs       zset of job ids by seq     {p}:active            set of live jobs
    {p}:idem:{t}:{key}      idempotency key -> job     {p}:artifact:{id}     hash team/mime/data
    {p}:usage:{t}:{day}     env-seconds that day       {p}:seq               job sequence
    {p}:wake                list: news for scheduler   {p}:scheduler         its heartbeat (TTL)
    {p}:training            set while a training run is active (TTL, :class:`TrainingBeacon`)
    {p}:inflight            hash <instance>/<episode> -> the lease of a scheduler's episode
    {p}:scheduler:{inst}    a scheduler instance's heartbeat (TTL; see the scheduler's sweep)

Every change of a job goes through :meth:`JobStore.update_job` (an optimistic WATCH/MULTI
transaction), so the API (cancel) and the scheduler (progress) never overwrite each other.

What comes from outside and reaches Redis is checked against Redis' own domain first (the API
answers 422 naming the field): a stream id by :func:`stream_id` (Redis refuses one past 2^64
mid-stream, after the answer has begun), a key part (job, rollout, artifact ids, team names,
cursors) by :func:`key_part` (never the ``:`` separator or a glob character).
"""
from __future__ import annotations

import hashlib
import json
import re
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.exceptions import WatchError
from redis.asyncio.retry import Retry

from consolerl.errors import ConsoleRLError

from .schema import TERMINAL, Job, JobEvent, Rollout, event_data, may_move


class StoreConflict(ConsoleRLError, ValueError):
    """An idempotency key reused with another body, or a refused state transition."""


class OutOfDomain(ConsoleRLError, ValueError):
    """A value from outside that Redis would refuse, or read as something else (a stream id
    past 2^64, a key part with a separator); the message says what the domain is."""


U64_MAX = 2 ** 64 - 1          # a stream id's parts: Redis reads each as an unsigned 64-bit


def at_most(n: int) -> str:
    """A regular expression (no anchors) for the decimal integers 0..``n``, leading zeros
    allowed: what Redis' ``string2ull`` reads as at most ``n``."""
    digits = str(n)
    # Fewer digits than n, or as many and smaller at the first digit that differs, or n.
    branches = [f"[0-9]{{1,{len(digits) - 1}}}"] if len(digits) > 1 else []
    for i, d in enumerate(digits):
        if d != "0" and (i or d != "1" or len(digits) == 1):  # else: fewer digits
            rest = len(digits) - i - 1
            branches.append(digits[:i] + (f"[0-{int(d) - 1}]" if d != "1" else "0")
                            + {0: "", 1: "[0-9]"}.get(rest, f"[0-9]{{{rest}}}"))
    return "0*(?:" + "|".join([*branches, digits]) + ")"


STREAM_ID_MAX_CHARS = 64
# <ms>-<seq> or <ms> (read as <ms>-0), each part at most 2^64-1; not "$", "+", "-", ">" nor "*":
# a client resumes after an id the stream gave it.
STREAM_ID = f"^{at_most(U64_MAX)}(?:-{at_most(U64_MAX)})?$"
_STREAM_ID = re.compile(STREAM_ID.strip("^$"))
KEY_PART_MAX_CHARS = 64
KEY_PART = f"^[A-Za-z0-9_-]{{1,{KEY_PART_MAX_CHARS}}}$"
_KEY_PART = re.compile(KEY_PART.strip("^$"))


def stream_id(text: str) -> str:
    """``text`` as the stream id Redis reads (``<ms>-<seq>``, canonical: no leading zeros,
    ``<ms>`` alone is ``<ms>-0``); :class:`OutOfDomain` for anything Redis would refuse or
    read otherwise."""
    if len(text) > STREAM_ID_MAX_CHARS or not _STREAM_ID.fullmatch(text):
        shown = repr(text[:40]) + ("..." if len(text) > 40 else "")
        raise OutOfDomain(f"{shown} is not an event id: <ms>-<seq> or <ms>, each a decimal "
                          f"integer at most {U64_MAX} (2^64-1), at most "
                          f"{STREAM_ID_MAX_CHARS} characters")
    ms, _, seq = text.partition("-")
    return f"{int(ms)}-{int(seq or 0)}"


def key_part(text: str) -> str:
    """``text`` when it may be one part of a key name (an id or a team): 1-64 ASCII letters,
    digits, ``_`` or ``-``; :class:`OutOfDomain` otherwise."""
    if not _KEY_PART.fullmatch(text):
        shown = repr(text[:40]) + ("..." if len(text) > 40 else "")
        raise OutOfDomain(f"{shown} is not an id: 1-{KEY_PART_MAX_CHARS} of the letters "
                          "A-Z a-z, digits, '_' and '-'")
    return text


def body_hash(body: Any) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"))
                          .encode()).hexdigest()


def day(t: float | None = None) -> str:
    return time.strftime("%Y%m%d", time.gmtime(time.time() if t is None else t))


def _inflight(instance: str, episode_id: str) -> str:
    return f"{key_part(instance)}/{key_part(episode_id)}"


def _training_key(prefix: str) -> str:
    return f"{prefix}:training"


class JobStore:
    def __init__(self, url: str, prefix: str = "consolerl:api", retries: int = 12):
        """``retries``: how often a command is retried on a lost connection, with exponential
        backoff from 0.1 s up to 2 s (12 retries wait about 17 s in all: choose it to outlast a
        Redis restart)."""
        self.url = url
        self.p = prefix
        self.retries = retries
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

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "p": self.p, "retries": self.retries, "_redis": None}

    async def close(self) -> None:
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

    async def idempotency_known(self, team: str, key: str) -> bool:
        return bool(await self.redis.exists(self._idem(team, key)))

    async def create_job(self, job: Job, spec: dict[str, Any],
                         idempotency: tuple[str, str] | None = None) -> tuple[Job, bool]:
        """Store ``job`` with ``spec``; with ``idempotency`` (key, body hash): the job an
        earlier request with that key made (``created`` False), or :class:`StoreConflict`
        when that request had another body."""
        if idempotency is not None:
            key = self._idem(job.team, idempotency[0])
            mine = json.dumps({"job": job.id, "body": idempotency[1]})
            if not await self.redis.set(key, mine, nx=True, ex=7 * 86400):
                held = json.loads(await self.redis.get(key) or mine)
                if held["body"] != idempotency[1]:
                    raise StoreConflict("this Idempotency-Key was used with another request body")
                earlier = await self.get_job(held["job"])
                if earlier is not None:
                    return earlier, False
                # The key was taken but the job not written (a crash between): write it now.
                job = job.model_copy(update={"id": held["job"]})
        seq = await self.redis.incr(self._k("seq"))
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(self._k("job", job.id), job.model_dump_json())
            pipe.set(self._k("job", job.id, "spec"), json.dumps(spec))
            pipe.zadd(self._k("team", job.team, "jobs"), {job.id: seq})
            pipe.sadd(self._k("active"), job.id)
            await pipe.execute()
        return job, True

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
        None to leave it). A change of ``state`` must be an allowed transition."""
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
                    pipe.multi()
                    pipe.set(key, new.model_dump_json())
                    if new.state in TERMINAL:
                        pipe.srem(self._k("active"), job_id)
                    await pipe.execute()
                    return new
                except WatchError:
                    continue

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
        jobs = [j for j in [await self.get_job(i.decode()) for i in ids[:limit]] if j]
        return jobs, len(ids) > limit

    async def active_jobs(self) -> list[Job]:
        ids = await self.redis.smembers(self._k("active"))
        jobs = [await self.get_job(i.decode()) for i in ids]
        return [j for j in jobs if j is not None]

    async def owns(self, team: str, job_id: str) -> bool:
        return await self.redis.zscore(self._k("team", team, "jobs"), job_id) is not None

    # ---- rollouts -------------------------------------------------------------------------------
    async def put_rollout(self, rollout: Rollout) -> None:
        await self.redis.hset(self._k("job", rollout.job_id, "rollouts"), rollout.id,
                              rollout.model_dump_json())

    async def put_rollouts(self, rollouts: list[Rollout]) -> None:
        if rollouts:
            await self.redis.hset(self._k("job", rollouts[0].job_id, "rollouts"), mapping={
                r.id: r.model_dump_json() for r in rollouts})

    async def get_rollout(self, job_id: str, rollout_id: str) -> Rollout | None:
        raw = await self.redis.hget(self._k("job", job_id, "rollouts"), rollout_id)
        return None if raw is None else Rollout.model_validate_json(raw)

    async def rollouts(self, job_id: str) -> list[Rollout]:
        raw = await self.redis.hgetall(self._k("job", job_id, "rollouts"))
        return sorted((Rollout.model_validate_json(v) for v in raw.values()),
                      key=lambda r: r.id)

    # ---- events ---------------------------------------------------------------------------------
    async def add_event(self, job_id: str, event: JobEvent) -> str:
        """Append ``event`` to the job's stream; its id (the SSE ``id``)."""
        eid = await self.redis.xadd(self._k("job", job_id, "events"),
                                    {"type": event.kind, "data": json.dumps(event_data(event))})
        return eid.decode()

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
    async def put_artifact(self, team: str, job_id: str, mime: str, data: bytes) -> str:
        aid = f"art_{secrets.token_hex(10)}"
        await self.redis.hset(self._k("artifact", aid), mapping={
            "team": team, "job": job_id, "mime": mime, "data": data})
        return aid

    async def get_artifact(self, team: str, artifact_id: str) -> tuple[str, bytes] | None:
        """(mime, bytes) of an artifact of ``team``; None for another team's (never a hint that
        it exists)."""
        got = await self.redis.hgetall(self._k("artifact", artifact_id))
        if not got or got.get(b"team", b"").decode() != team:
            return None
        return got[b"mime"].decode(), got[b"data"]

    async def add_usage(self, team: str, env_seconds: float) -> None:
        key = self._k("usage", team, day())
        await self.redis.incrbyfloat(key, env_seconds)
        await self.redis.expire(key, 3 * 86400)

    async def usage_today(self, team: str) -> float:
        raw = await self.redis.get(self._k("usage", team, day()))
        return float(raw or 0.0)

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
