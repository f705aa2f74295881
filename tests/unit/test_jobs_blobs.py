"""The jobs API's blob store (jobsapi.blobs): keys are checked before any file is
touched (no way out of the root), a write is atomic (a reader sees the old bytes or the new,
never a part; a failed write leaves the old and no temp file), deletes by key and by folder;
the config refuses what cannot work, and the OSS store never shows or pickles its AccessKey.
The OSS store against the local cloud is tests/integration/test_jobs_blobs_oss.py."""
from __future__ import annotations

import os
import pickle
import threading

import pytest

from consolerl.errors import ConfigError
from jobsapi.blobs import (BlobConfig, BlobKeyError, BlobUnavailable, LocalBlobs,
                           OssBlobs, check_key, open_blobs)

BAD_KEYS = ["", "../x", "a/../../b", "/abs", "a//b", "a/./b", "a/", ".", "..", "a\\b",
            "a\x00b", "a b", "ü", "x" * 513, "a/.."]


@pytest.mark.parametrize("key", BAD_KEYS)
def test_a_bad_key_is_refused_before_the_filesystem(tmp_path, key):
    root = tmp_path / "root"
    blobs = LocalBlobs(root)
    for call in (lambda: blobs.put(key, b"x", "image/png"), lambda: blobs.get(key),
                 lambda: blobs.delete([key])):
        with pytest.raises(BlobKeyError, match="is not a blob key"):
            call()
    assert not root.exists()            # nothing made, nothing read outside
    assert not (tmp_path / "x").exists() and not (tmp_path / "abs").exists()


def test_folders_are_checked_too(tmp_path):
    blobs = LocalBlobs(tmp_path)
    for folder in ("..", "../", "", "/", "a/../"):
        with pytest.raises(BlobKeyError, match="is not a blob folder"):
            blobs.delete_prefix(folder)
    assert check_key("team/job", folder=True) == check_key("team/job/", folder=True) == \
        "team/job/"


def test_put_get_overwrite_and_missing(tmp_path):
    blobs = LocalBlobs(tmp_path)
    assert blobs.get("t/j/a") is None
    blobs.put("t/j/a", b"one", "image/jpeg")
    assert blobs.get("t/j/a") == b"one"
    blobs.put("t/j/a", b"two", "image/jpeg")
    assert blobs.get("t/j/a") == b"two"
    assert (tmp_path / "t" / "j" / "a").read_bytes() == b"two"
    assert [p.name for p in (tmp_path / "t" / "j").iterdir()] == ["a"]    # no temp files
    assert blobs.get("t/j") is None                 # a folder is not a blob


def test_a_failed_write_keeps_the_old_bytes_and_leaves_no_temp_file(tmp_path, monkeypatch):
    blobs = LocalBlobs(tmp_path)
    blobs.put("t/j/a", b"old", "image/png")

    def crash(src, dst):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(BlobUnavailable, match="No space left on device"):
        blobs.put("t/j/a", b"new" * 1000, "image/png")
    monkeypatch.undo()
    assert blobs.get("t/j/a") == b"old"
    assert [p.name for p in (tmp_path / "t" / "j").iterdir()] == ["a"]


def test_readers_never_see_half_a_blob(tmp_path):
    blobs = LocalBlobs(tmp_path)
    one, two = b"1" * 2_000_000, b"2" * 1_000_000
    blobs.put("t/j/a", one, "image/png")
    stop, seen = threading.Event(), []

    def read():
        while not stop.is_set():
            seen.append(blobs.get("t/j/a"))
    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(40):
            blobs.put("t/j/a", two if i % 2 else one, "image/png")
    finally:
        stop.set()
        reader.join()
    assert seen and all(s in (one, two) for s in seen)


def test_delete_by_keys_and_by_folder(tmp_path):
    blobs = LocalBlobs(tmp_path)
    for key in ("a/j1/x", "a/j1/y", "a/j2/x", "b/j1/x"):
        blobs.put(key, key.encode(), "image/png")
    assert blobs.delete(["a/j2/x", "a/j2/missing"]) == 2     # absent keys are fine
    assert blobs.get("a/j2/x") is None
    with pytest.raises(BlobKeyError):                          # checked before any goes
        blobs.delete(["a/j1/x", "../b/j1/x"])
    assert blobs.get("a/j1/x") == b"a/j1/x"
    assert blobs.delete_prefix("a/j1") == 2
    assert blobs.get("a/j1/x") is None and blobs.get("a/j1/y") is None
    assert blobs.get("b/j1/x") == b"b/j1/x"
    assert blobs.delete_prefix("a/j1/") == 0                   # again: nothing, no error


def test_local_store_pickles(tmp_path):
    blobs = pickle.loads(pickle.dumps(LocalBlobs(tmp_path)))
    blobs.put("t/j/a", b"x", "image/png")
    assert LocalBlobs(tmp_path).get("t/j/a") == b"x"


@pytest.mark.parametrize("fields, named", [
    ({"kind": "s3"}, "BlobConfig.kind"),
    ({"kind": "local", "dir": ""}, "BlobConfig.dir"),
    ({"kind": "oss", "bucket": "b-1"}, "BlobConfig.endpoint"),
    ({"kind": "oss", "endpoint": "127.0.0.1:18080", "bucket": "b-1"}, "BlobConfig.endpoint"),
    ({"kind": "oss", "endpoint": "http://127.0.0.1:1"}, "BlobConfig.bucket"),
    ({"kind": "oss", "endpoint": "http://127.0.0.1:1", "bucket": "Bad_Name"},
     "BlobConfig.bucket"),
    ({"kind": "oss", "endpoint": "http://127.0.0.1:1", "bucket": "b-1", "prefix": "../x"},
     "BlobConfig.prefix"),
    ({"timeout_s": 0}, "BlobConfig.timeout_s"),
])
def test_config_refuses_what_cannot_work(fields, named):
    with pytest.raises(ConfigError, match=named):
        BlobConfig(**fields)


def test_the_oss_access_key_comes_from_the_environment_only(monkeypatch):
    config = BlobConfig(kind="oss", endpoint="http://127.0.0.1:9", bucket="blobs-1",
                        access_key_id_env="T_OSS_ID", access_key_secret_env="T_OSS_SECRET")
    monkeypatch.delenv("T_OSS_ID", raising=False)
    monkeypatch.delenv("T_OSS_SECRET", raising=False)
    with pytest.raises(ConfigError, match="T_OSS_ID"):
        open_blobs(config)
    monkeypatch.setenv("T_OSS_ID", "LTAI-test-id")
    with pytest.raises(ConfigError, match="T_OSS_SECRET"):
        open_blobs(config)
    monkeypatch.setenv("T_OSS_SECRET", "s3cr3t-never-shown")
    blobs = open_blobs(config)
    assert isinstance(blobs, OssBlobs)
    assert "s3cr3t" not in repr(blobs)
    with pytest.raises(TypeError, match="does not pickle"):
        pickle.dumps(blobs)
    # Nothing listens on port 9: a BlobUnavailable naming the call, not the secret.
    blobs.timeout_s = 0.5
    with pytest.raises(BlobUnavailable) as err:
        blobs.get("t/j/a")
    assert "oss://blobs-1/t/j/a" in str(err.value) and "s3cr3t" not in str(err.value)
    assert "did not answer" in str(err.value)
