"""Placement without a cluster: the trainer's bundles from what a worker asks, the resource
text of the placement error, and the config rules of tensor parallelism (which backend, which
device, how many GPUs a replica holds) and that vLLM is told the size."""
from __future__ import annotations

import json
import stat

import pytest

from cluster.replicas import policy_options
from consolerl.errors import ConfigError
from rollout_service.policy import PolicyConfig
from rollout_service.vllm_engine import EngineError, VllmEngine
from trainer.engine import EngineConfig, worker_options
from trainer.placement import TrainerRanks, fmt_resources, node_bundles, worker_resources


def test_a_bundle_is_a_nodes_workers_worth_of_what_one_worker_asks():
    engine = EngineConfig(workers=4, nodes=2, num_cpus_per_worker=2, num_gpus_per_worker=1,
                          memory_gib=2, resources={"trainer": 1})
    per_worker = worker_resources(worker_options(engine))
    assert per_worker == {"CPU": 2.0, "GPU": 1.0, "memory": 2.0 * 2**30, "trainer": 1.0}
    assert node_bundles(4, 2, per_worker) == [
        {"CPU": 4.0, "GPU": 2.0, "memory": 4.0 * 2**30, "trainer": 2.0}] * 2
    # One node: one bundle of every worker; fractions rounded to Ray's resolution.
    assert node_bundles(3, 1, {"CPU": 0.1}) == [{"CPU": 0.3}]
    # No GPU asked, none reserved.
    assert worker_resources(worker_options(EngineConfig())) == {"CPU": 1.0}


def test_a_worker_that_reserves_nothing_cannot_be_placed():
    per_worker = worker_resources(worker_options(EngineConfig(num_cpus_per_worker=0)))
    with pytest.raises(ConfigError, match="num_cpus_per_worker"):
        node_bundles(2, 1, per_worker)


def test_the_resource_text_leaves_out_rays_bookkeeping():
    assert fmt_resources({"GPU": 8.0, "node:10.0.0.1": 1.0, "object_store_memory": 1e9,
                          "CPU_group_0_abcd": 4.0, "memory": 64 * 2**30, "CPU": 32.0,
                          "accelerator_type:H100": 1.0, "trainer": 4.0}) \
        == "{CPU: 32, GPU: 8, memory: 64 GiB, trainer: 4}"


def test_trainer_ranks_are_a_list_and_remove_their_group_once():
    removed = []

    class Placement:
        def remove(self):
            removed.append(1)

    ranks = TrainerRanks(["a", "b"], Placement())
    assert ranks == ["a", "b"] and ranks[0] == "a" and ranks + ["s"] == ["a", "b", "s"]
    ranks.remove_placement()
    ranks.remove_placement()
    assert removed == [1] and ranks.placement is None
    TrainerRanks().remove_placement()               # none started: nothing to remove


def test_placement_timeout_must_be_positive():
    with pytest.raises(ConfigError, match="placement_timeout_s"):
        EngineConfig(placement_timeout_s=0)


TP = dict(backend="vllm", device="cuda", tensor_parallel_size=2)


@pytest.mark.parametrize("overrides, field, numbers", [
    ({"backend": "transformers"}, "tensor_parallel_size", "2 needs backend vllm"),
    ({"device": "cpu"}, "tensor_parallel_size", "got 'cpu'"),
    ({"num_gpus_per_replica": 0}, "num_gpus_per_replica", "(2), one GPU per vLLM worker, got 0"),
    ({"num_gpus_per_replica": 1}, "num_gpus_per_replica", "got 1"),
    ({"num_gpus_per_replica": 4}, "num_gpus_per_replica", "got 4"),
])
def test_tensor_parallelism_is_refused_where_it_cannot_work(overrides, field, numbers):
    with pytest.raises(ConfigError) as info:
        PolicyConfig(**{**TP, "num_gpus_per_replica": 2, **overrides})
    assert f"PolicyConfig.{field}" in str(info.value) and numbers in str(info.value)


def test_a_tensor_parallel_replica_holds_its_gpus():
    config = PolicyConfig(**TP, num_gpus_per_replica=2)
    assert policy_options(config)["num_gpus"] == 2
    # tp 1 keeps what it allowed before: fractions of a GPU, any device.
    PolicyConfig(backend="vllm", device="cuda", num_gpus_per_replica=0.5)
    PolicyConfig(backend="transformers", device="cpu")


def test_vllm_is_told_the_tensor_parallel_size(tmp_path):
    """The arguments the vLLM process is started with, as a stand-in interpreter sees them
    (a script that writes them down and exits)."""
    seen = tmp_path / "args.json"
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nprintf %s "$3" > {seen}\nexit 3\n')
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    config = PolicyConfig(**TP, num_gpus_per_replica=2, startup_timeout_s=30)
    with pytest.raises(EngineError, match="exited with 3"):
        VllmEngine("model", config, python=str(python))
    assert json.loads(seen.read_text())["tensor_parallel_size"] == 2


def test_vllm_on_cpu_is_given_the_cores_named_for_its_threads(tmp_path):
    """``cpu_threads_bind`` reaches the vLLM process as ``VLLM_CPU_OMP_THREADS_BIND`` (a
    stand-in interpreter writes down what it was given); a malformed list is refused."""
    seen = tmp_path / "bind"
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nprintf %s "$VLLM_CPU_OMP_THREADS_BIND" > {seen}\nexit 3\n')
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    config = PolicyConfig(backend="vllm", cpu_threads_bind="0-1", startup_timeout_s=30)
    with pytest.raises(EngineError, match="exited with 3"):
        VllmEngine("model", config, python=str(python))
    assert seen.read_text() == "0-1"
    with pytest.raises(ConfigError, match="cpu_threads_bind"):
        PolicyConfig(cpu_threads_bind="0-")
