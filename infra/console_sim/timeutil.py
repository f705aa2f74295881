"""ISO 8601 UTC times as Alibaba Cloud writes them (``2026-11-21T19:50:51Z``)."""
from __future__ import annotations

import re
import time
from datetime import datetime, timezone

_ISO = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{2}):([0-9]{2})"
                  r"(?::([0-9]{2})(?:\.[0-9]{1,6})?)?Z")


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def iso_minutes(ms: int) -> str:
    """ECS writes CreationTime to the minute: ``2026-11-21T19:50Z``."""
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%MZ")


def parse_iso(value: str) -> int | None:
    """Milliseconds since the epoch, or None when ``value`` is not ``YYYY-MM-DDThh:mm[:ss]Z``."""
    m = _ISO.fullmatch(value.strip())
    if not m:
        return None
    try:
        dt = datetime(int(m[1]), int(m[2]), int(m[3]), int(m[4]), int(m[5]), int(m[6] or 0),
                      tzinfo=timezone.utc)
    except ValueError:
        return None
    return int(dt.timestamp() * 1000)


# The cloud's clock: the machine's plus an offset (zero unless a fault sets it, see faults.py).
_offset_s = 0.0


def set_offset(seconds: float) -> None:
    global _offset_s
    _offset_s = float(seconds)


def now_s() -> float:
    """The cloud's time, epoch seconds."""
    return time.time() + _offset_s


def now_ms() -> int:
    return int(now_s() * 1000)
