"""Placement on a real two-node Ray cluster with fake GPUs (``ray.cluster_utils.Cluster``: two
raylets on this machine, each told it has GPUs; Ray assigns their ids and sets
``CUDA_VISIBLE_DEVICES`` as on real ones, and torch on CPU ignores them).

- the trainer's ranks, started by the real :func:`trainer.engine.start_workers` (tiny model,
  gloo), share one placement group, hold distinct GPUs, and with ``nodes: 2`` a node's ranks
  are together (ranks 0-1 on one node, 2-3 on the other); the group is gone after
  ``remove_placement`` and after a failed start;
- two policy replicas with tensor parallelism 2, started by the real
  :func:`cluster.replicas.start_policy` (its options from ``policy_options``; a probe actor in
  the PolicyServer's place, since vLLM cannot start on fake GPUs), see distinct devices;
- a group that cannot be placed fails within its timeout, saying what was asked and what the
  cluster has.
"""
from __future__ import annotations

import os
import time

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("torch")

from ray.cluster_utils import Cluster  # noqa: E402

from cluster import replicas as rollout_module  # noqa: E402
from rollout_service.models import cached_tiny_model  # noqa: E402
from rollout_service.policy import PolicyConfig  # noqa: E402
from tests.conftest import wait_for  # noqa: E402
from trainer.algo import AlgoConfig  # noqa: E402
from trainer.engine import EngineConfig, start_workers  # noqa: E402
from trainer.placement import PlacementError  # noqa: E402

# The head: 4 GPUs and the only "gpu_box" (where the policy test puts both replicas);
# the second node: 2 GPUs.
HEAD = {"num_cpus": 4, "num_gpus": 4, "resources": {"gpu_box": 2}}
SECOND = {"num_cpus": 2, "num_gpus": 2}
TOTAL = {"CPU": 6.0, "GPU": 6.0}


@pytest.fixture(scope="module")
def two_nodes():
    cluster = Cluster(initialize_head=True,
                      head_node_args={**HEAD, "include_dashboard": False})
    try:
        cluster.add_node(**SECOND)
        ray.init(address=cluster.address, log_to_driver=False)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def _where(actor) -> dict:
    """Where ``actor`` runs, from inside it: node, placement group, GPU ids, visible devices."""
    def probe(_self):
        group = ray.util.get_current_placement_group()
        return {"node": ray.get_runtime_context().get_node_id(),
                "group": group.id.hex() if group else None,
                "gpus": sorted(int(g) for g in ray.get_gpu_ids()),
                "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}
    return ray.get(actor.__ray_call__.remote(probe), timeout=60)


def _all_free() -> bool:
    free = ray.available_resources()
    return all(free.get(k, 0.0) == v for k, v in TOTAL.items())


def _engine(**kw) -> EngineConfig:
    return EngineConfig(num_cpus_per_worker=0.5, num_gpus_per_worker=1, threads_per_worker=1,
                        micro_batch_tokens=64, placement_timeout_s=60, **kw)


def _stop(ranks) -> None:
    for w in ranks:
        ray.kill(w)
    ranks.remove_placement()


def _check_devices(seen: list[dict]) -> None:
    """Each actor its own GPUs: no (node, GPU id) twice; CUDA_VISIBLE_DEVICES = its ids."""
    pairs = [(s["node"], g) for s in seen for g in s["gpus"]]
    assert len(pairs) == len(set(pairs)), seen
    for s in seen:
        assert s["visible"] == ",".join(str(g) for g in s["gpus"]), s


def test_trainer_ranks_share_one_placement_group_on_one_node(two_nodes):
    ranks = start_workers(str(cached_tiny_model()), _engine(workers=2), AlgoConfig())
    group = ranks.placement.group
    try:
        seen = [_where(w) for w in ranks]
        assert [s["group"] for s in seen] == [group.id.hex()] * 2
        assert seen[0]["node"] == seen[1]["node"]
        assert [len(s["gpus"]) for s in seen] == [1, 1]
        _check_devices(seen)
        table = ray.util.placement_group_table(group)
        assert table["strategy"] == "STRICT_PACK" and table["state"] == "CREATED"
        assert list(table["bundles"].values()) == [{"CPU": 1.0, "GPU": 2.0}]
    finally:
        _stop(ranks)
    assert ray.util.placement_group_table(group)["state"] == "REMOVED"
    wait_for(_all_free, timeout=30)


def test_with_two_nodes_a_nodes_ranks_are_together(two_nodes):
    ranks = start_workers(str(cached_tiny_model()), _engine(workers=4, nodes=2, memory_gib=0.25),
                          AlgoConfig())
    try:
        seen = [_where(w) for w in ranks]
        assert len({s["group"] for s in seen}) == 1 and seen[0]["group"] is not None
        # Ranks 0-1 on one node, 2-3 on the other: consecutive ranks share a node.
        assert seen[0]["node"] == seen[1]["node"] != seen[2]["node"] == seen[3]["node"]
        _check_devices(seen)
        table = ray.util.placement_group_table(ranks.placement.group)
        assert table["strategy"] == "STRICT_SPREAD"
        assert table["bundles_to_node_id"] == {0: seen[0]["node"], 1: seen[2]["node"]}
        assert list(table["bundles"].values()) == [
            {"CPU": 1.0, "GPU": 2.0, "memory": 0.5 * 2**30}] * 2
    finally:
        _stop(ranks)
    wait_for(_all_free, timeout=30)


def test_a_failed_start_removes_the_group(two_nodes, tmp_path):
    before = set(ray.util.placement_group_table())
    with pytest.raises(Exception):
        start_workers(str(tmp_path / "no-model"), _engine(workers=2), AlgoConfig())
    made = {k: v for k, v in ray.util.placement_group_table().items() if k not in before}
    assert len(made) == 1 and next(iter(made.values()))["state"] == "REMOVED", made
    wait_for(_all_free, timeout=30)


@ray.remote
class DeviceProbe:
    """Takes the PolicyServer's place in start_policy: constructed with its arguments, and
    started with exactly the options the real one gets (vLLM needs real GPUs)."""

    def __init__(self, config, engine, registry, name, metrics=None):
        self.name = name

    def shutdown(self) -> None:
        pass


def test_two_tensor_parallel_replicas_see_distinct_devices(two_nodes, monkeypatch):
    config = PolicyConfig(model="unused", backend="vllm", device="cuda", replicas=2,
                          tensor_parallel_size=2, num_gpus_per_replica=2,
                          num_cpus_per_replica=0.5, resources={"gpu_box": 1})
    monkeypatch.setattr(rollout_module, "PolicyServerActor", DeviceProbe)
    servers, _ = rollout_module.start_policy(config)
    try:
        seen = [_where(s) for s in servers]
        # Both on the head (the only gpu_box), two GPUs each, none shared.
        assert seen[0]["node"] == seen[1]["node"]
        assert [len(s["gpus"]) for s in seen] == [2, 2]
        _check_devices(seen)
        assert sorted(g for s in seen for g in s["gpus"]) == [0, 1, 2, 3]
    finally:
        for s in servers:
            ray.kill(s)
    wait_for(_all_free, timeout=30)


def test_a_group_no_node_can_hold_fails_within_its_timeout(two_nodes):
    # 6 GPUs in the cluster, but no node has 5.
    t0 = time.monotonic()
    with pytest.raises(PlacementError) as info:
        start_workers("unused", EngineConfig(num_gpus_per_worker=5, placement_timeout_s=2),
                      AlgoConfig())
    assert time.monotonic() - t0 < 15
    text = str(info.value)
    assert "1 worker(s) on one node" in text and "1 x {CPU: 1, GPU: 5}" in text, text
    assert "{CPU: 6, GPU: 6, gpu_box: 2" in text, text           # the cluster in all
    assert "0 node(s) could hold {CPU: 1, GPU: 5}" in text, text
    assert "not placed within 2 s" in text, text
    wait_for(_all_free, timeout=30)


def test_a_group_the_busy_nodes_cannot_hold_now_says_so(two_nodes):
    blocker = DeviceProbe.options(num_gpus=3, num_cpus=0, resources={"gpu_box": 1}).remote(
        None, None, None, "blocker")           # on the head
    ray.get(blocker.__ray_call__.remote(lambda _self: None), timeout=60)
    try:
        with pytest.raises(PlacementError) as info:
            # 2 x 2 GPUs on one node: only the head has 4, and the blocker holds 3 of them.
            start_workers("unused", EngineConfig(workers=2, num_cpus_per_worker=0.5,
                                                 num_gpus_per_worker=2, placement_timeout_s=2),
                          AlgoConfig())
        text = str(info.value)
        assert "1 x {CPU: 1, GPU: 4}" in text and "GPU: 3" in text, text   # 3 available
        assert "big enough but busy" in text, text
    finally:
        ray.kill(blocker)
    wait_for(_all_free, timeout=30)
