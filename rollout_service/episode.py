"""The one episode runner: every episode of console-rl runs here, whoever acts in it (the model
through the agent loop, the oracle, a scripted test agent) and whoever asked for it (the
orchestrator for RL and evaluation, the SFT export, the reward validation, the task suite).

    lease an account (the env worker's lease pool) → provision the task's prerequisites in it →
    open the start page signed in → the policy acts → close the browser → score (the reward
    service, before anything is destroyed: its end-state checks read the cloud) → recover
    (prerequisites the agent broke without being asked to) → destroy everything of the episode
    (tagged, named, and what the agent created, from the audit log) → verify nothing is left →
    release the lease

and returns one :class:`EpisodeOutcome`. A failure of the environment (no account, a
provisioning error, a browser that died, a lease lost, the cloud failing the scorer) is an
:class:`~consolerl.types.EnvError` value on the outcome, never the agent's failure.

The env side is anything with the env worker's episode methods (``acquire``, ``reset``,
``step``, ``close_browser``, ``end_episode``): :class:`env_workers.pool.EnvWorkerBody` in
process, or its Ray actor handle. A policy is any :data:`EpisodePolicy`; :func:`model_policy`
adapts an :class:`~rollout_service.agent.AgentLoop`, :func:`scripted_policy` a scripted agent
such as :func:`rollout_service.oracle.run_oracle`.
"""
from __future__ import annotations

import asyncio
import logging
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import oss2

from consolerl.accounts import Account
from consolerl.errors import CloudAPIError, EpisodeCancelled
from consolerl.experience import Trajectory, Turn
from consolerl.resources import fill
from consolerl.rewards import RewardResult
from consolerl.tasks import Task
from consolerl.types import EnvError, EpisodeSpec, Observation, StepResult
from env_workers.driver import DriverError
from infra.cloud import CloudClient, CloudConfig, Credentials
from infra.provisioning.sdk import Provisioned, ProvisionError, SdkProvisioner
from reward_service.actiontrail import TrailClient
from reward_service.rules import dotted
from reward_service.service import ScoreRequest
from reward_service.verifier import from_console

from .agent import AgentLoop
from .policy import call

log = logging.getLogger("rollout_service.episode")
StepFn = Callable[[str], Awaitable[StepResult]]
# A scripted agent: acts through ``step`` and returns the last step's result.
Script = Callable[[Task, Mapping[str, str], StepFn, Observation], Awaitable[StepResult]]
# Watches an episode: called with the step index (0: the opening page) and what the env
# answered, before the policy sees it; raising EpisodeCancelled stops the episode cleanly.
Observer = Callable[[int, StepResult], Awaitable[None]]


class EpisodePolicy(Protocol):
    """Acts in one episode: from the first observation, through ``step``, until it stops or a
    limit is hit; returns the trajectory (token-faithful when a model acted)."""

    async def __call__(self, task: Task, values: Mapping[str, str], observation: Observation,
                       step: StepFn, *, trajectory_id: str, seed: int) -> Trajectory: ...


def model_policy(agent: AgentLoop) -> EpisodePolicy:
    """The model acting through the agent loop (prompt, generate, parse, act)."""
    async def policy(task: Task, values: Mapping[str, str], observation: Observation,
                     step: StepFn, *, trajectory_id: str, seed: int) -> Trajectory:
        return await agent.run(task.id, task.title, fill(task.procedure, values), observation,
                               step, seed=seed, trajectory_id=trajectory_id)
    return policy


def scripted_policy(script: Script) -> EpisodePolicy:
    """A scripted agent (the oracle, a test's hacker) as a policy. Its turns carry the action
    texts and no tokens; a script that raises :class:`DriverError` got stuck: the episode ends
    without an answer (``end_reason`` ``stuck``, the error in ``end_detail``)."""
    async def policy(task: Task, values: Mapping[str, str], observation: Observation,
                     step: StepFn, *, trajectory_id: str, seed: int) -> Trajectory:
        started = time.time()
        turns: list[Turn] = []
        last = [observation]

        async def recorded(text: str) -> StepResult:
            result = await step(text)
            turns.append(Turn((), (), (), (), -1, text, result.action_text,
                              result.observation.last_action_error))
            last[0] = result.observation
            return result
        try:
            final = await script(task, values, recorded, observation)
        except DriverError as exc:
            return Trajectory(trajectory_id, task.id, tuple(turns), "stuck",
                              final_observation=last[0].text, started_at=started,
                              ended_at=time.time(), end_detail=str(exc)[:300])
        if final.env_error is not None:
            end = "env_error"
        elif final.infeasible is not None:
            end = "report_infeasible"
        elif final.answer is not None:
            end = "stop"
        else:
            end = final.truncated or "env_limit"
        return Trajectory(trajectory_id, task.id, tuple(turns), end, final.answer,
                          final.infeasible, final.env_error, last[0].text, started,
                          time.time())
    return policy


@dataclass
class EpisodeOutcome:
    """One episode, start to clean-up. ``env_error`` set: the environment failed (the
    trajectory, if any, is not the agent's doing and never trains). ``reward``: the reward
    service's result (its ``rule_verdict`` is the rule channel's). ``broken_prerequisites``:
    prerequisites the agent removed without being asked to; ``leaked``: what destroy left
    behind (must stay empty); ``reasons``: provisioning, scoring and clean-up problems."""

    task_id: str
    expected: str                           # the task's: success | infeasible
    episode_id: str
    trajectory: Trajectory | None = None
    reward: RewardResult | None = None
    env_error: EnvError | None = None
    worker: str = ""
    account_id: str = ""
    fencing: int = 0
    provision_s: float = 0.0
    broken_prerequisites: list[str] = field(default_factory=list)
    leaked: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    # The console's audit events of the episode's window (eventId, eventName, eventTime,
    # errorCode): what the reward's evidence ids point at, for reports.
    audit_events: list[dict[str, str]] = field(default_factory=list)
    cancelled: bool = False                 # stopped by its observer (EpisodeCancelled)

    @property
    def status(self) -> str:
        """solved | failed | infeasible_reported | env_error | cancelled, by the rule channel:
        a solvable
        task is solved when the agent said it was done and the rule succeeded; a
        wrong-documentation task when the agent reported it infeasible and the rule saw no
        forbidden or required-to-fail event."""
        if self.cancelled:
            return "cancelled"
        if self.env_error is not None:
            return "env_error"
        traj = self.trajectory
        rule = self.reward.rule_verdict if self.reward is not None else None
        verdict = rule.verdict if rule is not None else "undetermined"
        if self.expected == "infeasible":
            reported = traj is not None and traj.infeasible is not None
            return "infeasible_reported" if reported and verdict != "failure" else "failed"
        said_done = traj is not None and traj.answer is not None
        return "solved" if said_done and verdict == "success" else "failed"


# Audit events that create something the agent owns -> (type, where its id is)
_CREATES = {
    "CreateVpc": ("vpc", "responseElements.VpcId"),
    "CreateVSwitch": ("vswitch", "responseElements.VSwitchId"),
    "CreateSecurityGroup": ("security_group", "responseElements.SecurityGroupId"),
    "RunInstances": ("instance", "responseElements.InstanceIdSets.InstanceIdSet"),
    "CreateUser": ("ram_user", "requestParameters.UserName"),
    "PutBucket": ("oss_bucket", "requestParameters.BucketName"),
}


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


def exists(client: CloudClient, r: Provisioned) -> bool:
    """Whether ``r`` is still in the cloud (Describe calls; rules live with their group)."""
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
    return True


# RewardService.score (called with the request and the task), or a RewardActor handle's score
# (``.remote``, with the request: the actor knows the suite's tasks)
Scorer = Any


class EpisodeRunner:
    """Runs episodes for ``accounts`` (the accounts the env workers lease: their AccessKeys
    provision, verify and destroy) against the cloud at ``endpoint``; ``scorer`` scores them.
    One SDK provisioner per account, shared by the episodes that lease it in turn."""

    def __init__(self, accounts: Mapping[str, Account] | list[Account], endpoint: str,
                 scorer: Scorer, *,
                 client_factory: Callable[[Account], CloudClient] | None = None,
                 ready_timeout_s: float = 120.0, acquire_timeout_s: float | None = 300.0):
        self.accounts = dict(accounts) if isinstance(accounts, Mapping) else {
            a.account_id: a for a in accounts}
        self.scorer = scorer
        self.acquire_timeout_s = acquire_timeout_s
        self._client_of = client_factory or (lambda a: CloudClient(
            CloudConfig(endpoint=endpoint), Credentials(a.access_key_id, a.access_key_secret)))
        self.ready_timeout_s = ready_timeout_s
        self._provisioners: dict[str, SdkProvisioner] = {}

    def provisioner(self, account: Account) -> SdkProvisioner:
        p = self._provisioners.get(account.account_id)
        if p is None:
            p = self._provisioners[account.account_id] = SdkProvisioner(
                lambda: self._client_of(account), ready_timeout_s=self.ready_timeout_s,
                poll_s=0.05)
        return p

    async def _score(self, request: ScoreRequest, task: Task) -> RewardResult:
        """A remote scorer knows the suite's tasks by id; a local one (``RewardService.score``)
        is also handed the task, which may be an API job's own definition."""
        method = self.scorer
        if getattr(method, "remote", None) is not None:
            return await method.remote(request.model_dump())
        return await asyncio.to_thread(method, request, task)

    async def run(self, env: Any, task: Task, policy: EpisodePolicy, *, max_steps: int,
                  trajectory_id: str = "", seed: int = 0, observer: Observer | None = None
                  ) -> EpisodeOutcome:
        """One episode of ``task`` on ``env`` (see the module docstring). ``max_steps``: the
        env worker's step limit for the episode; ``observer``: sees every step (see
        :data:`Observer`)."""
        start = await call(env.acquire, self.acquire_timeout_s)
        outcome = EpisodeOutcome(task.id, task.expected, secrets.token_hex(4),
                                 worker=start.worker, account_id=start.account_id,
                                 fencing=start.fencing)
        if start.env_error is not None:
            outcome.env_error = start.env_error
            return outcome
        account = self.accounts.get(start.account_id)
        if account is None:
            await call(env.end_episode)
            outcome.env_error = EnvError("internal", f"account {start.account_id} is not one "
                                         "of the runner's accounts")
            return outcome
        provisioner = self.provisioner(account)
        extra: list[Provisioned] = []          # what the agent created, from the audit log
        try:
            try:
                t0 = time.perf_counter()
                ready = await asyncio.to_thread(provisioner.provision,
                                                list(task.prerequisites), outcome.episode_id)
                outcome.provision_s = time.perf_counter() - t0
            except (ProvisionError, CloudAPIError) as exc:
                outcome.env_error = EnvError("provision_failed", str(exc)[:300])
                outcome.reasons.append(str(exc))
                return outcome
            values = task.values(outcome.episode_id, ready.values())
            started = time.time()
            opened = await call(env.reset, EpisodeSpec(
                start_path=fill(task.start_page, values), drift=task.drift,
                max_steps=max_steps))
            if opened.env_error is not None:
                outcome.env_error = opened.env_error
                return outcome
            steps = [0]

            async def step(text: str) -> StepResult:
                result = await call(env.step, text)
                steps[0] += 1
                if observer is not None:
                    await observer(steps[0], result)
                return result
            try:
                if observer is not None:
                    await observer(0, StepResult(opened.observation))
                traj = await policy(task, values, opened.observation, step,
                                    trajectory_id=trajectory_id or uuid.uuid4().hex, seed=seed)
            except EpisodeCancelled as exc:
                outcome.cancelled = True
                outcome.reasons.append(f"cancelled: {exc}")
                await call(env.close_browser)
                return outcome
            await call(env.close_browser)
            outcome.trajectory = traj
            if traj.end_detail:
                outcome.reasons.append(f"policy {traj.end_reason}: {traj.end_detail}")
            if traj.env_error is not None:
                outcome.env_error = traj.env_error
                return outcome
            request = ScoreRequest(
                task_id=task.id, account_id=account.account_id, started_at=started,
                ended_at=max(time.time(), started), values=values,
                actions=traj.actions[:500], final_observation=traj.final_observation[:200_000],
                answer=None if traj.answer is None else traj.answer[:4000],
                infeasible_reason=None if traj.infeasible is None else traj.infeasible[:4000])
            try:
                outcome.reward = await self._score(request, task)
            except CloudAPIError as exc:
                outcome.env_error = EnvError("score_failed", exc.code)
                return outcome
            outcome.reasons += outcome.reward.reasons
            client = provisioner.client
            named = {fill(v, values) for req in task.success.required_events
                     for v in req.literals()}
            outcome.broken_prerequisites = await asyncio.to_thread(lambda: [
                f"{r.type} {r.cloud_id}" for r in ready.resources
                if r.cloud_id not in named and not exists(client, r)])
            trail = TrailClient(client, account_id=account.account_id)
            events = await asyncio.to_thread(trail.events, started - 1, time.time() + 1)
            console = [e for e in events if from_console(e)]
            extra = agent_created(console)
            outcome.audit_events = [{k: str(e.get(k) or "") for k in
                                     ("eventId", "eventName", "eventTime", "errorCode")}
                                    for e in console[:200]]
            return outcome
        finally:
            report = await asyncio.to_thread(provisioner.destroy, outcome.episode_id, extra)
            if report.errors:
                log.warning("destroy of episode %s: %s", outcome.episode_id, report.errors)
            outcome.reasons += report.errors
            outcome.leaked = await asyncio.to_thread(lambda: provisioner.leftovers(
                outcome.episode_id) + [f"{x.type} {x.cloud_id}" for x in extra
                                       if exists(provisioner.client, x)])
            released = await call(env.end_episode)
            if released is False and outcome.env_error is None:
                # Someone else may have held the account meanwhile: the reward is not the
                # agent's alone.
                outcome.env_error = EnvError("lease_lost", f"the lease on account "
                                             f"{account.account_id} expired during the episode")
