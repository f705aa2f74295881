"""The jobs API on a Ray cluster: the scheduler actor (env workers, policy, reward service,
:class:`~rollout_service.jobs.scheduler.JobScheduler`) and the HTTP side, either uvicorn in a
Ray actor (``api.hosting=actor``, what ``make serve`` runs) or a Ray Serve deployment with
FastAPI ingress (``api.hosting=serve``, what a KubeRay ``RayService`` deploys).

Why uvicorn in an actor by default: on this 2-core machine Ray Serve's proxy and router cost
more than the endpoint. ``python -m benchmarks.api --hosting serve`` measures it (GET
/v1/jobs/{id}, 50 clients); the figures are in the README.

The Serve application (both sides as deployments) is :mod:`cluster.serve_app`. The two sides
share nothing but Redis, so either restarts alone: a job keeps running while
the API restarts, and events resume by ``Last-Event-ID``.
"""
from __future__ import annotations

import asyncio
import gc
import os
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import ray
from prometheus_client import generate_latest

from cluster.rollout import start_policy
from consolerl.accounts import load_accounts
from consolerl.tasks import TASKS_DIR, load_suite
from env_workers.pool import EnvPool, EnvPoolConfig
from infra.observability.discovery import PublishConfig
from reward_service.actiontrail import TrailConfig
from reward_service.fusion import RewardConfig
from reward_service.service import RewardService
from rollout_service.agent import AgentConfig, AgentLoop
from rollout_service.episode import EpisodeRunner
from rollout_service.jobs.app import build_app
from rollout_service.jobs.auth import TokenBook
from rollout_service.jobs.scheduler import JobScheduler, SchedulerConfig
from rollout_service.jobs.store import JobStore
from rollout_service.models import HFChatTokenizer, resolve_model
from rollout_service.policy import PolicyConfig, PolicyRouter

SCHEDULER_NAME = "consolerl-api-scheduler"


@dataclass(frozen=True)
class SchedulerParts:
    """What the scheduler actor is built from (component configs only)."""

    env_pool: EnvPoolConfig
    policy: PolicyConfig
    agent: AgentConfig
    scheduler: SchedulerConfig
    endpoint: str
    accounts_file: str
    trail: TrailConfig
    reward: RewardConfig
    redis_url: str
    prefix: str
    tokens_file: str
    models: tuple[tuple[str, str], ...] = ()
    suite_dir: str = str(TASKS_DIR)
    metrics: PublishConfig | None = None     # the policy replicas announce their metrics


@dataclass(frozen=True)
class HttpParts:
    """What the HTTP side is built from."""

    redis_url: str
    prefix: str
    tokens_file: str
    models: tuple[str, ...] = ("live",)
    sse_max_s: float = 300.0
    suite_dir: str = str(TASKS_DIR)
    scheduler_name: str = SCHEDULER_NAME


class SchedulerBody:
    def __init__(self, parts: SchedulerParts, servers: list[Any] | None = None):
        accounts = load_accounts(parts.accounts_file)
        tasks = load_suite(parts.suite_dir)
        self.parts = parts
        self.pool = EnvPool(parts.env_pool)
        if servers:
            self.servers, self.router = list(servers), PolicyRouter(servers)
        else:
            self.servers, self.router = start_policy(parts.policy, parts.metrics)
        self.own_servers = not servers
        self.tokenizer = HFChatTokenizer(resolve_model(parts.policy.model))
        self.registered = dict(parts.models)
        self.extra: dict[str, tuple[list[Any], PolicyRouter, HFChatTokenizer]] = {}
        self.reward = RewardService(tasks, accounts, parts.endpoint, parts.trail, parts.reward)
        self.store = JobStore(parts.redis_url, parts.prefix)
        self.tokens = TokenBook(Path(parts.tokens_file))
        self.scheduler = JobScheduler(
            parts.scheduler, self.store,
            EpisodeRunner(accounts, parts.endpoint, self.reward.score),
            self.pool.actors, {t.id: t for t in tasks}, self.agent_for, self.tokens.quota,
            parts.agent)
        self._lock = asyncio.Lock()

    async def agent_for(self, model: str, config: AgentConfig) -> AgentLoop:
        """The live policy, or a registered checkpoint's or run folder's (one replica,
        started on first use and kept)."""
        if model == "live":
            return AgentLoop(self.router, self.tokenizer, config)
        async with self._lock:
            if model not in self.extra:
                path = self.registered[model]
                if (Path(path) / "final").is_dir():      # a run folder: its final model
                    path = str(Path(path) / "final")
                path = resolve_model(path)
                servers, router = start_policy(replace(self.parts.policy, model=path,
                                                       replicas=1), self.parts.metrics)
                self.extra[model] = (servers, router, HFChatTokenizer(path))
        _, router, tokenizer = self.extra[model]
        return AgentLoop(router, tokenizer, config)

    async def run(self) -> None:
        await self.scheduler.run()

    async def stop(self) -> None:
        self.scheduler.stop()

    async def metrics(self) -> bytes:
        return generate_latest(self.scheduler.registry) + generate_latest(self.reward.registry)

    def drain(self) -> None:
        self.pool.drain()
        for servers in [self.servers if self.own_servers else [],
                        *(s for s, _, _ in self.extra.values())]:
            for server in servers:
                ray.kill(server)


SchedulerActor = ray.remote(SchedulerBody)


def http_app(parts: HttpParts, scheduler_metrics: Any = None):
    """The FastAPI app of the HTTP side. Its /metrics add the scheduler's:
    ``scheduler_metrics`` (an async callable), or else the scheduler actor's, found by name."""
    suite = {t.id: t for t in load_suite(parts.suite_dir)}

    async def by_name() -> bytes:
        actor = ray.get_actor(parts.scheduler_name) if ray.is_initialized() else None
        return await actor.metrics.remote() if actor is not None else b""
    return build_app(JobStore(parts.redis_url, parts.prefix), TokenBook(Path(parts.tokens_file)),
                     suite, models=parts.models, sse_max_s=parts.sse_max_s,
                     extra_metrics=scheduler_metrics or by_name)


class HttpServerBody:
    """uvicorn serving :func:`http_app` inside a Ray actor, on a thread of its own with its own
    (uvloop) event loop: the actor's asyncio loop shares its thread with Ray's calls."""

    def __init__(self, parts: HttpParts, host: str, port: int):
        import uvicorn  # noqa: PLC0415 - only in the actor's process
        # Ray starts worker processes at niceness 15; the front door should not wait behind
        # browsers and the policy on a busy node. Needs CAP_SYS_NICE (root here); without it
        # the server runs at 15.
        try:
            os.setpriority(os.PRIO_PROCESS, 0, 0)
        except OSError:
            pass
        config = uvicorn.Config(http_app(parts), host=host, port=port, log_level="warning",
                                access_log=False, loop="uvloop", http="httptools")
        self.server = uvicorn.Server(config)
        self.thread: threading.Thread | None = None

    def start(self) -> str:
        # Fewer, cheaper garbage collections: what start-up made is frozen out of every
        # collection, and the young generation collects every 100k allocations, not 700.
        # Measured on GET /v1/jobs/{id} (50 clients): p99 about 70 ms -> 20-40 ms.
        gc.collect()
        gc.freeze()
        gc.set_threshold(100_000, 50, 1000)
        self.thread = threading.Thread(target=self.server.run, daemon=True, name="api-http")
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the API server did not start (is the port taken?)")
            time.sleep(0.05)
        return f"http://{self.server.config.host}:{self.server.config.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        if self.thread is not None:
            self.thread.join(10)


HttpServerActor = ray.remote(HttpServerBody)
