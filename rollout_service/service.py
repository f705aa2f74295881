"""The rollout side assembled from one :class:`~rollout_service.config.RolloutConfig`: env
worker actors, PolicyServer actors and their router, the reward service, the experience
stream, and the orchestrator, served as a Ray actor (``OrchestratorActor``)."""
from __future__ import annotations

from typing import Any

import ray
from prometheus_client import generate_latest

from env_workers.accounts import PoolConfig
from env_workers.pool import EnvPool, EnvPoolConfig
from infra.console_sim.accounts import load_accounts
from infra.console_sim.config import DEFAULT_ACCOUNTS_FILE
from infra.provisioning.tasks import TASKS_DIR, load_suite
from reward_service.service import RewardService

from .agent import AgentLoop
from .config import RolloutConfig
from .experience import ExperienceStream
from .models import HFChatTokenizer, resolve_model
from .orchestrator import Orchestrator
from .policy import PolicyConfig, PolicyRouter, PolicyServer


def start_policy(config: PolicyConfig) -> tuple[list[Any], PolicyRouter]:
    """``config.replicas`` PolicyServer actors (CPU/GPU per replica from the config)."""
    model = resolve_model(config.model)
    pinned = PolicyConfig(**{**config.__dict__, "model": model})
    resources: dict[str, float] = {"num_cpus": config.num_cpus_per_replica}
    if config.num_gpus_per_replica:
        resources["num_gpus"] = config.num_gpus_per_replica
    servers = [PolicyServer.options(**resources).remote(pinned, None, None, f"policy-{i}")
               for i in range(config.replicas)]
    return servers, PolicyRouter(servers)


class OrchestratorBody:
    """Builds everything from ``config`` on the current Ray cluster and runs groups."""

    def __init__(self, config: RolloutConfig, suite_dir: str | None = None,
                 servers: list[Any] | None = None):
        """``servers``: PolicyServer actors started by the caller (the trainer, which publishes
        weights to them); None starts ``config.policy.replicas`` of them here."""
        self.config = config
        accounts_file = config.cloud.accounts_file or str(DEFAULT_ACCOUNTS_FILE)
        self.accounts = load_accounts(accounts_file)
        tasks = load_suite(suite_dir or TASKS_DIR)
        self.pool = EnvPool(EnvPoolConfig(
            workers=config.env.workers, worker=config.env.worker,
            num_cpus_per_worker=config.env.num_cpus_per_worker, metrics_port=None,
            pool=PoolConfig(redis_url=config.stream.url, key_prefix=config.env.lease_prefix,
                            lease_ttl_s=config.env.lease_ttl_s, accounts_file=accounts_file)))
        if servers:
            self.servers, self.router = list(servers), PolicyRouter(servers)
            self.own_servers = False
        else:
            self.servers, self.router = start_policy(config.policy)
            self.own_servers = True
        tokenizer = HFChatTokenizer(resolve_model(config.policy.model))
        self.reward = RewardService(tasks, self.accounts, config.cloud.endpoint, config.trail,
                                    config.reward)
        self.stream = ExperienceStream(config.stream)
        self.orchestrator = Orchestrator(
            config.orchestrator, tasks, self.pool.actors, self.accounts, config.cloud.endpoint,
            AgentLoop(self.router, tokenizer, config.agent), self.reward.score, self.stream)

    async def run(self, max_groups: int | None) -> dict[str, Any]:
        """``max_groups`` finished groups, or ``None``: until :meth:`stop`."""
        return await self.orchestrator.run(max_groups)

    async def results(self) -> list[dict[str, Any]]:
        """Every episode so far: task, reward, verdict, env error (for evaluation)."""
        return [{"task_id": e.task_id, "env_error": e.env_error,
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


OrchestratorActor = ray.remote(OrchestratorBody)
