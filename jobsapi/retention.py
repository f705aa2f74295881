"""How long a finished job's results and screenshots are kept, and the sweep that deletes
screenshots (blob stores do not expire anything by themselves).

When a job finishes (:meth:`~.store.JobStore.update_job` moves it to a terminal state) its Redis
keys (the job, spec, rollouts, events) get a TTL of the team's ``results_s``, and two entries go
into an index sorted by when they are due: the job's screenshots (due after ``screenshots_s``)
and its results (due after ``results_s``). :class:`StorageSweeper` takes due entries, a
bounded number per tick: for screenshots it deletes the job's blob folder and artifact
references (the report then renders without them); for results it drops the job from the
team's list (Redis has expired the keys). Per team it keeps a byte count of what is stored,
maintained as things are written and swept (never by scanning), and exports it as
``consolerl_jobs_storage_bytes{team, kind}``: ``kind="blobs"`` the screenshots' bytes,
``kind="redis"`` the finished jobs' results in Redis (measured once, when a job finishes; jobs
still running are not counted: the queue quota bounds them).
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Annotated, Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from consolerl.config import AtLeast, Checked
from consolerl.errors import ConfigError

from .blobs import BlobUnavailable
from .domain import OutOfDomain, key_part

log = logging.getLogger("jobsapi.retention")
DAY_S = 86400.0


# A duration in seconds, > 0 and finite.
Seconds = Annotated[float, AtLeast(0, open=True)]


@dataclass(frozen=True)
class TeamRetention:
    """One team's override (a field left out keeps the default)."""

    results_s: float | None = None
    screenshots_s: float | None = None


@dataclass(frozen=True)
class RetentionConfig(Checked):
    """``api.retention``: a finished job's results (the job, its events, rollouts and report)
    are kept ``results_s``, its screenshots ``screenshots_s`` (no longer than the results);
    ``teams``: overrides by team name. An ``Idempotency-Key`` is remembered 7 days, or the
    team's ``results_s`` if shorter. A day's usage counter is kept ``usage_keep_s`` past the
    end of its (UTC) day. The sweep runs every ``sweep_every_s`` and takes at most
    ``sweep_batch`` due entries a tick. Every duration is in seconds (a soak run uses
    seconds-long ones)."""

    results_s: Seconds = 30 * DAY_S
    screenshots_s: Seconds = 7 * DAY_S
    teams: dict[str, TeamRetention] = field(default_factory=dict)
    usage_keep_s: Seconds = DAY_S
    sweep_every_s: Seconds = 60.0
    sweep_batch: Annotated[int, AtLeast(1)] = 100

    def __post_init__(self) -> None:
        super().__post_init__()
        for team, override in self.teams.items():
            try:
                key_part(team)
            except OutOfDomain as exc:
                raise ConfigError(f"RetentionConfig.teams: {exc}") from None
            for name in ("results_s", "screenshots_s"):
                value = getattr(override, name)
                if value is not None and (isinstance(value, bool) or not isinstance(
                        value, (int, float)) or not 0 < value < float("inf")):
                    raise ConfigError(f"RetentionConfig.teams.{team}.{name}: must be a number "
                                      f"of seconds > 0, got {value!r}")

    def for_team(self, team: str) -> TeamRetention:
        """The team's retention, both fields set; screenshots at most as long as results (a
        screenshot is reached through its job's results)."""
        override = self.teams.get(team, TeamRetention())
        results_s = self.results_s if override.results_s is None else override.results_s
        shots_s = self.screenshots_s if override.screenshots_s is None \
            else override.screenshots_s
        return TeamRetention(results_s=results_s, screenshots_s=min(shots_s, results_s))


class StorageSweeper:
    """Deletes what retention says is due (see the module docstring), ``batch`` entries a
    tick, every ``every_s``, through ``store`` (a :class:`~.store.JobStore`, which owns the
    key layout); exports the per-team byte counts. One per deployment is enough
    (the scheduler's process runs it); more are safe: an entry is settled by exactly one."""

    def __init__(self, store: Any, every_s: float | None = None,
                 batch: int | None = None, registry: CollectorRegistry | None = None):
        self.store = store
        self.every_s = every_s if every_s is not None else store.retention.sweep_every_s
        self.batch = batch if batch is not None else store.retention.sweep_batch
        self.registry = registry if registry is not None else CollectorRegistry()
        self.bytes = Gauge("consolerl_jobs_storage_bytes", "Bytes the jobs API keeps per "
                           "team: kind=blobs its screenshots in the blob store, kind=redis "
                           "its finished jobs' results in Redis (measured when each job "
                           "finished), until retention removes them.", ["team", "kind"],
                           registry=self.registry)
        self.swept = Counter("consolerl_jobs_swept_total", "Retention entries settled by the "
                             "sweep, by kind (screenshots: a job's blob folder deleted; "
                             "results: an expired job dropped from its team's list).",
                             ["kind"], registry=self.registry)
        self.errors = Counter("consolerl_jobs_sweep_errors_total", "Sweep ticks that failed "
                              "(blob store or Redis unreachable); their entries are retried.",
                              registry=self.registry)
        self._stop = asyncio.Event()

    async def tick(self, now: float | None = None) -> int:
        """Settle up to ``batch`` due entries; refresh the byte counts. How many were settled."""
        settled = 0
        try:
            await self.store.ensure_layout()      # a Redis from before retention: its old jobs
            for kind in await self.store.sweep(time.time() if now is None else now,
                                               self.batch):
                self.swept.labels(kind).inc()
                settled += 1
        finally:
            await self.refresh()
        return settled

    async def refresh(self) -> None:
        counts = await self.store.storage_bytes()
        self.bytes.clear()
        for (team, kind), value in sorted(counts.items()):
            self.bytes.labels(team, kind).set(value)

    async def run(self) -> None:
        """Sweep until :meth:`stop`; a failing tick (the blob store or Redis down) is logged
        and retried next tick."""
        self._stop.clear()
        while not self._stop.is_set():
            try:
                while await self.tick() >= self.batch and not self._stop.is_set():
                    await asyncio.sleep(0)       # a backlog: the next batch now
            except (BlobUnavailable, OSError) as exc:
                self.errors.inc()
                log.warning("retention sweep: %s; retrying in %g s", exc, self.every_s)
            except Exception:
                self.errors.inc()
                log.exception("retention sweep failed; retrying in %g s", self.every_s)
            try:
                await asyncio.wait_for(self._stop.wait(), self.every_s)
            except asyncio.TimeoutError:
                pass

    def stop(self) -> None:
        self._stop.set()
