"""Weights from the trainer to the policy replicas, and the replicas kept in step with it:
:func:`publish_weights` after each step, :class:`ReplicaSync` for a replica Ray restarted
(it serves nothing until it has the current version), :func:`generation_paused` around a step
that shares the cores with generation."""
from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from typing import Any

import ray

from .engine import call_for_rank0

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


def publish_weights(servers: list[Any], version: int, state_ref: Any) -> list[float]:
    """``version``'s weights to every policy replica. A replica that is down (crashed,
    being restarted by Ray) is skipped: :class:`ReplicaSync` brings it up to date when it
    is back. Fails only when no replica took the weights."""
    refs = [s.update_weights.remote(version, state_ref) for s in servers]
    times, failed = [], []
    for i, ref in enumerate(refs):
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


class ReplicaSync:
    """Every ``interval_s`` while the trainer waits for experience: a policy replica whose
    version differs from the trainer's (restarted by Ray after a crash: it reports -1 and
    refuses to generate until then) gets the current weights from rank 0."""

    def __init__(self, trainer: Any, servers: list[Any], interval_s: float = 2.0):
        self.trainer, self.servers, self.interval_s = trainer, servers, interval_s
        self.last = 0.0

    def __call__(self) -> None:
        if time.monotonic() - self.last < self.interval_s:
            return
        self.last = time.monotonic()
        version = self.trainer.version
        for i, server in enumerate(self.servers):
            try:
                served = ray.get(server.version.remote(), timeout=10)
            except _REPLICA_DOWN:
                continue                              # still restarting: next time
            if served == version:
                continue
            try:
                state_ref, others = call_for_rank0(self.trainer.workers,
                                                   self.trainer.config.engine, "published_state")
                ray.get(server.update_weights.remote(version, state_ref), timeout=600)
                ray.get(others, timeout=600)
                log.warning("policy-%d was restarted: sent it the weights of version %d", i,
                            version)
            except _REPLICA_DOWN as exc:
                log.warning("policy-%d: weights not delivered: %s", i, type(exc).__name__)
