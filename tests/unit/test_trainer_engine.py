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
from trainer.engine import EngineConfig, LoraConfig, OptimConfig, TrainerWorkerBody  # noqa: E402


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
    worker = TrainerWorkerBody(0, 1, tiny, EngineConfig(micro_batch_tokens=64,
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
    worker = TrainerWorkerBody(0, 1, tiny, EngineConfig(
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
    worker = TrainerWorkerBody(0, 1, tiny, EngineConfig(micro_batch_tokens=64,
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
    assert eng.autocast_dtype(EngineConfig(dtype="bfloat16"), "cpu") is None  # bf16 weights
    monkeypatch.setattr(eng, "native_bf16", lambda device: False)
    assert eng.autocast_dtype(EngineConfig(), "cpu") is None
    assert eng.autocast_dtype(EngineConfig(autocast="bfloat16"), "cpu") == torch.bfloat16
    with pytest.raises(Exception, match="EngineConfig.autocast"):
        EngineConfig(autocast="fp8")
    with pytest.raises(Exception, match="EngineConfig.memory_gib"):
        EngineConfig(memory_gib=-1)
