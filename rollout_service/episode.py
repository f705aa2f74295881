"""One episode's lifecycle: provision → execute → recover → score → destroy → verify.

- provision: the task's prerequisites under a fresh episode id (a failure makes the episode an
  ``env_error``: it never counts as the agent's failure);
- execute: sign in on the task's start page and let the policy act (here: the oracle);
- recover: before scoring, find prerequisites the agent broke without being asked to (a
  declared resource that is gone although no required event names it), and record them;
- score: the reward service's rule channel (:class:`reward_service.verifier.RuleVerifier`):
  the task's success rule over the episode's console audit events and the end state;
- destroy: everything tagged with or named after the episode, plus what the agent created
  (found in the audit log), then verify through Describe calls that nothing is left.
"""
from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import oss2

from consolerl.errors import CloudAPIError
from consolerl.types import EnvError, EpisodeSpec, Observation, StepResult
from env_workers.driver import DriverError, StepFn
from env_workers.worker import EnvWorker
from infra.cloud import CloudClient
from consolerl.accounts import Account
from reward_service.actiontrail import TrailClient
from consolerl.rewards import RuleOutcome
from reward_service.rules import dotted
from reward_service.verifier import RuleVerifier, record

from consolerl.resources import fill
from rollout_service.oracle import run_oracle
from infra.provisioning.sdk import Provisioned, ProvisionError, ProvisionResult, SdkProvisioner
from consolerl.tasks import Task

# Audit events that create something the agent owns -> (type, where its id is)
_CREATES = {
    "CreateVpc": ("vpc", "responseElements.VpcId"),
    "CreateVSwitch": ("vswitch", "responseElements.VSwitchId"),
    "CreateSecurityGroup": ("security_group", "responseElements.SecurityGroupId"),
    "RunInstances": ("instance", "responseElements.InstanceIdSets.InstanceIdSet"),
    "CreateUser": ("ram_user", "requestParameters.UserName"),
    "PutBucket": ("oss_bucket", "requestParameters.BucketName"),
}


@dataclass
class EpisodeOutcome:
    task_id: str
    episode_id: str
    status: str                      # solved | failed | infeasible_reported | env_error
    provision_s: float = 0.0
    steps: int = 0
    reasons: list[str] = field(default_factory=list)
    broken_prerequisites: list[str] = field(default_factory=list)
    leaked: list[str] = field(default_factory=list)
    fencing: int = 0
    # The trajectory (what a judge reads) and the rule channel's outcome:
    actions: list[str] = field(default_factory=list)     # canonical action texts, in order
    final_text: str = ""                                  # the last observation's text
    answer: str | None = None
    infeasible: str | None = None
    rule: RuleOutcome | None = None
    started_at: float = 0.0
    ended_at: float = 0.0


Policy = Callable[[Task, Mapping[str, str], StepFn, Observation], Awaitable[StepResult]]


def agent_created(events: list[dict[str, Any]]) -> list[Provisioned]:
    """What the agent's console operations created (to destroy it with the episode)."""
    made = []
    for e in events:
        if e.get("errorCode") or e.get("eventName") not in _CREATES:
            continue
        kind, path = _CREATES[e["eventName"]]
        value = dotted(e, path)
        for rid in (value if isinstance(value, list) else [value]):
            if rid:
                made.append(Provisioned("agent", kind, str(rid), e.get("acsRegion", "")))
    return made


def _exists(client: CloudClient, r: Provisioned) -> bool:
    try:
        if r.type == "vpc":
            return bool(client.rpc("Vpc", "DescribeVpcs", {"RegionId": r.region,
                                                           "VpcId": r.cloud_id})["TotalCount"])
        if r.type == "vswitch":
            return bool(client.rpc("Vpc", "DescribeVSwitches", {
                "RegionId": r.region, "VSwitchId": r.cloud_id})["TotalCount"])
        if r.type == "security_group":
            client.rpc("Ecs", "DescribeSecurityGroupAttribute", {
                "RegionId": r.region, "SecurityGroupId": r.cloud_id})
            return True
        if r.type == "instance":
            return bool(client.rpc("Ecs", "DescribeInstances", {
                "RegionId": r.region, "InstanceIds": f'["{r.cloud_id}"]'})["TotalCount"])
        if r.type == "ram_user":
            client.rpc("Ram", "GetUser", {"UserName": r.cloud_id})
            return True
        if r.type == "oss_bucket":
            client.oss_bucket(r.cloud_id).get_bucket_info()
            return True
    except (CloudAPIError, oss2.exceptions.OssError):
        return False
    return True             # rules live with their group


async def run_episode(task: Task, worker: EnvWorker, account: Account, client: CloudClient,
                      provisioner: SdkProvisioner, *, max_steps: int = 40,
                      ready: ProvisionResult | None = None,
                      policy: Policy = run_oracle) -> EpisodeOutcome:
    """Run ``task`` once with ``policy`` (default: the oracle); ``ready``: prerequisites a
    warm pool provisioned. A policy that raises :class:`DriverError` ends the episode
    without an answer (the agent got stuck)."""
    started = time.time()
    episode_id = ready.episode_id if ready else secrets.token_hex(4)
    outcome = EpisodeOutcome(task.id, episode_id, "failed")
    try:
        t0 = time.perf_counter()
        result = ready or provisioner.provision(list(task.prerequisites), episode_id)
        outcome.provision_s = 0.0 if ready else time.perf_counter() - t0
    except ProvisionError as exc:
        outcome.status = "env_error"
        outcome.reasons.append(str(exc))
        outcome.leaked = provisioner.leftovers(episode_id)
        return outcome
    values = task.values(episode_id, result.values())
    extra: list[Provisioned] = []          # what the agent created, from the audit log
    try:
        spec = EpisodeSpec(start_path=fill(task.start_page, values), drift=task.drift,
                           max_steps=max_steps)
        observation = await worker.reset(spec, account)
        if isinstance(observation, EnvError):
            outcome.status = "env_error"
            outcome.reasons.append(f"{observation.kind}: {observation.message}")
            return outcome
        last: list[StepResult] = []

        async def step(action: str) -> StepResult:
            result = await worker.step(action)
            if result.action_text:
                outcome.actions.append(result.action_text)
            last[:] = [result]
            return result
        try:
            final = await policy(task, values, step, observation)
            outcome.steps = final.observation.step
        except DriverError as exc:
            final = None
            outcome.reasons.append(f"policy stuck: {str(exc)[:300]}")
        await worker.close_episode()
        ended = time.time()
        outcome.started_at, outcome.ended_at = started, ended
        outcome.final_text = (last[0].observation if last else observation).text
        if final is not None:
            outcome.answer, outcome.infeasible = final.answer, final.infeasible
        verifier = RuleVerifier(TrailClient(client, account_id=account.account_id), client)
        rule, console_events = await asyncio.to_thread(
            verifier.verify_with_events, task, record(account.account_id, started, values, ended))
        outcome.rule = rule
        named = {fill(v, values) for req in task.success.required_events for v in req.literals()}
        outcome.broken_prerequisites = [
            f"{r.type} {r.cloud_id}" for r in result.resources
            if r.cloud_id not in named and not _exists(client, r)]
        if task.expected == "infeasible":
            if final is not None and final.infeasible is not None and rule.verdict != "failure":
                outcome.status = "infeasible_reported"
            else:
                outcome.reasons.append("did not report the task as infeasible"
                                       if rule.verdict != "failure" else "a forbidden event")
        elif final is not None and final.answer is not None:
            outcome.status = "solved" if rule.verdict == "success" else "failed"
            outcome.reasons += rule.reasons
        extra = agent_created(console_events)
    finally:
        await worker.close_episode()
        report = provisioner.destroy(episode_id, extra=extra)
        outcome.reasons += report.errors
        outcome.leaked = provisioner.leftovers(episode_id) + [
            f"{x.type} {x.cloud_id}" for x in extra if _exists(client, x)]
    return outcome
