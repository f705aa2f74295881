"""The orchestrator as a Ray actor built from configs/cpu.yaml (with overrides): real Redis
(leases and the experience stream), real Chromium on the local cloud, a PolicyServer actor with
a tiny random transformers model, the reward service, 2 env worker actors, groups of 2. Groups
reach the stream with the reward service's rewards, every account is released, nothing
leaks."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import ray

torch = pytest.importorskip("torch")

from cluster.builders import rollout_spec  # noqa: E402
from cluster.config import JobConfig
from cluster.rollout import TrainingRolloutsActor  # noqa: E402
from consolerl.config import load_config  # noqa: E402
from consolerl.experience import decode_group
from env_workers.accounts import PoolConfig  # noqa: E402
from env_workers.leases import AccountPool  # noqa: E402
from rollout_service.experience import ExperienceStream
from rollout_service.models import tiny_model  # noqa: E402
from tests.conftest import CloudServer, _server  # noqa: E402

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.fixture(scope="module")
def orch_cloud(tmp_path_factory) -> Iterator[CloudServer]:
    yield from _server(tmp_path_factory, "orch-cloud", ["--lookup-qps", "0", "--transition",
                                                       "0.3", "--network-ready", "0.1"])


# The turns on the env workers (their act: prompts, the policy actor's generations and the
# browser steps in the worker's process) or on the orchestrator (a call to each per turn).
@pytest.mark.parametrize("turn_loop", ["worker", "orchestrator"])
def test_groups_flow_to_the_stream_with_rewards_and_nothing_leaks(orch_cloud, redis_server,
                                                                  tmp_path, turn_loop):
    model = tiny_model(tmp_path / "tiny")
    config = load_config(JobConfig, CONFIGS / "cpu.yaml", [
        f"cloud.endpoint={orch_cloud.endpoint}", f"env.worker.console_url={orch_cloud.url}",
        "env.workers=2", "env.pool.key_prefix=test:orch", "env.num_cpus_per_worker=0.5",
        f"policy.model={model}", "policy.backend=transformers",
        "policy.num_cpus_per_replica=0.5",
        "agent.max_steps=3", "agent.max_new_tokens=12",
        "orchestrator.group_size=2", "orchestrator.groups_per_step=2",
        "orchestrator.drop_uniform_groups=false", f"orchestrator.turn_loop={turn_loop}",
        r"orchestrator.task_filter=^(ram-create-user-0|ecs-add-rule-0)$",
        "orchestrator.split=all",
        f"stream.url={redis_server.url}", f"stream.stream=test:orch:exp:{turn_loop}",
        "trail.qps=20", "trail.settle_s=20", "trail.poll_s=0.25", "trail.clock_skew_s=5",
        # One run with the reward service's judges served in the cluster (the tiny model
        # behind the chat API): the rollout side starts and stops them.
        *([f"reward.judges.endpoint=policy:{model}", "reward.judges.enabled=true",
           "reward.judges.k=1", "reward.judges.timeout_s=20", "reward.judges.deadline_s=30"]
          if turn_loop == "orchestrator" else [])])
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        actor = TrainingRolloutsActor.remote(rollout_spec(config, config.policy, None),
                                             config.orchestrator, config.stream)
        summary = ray.get(actor.run.remote(2), timeout=600)
        metrics = ray.get(actor.metrics.remote()).decode()
        ray.get(actor.drain.remote(), timeout=120)
    finally:
        ray.shutdown()
    assert summary["groups_pushed"] == 2 and summary["env_errors"] == 0, summary
    assert summary["turn_loop"] == turn_loop
    assert summary["leaked_resources"] == 0
    assert "consolerl_rollout_episodes_total" in metrics
    assert "consolerl_reward_scores_total" in metrics
    assert ("consolerl_reward_judge_calls_total" in metrics) == (turn_loop == "orchestrator")
    stream = ExperienceStream(config.stream)
    entries = stream.redis.xrange(f"test:orch:exp:{turn_loop}")
    assert len(entries) == 2
    groups = [decode_group(fields) for _, fields in entries]
    assert {g.task_id for g in groups} == {"ram-create-user-0", "ecs-add-rule-0"}
    for g in groups:
        assert len(g.samples) == 2
        for s in g.samples:
            # A random model does not do the task: the reward service says failure, by rule.
            assert s.reward == 0.0 and s.verdict == "failure"
            assert s.turns and all(t.version == 0 for t in s.turns)
            assert all(len(t.response_ids) == len(t.logprobs) == len(t.loss_mask)
                       for t in s.turns)
    # Every account is free again.
    leases = AccountPool.from_config(PoolConfig(redis_url=redis_server.url,
                                                key_prefix="test:orch"))
    try:
        assert leases.status().leased == 0
    finally:
        leases.close()
