"""Where the secrets check looks: the places of a run (:class:`Places`) and one scanner per
kind of place, each feeding a :class:`~tools.secrets.search.Check`: a file tree (the run
folder, Ray's logs), Redis, the local cloud's SQLite state (read from copies) and metrics
pages."""
from __future__ import annotations

import os
import shutil
import sqlite3
import stat
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import redis

from .search import CHUNK_BYTES, Check


@dataclass(frozen=True)
class Places:
    """Where the secrets come from and where to look, resolved from the arguments."""

    run_dir: Path
    accounts_file: Path
    tokens_file: Path | None = None
    secret_file: Path | None = None
    redis_url: str = ""
    redis_aof: Path | None = None
    state_dir: Path | None = None
    logs: tuple[Path, ...] = ()
    metrics_urls: tuple[str, ...] = ()


def scan_tree(check: Check, root: Path, place: str, chunk_bytes: int = CHUNK_BYTES) -> None:
    """Every regular file under ``root``; links are not followed and are counted, unreadable
    files are errors."""
    check.count(place, "files", 0)
    check.count(place, "bytes", 0)
    for folder, dirs, files in os.walk(root, onerror=lambda e: check.errors.append(
            f"{place}: cannot list {e.filename}: {e.strerror}")):
        dirs.sort()
        for name in [*sorted(files), *(d for d in dirs if os.path.islink(Path(folder, d)))]:
            path = Path(folder, name)
            try:
                mode = path.lstat().st_mode
            except OSError as exc:
                check.errors.append(f"{place}: {path}: {exc.strerror}")
                continue
            if stat.S_ISLNK(mode):
                check.count(place, "links not followed")
                continue
            if not stat.S_ISREG(mode):
                check.count(place, "special files skipped")
                continue
            check.search_value([str(path.relative_to(root)).encode()], place,
                               f"file name {path}")
            try:
                with open(path, "rb") as f:
                    search = check.search(place, str(path))
                    while chunk := f.read(chunk_bytes):
                        search.feed(chunk)
            except OSError as exc:
                check.errors.append(f"{place}: {path}: {exc.strerror}")
                continue
            check.count(place, "files")
            check.count(place, "bytes", search.size)


def _key(data: bytes) -> str:
    return data.decode("utf-8", "backslashreplace")


def scan_redis(check: Check, client: redis.Redis, page: int = 500) -> None:
    """Every key (SCAN) and every value of strings, hashes, lists, sets, zsets and streams,
    paged so memory stays bounded."""
    place = "redis"
    for what in ("keys", "values", "bytes"):
        check.count(place, what, 0)
    for key in client.scan_iter(count=page):
        k = _key(key)
        check.count(place, "keys")
        check.search_value([key], place, f"key name {k}")
        kind = _key(client.type(key))
        values: Iterator[tuple[str, bytes]]
        if kind == "string":
            values = _string_pieces(client, key, k)
        elif kind == "hash":
            values = (pair for f, v in client.hscan_iter(key, count=page)
                      for pair in ((f"hash {k} field name", f),
                                   (f"hash {k} field {_key(f)}", v)))
        elif kind == "list":
            values = ((f"list {k} index {i + j}", v) for i in range(0, client.llen(key), page)
                      for j, v in enumerate(client.lrange(key, i, i + page - 1)))
        elif kind == "set":
            values = ((f"set {k} member", v) for v in client.sscan_iter(key, count=page))
        elif kind == "zset":
            values = ((f"zset {k} member", v) for v, _ in client.zscan_iter(key, count=page))
        elif kind == "stream":
            values = _stream_values(client, key, k, page)
        else:
            check.notes.append(f"redis: key {k} has type {kind}, which is not searched")
            continue
        for location, value in values:
            check.count(place, "values")
            check.count(place, "bytes", check.search_value(
                value if isinstance(value, Iterator) else [value], place, location))


def _string_pieces(client: redis.Redis, key: bytes, k: str) -> Iterator[tuple[str, object]]:
    size = client.strlen(key)
    if size <= CHUNK_BYTES:
        yield f"string {k}", client.get(key) or b""
    else:
        yield f"string {k}", (client.getrange(key, i, i + CHUNK_BYTES - 1)
                              for i in range(0, size, CHUNK_BYTES))


def _stream_values(client: redis.Redis, key: bytes, k: str,
                   page: int) -> Iterator[tuple[str, bytes]]:
    low = b"-"
    while batch := client.xrange(key, low, b"+", count=page):
        for entry_id, fields in batch:
            for f, v in fields.items():
                yield f"stream {k} entry {_key(entry_id)} field name", f
                yield f"stream {k} entry {_key(entry_id)} field {_key(f)}", v
        low = b"(" + batch[-1][0]


def sqlite_copies(state_dir: Path, into: Path) -> list[tuple[str, Path]]:
    """(name, copy) of every ``*.db`` under ``state_dir``, with its ``-wal`` and ``-shm``, so
    that reading never checkpoints or changes the originals."""
    copies = []
    for i, db in enumerate(sorted(state_dir.rglob("*.db"))):
        target = into / f"{i}-{db.name}"
        for suffix in ("", "-wal", "-shm"):
            source = Path(str(db) + suffix)
            if source.exists():
                shutil.copyfile(source, str(target) + suffix)
        copies.append((str(db), target))
    return copies


def session_hashes(copies: list[tuple[str, Path]]) -> dict[str, str]:
    """sha256 of console session token -> who, from the cloud's ``console_sessions``."""
    known: dict[str, str] = {}
    for _, copy in copies:
        db = sqlite3.connect(copy)
        try:
            for token_hash, account in db.execute(
                    "SELECT token_hash, account_id FROM console_sessions"):
                known[token_hash] = f"console session of account {account}"
        except sqlite3.Error:
            pass                # not the cloud's database, or a cloud without the console
        finally:
            db.close()
    return known


def scan_sqlite(check: Check, copies: list[tuple[str, Path]]) -> None:
    place = "sqlite"
    for what in ("databases", "tables", "rows", "cells", "bytes"):
        check.count(place, what, 0)
    for name, copy in copies:
        db = sqlite3.connect(copy)
        db.text_factory = bytes
        try:
            tables = [_key(t) for (t,) in db.execute(
                "SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")]
            check.count(place, "databases")
            for table in tables:
                _scan_table(check, db, name, table)
        except sqlite3.Error as exc:
            check.errors.append(f"sqlite: {name}: {exc}")
        finally:
            db.close()


def _scan_table(check: Check, db: sqlite3.Connection, name: str, table: str) -> None:
    place = "sqlite"
    quoted = '"' + table.replace('"', '""') + '"'
    info = list(db.execute(f"PRAGMA table_info({quoted})"))
    columns = [_key(c[1]) if isinstance(c[1], bytes) else c[1] for c in info]
    keys = [i for i, c in enumerate(info) if c[5]]      # primary key columns
    try:
        rows = db.execute(f"SELECT rowid, * FROM {quoted}")
        has_rowid = True
    except sqlite3.OperationalError:                    # a WITHOUT ROWID table
        rows = db.execute(f"SELECT NULL, * FROM {quoted}")
        has_rowid = False
    check.count(place, "tables")
    for row in rows:
        check.count(place, "rows")
        if has_rowid:
            where = f"rowid {row[0]}"
        else:
            key = ", ".join(_key(v) if isinstance(v, bytes) else str(v)
                            for v in (row[1 + i] for i in keys))
            where = f"key ({key[:80]})"
        for column, value in zip(columns, row[1:]):
            if value is None:
                continue
            data = value if isinstance(value, bytes) else str(value).encode()
            check.count(place, "cells")
            check.count(place, "bytes", check.search_value(
                [data], place, f"{name}: {table}.{column} {where}"))


def scan_url(check: Check, url: str) -> None:
    place = "metrics"
    check.count(place, "urls", 0)
    check.count(place, "bytes", 0)
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            search = check.search(place, url)
            while chunk := response.read(1 << 20):
                search.feed(chunk)
    except (OSError, ValueError) as exc:
        check.errors.append(f"--metrics-url {url}: cannot read: {exc}")
        return
    check.count(place, "urls")
    check.count(place, "bytes", search.size)


