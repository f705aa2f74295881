"""The rollout side, built once: :class:`RolloutSide` (accounts, tasks, env pool, policy
replicas and router, tokenizer, reward service, drain) from a :class:`RolloutSpec`, used by
the training job's :class:`TrainingRollouts` actor and by the jobs API's scheduler
(:mod:`cluster.jobs_api`) alike. This module imports only the rollout side, so an actor's
process starts without the trainer's torch and verl (:func:`cluster.builders.rollout_spec`
picks the spec out of the job config)."""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import ray
from prometheus_client import generate_latest

from consolerl.accounts import load_accounts
from consolerl.rewards import is_success
from consolerl.tasks import TASKS_DIR, load_suite
from env_workers.leases import AccountPool
from env_workers.pool import EnvPool, EnvPoolConfig
from cluster.judges import JudgeSection, start_judges
from cluster.replicas import start_policy
from infra.observability.discovery import PublishConfig, publish
from reward_service.actiontrail import TrailConfig
from reward_service.fusion import RewardConfig
from reward_service.service import RewardService
from rollout_service.agent import AgentConfig, AgentLoop
from rollout_service.experience import ExperienceStream, StreamConfig
from rollout_service.models import HFChatTokenizer
from rollout_service.orchestrator import Orchestrator, OrchestratorConfig
from rollout_service.policy import PolicyConfig, PolicyRouter


def success_by_version(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The train success curve: per policy version (the weights after that many steps), the
    share of scored episodes (env errors left out) that succeeded, whether their group was
    trained or dropped as uniform."""
    by: dict[int, list[float]] = {}
    for r in results:
        if r.get("env_error") or r.get("reward") is None or r.get("version", -1) < 0:
            continue
        by.setdefault(int(r["version"]), []).append(1.0 if is_success(r["reward"]) else 0.0)
    return [{"version": v, "episodes": len(ws), "success": round(sum(ws) / len(ws), 4)}
            for v, ws in sorted(by.items())]


@dataclass(frozen=True)
class RolloutSpec:
    """What the rollout side is built from (component configs, never the root config): the
    env pool, the policy (its model resolved; started here when the caller gives no
    servers), the agent's prompt and sampling, and the reward service's cloud endpoint,
    accounts, ActionTrail and reward settings, and its judges (``judges``: ``reward.judges``
    when on, else None; a ``policy:`` judge is served with ``policy``'s settings)."""

    env_pool: EnvPoolConfig
    policy: PolicyConfig
    agent: AgentConfig
    endpoint: str
    accounts_file: str
    trail: TrailConfig
    reward: RewardConfig
    suite_dir: str = str(TASKS_DIR)
    metrics: PublishConfig | None = None     # announce the metrics for discovery
    judges: JudgeSection | None = None
    # drift profile -> the console inventory's labels (the evidence channel's whole console)
    console_labels: dict[str, frozenset[str]] | None = None


class RolloutSide:
    """The parts every user of episodes needs, on the current Ray cluster: the accounts and
    tasks, the env workers, the policy replicas and their router, the tokenizer, the reward
    service and its judges (a served judge's replica and API started here). :meth:`drain`
    releases every account and stops the workers (and the replicas and judges it started)."""

    def __init__(self, spec: RolloutSpec, servers: list[Any] | None = None):
        """``servers``: PolicyServer actors started by the caller (the training job, which
        publishes weights to them); None starts ``spec.policy.replicas`` of them here."""
        self.spec = spec
        self.accounts = load_accounts(spec.accounts_file)
        self.tasks = load_suite(spec.suite_dir)
        self.pool = EnvPool(spec.env_pool)
        self.own_servers = not servers
        if servers:
            self.servers, self.router = list(servers), PolicyRouter(servers)
        else:
            self.servers, self.router = start_policy(spec.policy, spec.metrics)
        self.tokenizer = HFChatTokenizer(spec.policy.model)
        try:
            judges, self.stop_judges = start_judges(spec.judges, spec.policy, spec.metrics)
        except BaseException:
            self.drain_started()
            raise
        self.reward = RewardService(self.tasks, self.accounts, spec.endpoint, spec.trail,
                                    spec.reward, judges=judges,
                                    console_labels=spec.console_labels)

    def agent(self, config: AgentConfig | None = None) -> AgentLoop:
        """The agent loop over the served policy (``config``: the spec's agent by default)."""
        return AgentLoop(self.router, self.tokenizer, config or self.spec.agent)

    def drain(self) -> None:
        self.drain_started()
        self.stop_judges()

    def drain_started(self) -> None:
        self.pool.drain()
        if self.own_servers:
            for server in self.servers:
                ray.kill(server)


class TrainingRollouts:
    """The training job's rollouts: the orchestrator over a :class:`RolloutSide`, pushing
    groups to the experience stream (as a Ray actor: :data:`TrainingRolloutsActor`).
    ``step_gamma``: the trainer's ``AlgoConfig.step_signal_gamma`` (see
    :class:`~rollout_service.orchestrator.Orchestrator`)."""

    def __init__(self, spec: RolloutSpec, orchestrator: OrchestratorConfig,
                 stream: StreamConfig, servers: list[Any] | None = None,
                 step_gamma: float | None = None):
        self.side = RolloutSide(spec, servers)
        self.stream = ExperienceStream(stream)
        self.orchestrator = Orchestrator(
            orchestrator, self.side.tasks, self.side.pool.actors, self.side.accounts,
            spec.endpoint, self.side.agent(), self.side.reward.score, self.stream,
            step_gamma=step_gamma)
        self.endpoint = publish(spec.metrics, [self.orchestrator.registry,
                                               self.side.reward.registry], "rollout", "rollout")

    async def run(self, max_groups: int | None) -> dict[str, Any]:
        """``max_groups`` finished groups, or ``None``: until :meth:`stop`."""
        return await self.orchestrator.run(max_groups)

    async def results(self) -> list[dict[str, Any]]:
        """Every episode so far (for evaluation): task, reward, verdict, env error, and its
        cost: prompt and generated tokens, wall seconds holding its env account."""
        return [{"task_id": e.task_id, "env_error": e.env_error, "reward": e.reward,
                 "verdict": e.verdict, "end_reason": e.end_reason, "steps": e.steps,
                 "version": e.version, "prompt_tokens": e.prompt_tokens,
                 "completion_tokens": e.completion_tokens, "env_s": e.env_s}
                for e in self.orchestrator.episodes]

    async def stop(self, interrupt: bool = False) -> None:
        """No new episodes; ``interrupt``: those in flight stop at their next step (cleaned
        up, accounts released) instead of finishing."""
        self.orchestrator.stop(interrupt)

    async def sweep(self, timeout_s: float) -> int:
        """After the episodes stopped: destroy what dead holders (a killed job, a lost
        worker) left in any account, waiting up to ``timeout_s`` for their leases to expire;
        returns how many such episodes were cleaned."""
        live = self.orchestrator.live_workers()       # not one lost with its node
        if not live:
            return 0
        pool = AccountPool.from_config(self.side.spec.env_pool.pool)
        deadline = time.monotonic() + timeout_s
        cleaned = 0
        try:
            while any(pool.unfinished_episodes(a.account_id) for a in self.side.accounts):
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
            generate_latest(self.side.reward.registry)

    def drain(self) -> None:
        """Release every account and stop the env workers (and the PolicyServers it
        started)."""
        self.side.drain()
        if self.endpoint is not None:
            self.endpoint.close()


TrainingRolloutsActor = ray.remote(TrainingRollouts)
