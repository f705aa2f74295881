"""The trainer's weight publisher on Ray with a tiny model: two data-parallel trainer workers
(gloo DDP) and two transformers PolicyServers. The collective transport delivers rank 0's
weights to both replicas (they then generate what a model holding those weights generates); a
replica that Ray restarted misses the stream, gets the weights by the object store in the same
publish, and is back on the collective path at the next one (its group formed again); the
metrics count each path; ``object_store`` keeps the old path."""
from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")
ray = pytest.importorskip("ray")

from prometheus_client import CollectorRegistry  # noqa: E402

from rollout_service.agent import SamplingParams  # noqa: E402
from rollout_service.models import cached_tiny_model  # noqa: E402
from rollout_service.policy import (PolicyConfig, PolicyServerActor,  # noqa: E402
                                    TransformersEngine)
from trainer.algo import AlgoConfig  # noqa: E402
from trainer.config import WeightsConfig  # noqa: E402
from trainer.engine import EngineConfig, start_workers  # noqa: E402
from trainer.weight_sync import ReplicaSync, WeightPublisher  # noqa: E402

PROMPT = [5, 17, 99, 3, 42, 7]


@pytest.fixture(scope="module")
def setup():
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    model = str(cached_tiny_model())
    workers = start_workers(model, EngineConfig(workers=2, num_cpus_per_worker=0.5,
                                                threads_per_worker=1), AlgoConfig())
    config = PolicyConfig(model=model, backend="transformers")
    servers = [PolicyServerActor.options(num_cpus=0.5, max_restarts=-1,
                                         max_task_retries=0).remote(config, None, None,
                                                                    f"policy-{i}")
               for i in range(2)]
    try:
        yield model, workers, servers
    finally:
        ray.shutdown()


def _set_weights(model, workers, seed):
    """Give both trainer ranks the same new weights (as a step would); returns them."""
    engine = TransformersEngine(model)
    gen = torch.Generator().manual_seed(seed)
    state = {k: v + 0.3 * torch.randn(v.shape, generator=gen)
             for k, v in engine.model.state_dict().items()}
    ray.get([w.load_training_state.remote(state, None) for w in workers])
    engine.update_weights(0, state)
    return engine


def _restart(server) -> None:
    """Kill ``server``'s process and wait until Ray has restarted it (version -1)."""
    ray.kill(server, no_restart=False)
    deadline = time.monotonic() + 120
    while True:
        try:
            if ray.get(server.version.remote(), timeout=10) == -1:
                return
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            pass
        assert time.monotonic() < deadline, "the replica was not restarted"
        time.sleep(0.5)


def _count(registry, name, **labels):
    return registry.get_sample_value(name, labels) or 0.0


def test_collective_publish_falls_back_for_a_restarted_replica_and_forms_again(setup):
    model, workers, servers = setup
    registry = CollectorRegistry()
    publisher = WeightPublisher(servers, workers, WeightsConfig(chunk_mib=1, timeout_s=20),
                                EngineConfig(), registry)
    want = _set_weights(model, workers, 1).generate(PROMPT, SamplingParams(8, 1.0, seed=3))
    publisher(1)
    for s in servers:
        got = ray.get(s.generate.remote(PROMPT, SamplingParams(8, 1.0, seed=3)))
        assert got.version == 1 and got.token_ids == want.token_ids
        assert got.logprobs == pytest.approx(want.logprobs, abs=1e-4)   # other threads
    updates = "consolerl_weight_sync_replica_updates_total"
    assert _count(registry, updates, transport="collective") == 2
    assert _count(registry, updates, transport="object_store") == 0
    assert registry.get_sample_value("consolerl_weight_sync_collective_bytes_total") > 0

    # Ray restarts policy-1: it has no weight group any more and waits for weights.
    _restart(servers[1])
    want = _set_weights(model, workers, 2).generate(PROMPT, SamplingParams(8, 1.0, seed=3))
    t0 = time.monotonic()
    publisher(2)
    assert time.monotonic() - t0 < 20                  # no waiting for a timeout
    for s in servers:
        got = ray.get(s.generate.remote(PROMPT, SamplingParams(8, 1.0, seed=3)))
        assert got.version == 2 and got.token_ids == want.token_ids
    assert _count(registry, updates, transport="collective") == 3
    assert _count(registry, updates, transport="object_store") == 1
    assert _count(registry, "consolerl_weight_sync_collective_failures_total",
                  stage="transfer") == 1

    # The next publish forms policy-1's group again: both on the collective path.
    publisher(3)
    assert [ray.get(s.version.remote()) for s in servers] == [3, 3]
    assert _count(registry, updates, transport="collective") == 5
    assert _count(registry, updates, transport="object_store") == 1


def test_replica_sync_forgets_the_group_of_a_restarted_replica(setup):
    model, workers, servers = setup
    publisher = WeightPublisher(servers, workers, WeightsConfig(timeout_s=20))
    publisher(4)
    assert set(publisher.keys) == {0, 1}

    class Trainer:
        version = 4
    _restart(servers[0])
    deadline = time.monotonic() + 120
    sync = ReplicaSync(Trainer(), publisher, interval_s=0)
    while ray.get(servers[0].version.remote(), timeout=60) != 4:
        sync()
        assert time.monotonic() < deadline
        time.sleep(0.5)
    assert set(publisher.keys) == {1}               # policy-0's group: formed next publish
    publisher(5)
    assert set(publisher.keys) == {0, 1}
    assert [ray.get(s.version.remote()) for s in servers] == [5, 5]


def test_object_store_transport_keeps_the_old_path(setup):
    model, workers, servers = setup
    registry = CollectorRegistry()
    publisher = WeightPublisher(servers, workers, WeightsConfig(transport="object_store"),
                                registry=registry)
    times = publisher(6)
    assert len(times) == 2 and not publisher.keys
    assert [ray.get(s.version.remote()) for s in servers] == [6, 6]
    assert _count(registry, "consolerl_weight_sync_replica_updates_total",
                  transport="object_store") == 2
