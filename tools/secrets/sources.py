"""How the secrets check gathers what it must not find: the accounts file's passwords and
AccessKey secrets, the lines of ``--secret-file``, ``$CONSOLE_RL_TOKEN``, and the known hashes
of the jobs API's tokens (by which a token found by its shape is named)."""
from __future__ import annotations

import json
import os
from pathlib import Path

from consolerl.accounts import load_accounts
from consolerl.errors import ConfigError
from jobsapi.auth import TOKEN_PREFIX

from .places import Places
from .search import MIN_SECRET_CHARS, Secret


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


