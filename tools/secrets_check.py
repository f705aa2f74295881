"""``python -m tools.secrets_check``: no account password, AccessKey secret or API token in a
run's outputs.

    python -m tools.secrets_check --run-dir runs/demo [--config configs/demo.yaml] [--json]
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

The pieces, by concern: :mod:`tools.secrets.sources` (the secrets), :mod:`tools.secrets.search`
(their forms and the streaming search), :mod:`tools.secrets.places` (the scanners) and
:mod:`tools.secrets.report` (the run and its redacted report). This module is the command: it
resolves the places from the arguments and the run's config.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import redis

from consolerl.errors import ConfigError
from infra.console_sim.config import DEFAULT_ACCOUNTS_FILE
from tools.secrets.places import Places
from tools.secrets.report import redactor, render, run_check
from tools.secrets.sources import load_secrets

RAY_LOGS = Path("/tmp/ray/session_latest/logs")


def _config_fields(parser: argparse.ArgumentParser, args: argparse.Namespace
                   ) -> tuple[str, str, str]:
    """(accounts file, tokens file, Redis URL) of ``--config``, else of the run's record."""
    if args.config:
        # The typed root config; imported here because it is slow (it reaches the trainer).
        from cluster.config import JobConfig
        from consolerl.config import load_config
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
        prog="python -m tools.secrets_check",
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
