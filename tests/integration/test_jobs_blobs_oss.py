"""The OSS blob store (jobsapi.blobs.OssBlobs, through the official oss2 SDK)
against the real local cloud's OSS protocol: objects written, read, deleted by key and by
folder (more than one listing page), a bucket that holds objects refuses to go; a wrong
AccessKey, another account's bucket and a missing bucket are BlobUnavailable without the
secret; and the job store keeps an artifact's bytes there and only a reference in Redis."""
from __future__ import annotations

import uuid

import oss2
import pytest

from jobsapi.blobs import BlobConfig, BlobUnavailable, OssBlobs, open_blobs
from jobsapi.schema import Job, Sampling
from jobsapi.store import JobStore
from tests.conftest import run_async


@pytest.fixture
def bucket(cloud, accounts):
    account = accounts[-1]
    name = f"blobs-{uuid.uuid4().hex[:12]}"
    oss2.Bucket(oss2.Auth(account.access_key_id, account.access_key_secret), cloud.url,
                name).create_bucket()
    return account, name


def _blobs(cloud, account, name, prefix="", secret=None) -> OssBlobs:
    return OssBlobs(cloud.url, name, account.access_key_id,
                    secret or account.access_key_secret, prefix, timeout_s=5)


def test_put_get_delete(cloud, bucket):
    account, name = bucket
    blobs = _blobs(cloud, account, name, prefix="consolerl/")
    jpeg = b"\xff\xd8\xff" + bytes(range(256)) * 200
    blobs.put("docs/job_1/art_a-job_1", jpeg, "image/jpeg")
    assert blobs.get("docs/job_1/art_a-job_1") == jpeg
    assert blobs.get("docs/job_1/missing") is None
    raw = blobs.bucket.get_object("consolerl/docs/job_1/art_a-job_1")   # under the prefix
    assert raw.headers["Content-Type"] == "image/jpeg" and raw.read() == jpeg
    assert blobs.delete(["docs/job_1/art_a-job_1", "docs/job_1/missing"]) == 2
    assert blobs.get("docs/job_1/art_a-job_1") is None


def test_delete_a_folder_of_more_than_a_listing_page(cloud, bucket):
    account, name = bucket
    blobs = _blobs(cloud, account, name)
    for i in range(1003):
        blobs.put(f"t/job_a/{i:04d}", b"x", "image/jpeg")
    blobs.put("t/job_b/keep", b"y", "image/jpeg")
    blobs.put("t/job_a2/keep", b"z", "image/jpeg")     # same leading text, another folder
    with pytest.raises(oss2.exceptions.ServerError) as refused:
        blobs.bucket.delete_bucket()
    assert refused.value.code == "BucketNotEmpty"
    assert blobs.delete_prefix("t/job_a") == 1003
    assert [o.key for o in oss2.ObjectIterator(blobs.bucket)] == ["t/job_a2/keep",
                                                                  "t/job_b/keep"]
    blobs.delete(["t/job_b/keep", "t/job_a2/keep"])
    blobs.bucket.delete_bucket()


def test_refusals_are_unavailable_without_the_secret(cloud, bucket, accounts):
    account, name = bucket
    wrong = _blobs(cloud, account, name, secret="not-the-secret-xyz")
    with pytest.raises(BlobUnavailable) as err:
        wrong.put("t/j/a", b"x", "image/jpeg")
    assert "HTTP 403 SignatureDoesNotMatch" in str(err.value)
    assert "not-the-secret" not in str(err.value)
    assert account.access_key_secret not in str(err.value)
    other = _blobs(cloud, accounts[-2], name)            # the bucket is not theirs
    with pytest.raises(BlobUnavailable, match="HTTP 403 AccessDenied"):
        other.get("t/j/a")
    missing = _blobs(cloud, account, f"none-{uuid.uuid4().hex[:8]}")
    with pytest.raises(BlobUnavailable, match="HTTP 404 NoSuchBucket"):
        missing.put("t/j/a", b"x", "image/jpeg")


def test_the_job_store_keeps_only_a_reference_in_redis(cloud, bucket, redis_server,
                                                       monkeypatch):
    account, name = bucket
    monkeypatch.setenv("T_OSS_ID", account.access_key_id)
    monkeypatch.setenv("T_OSS_SECRET", account.access_key_secret)
    config = BlobConfig(kind="oss", endpoint=cloud.url, bucket=name, prefix="api",
                        access_key_id_env="T_OSS_ID", access_key_secret_env="T_OSS_SECRET")
    shot = b"\xff\xd8\xff" + b"j" * 40_000

    async def scenario():
        store = JobStore(redis_server.url, "oss:api", blobs=config)
        job = Job(id="job_oss1", team="docs", state="queued", created_at=0.0, model="live",
                  samples_per_task=1, sampling=Sampling(), priority=5, task_ids=["t"])
        await store.create_job(job, {"tasks": [{"id": "t"}]})
        aid = await store.put_artifact("docs", job.id, "image/jpeg", shot)
        got = await store.get_artifact("docs", aid)
        other = await store.get_artifact("ops", aid)
        refs = await store.redis.hgetall(f"oss:api:job:{job.id}:artifacts")
        await store.close()
        return aid, got, other, refs
    aid, got, other, refs = run_async(scenario())
    assert got == ("image/jpeg", shot)
    assert other is None                                 # another team's: not there
    assert set(refs) == {aid.encode(), b"#bytes"} and len(refs[aid.encode()]) < 200
    assert int(refs[b"#bytes"]) == len(shot)            # counted, not kept
    assert open_blobs(config).get(f"docs/job_oss1/{aid}") == shot
    assert _blobs(cloud, account, name).get(f"api/docs/job_oss1/{aid}") == shot
