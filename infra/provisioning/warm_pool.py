"""WarmPool: provisioned prerequisite sets kept ready per task template, so that an episode
starts without waiting for its VPCs and instances to come up.

Each ready set is provisioned under its own fresh episode id (the provisioner tags and names
everything with it), so handing a set to an episode is handing over that id: the episode runs
under ``result.episode_id`` and its cleanup is the usual ``provisioner.destroy(episode_id)``.

- :meth:`WarmPool.start` starts a refill thread that keeps ``k`` sets ready (or being made) per
  template on a small worker pool. A failed provisioning is logged, counted and retried after
  an exponential backoff for that template only; it never stops the thread or other templates.
- :meth:`WarmPool.take` hands out a ready set at once (a hit), otherwise provisions one for the
  caller (a miss) and returns whichever comes first, that one or a set the refill finishes
  meanwhile; an empty pool delays a take, it never fails it.
- :meth:`WarmPool.stop` stops refilling and destroys the sets nobody took.
"""
from __future__ import annotations

import logging
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from consolerl.errors import ConfigError, ConsoleRLError

from consolerl.resources import ResourceSpec
from .sdk import ProvisionError, ProvisionResult, SdkProvisioner

log = logging.getLogger(__name__)

ValuesFor = Callable[[str, str], Mapping[str, str]]     # (template, episode id) -> values


class WarmPoolClosed(ConsoleRLError, RuntimeError):
    """``take`` after :meth:`WarmPool.stop`."""


class WarmPoolTimeout(ConsoleRLError, TimeoutError):
    """``take`` got no set within its ``timeout_s``."""


class _Metrics:
    def __init__(self, registry: CollectorRegistry):
        self.ready = Gauge("consolerl_warm_pool_ready_sets",
                           "Provisioned sets ready to hand out.", ["template"], registry=registry)
        self.takes = Counter("consolerl_warm_pool_takes_total",
                             "Takes by outcome: hit (a ready set) or miss (provisioned on "
                             "demand).", ["template", "outcome"], registry=registry)
        self.seconds = Histogram("consolerl_warm_pool_provision_seconds",
                                 "Duration of successful provisionings of one set.",
                                 ["template"], registry=registry,
                                 buckets=(0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300))
        self.failures = Counter("consolerl_warm_pool_provision_failures_total",
                                "Failed provisionings (kind: refill or take).",
                                ["template", "kind"], registry=registry)
        self.destroyed = Counter("consolerl_warm_pool_destroyed_sets_total",
                                 "Unused sets destroyed at stop.", ["template"],
                                 registry=registry)


class _Miss:
    """A take's own provisioning: ``state`` says whether the taker is still waiting for it
    (``waiting``), got it (``taken``) or left with another set (``gone``: the set then joins
    the pool)."""

    def __init__(self) -> None:
        self.state: Literal["waiting", "taken", "gone"] = "waiting"


class WarmPool:
    """Keep ``k`` provisioned sets of every template ready.

    ``templates`` maps a template name (usually a task id) to its declarations;
    ``values_for(template, episode_id)`` gives the placeholder values of one set (``episode``
    is always filled in by the provisioner). ``workers`` bounds concurrent refills;
    ``backoff_s``/``max_backoff_s`` pace retries of a failing template. ``registry`` receives
    the ``consolerl_warm_pool_*`` metrics (a new one by default). Thread-safe.
    """

    def __init__(self, provisioner: SdkProvisioner, templates: Mapping[str, list[ResourceSpec]],
                 k: int, values_for: ValuesFor | None = None,
                 registry: CollectorRegistry | None = None, *, workers: int = 2,
                 backoff_s: float = 1.0, max_backoff_s: float = 60.0,
                 new_episode_id: Callable[[], str] | None = None):
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ConfigError(f"WarmPool.k: must be an integer >= 0, got {k!r}")
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ConfigError(f"WarmPool.workers: must be an integer >= 1, got {workers!r}")
        if not backoff_s > 0 or max_backoff_s < backoff_s:
            raise ConfigError("WarmPool.backoff_s: must be > 0 and <= max_backoff_s, got "
                              f"{backoff_s!r} and {max_backoff_s!r}")
        for name, specs in templates.items():
            if not isinstance(name, str) or not name:
                raise ConfigError(f"WarmPool.templates: names must be non-empty strings, got "
                                  f"{name!r}")
            if not isinstance(specs, (list, tuple)) or not all(
                    isinstance(s, ResourceSpec) for s in specs):
                raise ConfigError(f"WarmPool.templates[{name!r}]: must be a list of "
                                  "ResourceSpec (from parse_resources)")
        self.provisioner = provisioner
        self.templates: dict[str, tuple[ResourceSpec, ...]] = {
            name: tuple(specs) for name, specs in templates.items()}
        self.k = k
        self._workers = workers
        self._values_for = values_for
        self._new_id = new_episode_id or (lambda: secrets.token_hex(4))
        self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
        self.registry = registry if registry is not None else CollectorRegistry()
        self._metrics = _Metrics(self.registry)

        self._cond = threading.Condition()
        self._ready: dict[str, deque[ProvisionResult]] = {t: deque() for t in self.templates}
        self._refilling = dict.fromkeys(self.templates, 0)
        self._failures = dict.fromkeys(self.templates, 0)
        self._retry_at = dict.fromkeys(self.templates, 0.0)
        self._stopped = False
        self._refill = ThreadPoolExecutor(workers, thread_name_prefix="warm-pool-refill")
        # Takes provision on their own workers, so a busy refill never delays a taker.
        self._direct = ThreadPoolExecutor(max(2, workers), thread_name_prefix="warm-pool-take")
        self._thread: threading.Thread | None = None
        for template in self.templates:
            self._metrics.ready.labels(template).set(0)

    # ---- public ---------------------------------------------------------------------------------
    def start(self) -> None:
        """Start filling every template to ``k`` ready sets in the background."""
        with self._cond:
            if self._stopped:
                raise WarmPoolClosed("WarmPool.start: the pool was stopped")
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name="warm-pool", daemon=True)
        self._thread.start()

    def __enter__(self) -> WarmPool:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def ready_count(self, template: str) -> int:
        self._check(template)
        with self._cond:
            return len(self._ready[template])

    def take(self, template: str, timeout_s: float | None = None) -> ProvisionResult:
        """A provisioned set of ``template``, now if one is ready, else as soon as one is made.

        The set belongs to the caller from now on (destroy it with
        ``provisioner.destroy(result.episode_id)``). Raises :class:`WarmPoolTimeout` after
        ``timeout_s`` (the set being made then joins the pool), ``ProvisionError`` when the
        take's own provisioning fails and no other set arrived.
        """
        self._check(template)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            if self._stopped:
                raise WarmPoolClosed(f"WarmPool.take({template!r}): the pool was stopped")
            if self._ready[template]:
                self._metrics.takes.labels(template, "hit").inc()
                result = self._pop(template)
                self._cond.notify_all()              # wakes the refill thread
                return result
            self._metrics.takes.labels(template, "miss").inc()
            miss = _Miss()
            future = self._direct.submit(self._provision, template, "take")
        future.add_done_callback(lambda f: self._miss_done(template, miss, f))
        with self._cond:
            while True:
                if future.cancelled():                   # stop() came before it started
                    raise WarmPoolClosed(f"WarmPool.take({template!r}): the pool was stopped")
                if future.done() and (future.exception() is None or not self._ready[template]):
                    miss.state = "taken"
                    return future.result()           # raises the take's ProvisionError
                if self._ready[template]:
                    miss.state = "gone"
                    return self._pop(template)
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    miss.state = "gone"
                    raise WarmPoolTimeout(f"WarmPool.take({template!r}): no set within "
                                       f"{timeout_s:g} s; the one being made joins the pool")
                self._cond.wait(remaining)

    def stop(self, destroy_unused: bool = True) -> list[str]:
        """Stop refilling, wait for provisionings under way, and (by default) destroy every set
        nobody took. Returns the episode ids of those unused sets."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
        # Provisionings under way cannot be cancelled halfway; their sets land in the pool
        # and are destroyed with the others below.
        self._refill.shutdown(wait=True, cancel_futures=True)
        self._direct.shutdown(wait=True, cancel_futures=True)
        with self._cond:
            unused = [(t, self._pop(t)) for t in self.templates for _ in range(
                len(self._ready[t]))]
        if destroy_unused and unused:
            with ThreadPoolExecutor(min(len(unused), self._workers)) as pool:
                list(pool.map(lambda item: self._destroy(*item), unused))
        return [result.episode_id for _, result in unused]

    def _destroy(self, template: str, result: ProvisionResult) -> None:
        try:
            report = self.provisioner.destroy(result.episode_id)
        except Exception:       # one set's failure must not keep the others alive
            log.exception("warm pool: destroying unused set %s of %s failed",
                          result.episode_id, template)
            return
        if report.errors:
            log.warning("warm pool: destroying unused set %s of %s: %s", result.episode_id,
                        template, "; ".join(report.errors))
        self._metrics.destroyed.labels(template).inc()

    # ---- internals ------------------------------------------------------------------------------
    def _check(self, template: str) -> None:
        if template not in self.templates:
            raise ConfigError(f"WarmPool: unknown template {template!r}; declared: "
                              f"{', '.join(self.templates) or '(none)'}")

    def _pop(self, template: str) -> ProvisionResult:
        result = self._ready[template].popleft()
        self._metrics.ready.labels(template).set(len(self._ready[template]))
        return result

    def _put(self, template: str, result: ProvisionResult) -> None:
        self._ready[template].append(result)
        self._metrics.ready.labels(template).set(len(self._ready[template]))
        self._cond.notify_all()

    def _provision(self, template: str, kind: str) -> ProvisionResult:
        episode_id = self._new_id()
        try:
            values = dict(self._values_for(template, episode_id)) if self._values_for else {}
            result = self.provisioner.provision(list(self.templates[template]), episode_id,
                                                values)
        except Exception as exc:
            self._metrics.failures.labels(template, kind).inc()
            log.warning("warm pool: provisioning %s (%s, episode %s) failed: %s", template,
                        kind, episode_id, exc)
            # ProvisionError cleaned up already; anything else (a dropped connection, a bug
            # in values_for) may have left a half-made set behind.
            if not isinstance(exc, ProvisionError):
                self._sweep(episode_id)
            raise
        self._metrics.seconds.labels(template).observe(result.seconds)
        return result

    def _sweep(self, episode_id: str) -> None:
        try:
            self.provisioner.destroy(episode_id)
        except Exception:
            log.exception("warm pool: cleanup of failed episode %s failed", episode_id)

    def _miss_done(self, template: str, miss: _Miss, future: Future[ProvisionResult]) -> None:
        with self._cond:
            if miss.state == "gone" and not future.cancelled() and future.exception() is None:
                self._put(template, future.result())    # the taker left with another set
            self._cond.notify_all()                      # wakes a waiting taker

    def _refill_done(self, template: str, future: Future[ProvisionResult]) -> None:
        with self._cond:
            self._refilling[template] -= 1
            if future.cancelled():
                pass                                     # stop() before it started
            elif future.exception() is None:
                self._failures[template] = 0
                self._put(template, future.result())
            else:
                self._failures[template] += 1
                delay = min(self.max_backoff_s,
                            self.backoff_s * 2 ** (self._failures[template] - 1))
                self._retry_at[template] = time.monotonic() + delay
                log.warning("warm pool: %s failed %d time(s) in a row; next try in %.1f s",
                            template, self._failures[template], delay)
            self._cond.notify_all()

    def _run(self) -> None:
        """The refill loop: top every template up to ``k`` (ready plus being made), except
        those waiting out a backoff; sleep until something changes or a backoff ends."""
        with self._cond:
            while not self._stopped:
                try:
                    wake = self._top_up()
                except Exception:               # keep refilling whatever went wrong once
                    log.exception("warm pool: refill loop error")
                    wake = time.monotonic() + self.backoff_s
                self._cond.wait(None if wake is None else max(0.01, wake - time.monotonic()))

    def _top_up(self) -> float | None:
        """Start the provisionings each template lacks (called with the lock held); returns
        when the next backoff ends, if any."""
        now = time.monotonic()
        wake: float | None = None
        for template in self.templates:
            retry_at = self._retry_at[template]
            if now < retry_at:
                wake = retry_at if wake is None else min(wake, retry_at)
                continue
            missing = self.k - len(self._ready[template]) - self._refilling[template]
            for _ in range(max(0, missing)):
                future = self._refill.submit(self._provision, template, "refill")
                self._refilling[template] += 1
                future.add_done_callback(lambda f, t=template: self._refill_done(t, f))
        return wake
