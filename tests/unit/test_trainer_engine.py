"""One trainer worker in process (world size 1, the tiny model): a full fine-tuning step moves
the weights along the advantage, LoRA trains only the adapters and publishes merged weights in
the base model's names (what a PolicyServer loads)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from rollout_service.agent import SamplingParams
from consolerl.experience import Turn
from consolerl.experience import Group, Sample
from rollout_service.models import cached_tiny_model  # noqa: E402
from rollout_service.policy import TransformersEngine  # noqa: E402
from trainer.algo import AlgoConfig, build_batch, response_logprobs  # noqa: E402
from trainer.engine import EngineConfig, LoraConfig, OptimConfig, TrainerWorker  # noqa: E402


@pytest.fixture(scope="module")
def tiny():
    return str(cached_tiny_model())


def _batch():
    good = Turn((5, 6, 7, 8), (20, 21, 2), (-3.0, -3.0, -3.0), (1, 1, 1), 0, "", "")
    bad = Turn((5, 6, 7, 8), (30, 31, 2), (-3.0, -3.0, -3.0), (1, 1, 1), 0, "", "")
    group = Group("g", "t", (Sample("a", (good,), 1.0), Sample("b", (bad,), 0.0)))
    return build_batch([group], 0, AlgoConfig())


def _logprobs(worker, batch):
    with torch.no_grad():
        out = worker.model(input_ids=batch.input_ids_BT, attention_mask=batch.attention_mask_BT,
                           position_ids=batch.position_ids_BT)
    return response_logprobs(out.logits.float(), batch, 1.0)


def test_full_step_raises_the_rewarded_response_and_lowers_the_other(tiny):
    worker = TrainerWorker(0, 1, tiny, EngineConfig(micro_batch_tokens=64,
                                                        optim=OptimConfig(lr=1e-2)),
                               AlgoConfig())
    worker.init_distributed("")
    batch = _batch()
    before = _logprobs(worker, batch)
    metrics = worker.step(batch, int(batch.num_tokens()), int(batch.num_seqs()))
    after = _logprobs(worker, batch)
    assert metrics["tokens"] == 6 and metrics["micro_batches"] == 1 and metrics["grad_norm"] > 0
    # No KL term: the step's loss is its policy-gradient loss (counted once); one update per
    # batch, so the ratio is 1: nothing clipped, no drift between old and new.
    assert metrics["loss"] == pytest.approx(metrics["pg_loss"], abs=1e-9)
    assert metrics["pg_clipfrac"] == 0.0 and metrics["ppo_kl"] == pytest.approx(0.0, abs=1e-9)
    assert after[0].sum() > before[0].sum()             # advantage +1: more likely
    assert after[1].sum() < before[1].sum()             # advantage -1: less likely


def test_lora_trains_adapters_and_publishes_merged_weights_in_base_names(tiny):
    worker = TrainerWorker(0, 1, tiny, EngineConfig(
        micro_batch_tokens=64, optim=OptimConfig(lr=5e-2),
        lora=LoraConfig(rank=4, alpha=8, target_modules=("q_proj", "v_proj"))), AlgoConfig())
    worker.init_distributed("")
    engine = TransformersEngine(tiny)
    base = {k: v.clone() for k, v in engine.model.state_dict().items()}
    assert all("lora_" in n for n, p in worker.model.named_parameters() if p.requires_grad)
    batch = _batch()
    for _ in range(2):
        worker.step(batch, int(batch.num_tokens()), int(batch.num_seqs()))
    merged = worker.state_dict()
    assert set(merged) == set(base)                      # the base model's own names
    changed = [k for k in base if not torch.equal(base[k], merged[k])]
    assert changed and all(("q_proj" in k or "v_proj" in k) for k in changed)
    # The adapters stay separate inside the worker (unmerged after publishing).
    assert all(torch.equal(p, base[k.removeprefix("base_model.model.")
                                     .replace(".base_layer.", ".")])
               for k, p in worker.model.state_dict().items()
               if "lora_" not in k and "q_proj" in k)
    prompt = [5, 6, 7, 8]
    old = engine.generate(prompt, SamplingParams(4, 0.0))
    engine.update_weights(1, merged)
    new = engine.generate(prompt, SamplingParams(4, 0.0))
    assert new.version == 1 and new.logprobs != old.logprobs


def _grad_norm_of_one_step(tiny, **engine):
    worker = TrainerWorker(0, 1, tiny, EngineConfig(micro_batch_tokens=64,
                                                        optim=OptimConfig(lr=1e-3), **engine),
                               AlgoConfig())
    worker.init_distributed("")
    batch = _batch()
    return worker.step(batch, int(batch.num_tokens()), int(batch.num_seqs())), worker


def test_bf16_autocast_and_gradient_checkpointing_give_the_fp32_gradient(tiny):
    fp32, _ = _grad_norm_of_one_step(tiny, autocast="off")
    bf16, worker = _grad_norm_of_one_step(tiny, autocast="bfloat16")
    ckpt, _ = _grad_norm_of_one_step(tiny, autocast="off", gradient_checkpointing=True)
    assert fp32["bf16"] == 0.0 and bf16["bf16"] == 1.0
    assert worker.autocast == torch.bfloat16
    # master weights stay fp32 under autocast
    assert all(p.dtype == torch.float32 for p in worker.model.parameters())
    assert bf16["grad_norm"] == pytest.approx(fp32["grad_norm"], rel=0.05)
    assert ckpt["grad_norm"] == pytest.approx(fp32["grad_norm"], rel=1e-4)
    assert bf16["padded_tokens"] >= bf16["tokens"]


def test_autocast_auto_follows_the_cpu(monkeypatch):
    from trainer import engine as eng
    monkeypatch.setattr(eng, "native_bf16", lambda device: True)
    assert eng.autocast_dtype(EngineConfig(), "cpu") == torch.bfloat16
    assert eng.autocast_dtype(EngineConfig(autocast="off"), "cpu") is None
    monkeypatch.setattr(eng, "native_bf16", lambda device: False)
    assert eng.autocast_dtype(EngineConfig(), "cpu") is None
    assert eng.autocast_dtype(EngineConfig(autocast="bfloat16"), "cpu") == torch.bfloat16
    # dtype: bfloat16 is bf16 compute on any device (over fp32 weights)
    assert eng.autocast_dtype(EngineConfig(dtype="bfloat16"), "cpu") == torch.bfloat16
    with pytest.raises(Exception, match="EngineConfig.autocast"):
        EngineConfig(autocast="fp8")
    with pytest.raises(Exception, match="EngineConfig.memory_gib"):
        EngineConfig(memory_gib=-1)


def _one_step_update(tiny, **engine):
    worker = TrainerWorker(0, 1, tiny, EngineConfig(micro_batch_tokens=64,
                                                    optim=OptimConfig(lr=1e-6), **engine),
                           AlgoConfig())
    worker.init_distributed("")
    before = {n: p.detach().clone() for n, p in worker.model.named_parameters()}
    batch = _batch()
    metrics = worker.step(batch, int(batch.num_tokens()), int(batch.num_seqs()))
    assert all(p.dtype == torch.float32 for p in worker.model.parameters())   # master weights
    after = dict(worker.model.named_parameters())
    return metrics, torch.cat([(after[n].detach() - b).flatten() for n, b in before.items()])


def test_bf16_steps_move_every_weight_as_fp32_steps_do(tiny):
    """At lr 1e-6 an AdamW update is ~1e-6 per weight: on bf16 weights (a rounding step of
    ~1e-4 at |w| ~ 0.02) nearly all of it was lost; over fp32 master weights it lands."""
    fp32, d32 = _one_step_update(tiny, autocast="off")
    bf16, d16 = _one_step_update(tiny, dtype="bfloat16")
    assert fp32["bf16"] == 0.0 and bf16["bf16"] == 1.0
    assert (d32 != 0).float().mean() > 0.99
    assert (d16 != 0).float().mean() > 0.99
    assert (torch.sign(d16) == torch.sign(d32)).float().mean() > 0.98
    assert float(d16.abs().mean()) == pytest.approx(float(d32.abs().mean()), rel=0.1)


def test_engine_config_refuses_what_it_cannot_train():
    with pytest.raises(Exception, match="EngineConfig.dtype: float16 .* use bfloat16"):
        EngineConfig(dtype="float16")
    with pytest.raises(Exception, match="EngineConfig.autocast: off contradicts dtype"):
        EngineConfig(dtype="bfloat16", autocast="off")
    with pytest.raises(Exception, match="EngineConfig.lora.rank: 4 with strategy fsdp2"):
        EngineConfig(strategy="fsdp2", lora=LoraConfig(rank=4))
    with pytest.raises(Exception, match="EngineConfig.strategy"):
        EngineConfig(strategy="zero3")


def _prefixed_batch():
    """Three rows whose prompts share 20 tokens, then differ in content and length (left
    padding differs), with responses of different lengths."""
    shared = tuple(range(40, 60))
    turns = [Turn(shared + (7, 8, 9), (20, 21, 2), (-3.0,) * 3, (1, 1, 1), 0, "", ""),
             Turn(shared + (11, 12, 13, 14, 15, 16), (30, 2), (-3.0,) * 2, (1, 1), 0, "", ""),
             Turn(shared + (9,), (22, 23, 24, 2), (-3.0,) * 4, (1, 1, 1, 1), 0, "", "")]
    samples = tuple(Sample(f"s{i}", (t,), float(i % 2)) for i, t in enumerate(turns))
    return build_batch([Group("g", "t", samples)], 0, AlgoConfig())


def test_common_prefix_counts_the_tokens_every_row_shares():
    from trainer.engine import common_prefix
    batch = _prefixed_batch()
    assert common_prefix(batch) == 20
    assert common_prefix(batch.rows([2])) == 20       # one row keeps its last prompt token
    assert common_prefix(_batch()) == 3               # identical prompts of 4: all but one


def test_a_shared_prefix_runs_once_and_gives_the_same_logprobs_and_gradient(tiny):
    from trainer.engine import common_prefix
    batch = _prefixed_batch()
    results = []
    for share in (False, True):
        worker = TrainerWorker(0, 1, tiny, EngineConfig(autocast="off", share_prefix=share),
                                   AlgoConfig())
        worker.init_distributed("")
        calls = []
        worker.model.register_forward_hook(lambda m, a, kw, out: calls.append(
            tuple(kw["input_ids"].shape)), with_kwargs=True)
        new = worker._forward(worker.model, batch)
        (new * torch.tensor([[1.0], [-1.0], [0.5]])).sum().backward()
        grads = {n: p.grad.clone() for n, p in worker.model.named_parameters()
                 if p.grad is not None}
        results.append((new.detach(), grads, calls))
    (plain, plain_grads, plain_calls), (shared, shared_grads, shared_calls) = results
    assert common_prefix(batch) == 20
    assert plain_calls == [tuple(batch.input_ids_BT.shape)]
    # the prefix once (batch 1, 20 tokens), then every row without it
    assert shared_calls[0] == (1, 20) and shared_calls[1][0] == 3
    assert shared_calls[1][1] == batch.input_ids_BT.shape[1] - 20
    assert torch.allclose(plain, shared, atol=1e-5)
    assert set(plain_grads) == set(shared_grads)
    for name, g in plain_grads.items():
        assert torch.allclose(g, shared_grads[name], atol=1e-5, rtol=1e-4), name


def test_train_layers_trains_only_the_top_layers_and_publishes_the_whole_model(tiny):
    worker = TrainerWorker(0, 1, tiny, EngineConfig(train_layers=1, autocast="off",
                                                        optim=OptimConfig(lr=1e-2)),
                               AlgoConfig())
    worker.init_distributed("")
    layers = len(worker.model.model.layers)
    before = {k: v.clone() for k, v in worker.state_dict().items()}
    batch = _prefixed_batch()
    metrics = worker.step(batch, int(batch.num_tokens()), int(batch.num_seqs()))
    after = worker.state_dict()
    assert metrics["grad_norm"] > 0 and set(after) == set(before)
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    top = f"model.layers.{layers - 1}."
    assert changed and all(k.startswith(top) or k == "model.norm.weight" for k in changed)
    assert any(k.startswith(top) for k in changed)
    # Published: only what trains, marked partial; a policy engine loads it and keeps the rest.
    from consolerl.tensors import PartialWeights
    part = worker.published_state()
    assert isinstance(part, PartialWeights) and set(part) <= changed | {"model.norm.weight"}
    engine = TransformersEngine(tiny)
    prompt = [5, 6, 7, 8]
    old = engine.generate(prompt, SamplingParams(4, 0.0))
    engine.update_weights(1, part)
    assert engine.generate(prompt, SamplingParams(4, 0.0)).logprobs != old.logprobs
    assert all(torch.equal(engine.model.state_dict()[k], after[k]) for k in after
               if k != "lm_head.weight")
    with pytest.raises(ValueError, match="missing"):
        engine.update_weights(2, dict(part))         # a plain dict must be the whole model
    # Resumed from a checkpoint, the frozen layers are the checkpoint's: publish everything.
    worker.load_training_state(*worker.training_state())
    full = worker.published_state()
    assert not isinstance(full, PartialWeights) and set(full) == set(after)
    with pytest.raises(Exception, match="EngineConfig.train_layers: 99 is more than"):
        TrainerWorker(0, 1, tiny, EngineConfig(train_layers=99), AlgoConfig())
    with pytest.raises(Exception, match="EngineConfig.train_layers"):
        EngineConfig(train_layers=-1)
