"""Accounts of the local cloud, loaded from YAML and validated with errors naming the field."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from consolerl.config import read_yaml
from consolerl.errors import ConfigError
from consolerl.text import brief

_FIELDS = ("account_id", "login_name", "password", "access_key_id", "access_key_secret")


@dataclass(frozen=True)
class Account:
    """One cloud account. ``repr`` never shows the password or the AccessKey secret."""

    account_id: str
    login_name: str
    password: str = field(repr=False)
    access_key_id: str
    access_key_secret: str = field(repr=False)


def parse_accounts(data: object, source: str = "<accounts>") -> list[Account]:
    if not isinstance(data, list) or not data:
        raise ConfigError(f"{source}: expected a non-empty YAML list of accounts")
    accounts: list[Account] = []
    seen: dict[str, set[str]] = {"account_id": set(), "login_name": set(), "access_key_id": set()}
    for i, item in enumerate(data):
        where = f"{source}: account #{i + 1}"
        if not isinstance(item, dict):
            raise ConfigError(f"{where}: expected a mapping with keys {', '.join(_FIELDS)}")
        unknown = set(item) - set(_FIELDS)
        if unknown:
            raise ConfigError(f"{where}: unknown field(s) {brief(sorted(unknown, key=str))}; "
                              f"allowed: {list(_FIELDS)}")
        values = {}
        for name in _FIELDS:
            value = item.get(name)
            # str() of a container walks all of it (a YAML alias bomb): refused unprinted.
            if isinstance(value, (list, tuple, dict, set)):
                raise ConfigError(f"{where}: field '{name}' must be a string")
            if value is None or not str(value).strip():
                raise ConfigError(f"{where}: field '{name}' is required")
            values[name] = str(value)
        if not re.fullmatch(r"[0-9]{6,20}", values["account_id"]):
            raise ConfigError(f"{where}: field 'account_id' must be 6-20 digits")
        if not re.fullmatch(r"[A-Za-z0-9_.@-]{1,64}", values["login_name"]):
            raise ConfigError(f"{where}: field 'login_name' must be 1-64 of [A-Za-z0-9_.@-]")
        if not re.fullmatch(r"[A-Za-z0-9]{8,64}", values["access_key_id"]):
            raise ConfigError(f"{where}: field 'access_key_id' must be 8-64 alphanumerics")
        if len(values["access_key_secret"]) < 16:
            raise ConfigError(f"{where}: field 'access_key_secret' must be at least 16 characters")
        for key, taken in seen.items():
            if values[key] in taken:
                raise ConfigError(f"{where}: duplicate {key} {values[key]!r}")
            taken.add(values[key])
        accounts.append(Account(**values))
    return accounts


def load_accounts(path: Path | str) -> list[Account]:
    return parse_accounts(read_yaml(path), str(path))


# A lease's mark in the user agent of everything done under it (the browser, the SDK calls
# that provision, score and clean up): the cloud's audit log records the user agent, so any
# event can be traced to the lease (account and fencing number) it ran under, from outside.
LEASE_AGENT_PREFIX = "consolerl-lease/"
_LEASE_AGENT = re.compile(r"consolerl-lease/([0-9]{6,20})/([0-9]{1,19})")


def lease_agent(account_id: str, fencing: int) -> str:
    """The user-agent token of the lease ``fencing`` on ``account_id``."""
    return f"{LEASE_AGENT_PREFIX}{account_id}/{int(fencing)}"


def parse_lease_agent(user_agent: str) -> tuple[str, int] | None:
    """(account id, fencing number) of the lease token in ``user_agent``, or None."""
    m = _LEASE_AGENT.search(user_agent or "")
    return (m[1], int(m[2])) if m else None
