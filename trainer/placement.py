"""Where the trainer's ranks run: every rank in one Ray placement group, a node's ranks together.

``engine.workers`` ranks go on ``engine.nodes`` nodes, ``k = workers / nodes`` on each, and a
node's ranks are consecutive: ranks ``0..k-1`` on the first node, ``k..2k-1`` on the second,
and so on. That is the layout collective libraries assume (NCCL's rings and trees, FSDP's
hybrid sharding): neighbouring ranks talk over the node's own links, and only the node
boundaries cross the network.

The construct: one placement group of ``nodes`` bundles, each bundle ``k`` workers' worth of
what one worker asks of Ray (CPUs, GPUs, memory, custom resources: the same options the actor
is started with), with strategy ``STRICT_SPREAD`` (every bundle on a node of its own) when
``nodes > 1`` and ``STRICT_PACK`` for one node. Rank ``r`` is scheduled into bundle
``r // k`` and asks there for one worker's share, so the ``k`` ranks of a bundle share its
node, and Ray gives each of them distinct GPUs out of the ones the bundle reserved.

Why not the alternatives: one ``STRICT_PACK`` group per node keeps a node's ranks together
but nothing keeps two such groups apart (on a node large enough both land on it, and
``nodes: 2`` would silently run on one); one bundle per rank with ``STRICT_SPREAD`` puts
every rank on a node of its own; ``PACK`` / ``SPREAD`` are best effort. Bundles of a node's
size under ``STRICT_SPREAD`` give both properties with one group, which is also what a
trainer's ranks should share: they start, and are removed, together.

The group is reserved before any rank starts; waiting for it is bounded by
``engine.placement_timeout_s``. A group that is not placed by then is removed and
:class:`PlacementError` says what was asked (bundles x resources) and what the cluster has
(total, available, per node), instead of the job hanging with its actors pending. The group
is removed when the trainer stops (:meth:`TrainerRanks.remove_placement`, after its actors are
stopped) and when the start fails; Ray also removes it when the driver that made it exits.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import ray

from consolerl.errors import ConfigError, ConsoleRLError

log = logging.getLogger("trainer.placement")


class PlacementError(ConsoleRLError, RuntimeError):
    """The trainer's placement group could not be placed on the cluster in time."""


# The actor options that reserve something, by the name Ray gives the resource in a bundle.
_RESOURCE_OPTIONS = (("num_cpus", "CPU"), ("num_gpus", "GPU"), ("memory", "memory"))


def worker_resources(options: dict[str, Any]) -> dict[str, float]:
    """What an actor started with ``options`` (``num_cpus``, ``num_gpus``, ``memory`` bytes,
    ``resources``) reserves, in Ray's resource names; zeros left out."""
    out = {name: float(options[key]) for key, name in _RESOURCE_OPTIONS if options.get(key)}
    out.update({k: float(v) for k, v in (options.get("resources") or {}).items() if v})
    return out


def node_bundles(workers: int, nodes: int, per_worker: dict[str, float]
                 ) -> list[dict[str, float]]:
    """``nodes`` bundles, each ``workers / nodes`` times ``per_worker`` (rounded to Ray's
    resolution of 1e-4, so that 3 x 0.1 CPUs is 0.3)."""
    if not per_worker:
        raise ConfigError("EngineConfig.num_cpus_per_worker: a trainer worker that reserves "
                          "nothing (0 CPUs, no GPUs, memory or custom resources) cannot be "
                          "placed; give it num_cpus_per_worker > 0")
    k = workers // nodes
    bundle = {name: round(v * k, 4) for name, v in per_worker.items()}
    return [dict(bundle) for _ in range(nodes)]


@dataclass(frozen=True)
class RankPlacement:
    """A placed group: rank ``r`` runs in bundle ``r // ranks_per_node``."""

    group: Any                          # ray.util.placement_group.PlacementGroup
    ranks_per_node: int
    bundles: tuple[dict[str, float], ...]
    strategy: str
    wait_s: float

    def bundle_of(self, rank: int) -> int:
        return rank // self.ranks_per_node

    def scheduling(self, rank: int) -> Any:
        """The ``scheduling_strategy`` option of rank ``rank``'s actor."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        return PlacementGroupSchedulingStrategy(self.group,
                                                placement_group_bundle_index=self.bundle_of(rank))

    def remove(self) -> None:
        """Give the group's resources back (its actors, if any are left, are killed)."""
        if ray.is_initialized():
            try:
                ray.util.remove_placement_group(self.group)
            except Exception:  # noqa: BLE001 - already gone (removed, or its driver ended)
                pass


def place_ranks(workers: int, nodes: int, per_worker: dict[str, float],
                timeout_s: float) -> RankPlacement:
    """Reserve the group for ``workers`` ranks on ``nodes`` nodes, each rank needing
    ``per_worker`` (:func:`worker_resources`); wait up to ``timeout_s`` for it."""
    bundles = node_bundles(workers, nodes, per_worker)
    strategy = "STRICT_SPREAD" if nodes > 1 else "STRICT_PACK"
    t0 = time.monotonic()
    group = ray.util.placement_group(bundles, strategy=strategy)
    try:
        placed = group.wait(timeout_s)
    except BaseException:
        ray.util.remove_placement_group(group)
        raise
    if not placed:
        ray.util.remove_placement_group(group)
        raise PlacementError(_not_placed(workers, nodes, per_worker, bundles, strategy,
                                         timeout_s))
    placement = RankPlacement(group, workers // nodes, tuple(bundles), strategy,
                              time.monotonic() - t0)
    log.info("trainer placement: %d x %s (%s) placed in %.1f s", nodes,
             fmt_resources(bundles[0]), strategy, placement.wait_s)
    return placement


def _not_placed(workers: int, nodes: int, per_worker: dict[str, float],
                bundles: list[dict[str, float]], strategy: str, timeout_s: float) -> str:
    """One line: what was asked, what the cluster has, what to change."""
    alive = [n for n in ray.nodes() if n.get("Alive")]
    fit = sum(1 for n in alive if _covers(n.get("Resources", {}), bundles[0]))
    where = ("one node" if nodes == 1 else f"{nodes} distinct nodes")
    text = (f"trainer placement: {workers} worker(s) on {where} ({workers // nodes} per node, "
            f"each {fmt_resources(per_worker)}) need {len(bundles)} x "
            f"{fmt_resources(bundles[0])} ({strategy}), not placed within {timeout_s:g} s; "
            f"the cluster has {fmt_resources(ray.cluster_resources())} in all, "
            f"{fmt_resources(ray.available_resources())} available, on {len(alive)} node(s): "
            + "; ".join(f"{n.get('NodeManagerAddress', '?')} "
                        f"{fmt_resources(n.get('Resources', {}))}" for n in alive) + ". ")
    if fit < nodes:
        text += (f"{fit} node(s) could hold {fmt_resources(bundles[0])} even when idle: set "
                 "trainer.engine.workers, nodes and the per-worker resources to what the "
                 "nodes offer")
    else:
        text += ("the nodes are big enough but busy (other actors hold the resources), or "
                 "still joining: raise trainer.engine.placement_timeout_s for an autoscaler")
    return text


def _covers(offered: dict[str, float], wanted: dict[str, float]) -> bool:
    return all(offered.get(k, 0.0) + 1e-9 >= v for k, v in wanted.items())


def fmt_resources(resources: dict[str, float]) -> str:
    """``{CPU: 4, GPU: 8, memory: 64 GiB, trainer: 4}``: what a user configures, without
    Ray's bookkeeping resources (node ids, object store, a placement group's own)."""
    parts = []
    for k, v in sorted(resources.items(), key=lambda kv: (kv[0] not in ("CPU", "GPU"), kv[0])):
        if k.startswith(("node:", "accelerator_type:")) or k == "object_store_memory" \
                or "_group_" in k:
            continue
        parts.append(f"{k}: {v / 2**30:.3g} GiB" if k == "memory" else f"{k}: {v:g}")
    return "{" + ", ".join(parts) + "}"


class TrainerRanks(list):
    """The trainer's rank actors, rank 0 first (a plain list to everything that indexes or
    zips them), and the :class:`RankPlacement` that holds them. Whoever stops the actors
    then calls :meth:`remove_placement`."""

    def __init__(self, actors: list[Any] | None = None,
                 placement: RankPlacement | None = None):
        super().__init__(actors or [])
        self.placement = placement

    def remove_placement(self) -> None:
        """Remove the placement group (once; a no-op without one)."""
        placement, self.placement = self.placement, None
        if placement is not None:
            placement.remove()
