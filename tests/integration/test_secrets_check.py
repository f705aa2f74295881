"""The secrets check over a run's outputs: a clean run folder, Redis, SQLite state
and metrics page pass; a password in a log, an AccessKey secret base64-encoded across a chunk
boundary of a binary file, secrets in a zlib-compressed stream entry, a hash field and a SQLite
column, an API token on a metrics page and a secret in a run's Redis AOF are each found at the
right place, and the output never shows a secret. Exit codes 0, 1 and 2 of the command."""
from __future__ import annotations

import base64
import json
import sqlite3
import subprocess
import sys
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import redis

from consolerl.accounts import load_accounts
from infra.console_sim.config import DEFAULT_ACCOUNTS_FILE
from infra.redis_local import RedisServer
from jobsapi.auth import TokenBook
from tools import secrets_check as sc
from tools.secrets.places import Places
from tools.secrets.report import run_check
from tools.secrets.search import secret_forms

ROOT = Path(__file__).resolve().parents[2]
ACCOUNTS = load_accounts(DEFAULT_ACCOUNTS_FILE)
CHUNK = 1 << 16
SERVED: dict[str, bytes] = {}


class _Page(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = SERVED.get(self.path, b"")
        self.send_response(200 if self.path in SERVED else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def metrics_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


@pytest.fixture
def world(tmp_path, redis_server, metrics_server, monkeypatch):
    """A clean run: files, Ray-like logs, Redis of every type, a cloud SQLite, a token file and
    a metrics page."""
    monkeypatch.delenv("CONSOLE_RL_TOKEN", raising=False)
    run, logs, state = tmp_path / "run", tmp_path / "ray-logs", tmp_path / "cloud"
    for d in (run / "logs", logs, state):
        d.mkdir(parents=True)
    (run / "logs" / "worker.log").write_text("episode ok, reward 1.0\n" * 50)
    (run / "blob.bin").write_bytes(bytes(range(256)) * (3 * CHUNK // 256))
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward": 0.5}) + "\n")
    (logs / "raylet.out").write_text("raylet started\n")
    db = sqlite3.connect(state / "cloud.db")
    db.executescript("CREATE TABLE events (seq INTEGER PRIMARY KEY, account_id TEXT, body TEXT);"
                     "CREATE TABLE nonces (nonce TEXT PRIMARY KEY, ts INTEGER) WITHOUT ROWID;"
                     "CREATE TABLE console_sessions (token_hash TEXT PRIMARY KEY, "
                     "account_id TEXT) WITHOUT ROWID;")
    db.executemany("INSERT INTO events (account_id, body) VALUES (?, ?)",
                   [(a.account_id, json.dumps({"Action": "CreateUser", "Password": "******"}))
                    for a in ACCOUNTS[:3]])
    db.execute("INSERT INTO nonces VALUES ('n-1', 1)")
    db.commit()
    db.close()
    c = redis.Redis.from_url(redis_server.url)
    c.flushdb()
    c.set("run:version", "3")
    c.hset("consolerl:api:job:1", mapping={"state": "done", "team": "docs"})
    c.rpush("run:list", "a", "b")
    c.sadd("run:set", "x")
    c.zadd("run:zset", {"m": 1.0})
    c.xadd("consolerl:experience", {"group_id": "g0", "data": zlib.compress(b'{"samples":[]}')})
    tokens = tmp_path / "tokens.json"
    token = TokenBook(tokens).create("docs", ["jobs:read"])
    SERVED.clear()
    SERVED["/metrics"] = b"consolerl_episodes_total 3\n"
    places = Places(run, DEFAULT_ACCOUNTS_FILE, tokens_file=tokens, redis_url=redis_server.url,
                       state_dir=state, logs=(logs,),
                       metrics_urls=(metrics_server + "/metrics",))
    yield {"places": places, "redis": c, "token": token, "state": state, "run": run}
    c.close()


def _argv(places: Places) -> list[str]:
    return ["--run-dir", str(places.run_dir), "--redis", places.redis_url,
            "--state-dir", str(places.state_dir), "--logs", *map(str, places.logs),
            "--tokens-file", str(places.tokens_file), "--metrics-url", *places.metrics_urls]


def _shows_no_secret(text: str, token: str) -> None:
    for secret in [token, *(v for a in ACCOUNTS for v in (a.password, a.access_key_secret))]:
        for form in [secret, *(f.decode() for f in secret_forms(secret))]:
            assert form not in text


def test_a_clean_run_passes(world, capsys):
    report = run_check(world["places"], chunk_bytes=CHUNK)
    assert report["ok"] and report["findings"] == [] and report["errors"] == []
    assert report["secrets"]["accounts"] == len(ACCOUNTS)
    scanned = report["scanned"]
    run_files = [p for p in world["run"].rglob("*") if p.is_file()]
    assert scanned["run"]["files"] == len(run_files) == 3
    assert scanned["run"]["bytes"] == sum(p.stat().st_size for p in run_files)
    assert scanned["logs"]["files"] == 1
    assert scanned["redis"]["keys"] == 6 and scanned["redis"]["values inflated"] == 1
    assert scanned["sqlite"]["tables"] == 3 and scanned["sqlite"]["rows"] == 4
    assert scanned["metrics"]["urls"] == 1
    assert sc.main(_argv(world["places"])) == 0
    assert "no secret found" in capsys.readouterr().out


def test_planted_secrets_are_found_where_they_are_and_never_shown(world, capsys):
    alice, bob, carol, dave, erin = ACCOUNTS[:5]
    run, c = world["run"], world["redis"]
    log = run / "logs" / "worker.log"
    log_offset = log.stat().st_size + len("login ")
    log.write_text(log.read_text() + f"login {alice.password} failed\n")
    blob = bytearray((run / "blob.bin").read_bytes())
    encoded = base64.b64encode(bob.access_key_secret.encode())
    blob[CHUNK - 10:CHUNK - 10 + len(encoded)] = encoded     # across the first chunk boundary
    (run / "blob.bin").write_bytes(bytes(blob))
    body = json.dumps({"samples": [{"observation": f"key {carol.access_key_secret}"}]})
    entry = c.xadd("consolerl:experience", {"group_id": "g1",
                                            "data": zlib.compress(body.encode(), 3)}).decode()
    c.hset("consolerl:api:job:1", "note", f"password={dave.password}")
    db = sqlite3.connect(world["state"] / "cloud.db")
    db.execute("UPDATE events SET body=? WHERE seq=2",
               (json.dumps({"AccessKeySecret": erin.access_key_secret}),))
    db.commit()
    db.close()
    SERVED["/metrics"] += f'# leaked {{token="{world["token"]}"}}\n'.encode()

    report = run_check(world["places"], chunk_bytes=CHUNK)
    found = {(f["kind"], f["owner"], f["form"], f["place"], f["location"]): f["offsets"]
             for f in report["findings"]}
    db_name = str(world["state"] / "cloud.db")
    tok_id = json.loads(world["places"].tokens_file.read_text())["tokens"][0]["id"]
    assert found == {
        ("password", alice.account_id, "raw", "run", str(log)): [log_offset],
        ("access_key_secret", bob.account_id, "base64", "run", str(run / "blob.bin")):
            [CHUNK - 10],
        ("access_key_secret", carol.account_id, "raw", "redis",
         f"stream consolerl:experience entry {entry} field data (inflated)"):
            [body.index(carol.access_key_secret)],
        ("password", dave.account_id, "raw", "redis", "hash consolerl:api:job:1 field note"):
            [len("password=")],
        ("access_key_secret", erin.account_id, "raw", "sqlite",
         f"{db_name}: events.body rowid 2"): [len('{"AccessKeySecret": "')],
        ("api_token", f"api token {tok_id} (team docs)", "shape", "metrics",
         world["places"].metrics_urls[0]): [SERVED["/metrics"].index(b"crl_")],
    }
    assert not report["ok"]
    _shows_no_secret(json.dumps(report), world["token"])
    for extra in ([], ["--json"]):
        assert sc.main(_argv(world["places"]) + extra) == 1
        out = capsys.readouterr().out
        assert out.count("FOUND") == 6 or json.loads(out)["ok"] is False
        _shows_no_secret(out, world["token"])


def test_a_secret_in_the_runs_redis_aof_is_found(tmp_path, monkeypatch):
    monkeypatch.delenv("CONSOLE_RL_TOKEN", raising=False)
    run = tmp_path / "run"
    server = RedisServer(run / "redis").start()
    with server.client() as c:
        c.hset("trail:cache", "k", f"ak={ACCOUNTS[1].access_key_secret}")
        c.execute_command("BGREWRITEAOF")     # the secret goes into the RDB-format base file
        c.hset("trail:cache", "k2", ACCOUNTS[2].password)
    server.stop()
    places = Places(run, DEFAULT_ACCOUNTS_FILE, redis_aof=run / "redis" / "appendonlydir")
    report = run_check(places)
    in_redis = {(f["owner"], f["location"]) for f in report["findings"] if f["place"] == "redis"}
    assert in_redis == {(ACCOUNTS[1].account_id, "hash trail:cache field k"),
                        (ACCOUNTS[2].account_id, "hash trail:cache field k2")}


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tools.secrets_check", *args], cwd=ROOT,
                          check=False, capture_output=True, text=True, timeout=60)


def test_the_command_exit_codes(world, tmp_path):
    clean = _cli(*_argv(world["places"]), "--json")
    assert clean.returncode == 0, clean.stderr
    assert json.loads(clean.stdout)["ok"] is True
    (world["run"] / "notes.txt").write_text(ACCOUNTS[0].access_key_secret)
    dirty = _cli(*_argv(world["places"]))
    assert dirty.returncode == 1 and "FOUND access_key_secret of 1000000000000001" in dirty.stdout
    _shows_no_secret(dirty.stdout + dirty.stderr, world["token"])
    usage = _cli("--run-dir", str(tmp_path / "nowhere"))
    assert usage.returncode == 2 and "--run-dir" in usage.stderr


@pytest.mark.parametrize("args,named", [
    (["--redis", "redis://127.0.0.1:1/0"], "--redis"),
    (["--redis", "redis://127.0.0.1:1/0", "--redis-aof", "/tmp"], "--redis-aof"),
    (["--metrics-url", "ftp://x"], "--metrics-url"),
    (["--state-dir", "/nonexistent"], "--state-dir"),
    (["--secret-file", "/nonexistent"], "--secret-file"),
])
def test_usage_errors_name_the_argument(world, args, named, capsys):
    with pytest.raises(SystemExit) as exited:
        sc.main(["--run-dir", str(world["run"]), "--logs", str(world["run"]), *args])
    assert exited.value.code == 2 and named in capsys.readouterr().err
