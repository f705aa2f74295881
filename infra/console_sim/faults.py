"""Faults an operator (or the fault-injection suite, ``tests/faults``) sets on a running local
cloud, for testing how the system above it copes: ``<state_dir>/faults.json`` with any of

- ``clock_offset_s``: the cloud's clock runs this far from the machine's (event times,
  signature time checks, the ``Date`` header all follow it);
- ``lookup_qps``: the per-account ActionTrail ``LookupEvents`` limit instead of the
  configured one (a throttling storm);
- ``delivery_delay_s``: audit events reach ``LookupEvents`` this late instead of the
  configured delay.

The file is read again when it changes (checked at most every ``check_s``); deleting it ends
the faults. A malformed file is ignored with a warning (the last good settings stay). Nothing
here is reachable over the network.
"""
from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

from . import timeutil

log = logging.getLogger("infra.console_sim.faults")
FILE_NAME = "faults.json"


@dataclass(frozen=True)
class Faults:
    clock_offset_s: float = 0.0
    lookup_qps: float | None = None
    delivery_delay_s: float | None = None


def parse_faults(data: object) -> Faults:
    """The settings of a faults file; ``ValueError`` naming the bad field."""
    if not isinstance(data, dict):
        raise ValueError("the faults file must hold a JSON object")
    unknown = sorted(set(data) - {"clock_offset_s", "lookup_qps", "delivery_delay_s"})
    if unknown:
        raise ValueError(f"unknown field(s) {unknown}")
    values: dict[str, float] = {}
    for name, value in data.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number")
        if name != "clock_offset_s" and value < 0:
            raise ValueError(f"{name} must be >= 0")
        values[name] = float(value)
    return Faults(**values)


class FaultFile:
    """The current :class:`Faults` of ``state_dir``; :meth:`refresh` also moves the cloud's
    clock (:func:`timeutil.set_offset`)."""

    def __init__(self, state_dir: Path, check_s: float = 0.2):
        self.path = Path(state_dir) / FILE_NAME
        self.check_s = check_s
        self.faults = Faults()
        self._checked = 0.0
        self._mtime: float | None = None

    def refresh(self) -> Faults:
        now = time.monotonic()
        if now - self._checked < self.check_s:
            return self.faults
        self._checked = now
        try:
            mtime = self.path.stat().st_mtime
        except OSError:
            mtime = None
        if mtime == self._mtime:
            return self.faults
        self._mtime = mtime
        if mtime is None:
            self.faults = Faults()
        else:
            try:
                self.faults = parse_faults(json.loads(self.path.read_text()))
                log.warning("faults set from %s: %s", self.path, self.faults)
            except (OSError, ValueError) as exc:
                log.warning("faults file %s ignored: %s", self.path, exc)
        timeutil.set_offset(self.faults.clock_offset_s)
        return self.faults
