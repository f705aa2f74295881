"""Where the jobs API keeps artifacts' bytes (screenshots): a blob store behind one small
interface, so Redis keeps references only.

    put(key, data, mime)   write (atomically: a reader sees the old bytes, the new, or none)
    get(key)               the bytes, or None when there are none
    delete(keys)           remove these keys (absent ones are fine); how many were asked for
    delete_prefix(folder)  remove every key under ``folder/``; how many went

Two kinds (:class:`BlobConfig`): ``local``, a directory (one machine, or a filesystem every
node mounts; a temp file renamed into place), the default; ``oss``, an Alibaba Cloud OSS bucket
through the official ``oss2`` SDK (the local cloud serves the same protocol). Its AccessKey
comes from environment variables named in the config, never from the config file, and never
appears in a message.

A key is ``/``-separated parts of ``A-Z a-z 0-9 . _ -`` (no empty part, no ``.`` or ``..``, at
most 512 characters): :class:`BlobKeyError` otherwise, before any filesystem or network call.
A backend that cannot be reached raises :class:`BlobUnavailable` (the API answers 503).
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Protocol

import oss2

from consolerl.config import AtLeast, Checked, OneOf
from consolerl.errors import ConfigError, ConsoleRLError

KEY_MAX_CHARS = 512
_PART = re.compile(r"[A-Za-z0-9._-]+")
KINDS = ("local", "oss")


class BlobKeyError(ConsoleRLError, ValueError):
    """A key (or folder) the blob store refuses: it names what is allowed."""


class BlobUnavailable(ConsoleRLError, ConnectionError):
    """The blob store could not be reached or refused the call (network, server error,
    credentials); the message names the operation and the key, never a secret."""


def check_key(key: str, folder: bool = False) -> str:
    """``key`` when it is a valid key (``folder``: a folder, written with or without a
    trailing ``/``, returned with one); :class:`BlobKeyError` otherwise."""
    text = key[:-1] if folder and key.endswith("/") else key
    parts = text.split("/") if isinstance(text, str) else []
    if not (0 < len(text) <= KEY_MAX_CHARS) or not all(
            _PART.fullmatch(p) and p not in (".", "..") for p in parts):
        shown = repr(key[:60]) if isinstance(key, str) else repr(key)
        raise BlobKeyError(f"{shown} is not a blob {'folder' if folder else 'key'}: "
                           f"'/'-separated parts of A-Z a-z 0-9 . _ - (no empty, '.' or '..' "
                           f"part), at most {KEY_MAX_CHARS} characters")
    return text + "/" if folder else text


class BlobStore(Protocol):
    def put(self, key: str, data: bytes, mime: str) -> None: ...

    def get(self, key: str) -> bytes | None: ...

    def delete(self, keys: Iterable[str]) -> int: ...

    def delete_prefix(self, folder: str) -> int: ...


@dataclass(frozen=True)
class BlobConfig(Checked):
    """``api.blobs``. ``kind``: ``local`` (``dir``, made on first write) or ``oss``
    (``endpoint`` with its scheme, e.g. ``https://oss-cn-hangzhou.aliyuncs.com`` or the local
    cloud's ``http://127.0.0.1:18080``; ``bucket``, which must exist; ``prefix``, a folder in
    it, "" for the bucket's root). The AccessKey pair is read from the environment variables
    named by ``access_key_id_env`` / ``access_key_secret_env`` where the store is opened."""

    kind: Annotated[str, OneOf(KINDS)] = "local"
    dir: str = "var/api/blobs"
    endpoint: str = ""
    bucket: str = ""
    prefix: str = ""
    access_key_id_env: str = "CONSOLERL_OSS_ACCESS_KEY_ID"
    access_key_secret_env: str = "CONSOLERL_OSS_ACCESS_KEY_SECRET"
    timeout_s: Annotated[float, AtLeast(0, open=True)] = 10.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.kind == "local" and not self.dir:
            raise ConfigError("BlobConfig.dir: a directory is needed with kind local")
        if self.kind == "oss":
            if not re.fullmatch(r"https?://[^/\s]+/?", self.endpoint):
                raise ConfigError(f"BlobConfig.endpoint: an http(s)://host[:port] URL is "
                                  f"needed with kind oss, got {self.endpoint!r}")
            if not re.fullmatch(r"[a-z0-9][a-z0-9-]{1,61}[a-z0-9]", self.bucket):
                raise ConfigError(f"BlobConfig.bucket: an OSS bucket name (3-63 of a-z 0-9 "
                                  f"-) is needed with kind oss, got {self.bucket!r}")
            if self.prefix:
                try:
                    check_key(self.prefix, folder=True)
                except BlobKeyError as exc:
                    raise ConfigError(f"BlobConfig.prefix: {exc}") from None


def open_blobs(config: BlobConfig) -> BlobStore:
    """The store ``config`` describes (OSS: ConfigError naming the variable when a key is not
    set; nothing is contacted before the first call)."""
    if config.kind == "local":
        return LocalBlobs(Path(config.dir))
    creds = []
    for name in (config.access_key_id_env, config.access_key_secret_env):
        value = os.environ.get(name, "")
        if not value:
            raise ConfigError(f"api.blobs: the environment variable {name} (the OSS AccessKey) "
                              "is not set")
        creds.append(value)
    return OssBlobs(config.endpoint, config.bucket, creds[0], creds[1], config.prefix,
                    config.timeout_s)


class LocalBlobs:
    """Blobs as files under ``root`` (``key`` is its path below it). A write goes to a temp
    file in the same folder, then is renamed over the key: readers never see half a blob.
    Not fsynced: an artifact lost to a power cut is a missing screenshot, not a wrong one."""

    def __init__(self, root: Path | str):
        self.root = Path(root).resolve()

    def __repr__(self) -> str:
        return f"LocalBlobs({str(self.root)!r})"

    def _path(self, key: str, folder: bool = False) -> Path:
        return self.root.joinpath(*check_key(key, folder).rstrip("/").split("/"))

    def put(self, key: str, data: bytes, mime: str) -> None:
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                os.replace(tmp, path)
            except BaseException:
                os.unlink(tmp)
                raise
        except OSError as exc:
            raise BlobUnavailable(f"writing blob {key!r}: {exc.strerror or exc}") from None

    def get(self, key: str) -> bytes | None:
        try:
            return self._path(key).read_bytes()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None
        except OSError as exc:
            raise BlobUnavailable(f"reading blob {key!r}: {exc.strerror or exc}") from None

    def delete(self, keys: Iterable[str]) -> int:
        paths = [self._path(k) for k in keys]          # every key checked before any goes
        for path in paths:
            try:
                path.unlink()
            except (FileNotFoundError, IsADirectoryError):
                pass
        return len(paths)

    def delete_prefix(self, folder: str) -> int:
        path = self._path(folder, folder=True)
        if not path.is_dir():
            return 0
        count = sum(1 for p in path.rglob("*") if p.is_file())
        shutil.rmtree(path, ignore_errors=True)
        return count


class OssBlobs:
    """Blobs as objects of an OSS bucket (``prefix`` + key), through ``oss2``. The client is
    made on first use in the process that uses it (the store pickles without it, and without
    the AccessKey: a process that unpickles one opens it again from its own environment)."""

    def __init__(self, endpoint: str, bucket: str, access_key_id: str, access_key_secret: str,
                 prefix: str = "", timeout_s: float = 10.0):
        self.endpoint, self.bucket_name = endpoint.rstrip("/"), bucket
        self.prefix = check_key(prefix, folder=True) if prefix else ""
        self.timeout_s = timeout_s
        self._auth = oss2.Auth(access_key_id, access_key_secret)
        self._bucket: Any = None

    def __repr__(self) -> str:          # never the AccessKey
        return f"OssBlobs({self.endpoint!r}, {self.bucket_name!r}, prefix={self.prefix!r})"

    def __reduce__(self):
        raise TypeError("OssBlobs does not pickle (it holds an AccessKey): pass its "
                        "BlobConfig and open_blobs() where it is used")

    @property
    def bucket(self) -> Any:
        if self._bucket is None:
            self._bucket = oss2.Bucket(self._auth, self.endpoint, self.bucket_name,
                                       connect_timeout=self.timeout_s, app_name="console-rl-jobs")
        return self._bucket

    def _fail(self, what: str, key: str, exc: Exception) -> BlobUnavailable:
        detail = f"HTTP {exc.status} {exc.code or ''}".strip() \
            if isinstance(exc, oss2.exceptions.OssError) else type(exc).__name__
        if isinstance(exc, oss2.exceptions.RequestError):
            detail = "the endpoint did not answer (connection or timeout)"
        elif isinstance(exc, oss2.exceptions.OssError) and exc.status < 0:
            detail = type(exc).__name__             # oss2's own checks (CRC, format)
        return BlobUnavailable(f"OSS {what} oss://{self.bucket_name}/{self.prefix}{key}: "
                               f"{detail}")

    def put(self, key: str, data: bytes, mime: str) -> None:
        name = self.prefix + check_key(key)
        try:
            self.bucket.put_object(name, data, headers={"Content-Type": mime})
        except oss2.exceptions.OssError as exc:
            raise self._fail("put", key, exc) from None

    def get(self, key: str) -> bytes | None:
        name = self.prefix + check_key(key)
        try:
            return self.bucket.get_object(name).read()
        except oss2.exceptions.NoSuchKey:
            return None
        except oss2.exceptions.OssError as exc:
            raise self._fail("get", key, exc) from None

    def delete(self, keys: Iterable[str]) -> int:
        checked = [check_key(k) for k in keys]
        for i in range(0, len(checked), 1000):       # OSS deletes at most 1000 a request
            try:
                self.bucket.batch_delete_objects([self.prefix + k for k in checked[i:i + 1000]])
            except oss2.exceptions.OssError as exc:
                raise self._fail("delete", checked[i], exc) from None
        return len(checked)

    def delete_prefix(self, folder: str) -> int:
        under = self.prefix + check_key(folder, folder=True)
        count = 0
        try:
            while True:
                # Listing from the start each time: what was deleted is gone from the list.
                page = self.bucket.list_objects(prefix=under, max_keys=1000)
                names = [o.key for o in page.object_list]
                if names:
                    self.bucket.batch_delete_objects(names)
                    count += len(names)
                if not page.is_truncated:
                    return count
        except oss2.exceptions.OssError as exc:
            raise self._fail("delete under", folder, exc) from None
