"""Typed configuration of the local cloud server."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DEFAULT_ACCOUNTS_FILE = Path(__file__).with_name("default_accounts.yaml")


@dataclass(frozen=True)
class SimConfig:
    """Settings of one local-cloud process.

    ``delivery_delay_s`` holds audit events back from LookupEvents for that long (the real
    ActionTrail takes up to ~10 minutes); ``lookup_qps`` is the per-account LookupEvents limit
    (0 disables it); ``transition_s`` is how long instance status transitions take
    (Pending → Running, Stopping → Stopped, Starting → Running), ``network_ready_s`` how
    long a new VPC or vSwitch stays Pending before it is Available.
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
