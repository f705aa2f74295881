"""Typed configuration of the local cloud server."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from consolerl.errors import ConfigError

DEFAULT_ACCOUNTS_FILE = Path(__file__).with_name("default_accounts.yaml")


@dataclass(frozen=True)
class SigninLimits:
    """When wrong passwords lock sign-in. Defaults: 5 wrong passwords for one name, or 100
    from one address, within 5 minutes lock it for 5 minutes, then 10, 20, ... up to 1 hour
    for further locks in a row."""

    account_failures: int = 5
    address_failures: int = 100
    window_s: float = 300.0
    lockout_s: float = 300.0
    max_lockout_s: float = 3600.0
    max_tracked: int = 10_000

    def __post_init__(self) -> None:
        for name in ("account_failures", "address_failures", "max_tracked"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"SigninLimits.{name} must be an integer >= 1, got {value!r}")
        for name in ("window_s", "lockout_s", "max_lockout_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ConfigError(f"SigninLimits.{name} must be a number > 0, got {value!r}")


@dataclass(frozen=True)
class SimConfig:
    """Settings of one local-cloud process.

    ``delivery_delay_s`` holds audit events back from LookupEvents for that long (the real
    ActionTrail takes up to ~10 minutes); ``lookup_qps`` is the per-account LookupEvents limit
    (0 disables it); ``transition_s`` is how long instance status transitions take
    (Pending → Running, Stopping → Stopped, Starting → Running), ``network_ready_s`` how
    long a new VPC or vSwitch stays Pending before it is Available; ``signin`` when wrong
    console passwords lock sign-in (``console/signin.py``).
    """

    host: str = "127.0.0.1"
    port: int = 18080
    state_dir: Path = Path("var/console_sim")
    accounts_file: Path = DEFAULT_ACCOUNTS_FILE
    delivery_delay_s: float = 0.0
    lookup_qps: float = 2.0
    max_clock_skew_s: float = 900.0
    transition_s: float = 2.0
    network_ready_s: float = 0.5
    max_query_bytes: int = 32 * 1024
    max_body_bytes: int = 1024 * 1024
    signin: SigninLimits = field(default_factory=SigninLimits)
