"""FSDP2 trainer workers on real Ray actors over gloo, against DDP on the same weights.

A small random Llama (4 layers, tied embeddings) keeps it fast. The batch's prompts share a
20-token prefix (the shared-prefix path runs) and each rank's shard takes two micro-batches
(gradient accumulation with the sync on the last one only). One step under FSDP2 and under
DDP from the same weights gives the same loss, gradient norm and weights; a sharded
checkpoint written by two ranks resumes on one (FSDP2 and DDP alike) with the weights and
optimizer state that were saved, and the next step matches the two-rank run's."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
ray = pytest.importorskip("ray")

from consolerl.experience import Group, Sample, Turn  # noqa: E402
from consolerl.tensors import PartialWeights  # noqa: E402
from trainer.algo import AlgoConfig, build_batch  # noqa: E402
from trainer.checkpoint import CheckpointConfig, CheckpointManager  # noqa: E402
from trainer.engine import EngineConfig, OptimConfig, call_for_rank0, start_workers  # noqa: E402


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256, tie_word_embeddings=True)
    path = tmp_path_factory.mktemp("llama-tiny")
    LlamaForCausalLM(config).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def ray_session():
    # address="local": a Ray of its own even when another test run has one on this machine.
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def _batch(seed: int):
    """8 rows (4 per rank) whose prompts share 20 tokens, then differ; mixed rewards."""
    shared = tuple(40 + (seed * 5 + k) % 200 for k in range(20))
    samples = []
    for i in range(8):
        prompt = shared + tuple(300 + (seed + i * 7 + k) % 150 for k in range(1 + i % 4))
        response = tuple(100 + (seed * 3 + i + k) % 90 for k in range(2 + i % 3))
        turn = Turn(prompt, response, tuple(-3.0 for _ in response), (1,) * len(response), 0,
                    "", "")
        samples.append(Sample(f"s{i}", (turn,), float(i % 2)))
    return build_batch([Group(f"g{seed}", "t", tuple(samples))], 0, AlgoConfig())


def _uneven_batch(long_rows: int, short_rows: int):
    """``long_rows`` rows of 43 tokens sharing a 20-token prefix (one per micro-batch of 64
    tokens), then ``short_rows`` short rows with nothing in common: split over two ranks, the
    ranks' micro-batches differ in number and in shared prefixes."""
    shared = tuple(50 + k for k in range(20))
    samples = []
    for i in range(long_rows + short_rows):
        prompt = shared + tuple(300 + (i * 7 + k) % 150 for k in range(20)) \
            if i < long_rows else tuple(80 + i * 9 + k for k in range(3 + i % 3))
        response = tuple(100 + (i * 5 + k) % 90 for k in range(3))
        turn = Turn(prompt, response, (-3.0,) * 3, (1,) * 3, 0, "", "")
        samples.append(Sample(f"u{i}", (turn,), float(i % 2)))
    return build_batch([Group("gu", "t", tuple(samples))], 0, AlgoConfig())


def _engine(strategy: str, workers: int, **kw) -> EngineConfig:
    return EngineConfig(workers=workers, strategy=strategy, num_cpus_per_worker=0.5,
                        threads_per_worker=1, micro_batch_tokens=64, autocast="off",
                        optim=OptimConfig(lr=1e-3, weight_decay=0.01), **kw)


def _step(workers, batch):
    shards = batch.split(len(workers))
    tokens, seqs = int(batch.num_tokens()), int(batch.num_seqs())
    return ray.get([w.step.remote(s, tokens, seqs) for w, s in zip(workers, shards)])


def _rank0(workers, engine, method, *args):
    ref, others = call_for_rank0(workers, engine, method, *args)
    out = ray.get(ref)
    assert ray.get(others) == [None] * len(others)
    return out


def _close(a: dict, b: dict, atol: float) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k], b[k], atol=atol, rtol=1e-4), \
            (k, float((a[k] - b[k]).abs().max()))


def _optim_close(a: dict, b: dict) -> None:
    assert a["state"].keys() == b["state"].keys() and a["state"]
    for name, sa in a["state"].items():
        sb = b["state"][name]
        assert float(sa["step"]) == float(sb["step"])
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.allclose(sa[key], sb[key], atol=1e-9, rtol=1e-5), (name, key)


def _stop(*ranks) -> None:
    """Stop each start_workers' ranks and give back their placement group (the module's Ray
    has room for a few groups only)."""
    for workers in ranks:
        ray.get([w.shutdown.remote() for w in workers])
        for w in workers:
            ray.kill(w)
        workers.remove_placement()


def test_fsdp2_step_equals_ddp_and_resumes_at_another_world_size(model_path, ray_session,
                                                                  tmp_path):
    # After the compared step: shards whose micro-batches differ (4 and 1 before the ranks
    # agree; a shared prefix on one rank only).
    batch, after = _batch(1), _uneven_batch(4, 4)
    ddp_cfg, fsdp_cfg = _engine("ddp", 2), _engine("fsdp2", 2)
    ddp = start_workers(model_path, ddp_cfg, AlgoConfig())
    fsdp = start_workers(model_path, fsdp_cfg, AlgoConfig())
    before = _rank0(fsdp, fsdp_cfg, "state_dict")
    _close(before, ray.get(ddp[0].state_dict.remote()), 0.0)

    m_ddp, m_fsdp = _step(ddp, batch), _step(fsdp, batch)
    assert all(m["micro_batches"] == 2 for m in m_ddp + m_fsdp)
    assert [m["sharded"] for m in m_fsdp] == [1.0, 1.0] and m_ddp[0]["sharded"] == 0.0
    assert sum(m["loss"] for m in m_fsdp) == pytest.approx(sum(m["loss"] for m in m_ddp),
                                                           rel=1e-5, abs=1e-7)
    # The norm over both ranks' shards, the same on every rank, and DDP's.
    assert m_fsdp[0]["grad_norm"] == pytest.approx(m_fsdp[1]["grad_norm"], rel=1e-6)
    assert m_fsdp[0]["grad_norm"] == pytest.approx(m_ddp[0]["grad_norm"], rel=1e-5)
    stepped = _rank0(fsdp, fsdp_cfg, "state_dict")
    _close(stepped, ray.get(ddp[0].state_dict.remote()), 2e-6)
    assert not torch.equal(stepped["model.layers.0.mlp.up_proj.weight"],
                           before["model.layers.0.mlp.up_proj.weight"])
    # Tied: one tensor under both names, as DDP gives it.
    assert stepped["lm_head.weight"] is stepped["model.embed_tokens.weight"]

    # The published weights, gathered a tensor at a time on every rank.
    published = _rank0(fsdp, fsdp_cfg, "published_state")
    assert not isinstance(published, PartialWeights)
    _close(published, stepped, 0.0)

    # A sharded checkpoint from both ranks; a full one from DDP beside it.
    ckpt = CheckpointConfig(dir=str(tmp_path / "fsdp"), keep=1)
    path = _rank0(fsdp, fsdp_cfg, "save_checkpoint", ckpt, 1, 1, {"trained_groups": ["g1"]})
    manager = CheckpointManager(ckpt)
    assert manager.latest_path() == tmp_path / "fsdp" / "step-000001"
    loaded = manager.load(path)
    assert loaded.sharded and loaded.trainer_state == {"trained_groups": ["g1"]}
    assert {f.name for f in (tmp_path / "fsdp" / "step-000001" / "sharded").iterdir()} == {
        ".metadata", "__0_0.distcp", "__1_0.distcp"}
    saved_optim = _rank0(fsdp, fsdp_cfg, "full_optimizer_state")
    ddp_ckpt = CheckpointConfig(dir=str(tmp_path / "ddp"))
    ddp_path = ray.get(ddp[0].save_checkpoint.remote(ddp_ckpt, 1, 1, {}))
    _optim_close(saved_optim, ray.get(ddp[0].full_optimizer_state.remote()))

    # The two-rank run goes on one step.
    assert [m["micro_batches"] for m in _step(fsdp, after)] == [4.0, 1.0]
    two_ranks = _rank0(fsdp, fsdp_cfg, "state_dict")
    _stop(ddp, fsdp)

    # One FSDP2 rank resumes from the two ranks' shards (DCP reshards), and steps the same.
    one_cfg = _engine("fsdp2", 1)
    one = start_workers(model_path, one_cfg, AlgoConfig())
    assert ray.get(one[0].load_checkpoint.remote(ckpt, path)) == 1
    _close(_rank0(one, one_cfg, "state_dict"), stepped, 0.0)
    _optim_close(_rank0(one, one_cfg, "full_optimizer_state"), saved_optim)
    _step(one, after)
    _close(_rank0(one, one_cfg, "state_dict"), two_ranks, 2e-6)

    # DDP (one rank) loads the sharded checkpoint; FSDP2 loads DDP's full one.
    plain = start_workers(model_path, _engine("ddp", 1), AlgoConfig())
    ray.get(plain[0].load_checkpoint.remote(ckpt, path))
    _close(ray.get(plain[0].state_dict.remote()), stepped, 0.0)
    _optim_close(ray.get(plain[0].full_optimizer_state.remote()), saved_optim)
    ray.get(one[0].load_checkpoint.remote(ddp_ckpt, ddp_path))
    _close(_rank0(one, one_cfg, "state_dict"), stepped, 2e-6)
    _optim_close(_rank0(one, one_cfg, "full_optimizer_state"), saved_optim)
    _stop(one, plain)


def test_fsdp2_train_layers_publishes_only_the_top_layers(model_path, ray_session):
    cfg = _engine("fsdp2", 2, train_layers=1)
    workers = start_workers(model_path, cfg, AlgoConfig())
    before = _rank0(workers, cfg, "state_dict")
    _step(workers, _batch(3))
    part = _rank0(workers, cfg, "published_state")
    assert isinstance(part, PartialWeights)
    assert part and all(k.startswith("model.layers.3.") or k == "model.norm.weight"
                        for k in part)
    after = _rank0(workers, cfg, "state_dict")
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and changed <= set(part)
    _close({k: after[k] for k in part}, dict(part), 0.0)
    _stop(workers)


def test_fsdp2_bf16_compute_moves_every_fp32_master_weight(model_path, ray_session):
    """Under FSDP2, bf16 compute (bf16 gathers, fp32 gradient reduction) with gradient
    checkpointing at lr 1e-6: every sharded fp32 weight moves as DDP's fp32 step moves it."""
    updates = []
    for strategy, extra in (("ddp", {"autocast": "off"}), ("fsdp2", {"dtype": "bfloat16",
                                                   "gradient_checkpointing": True})):
        cfg = EngineConfig(workers=2, strategy=strategy, num_cpus_per_worker=0.5,
                           threads_per_worker=1, micro_batch_tokens=64,
                           optim=OptimConfig(lr=1e-6), **extra)
        workers = start_workers(model_path, cfg, AlgoConfig())
        before = _rank0(workers, cfg, "state_dict")
        # Rank 0 has two micro-batches, rank 1 one row: FSDP2 runs a zero-weighted filler.
        metrics = _step(workers, _uneven_batch(2, 1))
        assert metrics[0]["bf16"] == float(strategy == "fsdp2")
        after = _rank0(workers, cfg, "state_dict")
        updates.append(torch.cat([(after[k] - before[k]).flatten() for k in before
                                  if k != "lm_head.weight"]))
        _stop(workers)
    fp32, bf16 = updates
    assert (fp32 != 0).float().mean() > 0.99 and (bf16 != 0).float().mean() > 0.99
    assert (torch.sign(bf16) == torch.sign(fp32)).float().mean() > 0.98
    assert float(bf16.abs().mean()) == pytest.approx(float(fp32.abs().mean()), rel=0.1)


def test_grpo_trainer_under_fsdp2_publishes_checkpoints_and_resumes(model_path, ray_session,
                                                                    redis_server, tmp_path):
    """The GRPO loop's calls that read the weights or write a checkpoint reach every rank
    under FSDP2 (rank 0's answer used): publish (streamed over a weight group to a real
    policy server, each tensor gathered as it is sent; and by the object store), the sharded
    checkpoint, restore, and the final Hugging Face folder."""
    from transformers import AutoModelForCausalLM

    from rollout_service.agent import SamplingParams
    from rollout_service.policy import PolicyConfig, PolicyServerActor, TransformersEngine
    from trainer.config import WeightsConfig
    from trainer.weight_sync import WeightPublisher

    from rollout_service.experience import ExperienceStream, StreamConfig
    from trainer.config import TrainerConfig
    from trainer.grpo import GRPOTrainer
    from trainer.stream import ConsumerConfig

    cfg = _engine("fsdp2", 2)
    workers = start_workers(model_path, cfg, AlgoConfig())
    stream_cfg = StreamConfig(url=redis_server.url, stream="t:fsdp2")
    stream = ExperienceStream(stream_cfg)
    for seed in range(3):
        stream.push(_batch_group(seed))
    config = TrainerConfig(steps=2, engine=cfg, consumer=ConsumerConfig(block_ms=200),
                           checkpoint=CheckpointConfig(dir=str(tmp_path / "ckpt")),
                           read_timeout_s=20, weights=WeightsConfig(chunk_mib=1, timeout_s=60))
    server = PolicyServerActor.options(num_cpus=0.1).remote(
        PolicyConfig(model=model_path, backend="transformers"), None, None, "policy-0")
    publisher = WeightPublisher([server], workers, config.weights, cfg)

    def trainer() -> GRPOTrainer:
        return GRPOTrainer(config, stream_cfg, 1, workers, publisher, 0, tmp_path / "run")
    first = trainer()
    first.start()
    first.run(2)
    assert ray.get(server.version.remote()) == 2 and set(publisher.keys) == {0}
    state = _rank0(workers, cfg, "state_dict")
    local = TransformersEngine(model_path)
    local.update_weights(2, state)
    sampling = SamplingParams(6, 1.0, seed=5)
    want = local.generate([5, 17, 99, 3, 42], sampling)
    served = ray.get(server.generate.remote([5, 17, 99, 3, 42], sampling))
    assert served.token_ids == want.token_ids
    assert served.logprobs == pytest.approx(want.logprobs, abs=1e-5)
    # The object-store path reads the weights through every rank too.
    WeightPublisher([server], workers, WeightsConfig(transport="object_store"), cfg)(3)
    served = ray.get(server.generate.remote([5, 17, 99, 3, 42], sampling))
    assert ray.get(server.version.remote()) == 3 and served.token_ids == want.token_ids
    latest = CheckpointManager(config.checkpoint).latest()
    assert latest.step == 2 and latest.sharded

    _step(workers, _batch(9))                            # trained past the checkpoint
    again = trainer()
    assert again.restore() and (again.step, again.version) == (2, 2)
    _close(_rank0(workers, cfg, "state_dict"), state, 0.0)

    folder = _rank0(workers, cfg, "save_pretrained", str(tmp_path / "final"))
    saved = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).state_dict()
    _close({k: saved[k] for k in state}, state, 0.0)
    _stop(workers)
    ray.kill(server)


def _batch_group(seed: int) -> Group:
    def turn(i: int) -> Turn:
        prompt = tuple(10 + (seed * 7 + i + k) % 300 for k in range(20 + i))
        response = tuple(100 + (seed * 3 + i + k) % 90 for k in range(3))
        return Turn(prompt, response, (-2.0,) * 3, (1,) * 3, 0, "", "")
    return Group(f"g{seed}", "t", tuple(Sample(f"s{seed}-{i}", (turn(i),), float(i % 2))
                                        for i in range(4)))
