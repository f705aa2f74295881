"""The jobs API on a Ray cluster: the scheduler actor (:class:`JobsScheduler`: the rollout
side, :class:`~cluster.rollout.RolloutSide`, under a
:class:`~jobsapi.scheduler.JobScheduler`) and the HTTP side, either uvicorn in a
Ray actor (``api.hosting=actor``, what ``make serve`` runs: on a small machine Ray Serve's
proxy and router cost more than the endpoint, see ``python -m benchmarks.jobs_api --hosting
serve``) or a Ray Serve deployment with FastAPI ingress (``api.hosting=serve``, what a KubeRay
``RayService`` deploys; :mod:`cluster.serve_app`).

The two sides share nothing but Redis, so either restarts alone: a job keeps running while
the API restarts, and events resume by ``Last-Event-ID``.
"""
from __future__ import annotations

import asyncio
import gc
import os
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import ray
from prometheus_client import generate_latest

from cluster.replicas import start_policy
from cluster.rollout import RolloutSide, RolloutSpec
from consolerl.tasks import TASKS_DIR, load_suite
from env_workers.leases import AccountPool
from rollout_service.agent import AgentConfig, AgentLoop
from rollout_service.episode import EpisodeRunner
from jobsapi.app import build_app
from jobsapi.auth import TokenBook
from jobsapi.blobs import BlobConfig
from jobsapi.routers.context import ApiMetrics
from jobsapi.retention import RetentionConfig, StorageSweeper
from jobsapi.scheduler import JobScheduler, SchedulerConfig
from jobsapi.schema import SCRIPTED_MODELS
from jobsapi.store import JobStore
from rollout_service.models import (HFChatTokenizer, check_model_settings,
                                    model_agent_settings, resolve_model)
from rollout_service.policy import PolicyRouter

SCHEDULER_NAME = "consolerl-api-scheduler"
# The HTTP side collects its young generation rarely (HttpServer.start) and, left to the
# thresholds, the oldest almost never (after 1,000 middle collections: many hours). Cyclic
# garbage that was still referenced at a young collection (a request in flight) then piled up
# in the oldest generation: the actor's RSS grew ~0.25 MB a minute under the soak's traffic
# (docs/results/2026-11-26-soak.md). A full collection on a timer bounds it; its pause is
# consolerl_api_gc_pause_seconds.
GC_EVERY_S = 30.0


@dataclass(frozen=True)
class SchedulerSpec:
    """What the scheduler actor is built from (component configs only): the rollout side
    (its ``agent``: the settings of a model without ``agent.json``), the scheduler's
    settings, the jobs' Redis and key prefix, the tokens file, the checkpoints or run folders
    registered by name, the artifacts' blob store, the retention of finished jobs (its sweep
    runs beside the scheduler) and ``agent_named``, the model settings the config's
    ``agent`` section states (:func:`cluster.config.agent_named`: a model trained with other
    values is refused)."""

    rollout: RolloutSpec
    scheduler: SchedulerConfig
    redis_url: str
    prefix: str
    tokens_file: str
    models: tuple[tuple[str, str], ...] = ()
    blobs: BlobConfig = field(default_factory=BlobConfig)
    retention: RetentionConfig = field(default_factory=RetentionConfig)
    agent_named: tuple[str, ...] = ()


@dataclass(frozen=True)
class HttpSpec:
    """What the HTTP side is built from."""

    redis_url: str
    prefix: str
    tokens_file: str
    models: tuple[str, ...] = ("live", *SCRIPTED_MODELS)
    sse_max_s: float = 300.0
    suite_dir: str = str(TASKS_DIR)
    scheduler_name: str = SCHEDULER_NAME
    blobs: BlobConfig = field(default_factory=BlobConfig)
    retention: RetentionConfig = field(default_factory=RetentionConfig)


class JobsScheduler:
    """The API's jobs run on a :class:`RolloutSide`; ``model`` names in jobs are ``live``
    (the served policy), a registered checkpoint, started on first use (one replica),
    ``oracle`` (the scripted teacher: the scheduler needs no model for it) or ``replay`` (a
    drafted task's replay plan, carried out by the oracle's driver)."""

    def __init__(self, spec: SchedulerSpec, servers: list[Any] | None = None):
        self.spec = spec
        self.side = RolloutSide(spec.rollout, servers)
        self.registered = dict(spec.models)
        self.extra: dict[str, tuple[list[Any], PolicyRouter, HFChatTokenizer]] = {}
        self.store = JobStore(spec.redis_url, spec.prefix, blobs=spec.blobs,
                              retention=spec.retention)
        self.tokens = TokenBook(Path(spec.tokens_file))
        # The pool the env workers lease from: the start-up sweep ends a dead predecessor's
        # leases and sees which of its episodes their accounts still record.
        self.leases = AccountPool.from_config(spec.rollout.env_pool.pool)
        self.scheduler = JobScheduler(
            spec.scheduler, self.store,
            EpisodeRunner(self.side.accounts, spec.rollout.endpoint, self.side.reward.score),
            self.side.pool.actors, {t.id: t for t in self.side.tasks}, self.agent_for,
            self.tokens.quota, spec.rollout.agent, leases=self.leases)
        self.sweeper = StorageSweeper(self.store)
        self._lock = asyncio.Lock()
        self.settings: dict[str, dict[str, Any] | None] = {}    # model name -> agent.json's

    async def agent_for(self, model: str, config: AgentConfig) -> AgentLoop:
        """The live policy, or a registered checkpoint's or run folder's (one replica,
        started on first use and kept), with ``config`` (the job's sampling over the spec's
        agent) as that model runs: a model folder with ``agent.json`` takes every setting it
        keeps from there (:data:`~rollout_service.agent.MODEL_SETTINGS`, ``max_new_tokens``
        too: the model was trained to answer within it, whatever the job asks), after the
        settings the config states are checked against it
        (:func:`~rollout_service.models.check_model_settings`); one without runs with
        ``config``."""
        if model == "live":
            settings = self._settings(model, self.spec.rollout.policy.model)
            return self.side.agent(_with_settings(config, settings))
        async with self._lock:
            if model not in self.extra:
                path = registered_model(self.registered[model])
                self._settings(model, path)         # refused before a replica starts
                rollout = self.spec.rollout
                servers, router = start_policy(replace(rollout.policy, model=path,
                                                       replicas=1), rollout.metrics)
                self.extra[model] = (servers, router, HFChatTokenizer(path))
        _, router, tokenizer = self.extra[model]
        return AgentLoop(router, tokenizer, _with_settings(config, self.settings[model]))

    def _settings(self, model: str, path: str) -> dict[str, Any] | None:
        """``model``'s ``agent.json`` settings (read from ``path`` once, and checked then)."""
        if model not in self.settings:
            settings = model_agent_settings(path)
            check_model_settings(self.spec.rollout.agent, self.spec.agent_named, settings, path)
            self.settings[model] = settings
        return self.settings[model]

    async def run(self) -> None:
        """The scheduler, and beside it the retention sweep."""
        sweep = asyncio.ensure_future(self.sweeper.run())
        try:
            await self.scheduler.run()
        finally:
            self.sweeper.stop()
            await sweep

    async def stop(self) -> None:
        self.scheduler.stop()
        self.sweeper.stop()

    async def metrics(self) -> bytes:
        return generate_latest(self.scheduler.registry) + \
            generate_latest(self.sweeper.registry) + generate_latest(self.side.reward.registry)

    def drain(self) -> None:
        self.side.drain()
        for servers, _, _ in self.extra.values():
            for server in servers:
                ray.kill(server)
        self.leases.close()


def _with_settings(config: AgentConfig, settings: dict[str, Any] | None) -> AgentConfig:
    return config if settings is None else replace(config, **settings)


JobsSchedulerActor = ray.remote(JobsScheduler)


def registered_model(path: str) -> str:
    """The model folder a name in ``api.models`` stands for: a run folder's ``final``, or
    the folder (or model name) itself, resolved (:func:`rollout_service.models.resolve_model`)."""
    if (Path(path) / "final").is_dir():      # a run folder: its final model
        path = str(Path(path) / "final")
    return resolve_model(path)


def http_app(spec: HttpSpec, scheduler_metrics: Any = None):
    """The FastAPI app of the HTTP side. Its /metrics add the scheduler's:
    ``scheduler_metrics`` (an async callable), or else the scheduler actor's, found by name."""
    suite = {t.id: t for t in load_suite(spec.suite_dir)}

    async def by_name() -> bytes:
        actor = ray.get_actor(spec.scheduler_name) if ray.is_initialized() else None
        return await actor.metrics.remote() if actor is not None else b""
    return build_app(JobStore(spec.redis_url, spec.prefix, blobs=spec.blobs,
                              retention=spec.retention),
                     TokenBook(Path(spec.tokens_file)), suite, models=spec.models,
                     sse_max_s=spec.sse_max_s, extra_metrics=scheduler_metrics or by_name)


class HttpServer:
    """uvicorn serving :func:`http_app` inside a Ray actor, on a thread of its own with its own
    (uvloop) event loop: the actor's asyncio loop shares its thread with Ray's calls."""

    def __init__(self, spec: HttpSpec, host: str, port: int, gc_every_s: float = GC_EVERY_S):
        import uvicorn  # noqa: PLC0415 - only in the actor's process
        # Ray starts worker processes at niceness 15; the front door should not wait behind
        # browsers and the policy on a busy node. Needs CAP_SYS_NICE (root here); without it
        # the server runs at 15.
        try:
            os.setpriority(os.PRIO_PROCESS, 0, 0)
        except OSError:
            pass
        app = http_app(spec)
        self.metrics: ApiMetrics = app.state.jobs_api.metrics
        config = uvicorn.Config(app, host=host, port=port, log_level="warning",
                                access_log=False, loop="uvloop", http="httptools")
        self.server = uvicorn.Server(config)
        self.thread: threading.Thread | None = None
        self.gc_every_s = gc_every_s
        self._stopping = threading.Event()

    def start(self) -> str:
        # Fewer, cheaper garbage collections: what start-up made is frozen out of every
        # collection, the young generation collects every 100k allocations, not 700 (the
        # tail latency of GET /v1/jobs/{id} under load: benchmarks.jobs_api), and the whole
        # heap every gc_every_s, on a thread of its own (GC_EVERY_S).
        gc.collect()
        gc.freeze()
        gc.set_threshold(100_000, 50, 1000)
        self.thread = threading.Thread(target=self.server.run, daemon=True, name="api-http")
        self.thread.start()
        threading.Thread(target=self._collect, daemon=True, name="api-gc").start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the API server did not start (is the port taken?)")
            time.sleep(0.05)
        return f"http://{self.server.config.host}:{self.server.config.port}"

    def _collect(self) -> None:
        """A full collection every ``gc_every_s`` (see :data:`GC_EVERY_S`)."""
        while not self._stopping.wait(self.gc_every_s):
            started = time.perf_counter()
            gc.collect()
            self.metrics.gc_pause.observe(time.perf_counter() - started)

    def stop(self) -> None:
        self._stopping.set()
        self.server.should_exit = True
        if self.thread is not None:
            self.thread.join(10)


HttpServerActor = ray.remote(HttpServer)
