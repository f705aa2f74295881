"""The reward service: ``RewardService.score`` (rule channel, optional judges, fusion), served
as a Ray actor (``RewardActor``) and over HTTP (``POST /v1/score``, :func:`build_app`).

A request names the task (by id, from the suite), the account and the episode's time window,
the placeholder values of the episode, and what the judges need (actions, final page, the
agent's answer). The service holds one SDK client and one ActionTrail client per account; the
accounts' secrets stay in the service and never appear in a response.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import asdict
from typing import Any

import ray
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, Field

from consolerl.types import EnvError
from infra.cloud import CloudClient, CloudConfig, Credentials
from infra.console_sim.accounts import Account
from infra.provisioning.tasks import Task

from .actiontrail import TrailClient, TrailConfig
from .fusion import RewardConfig, RewardResult, fuse
from .judges import JudgeChannel
from .verifier import EpisodeRecord, RuleVerifier


class ScoreRequest(BaseModel):
    """``POST /v1/score``: one finished episode."""

    task_id: str = Field(min_length=3, max_length=64, pattern=r"^[a-z0-9][a-z0-9-]+$")
    account_id: str = Field(min_length=6, max_length=20, pattern=r"^\d+$")
    started_at: float = Field(gt=0, description="epoch seconds when the episode began")
    ended_at: float = Field(gt=0)
    values: dict[str, str] = Field(default_factory=dict, max_length=64)
    actions: list[str] = Field(default_factory=list, max_length=500)
    final_observation: str = Field(default="", max_length=200_000)
    answer: str | None = Field(default=None, max_length=4_000)
    infeasible_reason: str | None = Field(default=None, max_length=4_000)
    env_error: str | None = Field(default=None, max_length=2_000,
                                  description="the episode failed for infrastructure reasons")


class UnknownName(LookupError):
    """A request named a task or account the service does not know."""


class RewardService:
    def __init__(self, tasks: list[Task], accounts: list[Account], endpoint: str | None,
                 trail_config: TrailConfig | None = None, reward_config: RewardConfig | None = None,
                 judges: JudgeChannel | None = None,
                 client_factory: Callable[[Account], CloudClient] | None = None):
        self.tasks = {t.id: t for t in tasks}
        self.accounts = {a.account_id: a for a in accounts}
        self.trail_config = trail_config or TrailConfig()
        self.reward_config = reward_config or RewardConfig()
        self.judges = judges
        self._factory = client_factory or (lambda a: CloudClient(
            CloudConfig(endpoint=endpoint), Credentials(a.access_key_id, a.access_key_secret)))

    def score(self, request: ScoreRequest) -> RewardResult:
        task = self.tasks.get(request.task_id)
        if task is None:
            raise UnknownName(f"unknown task_id {request.task_id!r}")
        account = self.accounts.get(request.account_id)
        if account is None:
            raise UnknownName(f"unknown account_id {request.account_id!r}")
        if request.env_error:
            return fuse(task.expected, None, None, EnvError("env_error", request.env_error),
                        self.reward_config)
        client = self._factory(account)
        trail = TrailClient(lambda: self._factory(account), self.trail_config,
                            account_id=account.account_id)
        episode = EpisodeRecord(account.account_id, request.started_at, request.ended_at,
                                tuple(sorted(request.values.items())))
        rule = RuleVerifier(trail, client).verify(task, episode)
        verdict = None
        if rule.verdict == "undetermined" and self.judges is not None:
            verdict = self.judges.judge(
                task.title, task.procedure, request.actions, request.final_observation,
                request.answer, request.infeasible_reason, expected=task.expected,
                reference_reason=task.infeasible_reason)
        return fuse(task.expected, rule, verdict, None, self.reward_config)


def result_json(result: RewardResult) -> dict[str, Any]:
    return asdict(result)


def build_app(service: RewardService) -> FastAPI:
    app = FastAPI(title="console-rl reward service", version="1")

    @app.post("/v1/score")
    async def score(request: ScoreRequest) -> Mapping[str, Any]:
        # Scoring waits on ActionTrail (and judges): off the event loop.
        try:
            result = await asyncio.to_thread(service.score, request)
        except UnknownName as exc:
            raise HTTPException(status_code=404, detail=str(exc)) from None
        return result_json(result)

    @app.get("/healthz")
    async def healthz() -> Mapping[str, Any]:
        return {"status": "ok", "tasks": len(service.tasks), "accounts": len(service.accounts)}

    return app


@ray.remote
class RewardActor:
    """The service as a Ray actor: ``score`` runs in a thread, so many episodes are scored at
    once without blocking the actor's event loop."""

    def __init__(self, service: RewardService):
        self.service = service

    async def score(self, request: dict[str, Any]) -> RewardResult:
        return await asyncio.to_thread(self.service.score, ScoreRequest(**request))
