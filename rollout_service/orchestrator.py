"""The rollout orchestrator: GRPO groups of episodes on env workers, pushed to the experience
stream when complete; asynchronous (no batch barrier) or synchronous for comparison.

One episode: lease an account on a free env worker → provision the task's prerequisites in it →
open the start page → the agent loop (policy via the router) → close the browser → score with
the reward service (before anything is destroyed: the end-state checks read the cloud) →
destroy the episode's resources (tagged, named, and what the agent created, from the audit log)
→ release the account. A failure of the environment (no account, provisioning, browser) makes
the episode ``env_error``: it is retried up to ``max_env_retries`` times and never becomes
training data; a group whose retries run out is abandoned.

Async mode: every worker runs episodes back to back, taking the next episode of the oldest
open group; a group is pushed (``XADD``) the moment its n-th episode is scored. Admission
control (AReaL-style capacity, nothing thrown away): a new group is only opened while

    groups_admitted < (trainer_version + max_staleness + 1) * groups_per_step

so no group starts more than ``max_staleness`` trainer versions ahead of the version that
will consume it. ``groups_admitted`` counts the groups opened that can still reach the
trainer: groups dropped or abandoned never will, so they give their slot back (counting them
would stall the rollouts while the trainer waits for a group that is never opened). Groups
whose rewards are all equal are counted and, with ``drop_uniform_groups``, not pushed (GRPO
learns nothing from them).

Sync mode: open ``groups_per_step`` groups, run all their episodes, push them, then wait until
the trainer's version moves before the next batch (the batch barrier of verl's colocated loop).
"""
from __future__ import annotations

import asyncio
import logging
import re
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from consolerl.config import check_int
from consolerl.errors import CloudAPIError, ConfigError
from consolerl.types import EpisodeSpec
from infra.cloud import CloudClient, CloudConfig, Credentials
from consolerl.accounts import Account
from rollout_service.episode import agent_created
from consolerl.resources import fill
from infra.provisioning.sdk import ProvisionError, SdkProvisioner
from consolerl.tasks import Task
from reward_service.actiontrail import TrailClient
from consolerl.rewards import RewardResult
from reward_service.service import ScoreRequest
from reward_service.verifier import from_console

from .agent import AgentLoop
from consolerl.experience import Trajectory
from .experience import ExperienceStream
from consolerl.experience import Group, sample_of
from .policy import call

log = logging.getLogger("rollout_service.orchestrator")


@dataclass(frozen=True)
class OrchestratorConfig:
    group_size: int = 2
    mode: str = "async"                   # async | sync
    max_staleness: int = 1
    groups_per_step: int = 1
    max_env_retries: int = 2
    drop_uniform_groups: bool = True
    split: str = "train"
    task_filter: str = ""                 # regular expression over task ids ("": all)
    acquire_timeout_s: float = 300.0
    seed: int = 0

    def __post_init__(self) -> None:
        for name, low in (("group_size", 1), ("max_staleness", 0), ("groups_per_step", 1),
                          ("max_env_retries", 0)):
            check_int(f"OrchestratorConfig.{name}", getattr(self, name), low)
        if self.mode not in ("async", "sync"):
            raise ConfigError(f"OrchestratorConfig.mode: must be async or sync, "
                              f"got {self.mode!r}")
        if self.split not in ("train", "heldout", "all"):
            raise ConfigError(f"OrchestratorConfig.split: must be train, heldout or all, "
                              f"got {self.split!r}")
        try:
            re.compile(self.task_filter)
        except re.error as exc:
            raise ConfigError(f"OrchestratorConfig.task_filter: {exc}") from None


@dataclass
class EpisodeResult:
    task_id: str
    trajectory: Trajectory | None
    reward: RewardResult | None
    env_error: str = ""
    worker: str = ""
    busy_s: float = 0.0
    start_version: int = 0
    leaked: list[str] = field(default_factory=list)


@dataclass
class _Group:
    group_id: str
    task: Task
    n: int
    results: list[EpisodeResult | None]
    pending: list[int]                     # indices no worker has claimed yet
    in_flight: int = 0
    retries: int = 0
    abandoned: bool = False

    @property
    def done(self) -> bool:
        complete = all(r is not None for r in self.results)
        return (complete or self.abandoned) and self.in_flight == 0


class RolloutMetrics:
    def __init__(self, registry: CollectorRegistry):
        self.episodes = Counter("consolerl_rollout_episodes_total", "Episodes finished, by end "
                                "reason (stop, report_infeasible, max_steps, token_limit, "
                                "env_limit, env_error).", ["end"], registry=registry)
        self.groups = Counter("consolerl_rollout_groups_total", "Groups finished, by outcome "
                              "(pushed, dropped_uniform, abandoned).", ["outcome"],
                              registry=registry)
        self.retries = Counter("consolerl_rollout_env_retries_total", "Episodes retried after "
                               "an env error.", registry=registry)
        self.seconds = Histogram("consolerl_rollout_episode_seconds", "Wall time of an episode "
                                 "on its worker (lease to release).", registry=registry,
                                 buckets=(1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640))
        self.reward = Histogram("consolerl_rollout_reward", "Episode rewards.",
                                registry=registry, buckets=(-1, -0.5, 0, 0.25, 0.5, 0.75, 1))
        self.admission_wait = Counter("consolerl_rollout_admission_wait_seconds_total",
                                      "Time workers waited for staleness capacity.",
                                      registry=registry)
        self.busy_workers = Gauge("consolerl_rollout_busy_workers", "Workers inside an "
                                  "episode now.", registry=registry)
        self.trainer_version = Gauge("consolerl_rollout_trainer_version", "The trainer "
                                     "version the admission control last read.",
                                     registry=registry)


Scorer = Callable[[ScoreRequest], Any]       # sync or async; returns a RewardResult


class Orchestrator:
    """Runs groups on ``workers`` (EnvWorkerBody objects or EnvWorkerActor handles).

    ``accounts``: the accounts the workers lease (their credentials provision and destroy);
    ``endpoint``: the cloud's OpenAPI endpoint; ``scorer``: ``RewardService.score`` or a
    ``RewardActor`` handle's ``score``. Tasks are taken in turn, one per group.
    """

    def __init__(self, config: OrchestratorConfig, tasks: Sequence[Task],
                 workers: Sequence[Any], accounts: Sequence[Account], endpoint: str,
                 agent: AgentLoop, scorer: Any, stream: ExperienceStream,
                 registry: CollectorRegistry | None = None,
                 client_factory: Callable[[Account], CloudClient] | None = None):
        self.config = config
        pick = [t for t in tasks if (config.split == "all" or t.split == config.split)
                and re.search(config.task_filter, t.id)]
        if not pick:
            raise ConfigError(f"orchestrator: no task in split {config.split!r} matches "
                              f"{config.task_filter!r}")
        self.tasks = pick
        self.workers = list(workers)
        if not self.workers:
            raise ConfigError("orchestrator: needs at least one env worker")
        self.accounts = {a.account_id: a for a in accounts}
        self._client_of = client_factory or (lambda a: CloudClient(
            CloudConfig(endpoint=endpoint), Credentials(a.access_key_id, a.access_key_secret)))
        self.agent = agent
        self.scorer = scorer
        self.stream = stream
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = RolloutMetrics(self.registry)
        self._provisioners: dict[str, SdkProvisioner] = {}
        self.groups_opened = 0
        self.groups_pushed = 0
        self.groups_dropped = 0
        self.groups_abandoned = 0
        self.episodes: list[EpisodeResult] = []
        self.busy_s: dict[str, float] = {}
        self._stop = asyncio.Event()           # only polled (is_set), never awaited

    # ---- one episode ---------------------------------------------------------------------------
    def _provisioner(self, account: Account) -> SdkProvisioner:
        p = self._provisioners.get(account.account_id)
        if p is None:
            p = self._provisioners[account.account_id] = SdkProvisioner(
                lambda: self._client_of(account), ready_timeout_s=120, poll_s=0.05)
        return p

    async def _score(self, request: ScoreRequest) -> RewardResult:
        method = self.scorer
        if getattr(method, "remote", None) is not None:
            return await method.remote(request.model_dump())
        return await asyncio.to_thread(method, request)

    async def episode(self, worker: Any, task: Task, trajectory_id: str, seed: int
                      ) -> EpisodeResult:
        name = getattr(worker, "name", "") or str(id(worker))
        t0 = time.monotonic()
        self.metrics.busy_workers.inc()
        try:
            return await self._episode(worker, name, task, trajectory_id, seed)
        finally:
            self.metrics.busy_workers.dec()
            busy = time.monotonic() - t0
            self.busy_s[name] = self.busy_s.get(name, 0.0) + busy
            self.metrics.seconds.observe(busy)

    async def _episode(self, worker: Any, name: str, task: Task, trajectory_id: str,
                       seed: int) -> EpisodeResult:
        start = await call(worker.acquire, self.config.acquire_timeout_s)
        if start.env_error is not None:
            return EpisodeResult(task.id, None, None, f"{start.env_error.kind}: "
                                 f"{start.env_error.message}", name)
        account = self.accounts.get(start.account_id)
        if account is None:
            await call(worker.end_episode)
            return EpisodeResult(task.id, None, None, f"internal: account {start.account_id} "
                                 "is not in the orchestrator's accounts", name)
        provisioner = self._provisioner(account)
        episode_id = secrets.token_hex(4)
        extra: list[Any] = []
        result = EpisodeResult(task.id, None, None, worker=name)
        try:
            try:
                ready = await asyncio.to_thread(provisioner.provision,
                                                list(task.prerequisites), episode_id)
            except (ProvisionError, CloudAPIError) as exc:
                result.env_error = f"provision_failed: {str(exc)[:300]}"
                return result
            values = task.values(episode_id, ready.values())
            started = time.time()
            opened = await call(worker.reset, EpisodeSpec(
                start_path=fill(task.start_page, values), drift=task.drift,
                max_steps=self.agent.config.max_steps + 1))
            if opened.env_error is not None:
                result.env_error = f"{opened.env_error.kind}: {opened.env_error.message}"
                return result

            async def step(text: str):
                return await call(worker.step, text)
            traj = await self.agent.run(task.id, task.title, fill(task.procedure, values),
                                        opened.observation, step, seed=seed,
                                        trajectory_id=trajectory_id)
            await call(worker.close_browser)
            result.trajectory = traj
            if traj.env_error is not None:
                result.env_error = f"{traj.env_error.kind}: {traj.env_error.message}"
                return result
            request = ScoreRequest(
                task_id=task.id, account_id=account.account_id, started_at=started,
                ended_at=max(time.time(), started), values=values,
                actions=traj.actions[:500], final_observation=traj.final_observation[:200_000],
                answer=None if traj.answer is None else traj.answer[:4000],
                infeasible_reason=None if traj.infeasible is None else traj.infeasible[:4000])
            try:
                result.reward = await self._score(request)
            except CloudAPIError as exc:
                result.env_error = f"score_failed: {exc.code}"
                return result
            trail = TrailClient(provisioner.client, account_id=account.account_id)
            events = await asyncio.to_thread(trail.events, started - 1, time.time() + 1)
            extra = agent_created([e for e in events if from_console(e)])
            return result
        finally:
            report = await asyncio.to_thread(provisioner.destroy, episode_id, extra)
            if report.errors:
                log.warning("destroy of episode %s: %s", episode_id, report.errors)
            result.leaked = await asyncio.to_thread(provisioner.leftovers, episode_id)
            await call(worker.end_episode)
            end = "env_error" if result.env_error else (
                result.trajectory.end_reason if result.trajectory else "env_error")
            self.metrics.episodes.labels(end).inc()
            if result.reward is not None and not result.env_error:
                self.metrics.reward.observe(result.reward.reward)

    # ---- groups ----------------------------------------------------------------------------------
    def _open_group(self) -> _Group:
        task = self.tasks[self.groups_opened % len(self.tasks)]     # in turn
        self.groups_opened += 1
        n = self.config.group_size
        return _Group(f"g-{secrets.token_hex(6)}", task, n, [None] * n, list(range(n)))

    def _finish(self, group: _Group) -> str:
        """Push or drop a complete group; returns the outcome."""
        results = [r for r in group.results if r is not None]
        rewards = [r.reward.reward for r in results if r.reward is not None]
        trainable = all(r.reward is not None and r.reward.trainable for r in results)
        if group.abandoned or not trainable or len(rewards) != group.n:
            outcome = "abandoned"
            self.groups_abandoned += 1
        elif self.config.drop_uniform_groups and len(set(rewards)) == 1:
            outcome = "dropped_uniform"
            self.groups_dropped += 1
        else:
            samples = tuple(sample_of(r.trajectory, r.reward.reward, r.reward.verdict)
                            for r in results if r.trajectory is not None)
            self.stream.push(Group(group.group_id, group.task.id, samples, time.time(),
                                   {"rewards": rewards}))
            outcome = "pushed"
            self.groups_pushed += 1
        self.metrics.groups.labels(outcome).inc()
        return outcome

    @property
    def groups_admitted(self) -> int:
        """Groups opened that were not dropped or abandoned: pushed, or still running."""
        return self.groups_opened - self.groups_dropped - self.groups_abandoned

    async def _capacity(self, stop: asyncio.Event | None = None) -> None:
        """Wait until staleness capacity allows opening one more group (or ``stop`` is set)."""
        t0 = time.monotonic()
        while stop is None or not stop.is_set():
            version = await asyncio.to_thread(self.stream.trainer_version)
            self.metrics.trainer_version.set(version)
            limit = (version + self.config.max_staleness + 1) * self.config.groups_per_step
            if self.groups_admitted < limit:
                break
            await asyncio.sleep(0.2)
        waited = time.monotonic() - t0
        if waited > 0.01:
            self.metrics.admission_wait.inc(waited)

    async def run(self, max_groups: int | None, deadline_s: float | None = None
                  ) -> dict[str, Any]:
        """Run until ``max_groups`` groups are finished (pushed, dropped or abandoned), or,
        with ``None``, until :meth:`stop`. Episodes in flight at a stop are finished (and
        cleaned up); groups left incomplete are not pushed. A :meth:`stop` that came before
        this run began (an async actor need not start its calls in order) ends it at once."""
        if max_groups is not None and max_groups < 1:
            raise ConfigError("run: max_groups must be >= 1 (or None: until stopped)")
        limit = float("inf") if max_groups is None else max_groups
        t0 = time.monotonic()
        self.busy_s = {}
        try:
            if self.config.mode == "async":
                await self._run_async(limit, deadline_s)
            else:
                await self._run_sync(limit, deadline_s)
        finally:
            self._stop.clear()                 # a stop ends one run, not the next
        wall = time.monotonic() - t0
        return self.summary(wall)

    def summary(self, wall_s: float) -> dict[str, Any]:
        n_workers = len(self.workers)
        busy = sum(self.busy_s.values())
        return {
            "mode": self.config.mode, "wall_s": round(wall_s, 2),
            "episodes": len(self.episodes),
            "env_errors": sum(bool(e.env_error) for e in self.episodes),
            "groups_pushed": self.groups_pushed, "groups_dropped_uniform": self.groups_dropped,
            "groups_abandoned": self.groups_abandoned,
            "episodes_per_min": round(len(self.episodes) / wall_s * 60, 2) if wall_s else 0.0,
            "env_utilization": round(busy / (wall_s * n_workers), 4) if wall_s else 0.0,
            "leaked_resources": sum(len(e.leaked) for e in self.episodes),
        }

    def _returned(self, group: _Group, index: int, result: EpisodeResult) -> None:
        """Book an episode's result into its group (an env error puts the index back, within
        the retry budget, or abandons the group)."""
        group.in_flight -= 1
        if not result.env_error:
            group.results[index] = result
        elif not group.abandoned and group.retries < self.config.max_env_retries * group.n:
            group.retries += 1
            self.metrics.retries.inc()
            group.pending.append(index)
        else:
            group.abandoned = True

    def _seed(self, group: _Group, index: int) -> int:
        return (self.config.seed * 1_000_003 + int(group.group_id[2:], 16) + index) % 2**31

    def stop(self) -> None:
        """Ask :meth:`run` (the one in progress, or else the next) to end: no new episodes
        start; those in flight finish."""
        self._stop.set()

    async def _run_async(self, max_groups: float, deadline_s: float | None) -> None:
        open_groups: list[_Group] = []
        finished = 0
        lock = asyncio.Lock()
        stop = self._stop
        deadline = None if deadline_s is None else time.monotonic() + deadline_s

        async def claim() -> tuple[_Group, int] | None:
            while not stop.is_set():
                async with lock:
                    for g in open_groups:            # oldest open group first
                        if not g.abandoned and g.pending:
                            g.in_flight += 1
                            return g, g.pending.pop(0)
                    may_open = self.groups_opened < max_groups
                if not may_open:
                    if not open_groups:
                        return None
                    await asyncio.sleep(0.1)      # a retry may still need a worker
                    continue
                await self._capacity(stop)
                async with lock:
                    if self.groups_opened < max_groups and not stop.is_set():
                        g = self._open_group()
                        open_groups.append(g)
                        g.in_flight += 1
                        return g, g.pending.pop(0)
            return None

        async def work(worker: Any) -> None:
            nonlocal finished
            while not stop.is_set():
                if deadline is not None and time.monotonic() > deadline:
                    stop.set()
                    return
                slot = await claim()
                if slot is None:
                    return
                group, i = slot
                result = await self.episode(worker, group.task, f"{group.group_id}-{i}",
                                            self._seed(group, i))
                self.episodes.append(result)
                async with lock:
                    self._returned(group, i, result)
                    if group.done and group in open_groups:
                        open_groups.remove(group)
                        await asyncio.to_thread(self._finish, group)
                        finished += 1
                        if finished >= max_groups:
                            stop.set()

        await asyncio.gather(*(work(w) for w in self.workers))

    async def _run_sync(self, max_groups: float, deadline_s: float | None) -> None:
        done = 0
        unconsumed = 0                 # groups pushed that the trainer has not stepped on yet
        version = await asyncio.to_thread(self.stream.trainer_version)
        deadline = None if deadline_s is None else time.monotonic() + deadline_s
        while done < max_groups and not self._stop.is_set():
            if deadline is not None and time.monotonic() > deadline:
                return
            batch = [self._open_group() for _ in range(int(min(self.config.groups_per_step,
                                                               max_groups - done)))]

            async def work(worker: Any) -> None:
                while True:
                    slot = next(((g, g.pending.pop(0)) for g in batch
                                 if g.pending and not g.abandoned), None)
                    if slot is None:
                        return
                    group, i = slot
                    group.in_flight += 1
                    result = await self.episode(worker, group.task, f"{group.group_id}-{i}",
                                                self._seed(group, i))
                    self.episodes.append(result)
                    self._returned(group, i, result)
            while not all(g.done for g in batch):
                await asyncio.gather(*(work(w) for w in self.workers))    # the batch barrier
            for g in batch:
                unconsumed += await asyncio.to_thread(self._finish, g) == "pushed"
            done += len(batch)
            steps = unconsumed // self.config.groups_per_step
            if done < max_groups and steps:
                # The barrier: the next batch waits until the trainer has stepped on this one.
                # (Dropped or abandoned groups leave the batch short: generate more first.)
                while not self._stop.is_set() and \
                        await asyncio.to_thread(self.stream.trainer_version) < version + steps:
                    await asyncio.sleep(0.2)
                version += steps
                unconsumed -= steps * self.config.groups_per_step
