"""Console sign-in sessions, kept in the local cloud's SQLite file so that a restart of the
server does not sign browsers out. The cookie carries a random token; the table keeps only its
SHA-256, so the database never holds a usable session token."""
from __future__ import annotations

import hashlib
import secrets
from collections import OrderedDict
from dataclasses import dataclass, field

from ..store import Store
from .. import timeutil
from consolerl.drift import Drift

COOKIE = "consolerl_console_session"
_MAX_FLASH_SESSIONS = 10_000
SCHEMA = """
CREATE TABLE IF NOT EXISTS console_sessions (
    token_hash TEXT PRIMARY KEY,
    account_id TEXT NOT NULL,
    region TEXT NOT NULL,
    drift TEXT NOT NULL,
    csrf TEXT NOT NULL,
    expires_ms INTEGER NOT NULL
) WITHOUT ROWID;
"""


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass
class Session:
    token_hash: str
    account_id: str
    region: str
    drift: Drift
    csrf: str
    expires_ms: int
    flashes: list[tuple[str, str]] = field(default_factory=list)


class SessionStore:
    def __init__(self, store: Store, ttl_s: float = 12 * 3600):
        self.store = store
        self.ttl_ms = int(ttl_s * 1000)
        self.store.db.executescript(SCHEMA)
        # Toasts waiting for the next page view, for the most recently seen sessions (env
        # workers sign in once per episode: an unbounded map would grow forever). Losing them
        # on restart or eviction is harmless.
        self._flashes: OrderedDict[str, list[tuple[str, str]]] = OrderedDict()

    def create(self, account_id: str, region: str, drift: Drift) -> tuple[str, Session]:
        token = secrets.token_urlsafe(32)
        session = Session(_hash(token), account_id, region, drift, secrets.token_urlsafe(24),
                          timeutil.now_ms() + self.ttl_ms)
        with self.store.tx():
            self.store.db.execute(
                "DELETE FROM console_sessions WHERE expires_ms < ?", (timeutil.now_ms(),))
            self.store.db.execute(
                "INSERT INTO console_sessions VALUES (?,?,?,?,?,?)",
                (session.token_hash, account_id, region, str(drift), session.csrf,
                 session.expires_ms))
        return token, session

    def get(self, token: str | None) -> Session | None:
        if not token or len(token) > 128:
            return None
        token_hash = _hash(token)
        row = self.store.db.execute(
            "SELECT account_id, region, drift, csrf, expires_ms FROM console_sessions "
            "WHERE token_hash=?", (token_hash,)).fetchone()
        if row is None or row[4] < timeutil.now_ms():
            return None
        kinds = frozenset(k for k in row[2].split(",") if k)
        flashes = self._flashes.pop(token_hash, [])
        self._flashes[token_hash] = flashes
        while len(self._flashes) > _MAX_FLASH_SESSIONS:
            self._flashes.popitem(last=False)
        return Session(token_hash, row[0], row[1], Drift(kinds), row[3], row[4], flashes)

    def set_region(self, session: Session, region: str) -> None:
        with self.store.tx():
            self.store.db.execute("UPDATE console_sessions SET region=? WHERE token_hash=?",
                                  (region, session.token_hash))
        session.region = region

    def delete(self, session: Session) -> None:
        with self.store.tx():
            self.store.db.execute("DELETE FROM console_sessions WHERE token_hash=?",
                                  (session.token_hash,))
        self._flashes.pop(session.token_hash, None)

    def count_active(self) -> int:
        return self.store.db.execute("SELECT COUNT(*) FROM console_sessions WHERE expires_ms >= ?",
                                     (timeutil.now_ms(),)).fetchone()[0]
