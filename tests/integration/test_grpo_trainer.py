"""The GRPO trainer on Ray with a tiny model: two data-parallel workers (gloo DDP) step on groups
from a real Redis stream, publish weights to a PolicyServer, checkpoint, and acknowledge only
after the checkpoint; a crash before the checkpoint re-delivers, a crash between checkpoint and
acknowledgement trains nothing twice, and a resume continues from the checkpoint."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
ray = pytest.importorskip("ray")

from consolerl.experience import Turn
from rollout_service.experience import ExperienceStream, StreamConfig
from consolerl.experience import Group, Sample
from rollout_service.models import cached_tiny_model  # noqa: E402
from rollout_service.agent import SamplingParams  # noqa: E402
from rollout_service.policy import (PolicyConfig, PolicyServerActor,  # noqa: E402
                                    TransformersEngine)
from trainer.algo import AlgoConfig  # noqa: E402
from trainer.checkpoint import CheckpointConfig  # noqa: E402
from trainer.config import TrainerConfig  # noqa: E402
from trainer.engine import EngineConfig, OptimConfig, start_workers  # noqa: E402
from trainer.grpo import GRPOTrainer  # noqa: E402
from trainer.weight_sync import WeightPublisher  # noqa: E402
from trainer.stream import ConsumerConfig  # noqa: E402


@pytest.fixture(scope="module")
def cluster():
    ray.init(address="local", num_cpus=3, include_dashboard=False, log_to_driver=False)
    model = str(cached_tiny_model())
    workers = start_workers(model, EngineConfig(
        workers=2, num_cpus_per_worker=0.5, threads_per_worker=1, micro_batch_tokens=64,
        optim=OptimConfig(lr=1e-2)), AlgoConfig())
    server = PolicyServerActor.options(num_cpus=0.5).remote(
        PolicyConfig(model=model, backend="transformers"), None, None, "policy-0")
    try:
        yield model, workers, server
    finally:
        ray.shutdown()


def _group(i: int) -> Group:
    def turn(seed: int) -> Turn:
        prompt = tuple(10 + (seed * 7 + k) % 50 for k in range(5 + seed % 3))
        response = tuple(100 + (seed * 3 + k) % 40 for k in range(3 + seed % 2))
        return Turn(prompt, response, tuple(-2.0 for _ in response), (1,) * len(response), 0,
                    "", "")
    samples = tuple(Sample(f"t{i}-{j}", (turn(i * 10 + j), turn(i * 10 + j + 5)),
                           1.0 if j == 0 else 0.0) for j in range(2))
    return Group(f"g{i}", "ram-create-user-0", samples)


def _trainer(tmp_path, redis_server, workers, server, every: int = 1) -> GRPOTrainer:
    config = TrainerConfig(
        steps=4, checkpoint=CheckpointConfig(dir=str(tmp_path / "ckpt"), every_steps=every,
                                             keep=2),
        consumer=ConsumerConfig(block_ms=200), read_timeout_s=20)
    # The weights travel over a weight group (the default transport).
    return GRPOTrainer(config, StreamConfig(url=redis_server.url, stream="t:grpo"), 1, workers,
                       WeightPublisher([server], workers, config.weights), 0, tmp_path / "run")


def _states_equal(a, b) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_steps_publish_checkpoint_ack_and_resume(cluster, redis_server, tmp_path):
    model, workers, server = cluster
    stream = ExperienceStream(StreamConfig(url=redis_server.url, stream="t:grpo"))
    for i in range(4):
        stream.push(_group(i))
    before = ray.get(workers[0].state_dict.remote())

    trainer = _trainer(tmp_path, redis_server, workers, server)
    trainer.start()
    history = trainer.run(2)
    assert [h["step"] for h in history] == [1, 2] and trainer.version == 2
    assert all(h["rows"] == 4 and h["tokens"] > 0 and "weight_sync_s" in h for h in history)
    # DDP: both ranks hold the same weights, and they moved.
    w0, w1 = ray.get([w.state_dict.remote() for w in workers])
    assert _states_equal(w0, w1) and not _states_equal(w0, before)
    # Published: the server serves version 2 with the trainer's weights.
    assert ray.get(server.version.remote()) == 2 and stream.trainer_version() == 2
    local = TransformersEngine(model)
    local.update_weights(2, w0)
    sampling = SamplingParams(6, 1.0, seed=1)
    served = ray.get(server.generate.remote([10, 11, 12, 13], sampling))
    expected = local.generate([10, 11, 12, 13], sampling)
    assert served.token_ids == expected.token_ids
    assert served.logprobs == pytest.approx(expected.logprobs, abs=1e-4)
    assert trainer.consumer.pending() == 0                  # acked after each checkpoint

    # A crash after training step 3 but before its checkpoint: the entry stays pending.
    deliveries = trainer.collect(deadline=1e18)
    trainer.train_step([d.group for d in deliveries])
    assert trainer.consumer.pending() == 1

    resumed = _trainer(tmp_path, redis_server, workers, server)
    assert resumed.restore() and (resumed.step, resumed.version) == (2, 2)
    assert _states_equal(ray.get(workers[0].state_dict.remote()), w0)   # step 3 undone
    resumed.start()
    resumed.run(3)
    h = resumed.history[-1]
    assert h["step"] == 3 and h["redelivered"] == 1 and resumed.consumer.pending() == 0

    # A crash between the checkpoint of step 4 and its acknowledgement.
    def crash(ids):
        raise RuntimeError("crashed before XACK")
    resumed.consumer.ack = crash
    with pytest.raises(RuntimeError, match="before XACK"):
        resumed.run(4)
    again = _trainer(tmp_path, redis_server, workers, server)
    assert again.restore() and again.step == 4
    assert again.consumer.pending() == 0                    # acked on restore, not retrained
    assert "g3" in again.trained and len(again.trained) == 4
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 4                                  # steps 1, 2, 3, 4: none twice
