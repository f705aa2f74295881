"""The orchestrator on Ray with real Redis (leases and the experience stream), real Chromium
on the local cloud, the transformers PolicyServer with a tiny random model, the reward
service, 2 env workers and groups of 2: groups reach the stream with the reward service's
rewards, every account is released and nothing leaks."""
from __future__ import annotations

from collections.abc import Iterator

import pytest
import ray

torch = pytest.importorskip("torch")

from env_workers.accounts import PoolConfig  # noqa: E402
from env_workers.leases import AccountPool  # noqa: E402
from env_workers.pool import EnvPool, EnvPoolConfig  # noqa: E402
from env_workers.worker import WorkerConfig  # noqa: E402
from infra.provisioning.tasks import TASKS_DIR, load_suite  # noqa: E402
from reward_service.actiontrail import TrailConfig  # noqa: E402
from reward_service.service import RewardService  # noqa: E402
from rollout_service.agent import AgentConfig, AgentLoop  # noqa: E402
from rollout_service.experience import ExperienceStream, StreamConfig, decode_group  # noqa: E402
from rollout_service.models import HFChatTokenizer, tiny_model  # noqa: E402
from rollout_service.orchestrator import Orchestrator, OrchestratorConfig  # noqa: E402
from rollout_service.policy import PolicyConfig, PolicyRouter, PolicyServer  # noqa: E402
from tests.conftest import CloudServer, _server, run_async  # noqa: E402
from tests.integration.redis_server import RedisServer  # noqa: E402


@pytest.fixture(scope="module")
def orch_cloud(tmp_path_factory) -> Iterator[CloudServer]:
    yield from _server(tmp_path_factory, "orch-cloud", ["--lookup-qps", "0", "--transition",
                                                       "0.3", "--network-ready", "0.1"])


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("orch-redis"))
    server.start()
    yield server
    server.stop()


def test_groups_flow_to_the_stream_with_rewards_and_nothing_leaks(orch_cloud, redis_server,
                                                                  accounts, tmp_path):
    model = tiny_model(tmp_path / "tiny")
    tasks = [t for t in load_suite(TASKS_DIR) if t.id in ("ram-create-user-0",
                                                          "ecs-add-rule-0")]
    pool_config = PoolConfig(redis_url=redis_server.url, key_prefix="test:orch",
                             lease_ttl_s=10, acquire_timeout_s=60)
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        pool = EnvPool(EnvPoolConfig(workers=2, worker=WorkerConfig(console_url=orch_cloud.url),
                                     pool=pool_config, metrics_port=None))
        server = PolicyServer.remote(PolicyConfig(model=str(model)))
        router = PolicyRouter([server])
        agent = AgentLoop(router, HFChatTokenizer(model),
                          AgentConfig(max_steps=3, max_new_tokens=12, max_prompt_tokens=3000))
        reward = RewardService(tasks, accounts, orch_cloud.endpoint,
                               TrailConfig(qps=20, settle_s=20, poll_s=0.25, clock_skew_s=5))
        stream = ExperienceStream(StreamConfig(url=redis_server.url, stream="test:orch:exp"))
        orch = Orchestrator(OrchestratorConfig(group_size=2, max_staleness=1,
                                               groups_per_step=2, drop_uniform_groups=False,
                                               split="all"),
                            tasks, pool.actors, accounts, orch_cloud.endpoint, agent,
                            reward.score, stream)
        summary = run_async(orch.run(max_groups=2))
        pool.drain()
    finally:
        ray.shutdown()
    assert summary["groups_pushed"] == 2 and summary["env_errors"] == 0, summary
    assert summary["leaked_resources"] == 0
    entries = stream.redis.xrange("test:orch:exp")
    assert len(entries) == 2
    groups = [decode_group(fields) for _, fields in entries]
    assert {g.task_id for g in groups} == {t.id for t in tasks}
    for g in groups:
        assert len(g.samples) == 2
        for s in g.samples:
            # A random model does not do the task: the reward service says failure, by rule.
            assert s.reward == 0.0 and s.verdict == "failure"
            assert s.turns and all(t.version == 0 for t in s.turns)
            assert all(len(t.response_ids) == len(t.logprobs) == len(t.loss_mask)
                       for t in s.turns)
    # Every account is free again.
    leases = AccountPool.from_config(pool_config)
    try:
        assert leases.status().leased == 0
    finally:
        leases.close()
