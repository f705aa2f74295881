"""The jobs API as a Ray Serve application: the scheduler and the HTTP side (FastAPI ingress)
as two deployments. What a KubeRay ``RayService`` deploys (``cluster/deploy/rayservice.yaml``),
and what ``python -m cluster.serve api.hosting=serve`` runs:

    CONSOLERL_CONFIG=configs/serve.yaml serve run cluster.serve_app:app

``CONSOLERL_CONFIG`` names the config file, ``CONSOLERL_OVERRIDES`` adds ``section.key=value``
overrides (space-separated). The scheduler deployment has one replica (it is the single writer
of job progress); the HTTP deployment may have many (it keeps nothing in memory).
"""
from __future__ import annotations

import asyncio
import os
import shlex
from dataclasses import replace
from typing import Any

from ray import serve

from cluster.builders import jobs_api_specs, served_models
from cluster.config import JobConfig, agent_named, metrics_publish
from cluster.jobs_api import JobsScheduler, http_app
from consolerl.config import load_config
from rollout_service.models import resolve_model


def build(config: JobConfig, suite_dir: str | None = None,
          named: frozenset[str] = frozenset()) -> Any:
    """The bound Serve application for ``config`` (``named``: the model settings its
    ``agent`` section states, :func:`cluster.config.agent_named`; a served model they
    contradict is refused here, before anything is deployed)."""
    policy = replace(config.policy, model=resolve_model(config.policy.model))
    served_models(config, named, policy.model)
    sched_spec, http_spec = jobs_api_specs(config, policy, metrics_publish(config), suite_dir,
                                           named)

    @serve.deployment(name="consolerl-scheduler", num_replicas=1,
                      ray_actor_options={"num_cpus": 0}, max_ongoing_requests=16)
    class Scheduler:
        def __init__(self) -> None:
            self.body = JobsScheduler(sched_spec)
            self.task = asyncio.get_event_loop().create_task(self.body.run())

        async def metrics(self) -> bytes:
            return await self.body.metrics()

        def check_health(self) -> None:
            if self.task.done():
                raise RuntimeError(f"the scheduler stopped: {self.task.exception()!r}")

    hook: dict[str, Any] = {}           # the scheduler's handle, once a replica has it

    async def scheduler_metrics() -> bytes:
        handle = hook.get("scheduler")
        return await handle.metrics.remote() if handle is not None else b""

    app = http_app(http_spec, scheduler_metrics)

    @serve.deployment(name="consolerl-api", max_ongoing_requests=200,
                      ray_actor_options={"num_cpus": 0})
    @serve.ingress(app)
    class JobsApi:
        def __init__(self, scheduler: Any) -> None:
            hook["scheduler"] = scheduler

    return JobsApi.bind(Scheduler.bind())


def _from_env() -> Any:
    path = os.environ.get("CONSOLERL_CONFIG") or None
    overrides = shlex.split(os.environ.get("CONSOLERL_OVERRIDES", ""))
    return build(load_config(JobConfig, path, overrides), named=agent_named(path, overrides))


def __getattr__(name: str) -> Any:
    # ``serve run cluster.serve_app:app`` builds the application when it asks for it, so
    # importing this module (tests, cluster.serve) needs no config.
    if name == "app":
        return _from_env()
    raise AttributeError(name)
