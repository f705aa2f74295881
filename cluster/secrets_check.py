"""``python -m cluster.secrets_check``: no account password, AccessKey secret or API token in a
run's outputs (issue 23).

    python -m cluster.secrets_check --run-dir runs/demo [--config configs/demo.yaml] [--json]
        [--redis URL | --redis-aof DIR] [--state-dir DIR] [--logs DIR ...]
        [--metrics-url URL ...] [--accounts FILE] [--tokens-file FILE] [--secret-file FILE]

The secrets: the password and AccessKey secret of every account in the accounts file the run
used (``--accounts``; else ``cloud.accounts_file`` of ``--config`` or of the run's
``config.json``; else the local cloud's default accounts), the lines of ``--secret-file``
(``api token #n`` when a line starts with ``crl_``, else ``extra secret #n``) and the caller's
``$CONSOLE_RL_TOKEN`` when it is set. Jobs API tokens and console session cookies are stored
only as SHA-256 (``api.tokens_file``, the cloud's ``console_sessions``), so those are found by
their shape (``crl_`` + 43 URL-safe characters, ``consolerl_console_session=`` + 43) and named
by their hash when it is known. The local cloud has no signing key of its own: it reads
credentials from the accounts YAML, so no SQLite table is excluded from the search.

Each secret is searched raw, percent-encoded, JSON-escaped, HTML-escaped and base64 (standard
and URL-safe, at the three byte alignments, so it is found inside a longer encoded blob), in:

- ``run``: every file under ``--run-dir``, streamed in chunks that overlap by the longest
  needle, binary files too (compressed files are searched as stored, not inflated);
- ``logs``: ``--logs`` (default: Ray's ``/tmp/ray/session_latest/logs`` when it exists);
- ``redis``: every key name and value of every type at ``--redis`` (default: the run's
  Redis when it answers at the config's ``stream.url``, else the run folder's AOF loaded into
  a throw-away redis-server); zlib/gzip values (the experience stream) are inflated too;
- ``sqlite``: every column of every table of every ``*.db`` in ``--state-dir`` (default: the
  run folder's ``cloud``), read from a copy (with its WAL) so the check changes nothing;
- ``metrics``: the text of each ``--metrics-url``.

A finding names the secret's kind and owner and the location (file and byte offset, Redis key,
``table.column`` and row, URL), never the value; the whole output is also passed through a
redaction of every searched form. Exit status: 0 clean, 1 something found, 2 a bad argument or
a place that was asked for and could not be read.
"""
from __future__ import annotations

import argparse
import base64
import html
import json
import os
import re
import shutil
import sqlite3
import stat
import sys
import tempfile
import time
import urllib.request
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import quote, quote_plus

import redis

from consolerl.accounts import load_accounts
from consolerl.errors import ConfigError
from infra.console_sim.config import DEFAULT_ACCOUNTS_FILE
from infra.console_sim.console.sessions import COOKIE
from infra.redis_local import RedisServer
from rollout_service.jobs.auth import TOKEN_PREFIX, hash_token

CHUNK_BYTES = 8 << 20
MIN_SECRET_CHARS = 8            # shorter ones would match by chance; listed as not searched
MAX_OFFSETS = 5                 # offsets kept per finding (all are counted)
MAX_INFLATE_BYTES = 1 << 30     # per compressed value: a zlib bomb is searched this far
RAY_LOGS = Path("/tmp/ray/session_latest/logs")
REDACTED = "[redacted]"
_URLSAFE = b"A-Za-z0-9_-"
_URLSAFE_BYTES = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
# (kind, regex whose group 1 is the credential) for the secrets that are stored only hashed.
# No look-behind: it would cost the regex its literal-prefix scan (30x slower on binary data);
# the byte before a match is checked in code instead.
PATTERNS = (
    ("api_token", re.compile(rb"(%s[%s]{43})(?![%s])"
                             % (TOKEN_PREFIX.encode(), _URLSAFE, _URLSAFE))),
    ("console_session", re.compile(rb"%s=([%s]{43})(?![%s])"
                                   % (COOKIE.encode(), _URLSAFE, _URLSAFE))),
)


@dataclass(frozen=True)
class Secret:
    """One value that must not appear: ``kind`` (password, access_key_secret, api_token,
    extra) and ``owner`` (the account id, ``api token #n``), never shown with its value."""

    kind: str
    owner: str
    value: str = field(repr=False)


@dataclass
class Finding:
    kind: str
    owner: str
    form: str           # raw, percent, json, html, base64 (or "shape" for a hashed credential)
    place: str          # run, logs, redis, sqlite, metrics
    location: str
    offsets: list[int] = field(default_factory=list)
    count: int = 0


def secret_forms(value: str) -> dict[bytes, str]:
    """The byte strings that betray ``value``, each with its form's name."""
    forms: dict[bytes, str] = {}

    def add(text: str | bytes, form: str) -> None:
        data = text.encode() if isinstance(text, str) else text
        if len(data) >= MIN_SECRET_CHARS:
            forms.setdefault(data, form)

    add(value, "raw")
    for encoded in (quote(value, safe=""), quote_plus(value, safe="")):
        add(encoded, "percent")
        add(re.sub(r"%[0-9A-F]{2}", lambda m: m[0].lower(), encoded), "percent")
    for ascii_only in (True, False):
        escaped = json.dumps(value, ensure_ascii=ascii_only)[1:-1]
        add(escaped, "json")
        add(escaped.replace("/", "\\/"), "json")
    add(html.escape(value, quote=True), "html")
    raw = value.encode()
    for k in range(3):  # the secret after k other bytes: keep the characters it alone fixes
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            text = encode(b"\0" * k + raw).rstrip(b"=")
            add(text[-(-8 * k // 6):8 * (k + len(raw)) // 6], "base64")
    return forms


class Check:
    """The needles, the credential shapes and the findings of one run of the check."""

    def __init__(self, secrets: list[Secret], known_hashes: dict[str, str] | None = None):
        self.secrets = secrets
        self.needles: list[tuple[bytes, int, str]] = []
        for i, secret in enumerate(secrets):
            self.needles += [(data, i, form) for data, form in secret_forms(secret.value).items()]
        self.needles.sort(key=lambda n: -len(n[0]))
        self.known_hashes = dict(known_hashes or {})    # sha256 -> who (token id, account)
        self.overlap = max([len(n[0]) for n in self.needles] + [128]) - 1
        self.findings: dict[tuple, Finding] = {}
        self.scanned: dict[str, dict[str, int]] = {}
        self.notes: list[str] = []
        self.errors: list[str] = []

    def count(self, place: str, what: str, n: int = 1) -> None:
        counts = self.scanned.setdefault(place, {})
        counts[what] = counts.get(what, 0) + n

    def hit(self, kind: str, owner: str, form: str, place: str, location: str,
            offset: int) -> None:
        finding = self.findings.setdefault((kind, owner, form, place, location),
                                           Finding(kind, owner, form, place, location))
        finding.count += 1
        if len(finding.offsets) < MAX_OFFSETS:
            finding.offsets.append(offset)

    def search(self, place: str, location: str) -> Search:
        return Search(self, place, location)

    def search_value(self, chunks: Iterable[bytes], place: str, location: str) -> int:
        """Search one stored value (given in pieces), and its inflated bytes when it is zlib
        or gzip data; returns its stored size."""
        raw = self.search(place, location)
        inflate: Search | None = None
        inflater = zlib.decompressobj(wbits=47)     # 47: zlib or gzip header, told apart
        inflated = 0
        for chunk in chunks:
            raw.feed(chunk)
            if raw.size == len(chunk) and _looks_compressed(chunk):
                inflate = self.search(place, location + " (inflated)")
            if inflate is None or inflated > MAX_INFLATE_BYTES:
                continue
            try:
                data = inflater.decompress(chunk, CHUNK_BYTES)
                while data:
                    inflate.feed(data)
                    inflated += len(data)
                    if inflated > MAX_INFLATE_BYTES or not inflater.unconsumed_tail:
                        break
                    data = inflater.decompress(inflater.unconsumed_tail, CHUNK_BYTES)
            except zlib.error:
                inflate = None          # not compressed after all: the raw search stands
        if inflate is not None and inflate.size:
            self.count(place, "values inflated")
            if inflated > MAX_INFLATE_BYTES:
                self.notes.append(f"{place}: {location} inflates past {MAX_INFLATE_BYTES} "
                                  "bytes; searched that far")
        return raw.size

    def shape_owner(self, kind: str, credential: bytes) -> str:
        # API tokens and console session tokens are both kept as their hex SHA-256.
        who = self.known_hashes.get(hash_token(credential.decode("ascii")))
        if who:
            return who
        return ("api token not in the tokens file" if kind == "api_token"
                else "console session not in the cloud's state")


def _looks_compressed(data: bytes) -> bool:
    if data[:2] == b"\x1f\x8b":
        return True
    return len(data) >= 2 and data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0


class Search:
    """One byte stream searched for every needle and credential shape. Chunks come in order;
    the last ``overlap`` bytes are kept, so a match across two chunks is found exactly once."""

    def __init__(self, check: Check, place: str, location: str):
        self.check, self.place, self.location = check, place, location
        self.tail = b""
        self.start = 0          # stream offset of tail[0]
        self.size = 0

    def feed(self, chunk: bytes) -> None:
        if not chunk:
            return
        check = self.check
        buf = self.tail + chunk
        done = len(self.tail)   # bytes of buf already searched
        self.size += len(chunk)
        for data, i, form in check.needles:
            at = buf.find(data, max(0, done - len(data) + 1))
            while at >= 0:
                secret = check.secrets[i]
                check.hit(secret.kind, secret.owner, form, self.place, self.location,
                          self.start + at)
                at = buf.find(data, at + 1)
        for kind, pattern in PATTERNS:
            for m in pattern.finditer(buf, max(0, done - 128)):
                start = m.start(1)
                if m.end() > done and not (start and buf[start - 1] in _URLSAFE_BYTES):
                    check.hit(kind, check.shape_owner(kind, m[1]), "shape", self.place,
                              self.location, self.start + start)
        keep = min(len(buf), check.overlap)
        self.start += len(buf) - keep
        self.tail = buf[len(buf) - keep:]


# ---- places ----------------------------------------------------------------------------------
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


# ---- the secrets -----------------------------------------------------------------------------
def account_secrets(accounts_file: Path) -> list[Secret]:
    out = []
    for account in load_accounts(accounts_file):
        out.append(Secret("password", account.account_id, account.password))
        out.append(Secret("access_key_secret", account.account_id, account.access_key_secret))
    return out


def extra_secrets(path: Path) -> list[Secret]:
    """One secret a line (blank lines and ``#`` comments skipped)."""
    out: list[Secret] = []
    counts = {"api_token": 0, "extra": 0}
    for line in path.read_text(encoding="utf-8").splitlines():
        value = line.strip()
        if not value or value.startswith("#"):
            continue
        kind = "api_token" if value.startswith(TOKEN_PREFIX) else "extra"
        counts[kind] += 1
        label = "api token" if kind == "api_token" else "extra secret"
        out.append(Secret(kind, f"{label} #{counts[kind]}", value))
    return out


def token_hashes(tokens_file: Path) -> dict[str, str]:
    """sha256 -> ``api token tok_... (team T)`` from the jobs API's token file."""
    try:
        data = json.loads(tokens_file.read_text(encoding="utf-8"))
        tokens = data["tokens"]
        return {t["sha256"]: f"api token {t.get('id', '?')} (team {t.get('team', '?')})"
                for t in tokens if isinstance(t, dict) and "sha256" in t}
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{tokens_file}: not a jobs API token file: {exc}") from None


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


def load_secrets(places: Places) -> tuple[list[Secret], list[Secret]]:
    """(searched, too short to search) secrets of the accounts file, ``--secret-file`` and
    ``$CONSOLE_RL_TOKEN`` (the caller's own jobs API token, when set)."""
    secrets = account_secrets(places.accounts_file)
    if places.secret_file:
        secrets += extra_secrets(places.secret_file)
    if os.environ.get("CONSOLE_RL_TOKEN"):
        secrets.append(Secret("api_token", "api token from $CONSOLE_RL_TOKEN",
                              os.environ["CONSOLE_RL_TOKEN"]))
    return ([s for s in secrets if len(s.value) >= MIN_SECRET_CHARS],
            [s for s in secrets if len(s.value) < MIN_SECRET_CHARS])


# ---- the command -----------------------------------------------------------------------------
def run_check(places: Places, chunk_bytes: int = CHUNK_BYTES) -> dict:
    """Scan every place; the report as plain data, every string in it redacted."""
    t0 = time.monotonic()
    secrets, short = load_secrets(places)
    known: dict[str, str] = {}
    if places.tokens_file:
        known.update(token_hashes(places.tokens_file))
    with tempfile.TemporaryDirectory(prefix="secrets-check-") as tmp:
        copies = sqlite_copies(places.state_dir, Path(tmp)) if places.state_dir else []
        known.update(session_hashes(copies))
        check = Check(secrets, known)
        check.notes += [f"{s.kind} of {s.owner} is shorter than {MIN_SECRET_CHARS} characters: "
                        "not searched" for s in short]
        check.notes.append("the local cloud keeps credentials in its accounts file, not in "
                           "SQLite: no table is excluded")
        timings: dict[str, float] = {}

        def timed(place: str, fn, *args) -> None:
            start = time.monotonic()
            fn(*args)
            timings[place] = round(timings.get(place, 0.0) + time.monotonic() - start, 2)

        timed("run", scan_tree, check, places.run_dir, "run", chunk_bytes)
        for logs in places.logs:
            timed("logs", scan_tree, check, logs, "logs", chunk_bytes)
        if places.redis_url:
            with redis.Redis.from_url(places.redis_url) as client:
                timed("redis", scan_redis, check, client)
        elif places.redis_aof:
            server = RedisServer(Path(tmp) / "redis")
            shutil.copytree(places.redis_aof, server.data_dir / "appendonlydir")
            try:
                server.start(timeout_s=120)
                with redis.Redis(host="127.0.0.1", port=server.port) as client:
                    timed("redis", scan_redis, check, client)
            except (RuntimeError, OSError, redis.RedisError) as exc:
                check.errors.append(f"redis: cannot load {places.redis_aof}: {exc}")
            finally:
                server.stop()
        if copies:
            timed("sqlite", scan_sqlite, check, copies)
        for url in places.metrics_urls:
            timed("metrics", scan_url, check, url)
    sources = {"accounts_file": str(places.accounts_file),
               "accounts": len({s.owner for s in secrets if s.kind == "password"}),
               "secrets": len(secrets), "needles": len(check.needles),
               "tokens_file": str(places.tokens_file) if places.tokens_file else None,
               "known_hashes": len(known)}
    where = {"run": str(places.run_dir), "logs": [str(p) for p in places.logs],
             "redis": places.redis_url or (f"AOF {places.redis_aof}" if places.redis_aof
                                           else None),
             "sqlite": str(places.state_dir) if places.state_dir else None,
             "metrics": list(places.metrics_urls)}
    findings = sorted(check.findings.values(), key=lambda f: (f.place, f.location, f.owner))
    report = {"ok": not findings, "secrets": sources, "places": where, "scanned": check.scanned,
              "seconds": timings | {"total": round(time.monotonic() - t0, 2)},
              "findings": [asdict(f) for f in findings], "excluded": [],
              "notes": check.notes, "errors": check.errors}
    return _redacted(report, redactor(secrets))


def redactor(secrets: Iterable[Secret], also: Iterable[str] = ()) -> Callable[[str], str]:
    """A function that replaces every searched form of every secret (and each of ``also``) in
    a text: the last line of defence that keeps the check's own output clean, since paths,
    keys and columns are shown as found."""
    forms = {f.decode("utf-8", "replace") for s in secrets for f in secret_forms(s.value)}
    forms |= {s.value for s in secrets if s.value} | {v for v in also if v}
    ordered = sorted(forms, key=len, reverse=True)

    def redact(text: str) -> str:
        for form in ordered:
            text = text.replace(form, REDACTED)
        return text
    return redact


def _redacted(tree: object, redact: Callable[[str], str]) -> object:
    if isinstance(tree, str):
        return redact(tree)
    if isinstance(tree, dict):
        return {redact(k): _redacted(v, redact) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_redacted(v, redact) for v in tree]
    return tree


def render(report: dict) -> str:
    source = report["secrets"]
    lines = [(f"secrets check of {report['places']['run']}: {source['secrets']} secrets of "
              f"{source['accounts']} accounts from {source['accounts_file']} "
              f"({source['known_hashes']} known token and session hashes)")]
    for place, counts in report["scanned"].items():
        shown = ", ".join(f"{v} {k}" for k, v in counts.items())
        lines.append(f"  scanned {place:8} {shown} ({report['seconds'].get(place, 0)} s)")
    for place, where in report["places"].items():
        if not where:
            lines.append(f"  not scanned: {place} (none given or found)")
    for note in report["notes"]:
        lines.append(f"  note: {note}")
    for error in report["errors"]:
        lines.append(f"  ERROR: {error}")
    for f in report["findings"]:
        offsets = ", ".join(map(str, f["offsets"])) + (" ..." if f["count"] > len(f["offsets"])
                                                       else "")
        lines.append(f"FOUND {f['kind']} of {f['owner']} ({f['form']}) in {f['place']}: "
                     f"{f['location']} at offset {offsets} ({f['count']}x)")
    verdict = ("no secret found" if report["ok"] else
               f"{len(report['findings'])} finding(s)")
    lines.append(f"{verdict} in {report['seconds']['total']} s")
    return "\n".join(lines)


def _config_fields(parser: argparse.ArgumentParser, args: argparse.Namespace
                   ) -> tuple[str, str, str]:
    """(accounts file, tokens file, Redis URL) of ``--config``, else of the run's record."""
    if args.config:
        # The typed root config; imported here because it is slow (it reaches the trainer).
        from consolerl.config import load_config

        from .config import JobConfig
        try:
            config = load_config(JobConfig, args.config)
        except ConfigError as exc:
            parser.error(f"--config: {exc}")
        return config.cloud.accounts_file, config.api.tokens_file, config.stream.url
    recorded = args.run_dir / "config.json"
    data: dict = {}
    if recorded.is_file():
        try:
            data = json.loads(recorded.read_text(encoding="utf-8"))
        except ValueError:
            data = {}
    return (data.get("cloud", {}).get("accounts_file", ""),
            data.get("api", {}).get("tokens_file", "var/api/tokens.json"),
            data.get("stream", {}).get("url", ""))


def _answers(url: str) -> bool:
    try:
        with redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=5) as client:
            return bool(client.ping())
    except (redis.RedisError, ValueError, OSError):
        return False


def parse_places(argv: list[str] | None = None) -> tuple[Places, bool]:
    parser = argparse.ArgumentParser(
        prog="python -m cluster.secrets_check",
        description="Search a run's outputs for account passwords, AccessKey secrets and API "
                    "tokens. Exit 0: none found, 1: found, 2: bad argument or unreadable place.")
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--config", type=Path, help="the run's config (for accounts_file, "
                        "api.tokens_file, stream.url); default: the run's config.json")
    parser.add_argument("--accounts", type=Path, help="accounts YAML (overrides the config)")
    parser.add_argument("--tokens-file", type=Path,
                        help="the jobs API's token hashes (default: the config's)")
    parser.add_argument("--secret-file", type=Path,
                        help="more secrets, one a line (raw API tokens: only their hashes are "
                             "stored, so only tokens you know can be searched in encoded forms)")
    parser.add_argument("--redis", default="", metavar="URL")
    parser.add_argument("--redis-aof", type=Path, metavar="DIR",
                        help="an appendonlydir to load into a throw-away redis-server")
    parser.add_argument("--state-dir", type=Path, help="the local cloud's SQLite state")
    parser.add_argument("--logs", type=Path, nargs="+", action="extend", metavar="DIR")
    parser.add_argument("--metrics-url", nargs="+", action="extend", default=[], metavar="URL")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if not args.run_dir.is_dir():
        parser.error(f"--run-dir: {args.run_dir} is not a directory")
    for name in ("config", "accounts", "tokens_file", "secret_file"):
        path = getattr(args, name)
        if path is not None and not path.is_file():
            parser.error(f"--{name.replace('_', '-')}: {path} is not a readable file")
    for name in ("redis_aof", "state_dir"):
        path = getattr(args, name)
        if path is not None and not path.is_dir():
            parser.error(f"--{name.replace('_', '-')}: {path} is not a directory")
    for path in args.logs or ():
        if not path.is_dir():
            parser.error(f"--logs: {path} is not a directory")
    for url in args.metrics_url:
        if not re.match(r"https?://", url):
            parser.error(f"--metrics-url: {url!r} is not an http(s) URL")
    accounts, tokens, stream_url = _config_fields(parser, args)
    accounts_file = args.accounts or Path(accounts or DEFAULT_ACCOUNTS_FILE)
    if not accounts_file.is_file():
        parser.error(f"--accounts: the accounts file {accounts_file} is not readable")
    tokens_file = args.tokens_file or (Path(tokens) if tokens and Path(tokens).is_file()
                                       else None)
    redis_url, redis_aof = args.redis, args.redis_aof
    if redis_url and redis_aof:
        parser.error("--redis-aof: give either --redis or --redis-aof, not both")
    if redis_url and not _answers(redis_url):
        parser.error(f"--redis: nothing answers at {redis_url}")
    if not redis_url and redis_aof is None:
        if stream_url and _answers(stream_url):
            redis_url = stream_url
        elif (args.run_dir / "redis" / "appendonlydir").is_dir():
            redis_aof = args.run_dir / "redis" / "appendonlydir"
    state_dir = args.state_dir
    if state_dir is None and (args.run_dir / "cloud").is_dir():
        state_dir = args.run_dir / "cloud"
    logs = tuple(args.logs) if args.logs else ((RAY_LOGS.resolve(),) if RAY_LOGS.is_dir()
                                               else ())
    return Places(args.run_dir, accounts_file, tokens_file, args.secret_file, redis_url,
                  redis_aof, state_dir, logs, tuple(args.metrics_url)), args.json


def main(argv: list[str] | None = None) -> int:
    places, as_json = parse_places(argv)
    try:
        report = run_check(places)
    except (ConfigError, OSError, ValueError, redis.RedisError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    searched, short = load_secrets(places)
    text = json.dumps(report) if as_json else render(report)
    print(redactor(searched, [s.value for s in short if len(s.value) >= 4])(text))
    if report["findings"]:
        return 1
    return 2 if report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
