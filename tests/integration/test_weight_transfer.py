"""Weights over a process group of their own (real gloo between real processes): a state dict
arrives exactly (cast to the receiver's dtype, a tied weight sent once, tensors larger than a
chunk, many chunks); a receiver that dies or hangs makes the sender report it within the
group's timeout instead of hanging; a sender that gives up makes the receiver raise at once;
and a transformers PolicyServer (a Ray actor) loads a streamed update, whole or partial, to the
same generations as the same weights through the object store."""
from __future__ import annotations

import multiprocessing
import os
import pickle
import time

import pytest

torch = pytest.importorskip("torch")
ray = pytest.importorskip("ray")

from consolerl.tensors import PartialWeights  # noqa: E402
from rollout_service.agent import SamplingParams  # noqa: E402
from rollout_service.models import cached_tiny_model  # noqa: E402
from rollout_service.policy import PolicyConfig, PolicyServerActor  # noqa: E402
from rollout_service.weight_transfer import (GroupSpec, WeightSender,  # noqa: E402
                                             join_group, receive)
from tests.integration.weight_kit import stream_update  # noqa: E402

_CTX = multiprocessing.get_context("spawn")


def _receiver(spec: dict, behaviour: str, queue) -> None:
    """A receiving process: ``keep`` sums what arrives and reports it; ``die`` exits after the
    first chunk; ``hang`` joins and never receives; ``expect_error`` reports the error."""
    group = join_group(GroupSpec(**spec), 1)
    if behaviour == "hang":
        time.sleep(60)
        return
    got: dict = {}

    def load(pairs, partial):
        if behaviour == "die":
            os._exit(3)
        for name, t in pairs:
            got[name] = (str(t.dtype), tuple(t.shape), t.double().sum().item())
    try:
        stats = receive(group, load)
        queue.put(("ok", stats, got))
    except Exception as exc:  # noqa: BLE001 - reported to the test
        queue.put(("error", f"{type(exc).__name__}: {exc}", got))


def _start(sender, key, behaviour, timeout_s=20.0):
    spec = sender.open(key, 2, "gloo", timeout_s)
    queue = _CTX.Queue()
    proc = _CTX.Process(target=_receiver, args=(spec.as_dict(), behaviour, queue))
    proc.start()
    return proc, queue


def test_group_spec_round_trips_and_refuses_bad_values():
    spec = GroupSpec("k", "10.0.0.1", 1234, 3, "nccl", 5.0)
    assert pickle.loads(pickle.dumps(spec)) == spec == GroupSpec(**spec.as_dict())
    with pytest.raises(ValueError, match="backend"):
        GroupSpec("k", "h", 1, 2, "mpi")
    with pytest.raises(ValueError, match="world"):
        GroupSpec("k", "h", 1, 1)


def test_a_state_dict_arrives_exactly_in_the_receivers_dtype():
    sender = WeightSender("127.0.0.1")
    proc, queue = _start(sender, "exact", "keep")
    gen = torch.Generator().manual_seed(0)
    emb = torch.randn(1000, 64, generator=gen)
    state = {"embed.weight": emb, "head.weight": emb,            # tied: sent once
             "big.weight": torch.randn(400, 1000, generator=gen),  # 0.8 MB > a chunk
             "norm.weight": torch.randn(7, generator=gen), "scale": torch.tensor(3.0),
             "positions": torch.arange(5)}
    out = sender.send(iter(state.items()), ["exact"], "bfloat16", chunk_bytes=300_000)
    kind, stats, got = queue.get(timeout=60)
    proc.join(30)
    assert kind == "ok" and out["exact"]["ok"], (stats, out)
    assert sorted(got) == sorted(set(state) - {"head.weight"})
    for name, (dtype, shape, total) in got.items():
        want = state[name].to(torch.bfloat16) if state[name].is_floating_point() \
            else state[name]
        assert dtype == str(want.dtype) and shape == tuple(want.shape)
        assert total == want.double().sum().item(), name
    assert stats["tensors"] == 5 and stats["bytes"] == out["exact"]["bytes"] > 0
    # bf16: half the fp32 bytes (plus alignment)
    fp32 = sum(t.numel() * 4 for k, t in state.items() if k not in ("head.weight", "positions"))
    assert stats["bytes"] < 0.55 * fp32 + 4096


def test_a_receiver_that_dies_is_reported_at_once_and_the_others_go_on():
    sender = WeightSender("127.0.0.1")
    dead, _ = _start(sender, "dead", "die")
    alive, queue = _start(sender, "alive", "keep")
    state = {f"w{i}": torch.full((256, 1024), float(i)) for i in range(8)}   # 1 MiB each
    t0 = time.monotonic()
    out = sender.send(iter(state.items()), ["dead", "alive"], chunk_bytes=2**20)
    assert time.monotonic() - t0 < 15
    assert not out["dead"]["ok"] and "dead" in out["dead"]["error"]
    assert out["alive"]["ok"]
    kind, stats, got = queue.get(timeout=60)
    assert kind == "ok" and sorted(got) == sorted(state)
    dead.join(30)
    alive.join(30)
    assert dead.exitcode == 3
    assert "dead" not in sender.groups            # dropped: a new group next time


def test_a_receiver_that_hangs_fails_the_sender_within_the_timeout():
    sender = WeightSender("127.0.0.1")
    proc, _ = _start(sender, "hang", "hang", timeout_s=3.0)
    t0 = time.monotonic()
    out = sender.send(iter({"w": torch.ones(2**20)}.items()), ["hang"], chunk_bytes=2**20)
    took = time.monotonic() - t0
    proc.kill()
    proc.join(30)
    assert not out["hang"]["ok"] and "3 s" in out["hang"]["error"], out
    assert took < 3.0 * 3 + 5, took


def test_a_sender_that_gives_up_stops_the_receiver_at_once():
    sender = WeightSender("127.0.0.1")
    proc, queue = _start(sender, "abort", "keep")

    def pairs():
        yield "w0", torch.ones(1000)
        yield "w1", torch.ones(1000)
        raise RuntimeError("gather failed on rank 3")
    with pytest.raises(RuntimeError, match="rank 3"):
        sender.send(pairs(), ["abort"], chunk_bytes=1000 * 4)
    kind, message, _ = queue.get(timeout=30)
    proc.join(30)
    assert kind == "error" and "gave up" in message and "rank 3" in message


# -- into a running transformers PolicyServer -------------------------------------------------


@pytest.fixture(scope="module")
def servers():
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    model = str(cached_tiny_model())
    config = PolicyConfig(model=model, backend="transformers", seed=0)
    a = PolicyServerActor.options(num_cpus=0.5).remote(config, None, None, "collective")
    b = PolicyServerActor.options(num_cpus=0.5).remote(config, None, None, "object-store")
    try:
        yield model, a, b
    finally:
        ray.shutdown()


def _collective_update(sender, server, key, version, state, partial=False):
    """One collective update of ``server`` from this process (the trainer's side)."""
    return stream_update(sender, server, key, version, state, partial, timeout_s=30.0,
                         receive_timeout_s=60, chunk_bytes=2**20)


def test_a_streamed_update_serves_what_the_object_store_update_serves(servers):
    from transformers import AutoModelForCausalLM
    model, collective, object_store = servers
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    perturbed = {k: v + 0.5 * torch.randn(v.shape, generator=gen)
                 for k, v in hf.state_dict().items()}
    prompt = [5, 17, 99, 3, 42]
    before = ray.get(collective.generate.remote(prompt, SamplingParams(8, 0.0)))

    sender = WeightSender("127.0.0.1")
    stats = _collective_update(sender, collective, "tf-0", 1, perturbed)
    ray.get(object_store.update_weights.remote(1, ray.put(perturbed)))
    a = ray.get(collective.generate.remote(prompt, SamplingParams(8, 1.0, seed=5)))
    b = ray.get(object_store.generate.remote(prompt, SamplingParams(8, 1.0, seed=5)))
    assert a.version == b.version == 1 and stats["bytes"] > 0 and not stats["partial"]
    assert a.token_ids == b.token_ids and a.logprobs == b.logprobs
    after = ray.get(collective.generate.remote(prompt, SamplingParams(8, 0.0)))
    assert after.logprobs != before.logprobs            # the weights did change

    # A partial update (what train_layers publishes): the top layer and the norm only.
    top = max(int(k.split(".")[2]) for k in perturbed if k.startswith("model.layers."))
    part = PartialWeights({k: v * 0.5 for k, v in perturbed.items()
                           if k.startswith(f"model.layers.{top}.") or k == "model.norm.weight"})
    stats = _collective_update(sender, collective, "tf-0", 2, part, partial=True)
    ray.get(object_store.update_weights.remote(2, ray.put(part)))
    a = ray.get(collective.generate.remote(prompt, SamplingParams(8, 1.0, seed=6)))
    b = ray.get(object_store.generate.remote(prompt, SamplingParams(8, 1.0, seed=6)))
    assert stats["partial"] and stats["tensors"] == len(part)
    assert a.version == b.version == 2 and a.logprobs == b.logprobs

    # A sender that dies mid-update: the replica refuses to generate until whole weights
    # arrive (some of its weights may be new), then serves again.
    spec = sender.open("tf-1", 2, "gloo", 5.0)
    ray.get(collective.open_weight_group.remote(spec), timeout=60)
    ref = collective.receive_weights.remote(3, "tf-1")

    def broken():
        yield "model.norm.weight", perturbed["model.norm.weight"]
        raise RuntimeError("trainer crashed")
    with pytest.raises(RuntimeError):
        sender.send(broken(), ["tf-1"], "float32", 16)
    with pytest.raises(ray.exceptions.RayTaskError, match="gave up"):
        ray.get(ref, timeout=60)
    assert ray.get(collective.version.remote()) == -1
    ray.get(collective.update_weights.remote(3, ray.put(perturbed)))
    assert ray.get(collective.version.remote()) == 3


def test_a_freed_tensor_whose_address_is_reused_is_not_taken_for_a_tied_one():
    """An iterator that gathers each weight into a tensor of its own and drops it (FSDP) may
    hand out the next weight at the freed one's address with the same shape: it is still
    sent. (Here the memory is reused on purpose, so that it is every time.)"""
    sender = WeightSender("127.0.0.1")
    proc, queue = _start(sender, "reuse", "keep")

    def gathered():
        memory = bytearray(4096)
        for i in range(4):
            t = torch.frombuffer(memory, dtype=torch.float32)
            t.fill_(float(i))
            yield f"layers.{i}.weight", t
            del t
    out = sender.send(gathered(), ["reuse"], chunk_bytes=2**20)
    kind, stats, got = queue.get(timeout=60)
    proc.join(30)
    assert kind == "ok" and out["reuse"]["ok"]
    assert {k: v[2] for k, v in got.items()} == {f"layers.{i}.weight": 1024.0 * i
                                                 for i in range(4)}
