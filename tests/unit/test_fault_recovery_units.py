"""Recovery paths the fault-injection suite exercises end to end, one by one: a restarted
policy replica refuses to serve until it has the trainer's weights; the job says why it
stopped (a full disk named as such); lease marks in user agents parse back."""
from __future__ import annotations

import errno

import pytest

from trainer.failures import describe_failure
from consolerl.accounts import lease_agent, parse_lease_agent
from rollout_service.policy import PolicyServer, PolicyUnavailable, SamplingParams
from tests.conftest import run_async


class StubEngine:
    """Stands in for the model: this test is about the server's gate, not generation."""

    def __init__(self):
        self.version, self.busy_s, self.loaded = 0, 0.0, []

    def generate(self, prompt_ids, sampling):
        raise AssertionError("a replica waiting for weights must not generate")

    def update_weights(self, version, state_dict):
        self.version = version
        self.loaded.append(version)
        return 0.01


def test_a_restarted_replica_serves_only_once_it_has_the_trainers_weights():
    server = PolicyServer(engine=StubEngine(), name="policy-0")
    assert server.awaiting_weights is False         # not a Ray actor: never reconstructed
    server.awaiting_weights = True                  # what a restart by Ray sets
    assert run_async(server.version()) == -1
    with pytest.raises(PolicyUnavailable, match="waits for the trainer's current weights"):
        run_async(server.generate([1, 2, 3], SamplingParams(max_tokens=4)))
    run_async(server.update_weights(4, {}))
    assert run_async(server.version()) == 4 and server.awaiting_weights is False


def test_a_full_disk_is_named_in_the_jobs_error():
    exc = OSError(errno.ENOSPC, "No space left on device", "/ckpt/step-000003/model.bin")
    text = describe_failure(exc)
    assert "no space left" in text and "/ckpt/step-000003" in text
    # safetensors and torch.save report it in their own words
    assert "no space left" in describe_failure(RuntimeError(
        "Error while serializing: I/O error: No space left on device (os error 28)"))
    assert describe_failure(ValueError("bad\nsecond line")) == "ValueError: bad"


def test_lease_marks_parse_back():
    mark = lease_agent("1000000000000002", 1_795_509_012_881_123)
    assert parse_lease_agent(f"Mozilla/5.0 HeadlessChrome/140 console-rl {mark}") == \
        ("1000000000000002", 1_795_509_012_881_123)
    assert parse_lease_agent("AlibabaCloud Python/3.11") is None
    assert parse_lease_agent("consolerl-lease/12/3") is None        # not an account id


# Ray 2.60's memory-monitor message for an actor it killed (abridged; as recorded here).
RAY_OOM = ("1 worker(s) were killed due to the node running low on memory. Memory on the node "
           "(IP: 192.0.2.2, ID: 540e) was 3.21GB used / 23.54GB limit (0.136419)\nOOM kill "
           "reason: Memory usage 3357401088B exceeded threshold of 3235394048B\nRay killed 1 "
           "worker(s) based on the killing policy\nSelected to kill: (Actor(8fb2): job ID=01, "
           "task name=PolicyServer.generate, required resources={}, pid=8639, actual "
           "memory used=1.97GB, worker ID=dcbf)\n]")


def test_an_actor_killed_for_memory_is_named_with_its_setting():
    from trainer.failures import describe_oom
    text = describe_failure(RuntimeError(RAY_OOM))
    assert text == ("Ray's memory monitor killed PolicyServer (pid 8639) at 1.97 GB with "
                    "the node at 3.21 of 23.54 GB: lower policy.kv_cache_gib or "
                    "policy.max_model_len")
    # Without the figure in the message, the job's own last sample of that pid.
    bare = "killed due to memory pressure (class_name: LeasedEnvWorker, pid: 77)"
    assert "at 0.5 GB" in describe_oom(RuntimeError(bare), {77: ("ray::LeasedEnvWorker",
                                                                  2**29)})
    assert describe_oom(RuntimeError("something else")) is None
