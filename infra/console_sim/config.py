"""Typed configuration of the local cloud server."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from consolerl.config import AtLeast, Checked

DEFAULT_ACCOUNTS_FILE = Path(__file__).with_name("default_accounts.yaml")


@dataclass(frozen=True)
class SigninLimits(Checked):
    """When wrong passwords lock sign-in. Defaults: 5 wrong passwords for one name, or 100
    from one address, within 5 minutes lock it for 5 minutes, then 10, 20, ... up to 1 hour
    for further locks in a row."""

    account_failures: Annotated[int, AtLeast(1)] = 5
    address_failures: Annotated[int, AtLeast(1)] = 100
    window_s: Annotated[float, AtLeast(0, open=True)] = 300.0
    lockout_s: Annotated[float, AtLeast(0, open=True)] = 300.0
    max_lockout_s: Annotated[float, AtLeast(0, open=True)] = 3600.0
    max_tracked: Annotated[int, AtLeast(1)] = 10_000


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
