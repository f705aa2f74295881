"""Per-team bearer tokens and quotas.

A token is opaque (``crl_`` and 43 random URL-safe characters), shown once when it is made and
stored only as its SHA-256 in a JSON file the operator owns (``tokens.json``), with the team it
belongs to and its scopes. A team's quota caps its concurrent episodes, queued jobs, samples
per job and env-minutes per day.

    python -m cluster.serve token --file var/api/tokens.json --team docs --scopes jobs:write,jobs:read
"""
from __future__ import annotations

import hashlib
import json
import os
import secrets
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated

from consolerl.config import AtLeast, Checked
from consolerl.errors import ConfigError

from .schema import SCOPES
from .store import OutOfDomain, key_part

TOKEN_PREFIX = "crl_"


@dataclass(frozen=True)
class TeamQuota(Checked):
    concurrent_episodes: Annotated[int, AtLeast(1)] = 2
    queued_jobs: Annotated[int, AtLeast(1)] = 10
    samples_per_job: Annotated[int, AtLeast(1)] = 200
    env_minutes_per_day: Annotated[float, AtLeast(0, open=True)] = 600.0


def _team(team: object, where: str) -> None:
    """A team name is a part of the store's key names (:func:`~.store.key_part`)."""
    try:
        key_part(team if isinstance(team, str) else repr(team))
    except OutOfDomain as exc:
        raise ConfigError(f"{where}: {exc}") from None


@dataclass(frozen=True)
class Principal:
    """Who a request is: the team, the token's id (never the token) and its scopes."""

    team: str
    token_id: str
    scopes: frozenset[str]

    def may(self, scope: str) -> bool:
        return scope in self.scopes or "admin" in self.scopes


def hash_token(token: str) -> str:
    """A token's SHA-256: what the file keeps and what a presented token is looked up by (a
    dict lookup of a hash, so no text comparison of secrets). Any text hashes, never raises."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass
class TokenBook:
    """The token file: teams (with quotas) and token hashes. Reloaded when the file changes,
    so an operator adds a team or revokes a token without restarting the API."""

    path: Path
    _tokens: dict[str, Principal] = field(default_factory=dict)
    _quotas: dict[str, TeamQuota] = field(default_factory=dict)
    _mtime: float = -1.0
    _checked: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    recheck_s: float = 1.0                  # how often the file is looked at for changes

    def __post_init__(self) -> None:
        self.path = Path(self.path)
        self._reload()

    def __getstate__(self) -> dict:
        return {"path": self.path, "_tokens": {}, "_quotas": {}, "_mtime": -1.0,
                "_checked": 0.0, "recheck_s": self.recheck_s}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _lock=threading.Lock())

    def _reload(self) -> None:
        now = time.monotonic()
        if self._mtime >= 0 and now - self._checked < self.recheck_s:
            return
        self._checked = now
        try:
            mtime = self.path.stat().st_mtime
        except FileNotFoundError:
            mtime = 0.0
        if mtime == self._mtime:
            return
        data = self._read()
        tokens, quotas = {}, {}
        for team, spec in data["teams"].items():
            _team(team, f"{self.path}: team")
            try:
                quotas[team] = TeamQuota(**spec.get("quota", {}))
            except TypeError as exc:
                raise ConfigError(f"{self.path}: team {team!r}: {exc}") from None
        for t in data["tokens"]:
            if t["team"] not in quotas:
                raise ConfigError(f"{self.path}: token {t['id']} names an unknown team "
                                  f"{t['team']!r}")
            tokens[t["sha256"]] = Principal(t["team"], t["id"], frozenset(t["scopes"]))
        self._tokens, self._quotas, self._mtime = tokens, quotas, mtime

    def _read(self) -> dict:
        if not self.path.exists():
            return {"teams": {}, "tokens": []}
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{self.path}: not a readable token file: {exc}") from None
        if not isinstance(data, dict) or not isinstance(data.get("teams"), dict) or \
                not isinstance(data.get("tokens"), list):
            raise ConfigError(f"{self.path}: must hold {{'teams': {{...}}, 'tokens': [...]}}")
        return data

    def verify(self, token: str) -> Principal | None:
        with self._lock:
            self._reload()
            return self._tokens.get(hash_token(token))

    def quota(self, team: str) -> TeamQuota:
        with self._lock:
            self._reload()
            return self._quotas.get(team, TeamQuota())

    def teams(self) -> list[str]:
        with self._lock:
            self._reload()
            return sorted(self._quotas)

    def create(self, team: str, scopes: list[str], quota: TeamQuota | None = None) -> str:
        """Add ``team`` (with ``quota``, or keep its quota) and a new token for it; returns
        the token, which is not stored anywhere."""
        bad = [s for s in scopes if s not in SCOPES]
        if bad or not scopes:
            raise ConfigError(f"scopes: {bad or 'none given'}; allowed: {', '.join(SCOPES)}")
        _team(team, "team")
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        with self._lock:
            data = self._read()
            teams = data["teams"]
            if quota is not None or team not in teams:
                teams[team] = {"quota": asdict(quota or TeamQuota())}
            data["tokens"].append({"id": "tok_" + secrets.token_hex(6), "team": team,
                                   "scopes": sorted(set(scopes)),
                                   "sha256": hash_token(token)})
            self._write(data)
            self._mtime = -1.0
        return token

    def _write(self, data: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".tokens-")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
        os.chmod(tmp, 0o600)
        os.replace(tmp, self.path)
