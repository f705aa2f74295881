"""The secrets check's run and report: :func:`run_check` scans every place and returns the
report as plain data, :func:`render` prints it for a person; every string in either passes
through :func:`redactor` first, so the check never shows what it found."""
from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict
from pathlib import Path

import redis

from infra.redis_local import RedisServer

from .places import (Places, scan_redis, scan_sqlite, scan_tree, scan_url, session_hashes,
                     sqlite_copies)
from .search import CHUNK_BYTES, MIN_SECRET_CHARS, Check, Secret, secret_forms
from .sources import load_secrets, token_hashes

REDACTED = "[redacted]"


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


