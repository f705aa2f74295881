"""Retention of finished jobs against a real Redis, with seconds-long TTLs: a finished job's
keys expire after its team's results time, its report stays readable until then (without its
screenshots once those are swept), the sweep deletes blobs in bounded batches and keeps
entries whose blobs it could not delete, late writes never make a key without a TTL, usage
counters roll over with the day, and the per-team byte counts are exported
(``consolerl_jobs_storage_bytes``) and go back to nothing when everything is swept."""
from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client import generate_latest

from consolerl.tasks import TASKS_DIR, load_suite
from jobsapi.app import build_app
from jobsapi.auth import TokenBook
from jobsapi.blobs import BlobUnavailable, LocalBlobs
from jobsapi.retention import RetentionConfig, StorageSweeper, TeamRetention
from jobsapi.schema import (Job, JobCompletedEvent, JobStatusEvent, Rollout,
                            Sampling, Step)
from jobsapi.store import JobStore
from tests.conftest import run_async
from tests.integration.api_kit import serving

SUITE = {t.id: t for t in load_suite(TASKS_DIR)}
TASK = "ram-create-user-0"
PREFIX = "ret:api"
SHOT = b"\xff\xd8\xff\xe0" + b"J" * 45_000
SHORT = RetentionConfig(results_s=3.0, screenshots_s=1.0, sweep_every_s=0.2)


@pytest.fixture
def blob_dir(tmp_path) -> Path:
    return tmp_path / "blobs"


def make_store(redis_server, blob_dir, retention=SHORT, **kw) -> JobStore:
    return JobStore(redis_server.url, PREFIX, blobs=LocalBlobs(blob_dir), retention=retention,
                    **kw)


@pytest.fixture
def api(redis_server, blob_dir, tmp_path) -> Iterator[tuple[httpx.Client, dict[str, str]]]:
    redis_server.client().flushall()
    book = TokenBook(tmp_path / "tokens.json")
    tokens = {t: book.create(t, ["jobs:write", "jobs:read", "artifacts:read"])
              for t in ("docs", "eval")}
    app = build_app(make_store(redis_server, blob_dir), book, SUITE, scheduler_required=False)
    with serving(app) as url, httpx.Client(base_url=url, timeout=30) as http:
        yield http, tokens


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def make_job(store: JobStore, team: str = "docs") -> Job:
    job = Job(id=await store.new_job_id(), team=team, state="queued", created_at=time.time(),
              model="live", samples_per_task=1, sampling=Sampling(), priority=5,
              task_ids=[TASK])
    await store.create_job(job, {"tasks": [{"id": TASK}]})
    await store.add_event(job.id, JobStatusEvent(state="queued"))
    return job


async def run_job(store: JobStore, job_id: str, shots: int = 1) -> list[str | None]:
    """What the scheduler does to a job of one sample that passes: its artifacts, rollout,
    events and end."""
    job = await store.update_job(job_id, lambda j: j.model_copy(update={
        "state": "running", "started_at": time.time()}))
    assert job is not None
    aids = [await store.put_artifact(job.team, job_id, "image/jpeg", SHOT)
            for _ in range(shots)]
    await store.put_rollout(Rollout(
        id="r0000s000", job_id=job_id, task_id=TASK, sample=0, state="completed",
        verdict="success", reward=1.0, steps=[Step(index=i, action="noop()", screenshot=a)
                                             for i, a in enumerate(aids)]))
    done = await store.update_job(job_id, lambda j: j.model_copy(update={
        "state": "completed", "finished_at": time.time()}))
    await store.add_event(job_id, JobCompletedEvent(state="completed", episodes=done.episodes,
                                                    verdicts=done.verdicts))
    return aids


def on(store: JobStore, coro):
    """Run ``coro`` (which uses ``store``) on a loop of its own; the store's client, bound to
    that loop, is closed after it (the next call makes another)."""
    async def go():
        try:
            return await coro
        finally:
            await store.close()
    return run_async(go())


def _keys(job_id: str) -> list[str]:
    return [f"{PREFIX}:job:{job_id}{part}" for part in ("", ":spec", ":rollouts", ":events")]


def test_a_report_is_readable_until_its_results_expire(api, redis_server, blob_dir):
    http, tokens = api
    docs = _auth(tokens["docs"])
    r = http.post("/v1/jobs", headers=docs, json={"tasks": {"ids": [TASK]}})
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    store = make_store(redis_server, blob_dir)          # the scheduler's side
    sweeper = StorageSweeper(store, batch=10)
    [aid] = on(store, run_job(store, job_id))
    finished = time.time()
    assert aid is not None
    redis = redis_server.client()
    ttls = [redis.pttl(k) for k in _keys(job_id)]
    assert all(0 < t <= 3000 for t in ttls), ttls
    assert 3_600_000 < redis.pttl(f"{PREFIX}:job:{job_id}:artifacts") <= 3_603_000
    assert redis.zcard(f"{PREFIX}:expiry") == 2
    counts = on(store, store.storage_bytes())
    assert counts[("docs", "blobs")] == len(SHOT) and counts[("docs", "redis")] > 500

    # Before anything is due: the report embeds the screenshot, the artifact is served.
    assert on(sweeper.store, sweeper.tick()) == 0
    page = http.get(f"/v1/jobs/{job_id}/report.html", headers=docs)
    assert page.status_code == 200 and "data:image/jpeg;base64," in page.text
    assert http.get(f"/v1/artifacts/{aid}", headers=docs).content == SHOT
    assert http.get(f"/v1/artifacts/{aid}", headers=_auth(tokens["eval"])).status_code == 404
    metrics = generate_latest(sweeper.registry).decode()
    assert f'consolerl_jobs_storage_bytes{{kind="blobs",team="docs"}} {float(len(SHOT))}' \
        in metrics

    # The screenshots are due (1 s): swept; the report still renders, without them.
    assert on(sweeper.store, sweeper.tick(finished + 1.5)) == 1
    assert not list(blob_dir.rglob("art_*"))
    assert not redis.exists(f"{PREFIX}:job:{job_id}:artifacts")
    assert http.get(f"/v1/artifacts/{aid}", headers=docs).status_code == 404
    page = http.get(f"/v1/jobs/{job_id}/report.html", headers=docs)
    assert page.status_code == 200 and "no longer kept" in page.text
    assert "data:image" not in page.text
    report = http.get(f"/v1/jobs/{job_id}/report", headers=docs)
    assert report.status_code == 200 and report.json()["procedures"][0]["passes"] == 1
    assert ("docs", "blobs") not in on(store, store.storage_bytes())

    # The results are due (3 s): Redis expires them; the sweep drops the job from its list.
    time.sleep(max(0.0, finished + 3.2 - time.time()))
    assert not any(redis.exists(k) for k in _keys(job_id))
    for path in (f"/v1/jobs/{job_id}", f"/v1/jobs/{job_id}/report",
                 f"/v1/jobs/{job_id}/events?after=0"):
        assert http.get(path, headers=docs).status_code == 404, path
    assert http.get("/v1/jobs", headers=docs).json()["data"] == []
    assert on(sweeper.store, sweeper.tick(finished + 3.5)) == 1
    assert redis.zscore(f"{PREFIX}:team:docs:jobs", job_id) is None
    assert redis.zcard(f"{PREFIX}:expiry") == 0 and not redis.exists(f"{PREFIX}:storage")
    assert "consolerl_jobs_storage_bytes{" not in generate_latest(sweeper.registry).decode()
    assert [k for k in redis.keys(f"{PREFIX}:*") if job_id in k] == []


def test_late_writes_never_make_a_key_without_a_ttl(redis_server, blob_dir):
    redis_server.client().flushall()
    redis = redis_server.client()
    store = make_store(redis_server, blob_dir, RetentionConfig(results_s=2, screenshots_s=1))

    async def scenario():
        job = await make_job(store)
        await store.update_job(job.id, lambda j: j.model_copy(update={"state": "cancelled"}))
        # After the end: a rollout (its hash did not exist), an event, an artifact, counts.
        await store.put_rollout(Rollout(id="r0000s000", job_id=job.id, task_id=TASK,
                                        sample=0, state="cancelled"))
        event = await store.add_event(job.id, JobStatusEvent(state="cancelled"))
        shot = await store.put_artifact("docs", job.id, "image/jpeg", SHOT)
        await store.update_job(job.id, lambda j: j.model_copy(update={"error": "late"}))
        return job.id, event, shot
    job_id, event, shot = on(store, scenario())
    assert event is not None and shot is None             # a finished job takes no artifact
    assert not list(blob_dir.rglob("art_*"))
    assert all(0 < redis.pttl(k) <= 2000 for k in _keys(job_id))
    assert on(store, store.storage_bytes()).get(("docs", "blobs")) is None
    time.sleep(2.2)

    async def after():
        event = await store.add_event(job_id, JobStatusEvent(state="cancelled"))
        await store.put_rollout(Rollout(id="r0000s001", job_id=job_id, task_id=TASK,
                                        sample=1, state="cancelled"))
        return event, await store.update_job(job_id, lambda j: j)
    assert on(store, after()) == (None, None)
    assert not any(redis.exists(k) for k in _keys(job_id))


def test_per_team_retention_and_idempotency_keys(redis_server, blob_dir):
    redis = redis_server.client()
    redis.flushall()
    retention = RetentionConfig(results_s=10 * 86400, screenshots_s=500,
                                teams={"fast": TeamRetention(results_s=20)})
    store = make_store(redis_server, blob_dir, retention)

    async def scenario():
        ids = {}
        for team in ("docs", "fast"):
            job = Job(id=await store.new_job_id(), team=team, state="queued",
                      created_at=time.time(), model="live", samples_per_task=1,
                      sampling=Sampling(), priority=5, task_ids=[TASK])
            await store.create_job(job, {"tasks": [{"id": TASK}]}, ("nightly", "body-hash"))
            await store.update_job(job.id, lambda j: j.model_copy(update={"state": "failed"}))
            ids[team] = job.id
        return ids
    ids = on(store, scenario())
    assert 864_000_000 - 10_000 < redis.pttl(f"{PREFIX}:job:{ids['docs']}") <= 864_000_000
    assert 19_000 < redis.pttl(f"{PREFIX}:job:{ids['fast']}") <= 20_000
    due = dict(redis.zrange(f"{PREFIX}:expiry", 0, -1, withscores=True))
    fast = {m.split(":")[0]: score for m, score in due.items() if ":fast:" in m}
    assert fast["r"] - fast["b"] == 0                  # screenshots capped at the results' 20 s
    idem = {k.split(":")[3]: redis.pttl(k) for k in redis.keys(f"{PREFIX}:idem:*")}
    assert 7 * 86400_000 - 10_000 < idem["docs"] <= 7 * 86400_000   # 7 days at most
    assert 19_000 < idem["fast"] <= 20_000             # never outlives the job it names


def test_usage_counters_roll_over_with_the_day(redis_server, blob_dir):
    redis = redis_server.client()
    redis.flushall()
    day_end = 1_790_000_000 // 86400 * 86400 + 86400   # a UTC midnight
    clock = [day_end - 1.0]                          # one second before it
    store = make_store(redis_server, blob_dir, RetentionConfig(usage_keep_s=0.5),
                       clock=lambda: clock[0])
    on(store, store.add_usage("docs", 30.0))
    on(store, store.add_usage("docs", 12.5))
    [key] = redis.keys(f"{PREFIX}:usage:*")
    assert key.endswith(":docs:" + time.strftime("%Y%m%d", time.gmtime(day_end - 1)))
    assert 0 < redis.pttl(key) <= 1500                # the rest of the day plus 0.5 s
    assert on(store, store.usage_today("docs")) == 42.5
    clock[0] = day_end + 1.0                          # the next day: a fresh counter
    assert on(store, store.usage_today("docs")) == 0.0
    time.sleep(1.6)
    assert not redis.exists(key)


class _Down(LocalBlobs):
    def delete_prefix(self, folder: str) -> int:
        raise BlobUnavailable(f"OSS delete under oss://b/{folder}: HTTP 503 ServiceUnavailable")


def test_the_sweep_is_bounded_and_keeps_what_it_could_not_delete(redis_server, blob_dir):
    redis = redis_server.client()
    redis.flushall()
    store = make_store(redis_server, blob_dir, RetentionConfig(results_s=60, screenshots_s=1))

    async def three():
        return [(await make_job(store)).id for _ in range(3)]
    ids = on(store, three())
    for job_id in ids:
        on(store, run_job(store, job_id, shots=2))
    assert len(list(blob_dir.rglob("art_*"))) == 6
    later = time.time() + 2
    down = StorageSweeper(JobStore(redis_server.url, PREFIX, blobs=_Down(blob_dir),
                                   retention=store.retention), batch=2)
    with pytest.raises(BlobUnavailable):
        on(down.store, down.tick(later))
    assert redis.zcount(f"{PREFIX}:expiry", "-inf", later) == 3     # all still due
    assert on(store, store.storage_bytes())[("docs", "blobs")] == 6 * len(SHOT)
    sweeper = StorageSweeper(store, batch=2)
    assert on(sweeper.store, sweeper.tick(later)) == 2                       # at most a batch
    assert len(list(blob_dir.rglob("art_*"))) == 2
    assert on(sweeper.store, sweeper.tick(later)) == 1
    assert not list(blob_dir.rglob("art_*"))
    assert ("docs", "blobs") not in on(store, store.storage_bytes())
    assert redis.zcount(f"{PREFIX}:expiry", "-inf", "+inf") == 3     # the results, not yet due
