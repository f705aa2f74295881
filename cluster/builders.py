"""The builders of the composition root: each starts one part of the system on the current Ray
cluster from its own config section, never from the root config.

- :func:`start_policy`: ``PolicyServer`` actors and their router;
- :func:`rollout_parts`: what the rollout side is built from (the env pool, the agent, the
  reward service, the stream and the orchestrator's sections), picked out of a
  :class:`~cluster.config.JobConfig`;
- :class:`RolloutActor`: an actor that builds the env pool, the reward service and the
  orchestrator from those parts and runs groups.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import ray
from prometheus_client import generate_latest

from cluster.config import JobConfig
from consolerl.accounts import load_accounts
from consolerl.tasks import TASKS_DIR, load_suite
from env_workers.accounts import PoolConfig
from env_workers.pool import EnvPool, EnvPoolConfig
from infra.console_sim.config import DEFAULT_ACCOUNTS_FILE
from reward_service.actiontrail import TrailConfig
from reward_service.fusion import RewardConfig
from reward_service.service import RewardService
from rollout_service.agent import AgentConfig, AgentLoop
from rollout_service.experience import ExperienceStream, StreamConfig
from rollout_service.models import HFChatTokenizer, resolve_model
from rollout_service.orchestrator import Orchestrator, OrchestratorConfig
from rollout_service.policy import PolicyConfig, PolicyRouter, PolicyServer


def start_policy(config: PolicyConfig) -> tuple[list[Any], PolicyRouter]:
    """``config.replicas`` PolicyServer actors (CPU/GPU per replica from the config)."""
    model = resolve_model(config.model)
    pinned = replace(config, model=model)
    resources: dict[str, float] = {"num_cpus": config.num_cpus_per_replica}
    if config.num_gpus_per_replica:
        resources["num_gpus"] = config.num_gpus_per_replica
    servers = [PolicyServer.options(**resources).remote(pinned, None, None, f"policy-{i}")
               for i in range(config.replicas)]
    return servers, PolicyRouter(servers)


@dataclass(frozen=True)
class RolloutParts:
    """The component configs the rollout side is built from (what crosses into
    :class:`RolloutActor`): the env pool, the policy (started here when the caller gives no
    servers), the agent prompt and sampling, the orchestrator, the stream, and the reward
    service's cloud endpoint, accounts, ActionTrail and reward settings."""

    env_pool: EnvPoolConfig
    policy: PolicyConfig
    agent: AgentConfig
    orchestrator: OrchestratorConfig
    stream: StreamConfig
    endpoint: str
    accounts_file: str
    trail: TrailConfig
    reward: RewardConfig
    suite_dir: str = str(TASKS_DIR)


def rollout_parts(config: JobConfig, suite_dir: str | None = None) -> RolloutParts:
    """Pick the rollout side's sections out of the root config."""
    accounts_file = config.cloud.accounts_file or str(DEFAULT_ACCOUNTS_FILE)
    env = config.env
    pool = EnvPoolConfig(
        workers=env.workers, worker=env.worker, num_cpus_per_worker=env.num_cpus_per_worker,
        metrics_port=None,
        pool=PoolConfig(redis_url=config.stream.url, key_prefix=env.lease_prefix,
                        lease_ttl_s=env.lease_ttl_s, accounts_file=accounts_file))
    return RolloutParts(pool, config.policy, config.agent, config.orchestrator, config.stream,
                        config.cloud.endpoint, accounts_file, config.trail, config.reward,
                        suite_dir or str(TASKS_DIR))


class RolloutBody:
    """Builds the env pool, the reward service and the orchestrator from ``parts`` on the
    current Ray cluster and runs groups."""

    def __init__(self, parts: RolloutParts, servers: list[Any] | None = None):
        """``servers``: PolicyServer actors started by the caller (the trainer, which publishes
        weights to them); None starts ``parts.policy.replicas`` of them here."""
        self.accounts = load_accounts(parts.accounts_file)
        tasks = load_suite(parts.suite_dir)
        self.pool = EnvPool(parts.env_pool)
        if servers:
            self.servers, self.router = list(servers), PolicyRouter(servers)
            self.own_servers = False
        else:
            self.servers, self.router = start_policy(parts.policy)
            self.own_servers = True
        tokenizer = HFChatTokenizer(resolve_model(parts.policy.model))
        self.reward = RewardService(tasks, self.accounts, parts.endpoint, parts.trail,
                                    parts.reward)
        self.stream = ExperienceStream(parts.stream)
        self.orchestrator = Orchestrator(
            parts.orchestrator, tasks, self.pool.actors, self.accounts, parts.endpoint,
            AgentLoop(self.router, tokenizer, parts.agent), self.reward.score, self.stream)

    async def run(self, max_groups: int | None) -> dict[str, Any]:
        """``max_groups`` finished groups, or ``None``: until :meth:`stop`."""
        return await self.orchestrator.run(max_groups)

    async def results(self) -> list[dict[str, Any]]:
        """Every episode so far: task, reward, verdict, env error (for evaluation)."""
        return [{"task_id": e.task_id,
                 "env_error": None if e.env_error is None else e.env_error.kind,
                 "reward": None if e.reward is None else e.reward.reward,
                 "verdict": None if e.reward is None else e.reward.verdict,
                 "end_reason": e.trajectory.end_reason if e.trajectory else None,
                 "steps": len(e.trajectory.turns) if e.trajectory else 0}
                for e in self.orchestrator.episodes]

    async def stop(self) -> None:
        self.orchestrator.stop()

    async def metrics(self) -> bytes:
        return generate_latest(self.orchestrator.registry) + \
            generate_latest(self.reward.registry)

    def drain(self) -> None:
        """Release every account and stop the env workers (and the PolicyServers it
        started)."""
        self.pool.drain()
        if self.own_servers:
            for server in self.servers:
                ray.kill(server)


RolloutActor = ray.remote(RolloutBody)
