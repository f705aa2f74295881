"""SQLite persistence of the local cloud: resources, audit events, used nonces, OSS objects.

One connection, used from the server's event-loop thread only; WAL with synchronous=NORMAL
survives a process crash (a power loss may drop the last commits, which is fine for an emulator).
Every API call runs in one transaction (:meth:`Store.tx`): its resource changes and its audit
event land together or not at all.
"""
from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS resources (
    account_id TEXT NOT NULL,
    rtype      TEXT NOT NULL,
    rid        TEXT NOT NULL,
    region     TEXT NOT NULL,
    name       TEXT NOT NULL DEFAULT '',
    parent_id  TEXT NOT NULL DEFAULT '',
    created_ms INTEGER NOT NULL,
    data       TEXT NOT NULL,
    PRIMARY KEY (account_id, rtype, rid)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS res_parent ON resources (account_id, rtype, parent_id);
CREATE INDEX IF NOT EXISTS res_name ON resources (rtype, name);
CREATE INDEX IF NOT EXISTS res_list ON resources (account_id, rtype, region, created_ms);

CREATE TABLE IF NOT EXISTS events (
    seq           INTEGER PRIMARY KEY AUTOINCREMENT,
    account_id    TEXT NOT NULL,
    event_ms      INTEGER NOT NULL,
    event_id      TEXT NOT NULL,
    event_name    TEXT NOT NULL,
    service_name  TEXT NOT NULL,
    user_name     TEXT NOT NULL,
    event_rw      TEXT NOT NULL,
    access_key_id TEXT NOT NULL,
    body          TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS ev_time ON events (account_id, event_ms, seq);
CREATE INDEX IF NOT EXISTS ev_name ON events (account_id, event_name, event_ms);
CREATE INDEX IF NOT EXISTS ev_service ON events (account_id, service_name, event_ms);
CREATE INDEX IF NOT EXISTS ev_id ON events (account_id, event_id);
CREATE INDEX IF NOT EXISTS ev_ak ON events (account_id, access_key_id, event_ms);

CREATE TABLE IF NOT EXISTS event_resources (
    seq        INTEGER NOT NULL,
    account_id TEXT NOT NULL,
    rtype      TEXT NOT NULL,
    rname      TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS evr_name ON event_resources (account_id, rname, seq);
CREATE INDEX IF NOT EXISTS evr_type ON event_resources (account_id, rtype, seq);

CREATE TABLE IF NOT EXISTS nonces (
    nonce TEXT PRIMARY KEY,
    ts_ms INTEGER NOT NULL
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS objects (
    bucket       TEXT NOT NULL,
    key          TEXT NOT NULL,
    data         BLOB NOT NULL,
    content_type TEXT NOT NULL,
    etag         TEXT NOT NULL,
    modified_ms  INTEGER NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS obj_key ON objects (bucket, key);
"""


class Store:
    def __init__(self, state_dir: Path | str):
        self.path = Path(state_dir) / "cloud.db"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("PRAGMA foreign_keys=OFF")
        self.db.executescript(SCHEMA)
        self._depth = 0

    def close(self) -> None:
        self.db.close()

    @contextmanager
    def tx(self) -> Iterator[None]:
        """A transaction; nested use joins the outer one."""
        if self._depth:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        self.db.execute("BEGIN IMMEDIATE")
        self._depth = 1
        try:
            yield
        except BaseException:
            self._depth = 0
            self.db.execute("ROLLBACK")
            raise
        self._depth = 0
        self.db.execute("COMMIT")

    # ---- resources -------------------------------------------------------------------------
    def put(self, account_id: str, rtype: str, rid: str, region: str, data: dict[str, Any], *,
            name: str = "", parent_id: str = "", created_ms: int = 0) -> None:
        self.db.execute(
            "INSERT INTO resources (account_id, rtype, rid, region, name, parent_id, created_ms, data)"
            " VALUES (?,?,?,?,?,?,?,?) ON CONFLICT (account_id, rtype, rid) DO UPDATE SET"
            " region=excluded.region, name=excluded.name, parent_id=excluded.parent_id,"
            " data=excluded.data",
            (account_id, rtype, rid, region, name, parent_id, created_ms, json.dumps(data)))

    def get(self, account_id: str, rtype: str, rid: str) -> dict[str, Any] | None:
        row = self.db.execute(
            "SELECT data FROM resources WHERE account_id=? AND rtype=? AND rid=?",
            (account_id, rtype, rid)).fetchone()
        return json.loads(row[0]) if row else None

    def delete(self, account_id: str, rtype: str, rid: str) -> bool:
        cur = self.db.execute("DELETE FROM resources WHERE account_id=? AND rtype=? AND rid=?",
                              (account_id, rtype, rid))
        return cur.rowcount > 0

    def list(self, account_id: str, rtype: str, *, region: str | None = None,
             parent_id: str | None = None, name: str | None = None) -> list[dict[str, Any]]:
        sql = "SELECT data FROM resources WHERE account_id=? AND rtype=?"
        args: list[Any] = [account_id, rtype]
        if region is not None:
            sql += " AND region=?"
            args.append(region)
        if parent_id is not None:
            sql += " AND parent_id=?"
            args.append(parent_id)
        if name is not None:
            sql += " AND name=?"
            args.append(name)
        sql += " ORDER BY created_ms DESC, rid"
        return [json.loads(r[0]) for r in self.db.execute(sql, args)]

    def count(self, account_id: str, rtype: str, *, parent_id: str | None = None) -> int:
        sql = "SELECT COUNT(*) FROM resources WHERE account_id=? AND rtype=?"
        args: list[Any] = [account_id, rtype]
        if parent_id is not None:
            sql += " AND parent_id=?"
            args.append(parent_id)
        return self.db.execute(sql, args).fetchone()[0]

    def owner_of_name(self, rtype: str, name: str) -> str | None:
        """The account that holds a resource of this type and name (for global names: OSS)."""
        row = self.db.execute("SELECT account_id FROM resources WHERE rtype=? AND name=? LIMIT 1",
                              (rtype, name)).fetchone()
        return row[0] if row else None

    # ---- nonces ----------------------------------------------------------------------------
    def add_nonce(self, nonce: str, ts_ms: int) -> None:
        self.db.execute("INSERT OR IGNORE INTO nonces (nonce, ts_ms) VALUES (?, ?)", (nonce, ts_ms))

    def recent_nonces(self, since_ms: int) -> list[tuple[str, int]]:
        return list(self.db.execute("SELECT nonce, ts_ms FROM nonces WHERE ts_ms >= ?", (since_ms,)))

    def prune_nonces(self, before_ms: int) -> None:
        self.db.execute("DELETE FROM nonces WHERE ts_ms < ?", (before_ms,))

    # ---- OSS objects (a bucket's name is global, so objects are keyed by bucket and key) -----
    def put_object(self, bucket: str, key: str, data: bytes, content_type: str, etag: str,
                   modified_ms: int) -> None:
        self.db.execute(
            "INSERT INTO objects (bucket, key, data, content_type, etag, modified_ms)"
            " VALUES (?,?,?,?,?,?) ON CONFLICT (bucket, key) DO UPDATE SET data=excluded.data,"
            " content_type=excluded.content_type, etag=excluded.etag,"
            " modified_ms=excluded.modified_ms",
            (bucket, key, data, content_type, etag, modified_ms))

    def get_object(self, bucket: str, key: str) -> tuple[bytes, str, str, int] | None:
        """(data, content type, etag, modified ms), or None."""
        row = self.db.execute("SELECT data, content_type, etag, modified_ms FROM objects"
                              " WHERE bucket=? AND key=?", (bucket, key)).fetchone()
        return (bytes(row[0]), row[1], row[2], row[3]) if row else None

    def delete_object(self, bucket: str, key: str) -> bool:
        cur = self.db.execute("DELETE FROM objects WHERE bucket=? AND key=?", (bucket, key))
        return cur.rowcount > 0

    def list_objects(self, bucket: str, prefix: str, after: str, limit: int
                     ) -> list[tuple[str, int, str, int]]:
        """(key, size, etag, modified ms) of keys starting with ``prefix`` after ``after``, in
        key order (byte order of the UTF-8 text, as OSS lists), at most ``limit``."""
        return list(self.db.execute(
            "SELECT key, length(data), etag, modified_ms FROM objects WHERE bucket=? AND key>?"
            " AND substr(key, 1, ?)=? ORDER BY key LIMIT ?",
            (bucket, after, len(prefix), prefix, limit)))

    def count_objects(self, bucket: str) -> int:
        return self.db.execute("SELECT COUNT(*) FROM objects WHERE bucket=?",
                               (bucket,)).fetchone()[0]
