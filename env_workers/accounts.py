"""Where the account pool's accounts come from, and the pool's typed config.

Accounts come from one of three sources (``PoolConfig.accounts_source``):

- ``"local"``: the local cloud's accounts YAML (``infra/console_sim/default_accounts.yaml``
  unless ``accounts_file`` names another), loaded with the emulator's own loader;
- ``"file"``: a secrets YAML file of the real cloud's accounts (same fields), e.g. a mounted
  Kubernetes secret;
- ``"env"``: the environment: ``CONSOLERL_ACCOUNTS_FILE`` (path of such a file) or
  ``CONSOLERL_ACCOUNTS_YAML`` (the YAML itself).

Loaders of real secrets never quote file content in their errors: a YAML parser's message
shows the offending line, which may be a password.
"""
from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Annotated
from urllib.parse import urlsplit

import yaml

from consolerl.config import AtLeast, Checked, Matches, OneOf, Satisfies
from consolerl.errors import ConfigError
from consolerl.accounts import Account, load_accounts, parse_accounts
from infra.console_sim.config import DEFAULT_ACCOUNTS_FILE

ACCOUNTS_FILE_ENV = "CONSOLERL_ACCOUNTS_FILE"
ACCOUNTS_YAML_ENV = "CONSOLERL_ACCOUNTS_YAML"
ACCOUNT_SOURCES = ("local", "file", "env")
_REDIS_SCHEMES = ("redis", "rediss", "unix")
_RAY_GCS_PORT = 6379


def local_cloud_accounts(path: Path | str = DEFAULT_ACCOUNTS_FILE) -> list[Account]:
    """The local cloud's accounts (its default file unless ``path`` names another)."""
    return load_accounts(path)


def secrets_file_accounts(path: Path | str) -> list[Account]:
    """Accounts from a secrets YAML file (a list of mappings with the ``Account`` fields)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read accounts file: {exc.strerror}") from None
    return parse_accounts(_safe_yaml(text, str(path)), str(path))


def environment_accounts(environ: Mapping[str, str] | None = None) -> list[Account]:
    """Accounts named by the environment: ``CONSOLERL_ACCOUNTS_FILE`` wins over
    ``CONSOLERL_ACCOUNTS_YAML``; neither set is a :class:`ConfigError`."""
    env = os.environ if environ is None else environ
    if env.get(ACCOUNTS_FILE_ENV, "").strip():
        return secrets_file_accounts(env[ACCOUNTS_FILE_ENV].strip())
    if env.get(ACCOUNTS_YAML_ENV, "").strip():
        source = f"${ACCOUNTS_YAML_ENV}"
        return parse_accounts(_safe_yaml(env[ACCOUNTS_YAML_ENV], source), source)
    raise ConfigError(f"environment: set {ACCOUNTS_FILE_ENV} (path of an accounts YAML file) "
                      f"or {ACCOUNTS_YAML_ENV} (the YAML itself)")


def _safe_yaml(text: str, source: str) -> object:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        # Deliberately not str(exc): it quotes the line, and the line may hold a secret.
        raise ConfigError(f"{source}: not valid YAML{where}") from None


def _check_redis_url(where: str, url: object) -> None:
    if not isinstance(url, str):
        raise ConfigError(f"{where}: must be a string, got {url!r}")
    if not url:
        return                  # not set yet: refused when a pool is made from it
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise ConfigError(f"{where}: not a valid URL") from None
    if parts.scheme not in _REDIS_SCHEMES:
        raise ConfigError(f"{where}: must use one of "
                          f"{list(_REDIS_SCHEMES)}, got scheme {parts.scheme!r}")
    if parts.scheme == "unix":
        return
    host = parts.hostname or ""
    # redis-py defaults a missing port to 6379, where Ray's GCS listens on every Ray node.
    if (port or _RAY_GCS_PORT) == _RAY_GCS_PORT and _is_loopback(host):
        raise ConfigError(f"{where}: must name a port other than 6379 "
                          "on this machine (Ray's GCS listens there); start redis-server on "
                          "another port")


@dataclass(frozen=True)
class PoolConfig(Checked):
    """Settings of one :class:`~env_workers.leases.AccountPool`.

    ``lease_ttl_s``: how long a lease lives without a heartbeat (a crashed holder's account is
    free again after at most this long). ``heartbeat_interval_s``: how often a
    :class:`~env_workers.leases.Heartbeat` renews (default a third of the TTL, so two renewals
    may fail before the lease expires). ``acquire_timeout_s``: default wait for a free
    account. ``quarantine_threshold``: consecutive sign-in failures before an account is
    quarantined. ``waiter_ttl_s``: how long a waiter's place in the queue survives without the
    waiter polling (a dead waiter blocks the queue at most this long). ``poll_interval_s``:
    how often a waiter polls.
    """

    # Hidden from repr: a redis URL may carry a password (redis://:secret@host:port).
    # "" only inside a root config, whose composition root fills it in (the stream's Redis).
    redis_url: Annotated[str, Satisfies(_check_redis_url)] = field(default="", repr=False)
    key_prefix: Annotated[str, Matches(r"[A-Za-z0-9_.:{}-]{1,64}",
                                       "1-64 of [A-Za-z0-9_.:{}-]")] = "consolerl:pool"
    lease_ttl_s: Annotated[float, AtLeast(0.1)] = 60.0
    heartbeat_interval_s: Annotated[float, AtLeast(0.01)] | None = None
    acquire_timeout_s: Annotated[float, AtLeast(0)] = 300.0
    quarantine_threshold: Annotated[int, AtLeast(1)] = 3
    waiter_ttl_s: Annotated[float, AtLeast(0.1)] = 10.0
    poll_interval_s: Annotated[float, AtLeast(0.001)] = 0.05
    accounts_source: Annotated[str, OneOf(ACCOUNT_SOURCES)] = "local"
    accounts_file: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.heartbeat_interval_s is not None and \
                self.heartbeat_interval_s > self.lease_ttl_s / 2:
            raise ConfigError(
                f"PoolConfig.heartbeat_interval_s: must be at most half of lease_ttl_s "
                f"({self.lease_ttl_s / 2:g}), got {self.heartbeat_interval_s:g}")
        if self.waiter_ttl_s < 4 * self.poll_interval_s:
            raise ConfigError(f"PoolConfig.waiter_ttl_s: must be at least 4 x poll_interval_s "
                              f"({4 * self.poll_interval_s:g}), got {self.waiter_ttl_s:g}")
        if self.accounts_source == "file" and not self.accounts_file:
            raise ConfigError("PoolConfig.accounts_file: required when accounts_source is "
                              "'file'")

    @property
    def heartbeat_s(self) -> float:
        """The effective heartbeat interval."""
        if self.heartbeat_interval_s is None:
            return self.lease_ttl_s / 3
        return self.heartbeat_interval_s

    @classmethod
    def from_mapping(cls, data: Mapping[str, object]) -> PoolConfig:
        """Build from a mapping (the composition root's YAML section); unknown keys are errors."""
        allowed = [f.name for f in fields(cls)]
        unknown = sorted(set(data) - set(allowed))
        if unknown:
            raise ConfigError(f"pool config: unknown field(s) {unknown}; allowed: {allowed}")
        if "redis_url" not in data:
            raise ConfigError("pool config: field 'redis_url' is required")
        return cls(**data)  # type: ignore[arg-type]


def load_pool_accounts(config: PoolConfig,
                       environ: Mapping[str, str] | None = None) -> list[Account]:
    """The accounts of the source that ``config`` names."""
    if config.accounts_source == "local":
        return local_cloud_accounts(config.accounts_file or DEFAULT_ACCOUNTS_FILE)
    if config.accounts_source == "file":
        return secrets_file_accounts(config.accounts_file or "")
    return environment_accounts(environ)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
