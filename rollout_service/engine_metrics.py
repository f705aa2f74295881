"""The engine's own metrics (vLLM's ``vllm:*``) served by the PolicyServer's endpoint.

vLLM registers its metrics (KV-cache use, requests running and waiting in its scheduler,
preemptions, time to first token, ...) in the Prometheus registry of the process that runs its
``AsyncLLM``: the child process of :class:`~rollout_service.vllm_engine.VllmEngine`, which
serves no HTTP. Rather than a second endpoint per replica (a port and an announcement of its
own, a target that outlives a dead owner), the owner asks the child for the text over the
connection it already has, and :class:`EngineMetrics`, a ``prometheus_client`` collector,
serves it beside the PolicyServer's own metrics, so one target per replica carries both and
discovery is unchanged.

At each collection (a scrape): one request to the engine at most in flight; the collection
waits ``timeout_s`` for the answer, then serves the last answer it has (a busy or hung engine
never holds a scrape longer than that), unless that answer is older than ``max_age_s`` (a hung
engine's frozen numbers are not served as current; the series go missing instead). An engine
that is gone (its request fails) serves nothing.

Families are passed through as vLLM names them, with vLLM's labels (``model_name``,
``engine``, ...), plus ``server``: the replica's name, the label the ``consolerl_policy_*``
metrics carry, so that dashboards group both by replica. Only families under ``prefix`` are
served (vLLM's process also registers ``process_*`` and ``python_*`` collectors, which would
clash with the owner's), so each family appears once in the combined exposition.
"""
from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Iterator

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

log = logging.getLogger("rollout_service.engine_metrics")


class EngineMetrics:
    """A collector (``describe`` / ``collect``) of an engine's metrics text.

    ``request`` starts a fetch of the engine's exposition text and returns a future of it
    (:meth:`VllmEngine.request_metrics`); it may raise when the engine is gone."""

    def __init__(self, server: str, request: Callable[[], concurrent.futures.Future],
                 timeout_s: float = 0.5, max_age_s: float = 60.0, prefix: str = "vllm:"):
        self.server = server
        self.timeout_s = timeout_s
        self.max_age_s = max_age_s
        self.prefix = prefix
        self._request = request
        self._lock = threading.Lock()
        self._future: concurrent.futures.Future | None = None
        self._families: list[Metric] = []
        self._at = 0.0                              # monotonic time of the last answer
        self._failing = ""

    def describe(self) -> list[Metric]:
        # Registration would otherwise collect, i.e. ask the engine, to learn the names.
        return []

    def collect(self) -> Iterator[Metric]:
        yield from self.families()

    def families(self) -> list[Metric]:
        """The engine's families as served now (see the module docstring)."""
        with self._lock:
            if self._future is not None and self._future.done():
                # A late answer to an earlier scrape: kept as the last answer, and a fresh
                # one asked for all the same (the engine may have changed, or gone, since).
                self._take(self._future)
                self._future = None
            if self._future is None:
                try:
                    self._future = self._request()
                except Exception as exc:  # noqa: BLE001 - a dead engine: nothing to serve
                    return self._fail(f"{type(exc).__name__}: {exc}", drop=True)
            future = self._future
        concurrent.futures.wait([future], timeout=self.timeout_s)
        with self._lock:
            if future.done():
                if self._future is future:
                    self._future = None
                return list(self._families) if self._take(future) else []
            if self._families and time.monotonic() - self._at <= self.max_age_s:
                self._fail(f"no answer within {self.timeout_s:g} s (serving the last one, "
                           f"until it is {self.max_age_s:g} s old)")
                return list(self._families)
            return self._fail(f"no answer within {self.timeout_s:g} s", drop=True)

    def _take(self, future: concurrent.futures.Future) -> bool:
        """Keep a finished request's answer as the last one; False (and nothing kept) when
        it failed: the engine is gone, or its answer does not parse."""
        try:
            families = self._relabel(future.result())
        except Exception as exc:  # noqa: BLE001 - gone, or an unreadable answer
            self._fail(f"{type(exc).__name__}: {exc}", drop=True)
            return False
        self._families, self._at = families, time.monotonic()
        if self._failing:
            log.info("metrics of engine %s answer again", self.server)
            self._failing = ""
        return True

    def _fail(self, why: str, drop: bool = False) -> list[Metric]:
        """Note the failure; with ``drop``, forget the last answer. Only a drop is a warning
        (once per change): an engine busy for a scrape or two is normal under load on CPU."""
        if not drop:
            log.debug("metrics of engine %s: %s", self.server, why)
            return []
        if why != self._failing:
            log.warning("metrics of engine %s: %s", self.server, why)
            self._failing = why
        self._families, self._at = [], 0.0
        return []

    def _relabel(self, text: str) -> list[Metric]:
        out = []
        for family in text_string_to_metric_families(text):
            if not family.name.startswith(self.prefix):
                continue
            copy = Metric(family.name, family.documentation, family.type, family.unit)
            copy.samples = [s._replace(labels={**s.labels, "server": self.server})
                            for s in family.samples]
            out.append(copy)
        return out
