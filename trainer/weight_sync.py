"""Weights from the trainer to the policy replicas, and the replicas kept in step with it:
:class:`WeightPublisher` after each step, :class:`ReplicaSync` for a replica Ray restarted
(it serves nothing until it has the current version), :func:`generation_paused` around a step
that shares the cores with generation.

Two transports (``trainer.weights.transport``):

- ``collective``: rank 0 streams the weights to each replica over a process group of their
  own (:mod:`rollout_service.weight_transfer`; gloo on CPU, NCCL on GPU), formed at the first
  publish and formed again for a replica whose group broke (restarted, timed out). A replica
  the collective path misses gets the weights by the object store in the same publish.
- ``object_store`` (:func:`publish_weights`): rank 0's state dict goes into Ray's object store
  once, every replica takes it from there and loads it through a file.
"""
from __future__ import annotations

import contextlib
import itertools
import logging
import time
from collections.abc import Iterable, Iterator
from typing import Any

import ray
from prometheus_client import CollectorRegistry, Counter, Histogram

from .config import WeightsConfig
from .engine import EngineConfig, call_for_rank0

log = logging.getLogger("trainer.weight_sync")
# What a call to a replica that is down (crashed, restarting, gone with its node) raises.
_REPLICA_DOWN = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError,
                 ray.exceptions.GetTimeoutError)


@contextlib.contextmanager
def generation_paused(servers: list[Any], max_s: float) -> Iterator[None]:
    """The policy replicas hold new requests while the block runs (a trainer step on the cores
    they share); a replica that is down is skipped, and each pause lifts itself after
    ``max_s`` should the trainer die inside the block."""
    paused = []
    for s in servers:
        try:
            ray.get(s.pause.remote(max_s), timeout=30)
            paused.append(s)
        except _REPLICA_DOWN:
            pass
    try:
        yield
    finally:
        for s in paused:
            try:
                ray.get(s.resume.remote(), timeout=30)
            except _REPLICA_DOWN:
                pass


def publish_weights(servers: list[Any], version: int, state_ref: Any,
                    indexes: list[int] | None = None) -> list[float]:
    """``version``'s weights to every policy replica in ``servers`` (``indexes``: their
    numbers among all replicas, for the log; default their positions). A replica that is down
    (crashed, being restarted by Ray) is skipped: :class:`ReplicaSync` brings it up to date
    when it is back. Fails only when no replica took the weights."""
    refs = [s.update_weights.remote(version, state_ref) for s in servers]
    times, failed = [], []
    for i, ref in zip(indexes if indexes is not None else range(len(refs)), refs):
        try:
            times.append(ray.get(ref, timeout=600))
        except _REPLICA_DOWN as exc:
            failed.append(f"policy-{i}: {type(exc).__name__}")
    if failed:
        log.warning("weights v%d not delivered to %s; sent again when they are back",
                    version, ", ".join(failed))
    if not times:
        raise RuntimeError(f"no policy replica took the weights of version {version}: "
                           f"{', '.join(failed)}")
    return times


class WeightPublisher:
    """``publisher(version)``: ``version``'s weights (of the trainer ``workers``, rank 0
    first) to every policy replica in ``servers`` by ``config.transport``; returns each
    delivered replica's load seconds. Fails only when no replica took them. ``engine``: the
    trainer's (its backend is the collective's: ``gloo`` | ``nccl``; under FSDP2 reading the
    weights takes every rank). Metrics
    (``consolerl_weight_sync_*``) go to ``registry``."""

    def __init__(self, servers: list[Any], workers: list[Any], config: WeightsConfig,
                 engine: EngineConfig | None = None, registry: CollectorRegistry | None = None):
        self.servers, self.workers, self.config = list(servers), list(workers), config
        self.engine = engine if engine is not None else EngineConfig()
        self.backend = self.engine.backend
        self.keys: dict[int, str] = {}            # replica -> its formed group
        self.dtypes: dict[int, str] = {}
        self._formations = itertools.count()
        r = registry if registry is not None else CollectorRegistry()
        self.m_updates = Counter("consolerl_weight_sync_replica_updates_total", "Replica "
                                 "weight updates delivered, by transport (collective; "
                                 "object_store, also the collective's fallback).",
                                 ["transport"], registry=r)
        self.m_bytes = Counter("consolerl_weight_sync_collective_bytes_total", "Bytes streamed "
                               "to the policy replicas over the weight groups (once per "
                               "replica).", registry=r)
        self.m_seconds = Histogram("consolerl_weight_sync_transport_seconds", "Time of one "
                                   "publish's transfers, by transport.", ["transport"],
                                   registry=r, buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
                                                        30, 60, 120, 300))
        self.m_failures = Counter("consolerl_weight_sync_collective_failures_total", "Replicas "
                                  "the collective path missed (stage: open, the group did not "
                                  "form; transfer, the stream failed); they got the object "
                                  "store path.", ["stage"], registry=r)
        for t in ("collective", "object_store"):
            self.m_updates.labels(t)
            self.m_seconds.labels(t)
        for stage in ("open", "transfer"):
            self.m_failures.labels(stage)

    def __call__(self, version: int) -> list[float]:
        everyone = range(len(self.servers))
        if self.config.transport == "object_store":
            return self._object_store(version, everyone, required=True)
        delivered = self._collective(version)
        rest = [i for i in everyone if i not in delivered]
        times = list(delivered.values())
        if rest:
            times += self._object_store(version, rest, required=not delivered)
        return times

    # -- object store ------------------------------------------------------------------------------

    def _object_store(self, version: int, replicas: Iterable[int],
                      required: bool) -> list[float]:
        t0 = time.perf_counter()
        indexes = list(replicas)
        try:
            state_ref, others = call_for_rank0(self.workers, self.engine, "published_state")
            times = publish_weights([self.servers[i] for i in indexes], version, state_ref,
                                    indexes)
            ray.get(others)
        except RuntimeError:
            if required:
                raise
            return []
        self.m_updates.labels("object_store").inc(len(times))
        self.m_seconds.labels("object_store").observe(time.perf_counter() - t0)
        return times

    # -- collective --------------------------------------------------------------------------------

    def _collective(self, version: int) -> dict[int, float]:
        """Stream ``version`` to every replica with a group (formed first where missing);
        returns the replicas that took it and their seconds."""
        self._form_groups()
        if not self.keys:
            return {}
        t0 = time.perf_counter()
        keys = dict(self.keys)
        dtypes = set(self.dtypes[i] for i in keys)
        dtype = dtypes.pop() if len(dtypes) == 1 else ""   # else as the trainer holds them
        timeout = self.config.timeout_s
        receives = {i: self.servers[i].receive_weights.remote(version, key)
                    for i, key in keys.items()}
        sends = [w.weight_transfer.remote("send", list(keys.values()), dtype,
                                          self.config.chunk_mib * 2**20)
                 for w in self.workers]
        sent = ray.get(sends)[0]                 # the trainer failing is the job failing
        delivered: dict[int, float] = {}
        for i, ref in receives.items():
            outcome = sent.get(keys[i], {})
            try:
                out = ray.get(ref, timeout=timeout)
            except (*_REPLICA_DOWN, ray.exceptions.RayTaskError) as exc:
                log.warning("policy-%d: weights v%d not streamed (%s%s); sending them by the "
                            "object store", i, version, _short(exc),
                            f"; sender: {outcome['error']}" if outcome.get("error") else "")
                self.m_failures.labels("transfer").inc()
                self.forget(i)
                continue
            delivered[i] = float(out["seconds"])
            self.m_bytes.inc(int(out["bytes"]))
            if not outcome.get("ok"):
                self.forget(i)          # the sender closed its end: a new group next time
        if delivered:
            self.m_updates.labels("collective").inc(len(delivered))
            self.m_seconds.labels("collective").observe(time.perf_counter() - t0)
        return delivered

    def _form_groups(self) -> None:
        """A group for every replica that has none and answers: the sender's end opened on
        rank 0 (it joins in the background), then the replica's workers join it."""
        timeout = self.config.timeout_s
        opening: dict[int, tuple[str, Any]] = {}
        for i, server in enumerate(self.servers):
            if i in self.keys:
                continue
            try:
                info = ray.get(server.weight_receivers.remote(), timeout=30)
            except _REPLICA_DOWN:
                continue                       # down: ReplicaSync updates it when it is back
            key = f"policy-{i}-{next(self._formations)}"
            spec = ray.get(self.workers[0].weight_transfer.remote(
                "open", key, 1 + int(info["ranks"]), self.backend, timeout))
            self.dtypes[i] = str(info["dtype"])
            opening[i] = (key, server.open_weight_group.remote(spec))
        for i, (key, ref) in opening.items():
            try:
                ray.get(ref, timeout=timeout + 30)
                self.keys[i] = key
            except (*_REPLICA_DOWN, ray.exceptions.RayTaskError) as exc:
                log.warning("policy-%d: no weight group (%s); weights go by the object store",
                            i, _short(exc))
                self.m_failures.labels("open").inc()
                ray.get(self.workers[0].weight_transfer.remote("close", key))

    def resend(self, i: int, version: int) -> bool:
        """Replica ``i`` lost its weights (Ray restarted it: its weight group is gone too):
        ``version``'s weights by the object store now, a new group at the next publish.
        Whether it took them."""
        self.forget(i)
        return bool(self._object_store(version, [i], required=False))

    def forget(self, i: int) -> None:
        """Replica ``i``'s group is broken (it was restarted, a transfer failed): close the
        sender's end; the next publish forms a new one."""
        key = self.keys.pop(i, None)
        if key is not None:
            ray.get(self.workers[0].weight_transfer.remote("close", key))


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[-1] if text else ''}"[:300]


class ReplicaSync:
    """Every ``interval_s`` while the trainer waits for experience: a policy replica whose
    version differs from the trainer's (restarted by Ray after a crash: it reports -1 and
    refuses to generate until then) gets the current weights by ``publisher``
    (:meth:`WeightPublisher.resend`)."""

    def __init__(self, trainer: Any, publisher: WeightPublisher, interval_s: float = 2.0):
        self.trainer, self.publisher, self.interval_s = trainer, publisher, interval_s
        self.last = 0.0

    def __call__(self) -> None:
        if time.monotonic() - self.last < self.interval_s:
            return
        self.last = time.monotonic()
        version = self.trainer.version
        for i, server in enumerate(self.publisher.servers):
            try:
                served = ray.get(server.version.remote(), timeout=10)
            except _REPLICA_DOWN:
                continue                              # still restarting: next time
            if served != version and self.publisher.resend(i, version):
                log.warning("policy-%d was restarted: sent it the weights of version %d", i,
                            version)
