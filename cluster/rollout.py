"""The rollout side as one Ray actor: it builds the env pool, the reward service and the
orchestrator from :class:`RolloutParts` (component configs, never the root config) and runs
groups. This module imports only the rollout side, so the actor's process starts without the
trainer's torch and verl (:func:`cluster.builders.rollout_parts` picks the parts out of the
job config)."""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace
from typing import Any

import ray
from prometheus_client import generate_latest

from consolerl.accounts import load_accounts
from consolerl.tasks import TASKS_DIR, load_suite
from env_workers.leases import AccountPool
from env_workers.pool import EnvPool, EnvPoolConfig
from infra.observability.discovery import PublishConfig, publish
from reward_service.actiontrail import TrailConfig
from reward_service.fusion import RewardConfig
from reward_service.service import RewardService
from rollout_service.agent import AgentConfig, AgentLoop
from rollout_service.experience import ExperienceStream, StreamConfig
from rollout_service.models import HFChatTokenizer, resolve_model
from rollout_service.orchestrator import Orchestrator, OrchestratorConfig
from rollout_service.policy import PolicyConfig, PolicyRouter, PolicyServer


def start_policy(config: PolicyConfig, metrics: PublishConfig | None = None
                 ) -> tuple[list[Any], PolicyRouter]:
    """``config.replicas`` PolicyServer actors (CPU/GPU per replica and placement from the
    config), each announcing its metrics when ``metrics`` is given."""
    model = resolve_model(config.model)
    pinned = replace(config, model=model)
    options = policy_options(config)
    servers = [PolicyServer.options(**options).remote(pinned, None, None, f"policy-{i}",
                                                      metrics)
               for i in range(config.replicas)]
    return servers, PolicyRouter(servers)


def policy_options(config: PolicyConfig) -> dict[str, Any]:
    """The Ray actor options of every PolicyServer: CPUs, GPUs, the custom resources its
    config names (only nodes that offer them host it), placement, restarts."""
    # A crashed replica is restarted by Ray; it serves again once the job sends it the
    # current weights (cluster.job syncs replicas whose version differs from the trainer's).
    options: dict[str, Any] = {"num_cpus": config.num_cpus_per_replica,
                               "scheduling_strategy": config.scheduling_strategy,
                               "max_restarts": -1, "max_task_retries": 0}
    if config.num_gpus_per_replica:
        options["num_gpus"] = config.num_gpus_per_replica
    if config.resources:
        options["resources"] = dict(config.resources)
    return options


def success_by_version(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The train success curve: per policy version (the weights after that many steps), the
    share of scored episodes (env errors left out) that succeeded, whether their group was
    trained or dropped as uniform."""
    by: dict[int, list[float]] = {}
    for r in results:
        if r.get("env_error") or r.get("reward") is None or r.get("version", -1) < 0:
            continue
        by.setdefault(int(r["version"]), []).append(1.0 if r["reward"] >= 1.0 else 0.0)
    return [{"version": v, "episodes": len(ws), "success": round(sum(ws) / len(ws), 4)}
            for v, ws in sorted(by.items())]


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
    metrics: PublishConfig | None = None     # announce the metrics for discovery


class RolloutBody:
    """Builds the env pool, the reward service and the orchestrator from ``parts`` on the
    current Ray cluster and runs groups."""

    def __init__(self, parts: RolloutParts, servers: list[Any] | None = None):
        """``servers``: PolicyServer actors started by the caller (the trainer, which publishes
        weights to them); None starts ``parts.policy.replicas`` of them here."""
        self.accounts = load_accounts(parts.accounts_file)
        tasks = load_suite(parts.suite_dir)
        self.pool = EnvPool(parts.env_pool)
        self.pool_config = parts.env_pool.pool
        if servers:
            self.servers, self.router = list(servers), PolicyRouter(servers)
            self.own_servers = False
        else:
            self.servers, self.router = start_policy(parts.policy, parts.metrics)
            self.own_servers = True
        tokenizer = HFChatTokenizer(resolve_model(parts.policy.model))
        self.reward = RewardService(tasks, self.accounts, parts.endpoint, parts.trail,
                                    parts.reward)
        self.stream = ExperienceStream(parts.stream)
        self.orchestrator = Orchestrator(
            parts.orchestrator, tasks, self.pool.actors, self.accounts, parts.endpoint,
            AgentLoop(self.router, tokenizer, parts.agent), self.reward.score, self.stream)
        self.endpoint = publish(parts.metrics, [self.orchestrator.registry,
                                                self.reward.registry], "rollout", "rollout")

    async def run(self, max_groups: int | None) -> dict[str, Any]:
        """``max_groups`` finished groups, or ``None``: until :meth:`stop`."""
        return await self.orchestrator.run(max_groups)

    async def results(self) -> list[dict[str, Any]]:
        """Every episode so far: task, reward, verdict, env error (for evaluation)."""
        return [{"task_id": e.task_id, "env_error": e.env_error, "reward": e.reward,
                 "verdict": e.verdict, "end_reason": e.end_reason, "steps": e.steps,
                 "version": e.version}
                for e in self.orchestrator.episodes]

    async def stop(self) -> None:
        self.orchestrator.stop()

    async def sweep(self, timeout_s: float) -> int:
        """After the episodes stopped: destroy what dead holders (a killed job, a lost
        worker) left in any account, waiting up to ``timeout_s`` for their leases to expire;
        returns how many such episodes were cleaned."""
        live = self.orchestrator.live_workers()       # not one lost with its node
        if not live:
            return 0
        pool = AccountPool.from_config(self.pool_config)
        deadline = time.monotonic() + timeout_s
        cleaned = 0
        try:
            while any(pool.unfinished_episodes(a.account_id) for a in self.accounts):
                if time.monotonic() > deadline:
                    break
                found = await self.orchestrator.runner.clear_orphans(live[0])
                cleaned += found
                if not found:
                    await asyncio.sleep(1.0)
        finally:
            pool.close()
        return cleaned

    async def metrics(self) -> bytes:
        return generate_latest(self.orchestrator.registry) + \
            generate_latest(self.reward.registry)

    def drain(self) -> None:
        """Release every account and stop the env workers (and the PolicyServers it
        started)."""
        self.pool.drain()
        if self.endpoint is not None:
            self.endpoint.close()
        if self.own_servers:
            for server in self.servers:
                ray.kill(server)


RolloutActor = ray.remote(RolloutBody)
