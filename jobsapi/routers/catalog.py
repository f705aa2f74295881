"""The task catalog and the validation of task definitions; the team's quota and the models a
job may name."""
# No "from __future__ import annotations": FastAPI reads the routes' annotations.

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel

from consolerl.errors import ConfigError
from consolerl.tasks import parse_task

from ..auth import Principal
from ..schema import Quota, TaskInfo, TaskList, ValidationResult
from .context import ERRORS, Context, auth

router = APIRouter(prefix="/v1", responses=ERRORS)


class ValidateBody(BaseModel):
    tasks: list[dict[str, Any]]


class ModelList(BaseModel):
    object: str = "list"
    data: list[str]


@router.get("/tasks", response_model=TaskList, tags=["tasks"], operation_id="list_tasks")
async def list_tasks(ctx: Context, who: Annotated[Principal, Depends(auth("jobs:read"))],
                     product: Annotated[str | None, Query(max_length=16)] = None,
                     split: Annotated[str | None, Query(max_length=16)] = None,
                     q: Annotated[str | None, Query(max_length=100)] = None) -> TaskList:
    """The task catalog, filtered by product, split and a text in the id or title."""
    needle = (q or "").lower()
    return TaskList(data=[TaskInfo(id=t.id, product=t.product, title=t.title,
                                   split=t.split, difficulty=t.difficulty,
                                   expected=t.expected, procedure=t.procedure)
                          for t in ctx.catalog.values()
                          if (product is None or t.product == product)
                          and (split is None or t.split == split)
                          and (needle in t.id or needle in t.title.lower())])


@router.post("/tasks/validate", response_model=ValidationResult, tags=["tasks"],
             operation_id="validate_tasks")
async def validate(body: ValidateBody,
                   who: Annotated[Principal, Depends(auth("jobs:read"))]) -> ValidationResult:
    """Validate task definitions exactly as task files are; each error names the task
    and the field."""
    errors, ids = [], []
    for i, data in enumerate(body.tasks[:100]):
        try:
            ids.append(parse_task(data, f"tasks[{i}]").id)
        except ConfigError as exc:
            errors.append(str(exc))
    return ValidationResult(valid=not errors and bool(body.tasks), task_ids=ids,
                            errors=errors or ([] if body.tasks else ["tasks: empty"]))


@router.get("/quota", response_model=Quota, tags=["account"], operation_id="get_quota")
async def quota(ctx: Context, who: Annotated[Principal, Depends(auth("jobs:read"))]) -> Quota:
    q = ctx.tokens.quota(who.team)
    active = await ctx.store.team_jobs(who.team)        # its index: other teams cost nothing
    return Quota(team=who.team, concurrent_episodes=q.concurrent_episodes,
                 queued_jobs=q.queued_jobs, samples_per_job=q.samples_per_job,
                 env_minutes_per_day=q.env_minutes_per_day, used={
                     "queued_jobs": sum(j.state == "queued" for j in active),
                     "running_episodes": sum(j.episodes.running for j in active),
                     "env_minutes_today": round(await ctx.store.usage_today(who.team) / 60,
                                                3)})


@router.get("/models", response_model=ModelList, tags=["account"], operation_id="list_models")
async def list_models(ctx: Context,
                      who: Annotated[Principal, Depends(auth("jobs:read"))]) -> ModelList:
    """The models a job may name: ``live`` and those the operator registered."""
    return ModelList(data=list(ctx.models))
