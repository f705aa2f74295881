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
``step``, ``close_browser``, ``end_episode``): :class:`env_workers.pool.LeasedEnvWorker` in
process, or its Ray actor handle. A policy is any :data:`EpisodePolicy`; :func:`model_policy`
adapts an :class:`~rollout_service.agent.AgentLoop`, :func:`scripted_policy` a scripted agent
such as :func:`datagen.oracle.run_oracle`.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import hashlib
import logging
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import oss2
import ray.exceptions

from consolerl.accounts import Account, lease_agent
from consolerl.audit import AuditEvent
from consolerl.errors import CloudAPIError, ConsoleRLError, EpisodeCancelled
from consolerl.experience import MAX_PAGES, Trajectory, Turn, keep_pages, page_seen
from consolerl.resources import fill
from consolerl.rewards import RewardResult
from consolerl.tasks import Task
from consolerl.types import EnvError, EpisodeSpec, Observation, StepResult
from env_workers.driver import DriverError
from env_workers.pool import actor_state
from infra.cloud import CloudClient, CloudConfig, Credentials
from infra.provisioning.sdk import Provisioned, ProvisionError, SdkProvisioner
from reward_service.actiontrail import TrailClient
from reward_service.service import MAX_ACTION_CHARS, MAX_ACTIONS, ScoreRequest

from .agent import AgentLoop
from .policy import call

log = logging.getLogger("rollout_service.episode")
T = TypeVar("T")
StepFn = Callable[[str], Awaitable[StepResult]]


@dataclass(frozen=True)
class Halt:
    """What a script returns to end its episode where it is, without an answer (it cannot or
    will not go on: SRC's rollback, a flow that got stuck); ``detail`` says why."""

    detail: str


# A scripted agent: acts through ``step`` and returns the last step's result, or a Halt.
Script = Callable[[Task, Mapping[str, str], StepFn, Observation],
                  Awaitable[StepResult | Halt]]
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


class WorkerSidePolicy:
    """The model acting through the agent loop on the env worker itself (its ``act``): the
    episode's turns (prompt, generate on the policy servers, step the browser) run in the
    worker's process and the rollout side makes one call for all of them instead of one
    env worker call per turn. ``shipped``: what ``act`` receives for the agent (the agent
    itself in process, ``[ray.put(agent)]`` for Ray actors: fetched once per worker process).

    As a plain :data:`EpisodePolicy` (an env without ``act``, or an episode with an observer,
    which must see every step) it runs the turns here, as :func:`model_policy` does."""

    def __init__(self, agent: AgentLoop, shipped: Any = None):
        self.shipped = agent if shipped is None else shipped
        self._here = model_policy(agent)

    async def __call__(self, task: Task, values: Mapping[str, str], observation: Observation,
                       step: StepFn, *, trajectory_id: str, seed: int) -> Trajectory:
        return await self._here(task, values, observation, step, trajectory_id=trajectory_id,
                                seed=seed)

    async def on_worker(self, env: Any, task: Task, values: Mapping[str, str],
                        observation: Observation, *, trajectory_id: str, seed: int
                        ) -> Trajectory:
        # No bound of its own (an episode's length is the agent's steps times the policy's
        # and the browser's latencies); the worker bounds each step, and a worker that is
        # lost ends the call within LOST_CHECK_S.
        trajectory, failure = await _env_call(
            env.act, self.shipped, task.id, task.title, fill(task.procedure, values),
            observation, seed, trajectory_id, wait_s=None)
        if trajectory is None:
            raise PolicyFailed(failure)
        return trajectory


def episode_id_seed(random_ids: bool, trajectory_id: str, seed: int) -> int | None:
    """An episode's element-id seed (``EpisodeSpec.id_seed``, for :meth:`EpisodeRunner.run`):
    ``None`` (document order) unless ``random_ids`` (``AgentConfig.random_ids``); else a
    number drawn from the episode's trajectory id and seed (a hash, the same in every
    process), so two episodes of a group see different ids. A loop that replays an episode's
    actions in a new episode passes that episode's seed again, not a new one."""
    if not random_ids:
        return None
    digest = hashlib.blake2b(f"{trajectory_id}\0{seed}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


class PolicyFailed(ConsoleRLError, RuntimeError):
    """The agent loop raised on the env worker (e.g. a policy replica gone)."""


def scripted_policy(script: Script) -> EpisodePolicy:
    """A scripted agent (the oracle, a test's hacker) as a policy. Its turns carry the action
    texts and no tokens; a script that returns a :class:`Halt` (or raises :class:`DriverError`:
    it got stuck) ends the episode without an answer (``end_reason`` ``stuck``, the why in
    ``end_detail``)."""
    async def policy(task: Task, values: Mapping[str, str], observation: Observation,
                     step: StepFn, *, trajectory_id: str, seed: int) -> Trajectory:
        started = time.time()
        turns: list[Turn] = []
        last = [observation]
        pages = [page_seen(observation.url, observation.text)]

        async def recorded(text: str) -> StepResult:
            result = await step(text)
            turns.append(Turn((), (), (), (), -1, text, result.action_text,
                              result.observation.last_action_error))
            last[0] = result.observation
            pages.append(page_seen(result.observation.url, result.observation.text))
            return result
        try:
            final = await script(task, values, recorded, observation)
        except DriverError as exc:
            final = Halt(str(exc))
        if isinstance(final, Halt):
            return Trajectory(trajectory_id, task.id, tuple(turns), "stuck",
                              final_observation=last[0].text, started_at=started,
                              ended_at=time.time(), end_detail=final.detail[:300],
                              pages=keep_pages(pages))
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
                          time.time(), pages=keep_pages(pages))
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
    worker_pid: int = 0
    provision_s: float = 0.0
    # Wall seconds the episode held its account: from the lease taken to its release
    # (provisioning, the agent's turns, scoring, clean-up); 0 when it ended before provisioning.
    episode_s: float = 0.0
    broken_prerequisites: list[str] = field(default_factory=list)
    leaked: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    # The console's audit events of the episode's window, each only its id, name, time and
    # error code (AuditEvent.brief): what the reward's evidence ids point at, for reports.
    audit_events: list[AuditEvent] = field(default_factory=list)
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


@dataclass(frozen=True)
class EpisodeLease:
    """The lease an episode runs under, as soon as it is taken (before anything is
    provisioned): what a caller records to find the episode again if it dies mid-way (the
    account to sweep, the fencing number whose lease it may end)."""

    episode_id: str
    account_id: str
    fencing: int
    worker: str


# Called with the episode's lease before anything is provisioned; raising stops the episode
# there (nothing made, the account released) as an env error ``internal``.
OnLease = Callable[[EpisodeLease], Awaitable[None]]


@dataclass(frozen=True)
class OrphanSweep:
    """What one :meth:`EpisodeRunner.sweep_orphans` destroyed: the episodes of dead holders
    cleaned in ``account_id`` and how many of their resources were deleted."""

    account_id: str = ""
    episodes: tuple[str, ...] = ()
    resources: int = 0


# Audit events that create something the agent owns -> (type, where its id is)
_CREATES = {
    "CreateVpc": ("vpc", "responseElements.VpcId"),
    "CreateVSwitch": ("vswitch", "responseElements.VSwitchId"),
    "CreateSecurityGroup": ("security_group", "responseElements.SecurityGroupId"),
    "RunInstances": ("instance", "responseElements.InstanceIdSets.InstanceIdSet"),
    "CreateUser": ("ram_user", "requestParameters.UserName"),
    "PutBucket": ("oss_bucket", "requestParameters.BucketName"),
}


class _WorkerFailed(ConsoleRLError, RuntimeError):
    """An env worker call raised: the worker itself broke (its process died, the actor
    is restarting); carries the episode's :class:`EnvError`."""

    def __init__(self, error: EnvError):
        super().__init__(error.message)
        self.error = error

    def __reduce__(self):
        return (type(self), (self.error,))


# How long an env worker call may take before the worker counts as broken. Generous against
# the worker's own limits (Playwright's action, navigation and snapshot timeouts bound a step at
# well under a minute; a reset launches a browser and signs in): a call past them is a worker
# that hangs (a browser that died mid-call), and the episode ends as an env error instead of
# holding the run up.
CALL_TIMEOUT_S = {"step": 120.0, "reset": 240.0}
DEFAULT_CALL_TIMEOUT_S = 60.0


def _call_timeout(method: Any, extra_s: float | None = 0.0) -> float | None:
    name = getattr(method, "_method_name", "") or getattr(method, "__name__", "")
    if extra_s is None:
        return None
    return CALL_TIMEOUT_S.get(name, DEFAULT_CALL_TIMEOUT_S) + extra_s


# A call to a Ray actor that has not answered after this long is checked against the actor's
# state in Ray's GCS, then again as often: one that Ray is restarting (its process or node was
# lost; with no node offering its resources it may wait for one indefinitely) or that is dead
# ends the call at once instead of waiting out its whole bound.
LOST_CHECK_S = 5.0


async def _bounded(method: Any, args: tuple[Any, ...], timeout: float | None) -> Any:
    """``method(*args)``; :class:`_NoAnswer` when it has not answered within ``timeout``,
    :class:`_ActorGone` as soon as Ray says its actor is restarting or dead."""
    task = asyncio.ensure_future(call(method, *args))
    ray_actor = getattr(getattr(method, "_actor", None), "_actor_id", None) is not None
    end = None if timeout is None else time.monotonic() + timeout
    try:
        while True:
            wait = None if end is None else max(0.0, end - time.monotonic())
            if ray_actor:
                wait = LOST_CHECK_S if wait is None else min(wait, LOST_CHECK_S)
            done, _ = await asyncio.wait({task}, timeout=wait)
            if done:
                return task.result()
            if end is not None and time.monotonic() >= end:
                task.cancel()
                raise _NoAnswer(timeout)
            state = await asyncio.to_thread(actor_state, method)
            if state in ("RESTARTING", "DEAD"):
                task.cancel()
                raise _ActorGone(state)
    except asyncio.CancelledError:
        task.cancel()
        raise


class _NoAnswer(ConsoleRLError, TimeoutError):
    """An env worker call that did not answer within its bound."""


class _ActorGone(ConsoleRLError, RuntimeError):
    """An env worker call whose actor Ray reports restarting or dead (``state``)."""

    def __init__(self, state: str):
        super().__init__(f"its actor is {state} (its process or node was lost)")
        self.state = state

    def __reduce__(self):
        return (type(self), (self.state,))


async def _env_call(method: Any, *args: Any, wait_s: float | None = 0.0) -> Any:
    """An env worker call; an exception (rather than an :class:`EnvError` value) or no answer
    within its bound (:data:`CALL_TIMEOUT_S`, plus ``wait_s`` the call itself may wait; None:
    unbounded) means the worker broke and becomes :class:`_WorkerFailed`."""
    name = getattr(method, "_method_name", "") or getattr(method, "__name__", "call")
    timeout = _call_timeout(method, wait_s)
    try:
        return await _bounded(method, args, timeout)
    except _NoAnswer:
        raise _WorkerFailed(EnvError("worker_failed", f"env worker {name} did not answer "
                                     f"within {timeout:g} s")) from None
    except _ActorGone as exc:
        raise _WorkerFailed(EnvError("worker_lost", f"env worker {name}: {exc}")) from None
    except Exception as exc:  # noqa: BLE001 - any failure of the worker is an env error
        kind = "worker_lost" if worker_lost(exc) else "worker_failed"
        raise _WorkerFailed(EnvError(kind, f"env worker {name} failed: "
                                     f"{type(exc).__name__}: {str(exc)[:200]}")) from None


def worker_lost(exc: BaseException) -> bool:
    """Whether an env worker call failed because the actor itself is gone (its process
    died, its node was lost: Ray restarts it elsewhere, or never) rather than inside it.
    Such an episode's worker holds no state worth a clean-up call (its lease ends by TTL)."""
    return isinstance(exc, (ray.exceptions.RayActorError,      # ActorDied, ActorUnavailable
                            _ActorGone))


async def _quiet(method: Any, *args: Any) -> Any:
    """A clean-up call to an env worker that may be gone (or hang): None when it fails."""
    try:
        return await _bounded(method, args, _call_timeout(method))
    except Exception as exc:  # noqa: BLE001 - clean-up goes on
        log.warning("env worker clean-up call failed: %s: %s", type(exc).__name__,
                    str(exc)[:200])
        return None


def agent_created(events: list[AuditEvent]) -> list[Provisioned]:
    """What the agent's console operations created (to destroy it with the episode)."""
    made = []
    for e in events:
        if e.refused or e.event_name not in _CREATES:
            continue
        kind, path = _CREATES[e.event_name]
        value = e.at(path)
        for rid in (value if isinstance(value, list) else [value]):
            if rid:
                made.append(Provisioned("agent", kind, str(rid), e.region))
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
                 ready_timeout_s: float = 120.0, acquire_timeout_s: float | None = 300.0,
                 executor: concurrent.futures.Executor | None = None):
        self.accounts = dict(accounts) if isinstance(accounts, Mapping) else {
            a.account_id: a for a in accounts}
        self.scorer = scorer
        self.acquire_timeout_s = acquire_timeout_s
        self._client_of = client_factory or (lambda a: CloudClient(
            CloudConfig(endpoint=endpoint), Credentials(a.access_key_id, a.access_key_secret)))
        self.ready_timeout_s = ready_timeout_s
        self.cleanup_wait_s = 60.0
        self._provisioners: dict[str, SdkProvisioner] = {}
        # The blocking calls (SDK, audit log, scoring) run here: the loop's default executor
        # (None) has cpu_count + 4 threads, which a scorer waiting out ActionTrail's rate
        # limit for hundreds of workers fills; the orchestrator passes one sized to them.
        self.executor = executor

    async def blocking(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in the runner's executor (as ``asyncio.to_thread`` does in the
        default one: the caller's context variables go with it)."""
        call = functools.partial(contextvars.copy_context().run, fn, *args)
        return await asyncio.get_running_loop().run_in_executor(self.executor, call)

    def provisioner(self, account: Account) -> SdkProvisioner:
        p = self._provisioners.get(account.account_id)
        if p is None:
            p = self._provisioners[account.account_id] = SdkProvisioner(
                lambda: self._client_of(account), ready_timeout_s=self.ready_timeout_s,
                poll_s=0.05)
        return p

    async def _destroy_orphans(self, env: Any, provisioner: SdkProvisioner,
                               orphans: Sequence[str]) -> tuple[list[str], int]:
        """Destroy what the episodes ``orphans`` (their holder died) left in the leased
        account; returns those cleaned (the others stay recorded) and how many resources
        were deleted."""
        cleaned: list[str] = []
        deleted = 0
        for orphan in orphans:
            try:
                report = await self.blocking(provisioner.destroy, orphan)
            except (CloudAPIError, oss2.exceptions.OssError) as exc:
                log.warning("orphaned episode %s: %s (left for later)", orphan, exc)
                continue
            if report.errors:
                log.warning("orphaned episode %s: %s", orphan, report.errors)
                continue
            await _env_call(env.cleaned, orphan)
            cleaned.append(orphan)
            deleted += len(report.deleted)
        return cleaned, deleted

    async def clear_orphans(self, env: Any, acquire_timeout_s: float = 5.0) -> int:
        """Lease one account through ``env`` (accounts that dead holders left resources in
        come first) and destroy what they left; returns how many episodes were cleaned (0
        when the account leased had none, e.g. those are still leased by the dead holder
        until its lease expires)."""
        return len((await self.sweep_orphans(env, acquire_timeout_s)).episodes)

    async def sweep_orphans(self, env: Any, acquire_timeout_s: float = 5.0) -> OrphanSweep:
        """:meth:`clear_orphans`, saying which account was swept, which episodes were
        cleaned and how many resources were deleted."""
        try:
            start = await _env_call(env.acquire, acquire_timeout_s,
                                    wait_s=acquire_timeout_s)
        except _WorkerFailed:
            return OrphanSweep()
        if start.env_error is not None:
            return OrphanSweep()
        account = self.accounts.get(start.account_id)
        if account is None or not getattr(start, "unfinished", ()):
            await _quiet(env.end_episode)
            return OrphanSweep(start.account_id)
        provisioner = self.provisioner(account)
        provisioner.user_agent = lease_agent(account.account_id, start.fencing)
        try:
            cleaned, deleted = await self._destroy_orphans(env, provisioner, start.unfinished)
            return OrphanSweep(account.account_id, tuple(cleaned), deleted)
        except _WorkerFailed:
            return OrphanSweep(account.account_id)
        finally:
            provisioner.user_agent = ""
            await _quiet(env.end_episode)

    def _clean_up(self, provisioner: SdkProvisioner, outcome: EpisodeOutcome,
                  extra: list[Provisioned]) -> bool:
        """Destroy the episode's resources (and ``extra``, what the agent made), waiting out a
        cloud that does not answer (restarting) for up to ``cleanup_wait_s``; sets
        ``outcome.leaked``. Returns whether nothing is left. When the cloud stays away, the
        account's write-ahead record keeps the episode for its next holder to destroy."""
        deadline = time.monotonic() + self.cleanup_wait_s
        while True:
            try:
                report = provisioner.destroy(outcome.episode_id, extra)
                outcome.leaked = provisioner.leftovers(outcome.episode_id) + [
                    f"{x.type} {x.cloud_id}" for x in extra if exists(provisioner.client, x)]
                break
            except (CloudAPIError, oss2.exceptions.OssError) as exc:
                if time.monotonic() > deadline:
                    outcome.reasons.append(f"clean-up failed: {exc}"[:300])
                    outcome.leaked = [f"episode {outcome.episode_id}: clean-up failed (the "
                                      "account's next holder destroys what is left)"]
                    return False
                log.warning("clean-up of episode %s: %s; retrying", outcome.episode_id, exc)
                time.sleep(1.0)
        if report.errors:
            log.warning("destroy of episode %s: %s", outcome.episode_id, report.errors)
        outcome.reasons += report.errors
        return not report.errors and not outcome.leaked

    @staticmethod
    def _console_events(client: CloudClient, account: Account, since: float
                        ) -> list[AuditEvent]:
        """The console's audit events in the account from ``since`` (wall clock) to now."""
        trail = TrailClient(client, account_id=account.account_id)
        return [e for e in trail.events(since - 1, time.time() + 1) if e.by_console]

    def _agent_created(self, provisioner: SdkProvisioner, account: Account, since: float
                       ) -> list[Provisioned]:
        """What the agent created since ``since`` (nothing when no browser episode began)."""
        if not since:
            return []
        try:
            return agent_created(self._console_events(provisioner.client, account, since))
        except CloudAPIError as exc:
            log.warning("audit log of account %s unreadable: %s", account.account_id, exc)
            return []

    async def _score(self, request: ScoreRequest, task: Task) -> RewardResult:
        """A remote scorer knows the suite's tasks by id; a local one (``RewardService.score``)
        is also handed the task, which may be an API job's own definition."""
        method = self.scorer
        if getattr(method, "remote", None) is not None:
            return await method.remote(request.model_dump())
        return await self.blocking(method, request, task)

    async def run(self, env: Any, task: Task, policy: EpisodePolicy, *, max_steps: int,
                  trajectory_id: str = "", seed: int = 0, observer: Observer | None = None,
                  interrupted: Callable[[], str] | None = None,
                  on_lease: OnLease | None = None, id_seed: int | None = None
                  ) -> EpisodeOutcome:
        """One episode of ``task`` on ``env`` (see the module docstring). ``max_steps``: the
        env worker's step limit for the episode; ``id_seed``: how the env worker numbers the
        page's elements (``EpisodeSpec.id_seed``; :func:`episode_id_seed` draws one for an
        agent with ``random_ids``); ``observer``: sees every step (see
        :data:`Observer`); ``interrupted``: asked before each step of turns run here, a
        non-empty answer (why) stops the episode there, cleaned up, as ``cancelled``;
        ``on_lease``: told the episode's lease before anything is provisioned (see
        :data:`OnLease`)."""
        try:
            start = await _env_call(env.acquire, self.acquire_timeout_s,
                                    wait_s=self.acquire_timeout_s)
        except _WorkerFailed as exc:
            return EpisodeOutcome(task.id, task.expected, secrets.token_hex(4),
                                  env_error=exc.error)
        outcome = EpisodeOutcome(task.id, task.expected, secrets.token_hex(4),
                                 worker=start.worker, account_id=start.account_id,
                                 fencing=start.fencing, worker_pid=getattr(start, "pid", 0))
        held = time.perf_counter()
        if start.env_error is not None:
            outcome.env_error = start.env_error
            return outcome
        account = self.accounts.get(start.account_id)
        if account is None:
            await _quiet(env.end_episode)
            outcome.env_error = EnvError("internal", f"account {start.account_id} is not one "
                                         "of the runner's accounts")
            return outcome
        if on_lease is not None:
            try:
                await on_lease(EpisodeLease(outcome.episode_id, account.account_id,
                                            start.fencing, start.worker))
            except Exception as exc:  # noqa: BLE001 - nothing is made without the record
                await _quiet(env.end_episode)
                outcome.env_error = EnvError("internal", f"the episode's lease could not be "
                                             f"recorded: {type(exc).__name__}: "
                                             f"{str(exc)[:200]}")
                return outcome
        provisioner = self.provisioner(account)
        provisioner.user_agent = lease_agent(account.account_id, start.fencing)
        extra: list[Provisioned] = []          # what the agent created, from the audit log
        started_at = [0.0]                      # when the browser episode began
        tracked = hasattr(env, "begin")         # the env worker keeps the write-ahead record
        try:
            if tracked:
                # Episodes in this account whose holder died before cleaning up (a killed job,
                # a lost node): their resources go first; then this one is recorded.
                await self._destroy_orphans(env, provisioner, getattr(start, "unfinished", ()))
                await _env_call(env.begin, outcome.episode_id)
            try:
                t0 = time.perf_counter()
                ready = await self.blocking(provisioner.provision,
                                                list(task.prerequisites), outcome.episode_id)
                outcome.provision_s = time.perf_counter() - t0
            except (ProvisionError, CloudAPIError) as exc:
                outcome.env_error = EnvError("provision_failed", str(exc)[:300])
                outcome.reasons.append(str(exc))
                return outcome
            values = task.values(outcome.episode_id, ready.values())
            started = started_at[0] = time.time()
            opened = await _env_call(env.reset, EpisodeSpec(
                start_path=fill(task.start_page, values), drift=task.drift,
                max_steps=max_steps, id_seed=id_seed))
            if opened.env_error is not None:
                outcome.env_error = opened.env_error
                return outcome
            steps = [0]

            async def step(text: str) -> StepResult:
                why = interrupted() if interrupted is not None else ""
                if why:
                    raise EpisodeCancelled(why)
                result = await _env_call(env.step, text)
                steps[0] += 1
                if observer is not None:
                    await observer(steps[0], result)
                return result
            try:
                tid = trajectory_id or uuid.uuid4().hex
                on_worker = getattr(policy, "on_worker", None)
                if observer is None and on_worker is not None and hasattr(env, "act"):
                    traj = await on_worker(env, task, values, opened.observation,
                                           trajectory_id=tid, seed=seed)
                else:
                    if observer is not None:
                        await observer(0, StepResult(opened.observation))
                    traj = await policy(task, values, opened.observation, step,
                                        trajectory_id=tid, seed=seed)
            except EpisodeCancelled as exc:
                outcome.cancelled = True
                outcome.reasons.append(f"cancelled: {exc}")
                await _quiet(env.close_browser)
                return outcome
            except _WorkerFailed:
                raise
            except Exception as exc:  # noqa: BLE001 - the policy broke, not the agent
                # A policy replica that died or restarted mid-episode (or any failure of
                # the generation path): the trajectory is incomplete and never trains.
                log.warning("episode %s: the policy failed: %s", outcome.episode_id, exc,
                            exc_info=True)
                outcome.env_error = EnvError("policy_failed",
                                             f"{type(exc).__name__}: {str(exc)[:300]}")
                await _quiet(env.close_browser)
                return outcome
            await _env_call(env.close_browser)
            outcome.trajectory = traj
            if traj.end_detail:
                outcome.reasons.append(f"policy {traj.end_reason}: {traj.end_detail}")
            if traj.env_error is not None:
                outcome.env_error = traj.env_error
                return outcome
            request = ScoreRequest(
                task_id=task.id, account_id=account.account_id, started_at=started,
                ended_at=max(time.time(), started), values=values,
                actions=[a[:MAX_ACTION_CHARS] for a in traj.actions[:MAX_ACTIONS]],
                final_observation=traj.final_observation[:200_000],
                answer=None if traj.answer is None else traj.answer[:4000],
                infeasible_reason=None if traj.infeasible is None else traj.infeasible[:4000],
                pages=list(traj.pages[:MAX_PAGES]))
            try:
                outcome.reward = await self._score(request, task)
            except CloudAPIError as exc:
                outcome.env_error = EnvError("score_failed", exc.code)
                return outcome
            except Exception as exc:  # noqa: BLE001 - the reward service broke, not the agent
                log.warning("episode %s: scoring failed: %s", outcome.episode_id, exc,
                            exc_info=True)
                outcome.env_error = EnvError("score_failed",
                                             f"{type(exc).__name__}: {str(exc)[:300]}")
                return outcome
            outcome.reasons += outcome.reward.reasons
            client = provisioner.client
            named = {fill(v, values) for req in task.success.required_events
                     for v in req.literals()}
            outcome.broken_prerequisites = await self.blocking(lambda: [
                f"{r.type} {r.cloud_id}" for r in ready.resources
                if r.cloud_id not in named and not exists(client, r)])
            try:
                console = await self.blocking(self._console_events, client, account,
                                                  started)
            except CloudAPIError as exc:
                # What the agent did cannot be read back (the cloud failing): not trusted.
                outcome.env_error = EnvError("score_failed", f"audit log: {exc.code}")
                return outcome
            extra = agent_created(console)
            outcome.audit_events = [e.brief() for e in console[:200]]
            return outcome
        except _WorkerFailed as exc:
            # The env worker itself broke (its process died, Ray lost it): not the agent's
            # doing. What the agent created is found from the audit log all the same.
            outcome.env_error = exc.error
            return outcome
        finally:
            # A worker lost with its process or node answers no clean-up call (a call to an
            # actor Ray is restarting waits for the restart): its lease expires by TTL.
            lost = outcome.env_error is not None and outcome.env_error.kind == "worker_lost"
            if outcome.env_error is not None and not extra:
                # Ended by an env error after the browser opened: what the agent created
                # is found from the audit log all the same, so that it is destroyed too.
                extra = await self.blocking(self._agent_created, provisioner, account,
                                                started_at[0])
            clean = await self.blocking(self._clean_up, provisioner, outcome, extra)
            if tracked and clean and not lost:
                await _quiet(env.cleaned, outcome.episode_id)
            provisioner.user_agent = ""         # the lease ends here
            released = None if lost else await _quiet(env.end_episode)
            if released is False and outcome.env_error is None:
                # Someone else may have held the account meanwhile: the reward is not the
                # agent's alone.
                outcome.env_error = EnvError("lease_lost", f"the lease on account "
                                             f"{account.account_id} expired during the episode")
            outcome.episode_s = time.perf_counter() - held
