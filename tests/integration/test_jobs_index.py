"""The jobs store's per-team indexes (live and queued jobs) against a real Redis: concurrent
submissions never pass the queued-jobs quota together and leave the index equal to the jobs'
states; the index follows every state change (scheduler and cancel) under concurrency; a
submission refused by the quota does not keep its Idempotency-Key; a submission's Redis
commands do not grow with other teams' active jobs; and a Redis without the indexes (or with
stale entries, or finished jobs from before retention) is rebuilt on first use."""
from __future__ import annotations

import asyncio
import concurrent.futures
import json
import time
from collections.abc import Iterator

import httpx
import pytest

from consolerl.tasks import TASKS_DIR, load_suite
from jobsapi.app import build_app
from jobsapi.auth import TeamQuota, TokenBook
from jobsapi.schema import Job, Sampling
from jobsapi.store import JobStore, QueueFull
from tests.conftest import run_async
from tests.integration.api_kit import serving

SUITE = {t.id: t for t in load_suite(TASKS_DIR)}
TASK = "ram-create-user-0"
PREFIX = "idx:api"
BODY = {"tasks": {"ids": [TASK]}, "samples_per_task": 1}


def _job(job_id: str, team: str, state: str = "queued") -> Job:
    return Job(id=job_id, team=team, state=state, created_at=time.time(), model="live",
               samples_per_task=1, sampling=Sampling(), priority=5, task_ids=[TASK])


def truth(redis, team: str) -> tuple[set[str], set[str]]:
    """The team's live and queued jobs, read from the jobs themselves."""
    live, queued = set(), set()
    for job_id in redis.zrange(f"{PREFIX}:team:{team}:jobs", 0, -1):
        raw = redis.get(f"{PREFIX}:job:{job_id}")
        state = json.loads(raw)["state"] if raw else None
        if state in ("queued", "running"):
            live.add(job_id)
        if state == "queued":
            queued.add(job_id)
    return live, queued


def index(redis, team: str) -> tuple[set[str], set[str]]:
    return (redis.smembers(f"{PREFIX}:team:{team}:active"),
            redis.smembers(f"{PREFIX}:team:{team}:queued"))


@pytest.fixture
def api(redis_server, tmp_path) -> Iterator[tuple[httpx.Client, dict[str, str]]]:
    redis_server.client().flushall()
    book = TokenBook(tmp_path / "tokens.json")
    scopes = ["jobs:write", "jobs:read", "jobs:cancel"]
    tokens = {"docs": book.create("docs", scopes, TeamQuota(queued_jobs=5)),
              "eval": book.create("eval", scopes, TeamQuota(queued_jobs=100))}
    app = build_app(JobStore(redis_server.url, PREFIX), book, SUITE, scheduler_required=False)
    with serving(app) as url, httpx.Client(base_url=url, timeout=60) as http:
        yield http, tokens


def _auth(token: str, **more: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", **more}


def test_concurrent_submissions_never_pass_the_quota_together(api, redis_server):
    http, tokens = api
    redis = redis_server.client()

    def submit(i: int) -> int:
        with httpx.Client(base_url=str(http.base_url), timeout=60) as own:
            return own.post("/v1/jobs", json=BODY, headers=_auth(tokens["docs"])).status_code
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        codes = list(pool.map(submit, range(30)))
    assert sorted(codes) == [202] * 5 + [429] * 25, codes
    assert index(redis, "docs") == truth(redis, "docs")
    assert len(truth(redis, "docs")[1]) == 5
    quota = http.get("/v1/quota", headers=_auth(tokens["docs"])).json()
    assert quota["used"]["queued_jobs"] == 5
    # Another team's queue is its own.
    assert http.post("/v1/jobs", json=BODY, headers=_auth(tokens["eval"])).status_code == 202
    # A cancelled job frees its place in the queue.
    job_id = sorted(truth(redis, "docs")[1])[0]
    assert http.post(f"/v1/jobs/{job_id}/cancel",
                     headers=_auth(tokens["docs"])).json()["state"] == "cancelled"
    assert index(redis, "docs") == truth(redis, "docs") and len(truth(redis, "docs")[1]) == 4
    assert http.post("/v1/jobs", json=BODY, headers=_auth(tokens["docs"])).status_code == 202


def test_a_refused_submission_keeps_no_idempotency_key(api, redis_server):
    http, tokens = api
    docs = tokens["docs"]
    first = [http.post("/v1/jobs", json=BODY, headers=_auth(docs, **{
        "Idempotency-Key": f"k{i}"})).json()["id"] for i in range(5)]
    # The queue is full: a known key still returns its job; a new one is refused and not kept.
    again = http.post("/v1/jobs", json=BODY, headers=_auth(docs, **{"Idempotency-Key": "k0"}))
    assert again.status_code == 202 and again.json()["id"] == first[0]
    refused = http.post("/v1/jobs", json=BODY, headers=_auth(docs, **{"Idempotency-Key": "k9"}))
    assert refused.status_code == 429 and refused.headers["retry-after"] == "30"
    assert "5 queued jobs" in refused.json()["detail"]
    http.post(f"/v1/jobs/{first[1]}/cancel", headers=_auth(docs))
    later = http.post("/v1/jobs", json=BODY, headers=_auth(docs, **{"Idempotency-Key": "k9"}))
    assert later.status_code == 202 and later.json()["id"] not in first


def test_the_index_follows_state_changes_under_concurrency(redis_server):
    redis = redis_server.client()
    redis.flushall()
    store = JobStore(redis_server.url, PREFIX)

    async def scenario():
        async def create(i: int):
            try:
                await store.create_job(_job(f"job_c{i:03d}", "docs"), {}, max_queued=40)
            except QueueFull:
                pass

        async def move(job_id: str, to: str):
            await store.update_job(job_id, lambda j: j.model_copy(update={"state": to}))
        await asyncio.gather(*(create(i) for i in range(60)))
        created = sorted(m.decode() for m in await store.redis.smembers(
            f"{PREFIX}:team:docs:queued"))
        # Meanwhile: more submissions, the scheduler starting jobs, cancels.
        await asyncio.gather(*(create(i) for i in range(60, 90)),
                             *(move(j, "running") for j in created[:30]),
                             *(move(j, "cancelled") for j in created[30:40]))
        await asyncio.gather(*(move(j, "completed") for j in created[:15]))
        await store.close()
        return created
    created = run_async(scenario())
    assert len(created) == 40                                # 60 raced for 40 places
    assert index(redis, "docs") == truth(redis, "docs")
    live, queued = truth(redis, "docs")
    assert set(created[15:30]) <= live - queued               # running
    assert not (set(created[:15]) | set(created[30:40])) & live     # finished
    assert len(queued) <= 40                 # the new ones: as many as found a place
    assert not redis.sismember(f"{PREFIX}:active", created[0])


def test_submission_cost_does_not_grow_with_other_teams_jobs(api, redis_server):
    http, tokens = api
    redis = redis_server.client()

    def commands_of_one_submission() -> int:
        redis.config_resetstat()
        assert http.post("/v1/jobs", json=BODY, headers=_auth(tokens["eval"])).status_code == 202
        stats = redis.info("commandstats")
        return sum(v["calls"] for k, v in stats.items()
                   if k not in ("cmdstat_config", "cmdstat_info"))
    http.post("/v1/jobs", json=BODY, headers=_auth(tokens["eval"]))       # warm (layout read)
    alone = commands_of_one_submission()
    store = JobStore(redis_server.url, PREFIX)

    async def others():
        for i in range(400):
            await store.create_job(_job(f"job_o{i:03d}", f"other{i % 20}"), {})
        await store.close()
    run_async(others())
    assert commands_of_one_submission() == alone, "a submission reads other teams' jobs"
    quota = http.get("/v1/quota", headers=_auth(tokens["eval"])).json()
    assert quota["used"]["queued_jobs"] == 3


def test_a_missing_index_is_rebuilt_and_old_jobs_get_retention(redis_server):
    redis = redis_server.client()
    redis.flushall()
    store = JobStore(redis_server.url, PREFIX)

    async def before():
        for i in range(6):
            await store.create_job(_job(f"job_r{i}", "docs"), {})
        await store.update_job("job_r0", lambda j: j.model_copy(update={"state": "running"}))
        await store.close()
    run_async(before())
    # A Redis from before the indexes: no layout key, no team index; a finished job without a
    # TTL; a stale member; an old inline artifact.
    for key in redis.keys(f"{PREFIX}:team:*:active") + redis.keys(f"{PREFIX}:team:*:queued"):
        redis.delete(key)
    redis.delete(f"{PREFIX}:layout")
    old = _job("job_old", "docs", "completed").model_copy(update={
        "finished_at": time.time() - 3600})
    redis.set(f"{PREFIX}:job:job_old", old.model_dump_json())
    redis.zadd(f"{PREFIX}:team:docs:jobs", {"job_old": 0, "job_gone": 1})
    redis.sadd(f"{PREFIX}:team:docs:queued", "job_gone")
    redis.hset(f"{PREFIX}:artifact:art_0123", mapping={"team": "docs", "mime": "image/png",
                                                      "data": b"png"})
    fresh = JobStore(redis_server.url, PREFIX)
    assert run_async(fresh.queued_count("docs")) == 5
    assert index(redis, "docs") == truth(redis, "docs")
    assert redis.get(f"{PREFIX}:layout") == "2"
    # Retention from when it finished: 30 days less the hour since.
    assert 30 * 86400_000 - 3_700_000 < redis.pttl(f"{PREFIX}:job:job_old") < 30 * 86400_000 - 3_500_000
    assert redis.zscore(f"{PREFIX}:team:docs:jobs", "job_gone") is None
    assert 0 < redis.pttl(f"{PREFIX}:artifact:art_0123") <= 7 * 86400_000
    assert {m.split(":")[0] for m in redis.zrange(f"{PREFIX}:expiry", 0, -1)} == {"b", "r"}
    # Again (another process, the key present): nothing changes, nothing counted twice.
    storage = redis.hgetall(f"{PREFIX}:storage")
    redis.delete(f"{PREFIX}:layout")
    run_async(JobStore(redis_server.url, PREFIX).ensure_layout())
    assert redis.hgetall(f"{PREFIX}:storage") == storage
    assert index(redis, "docs") == truth(redis, "docs")
