"""The rollout orchestrator: GRPO groups of episodes on env workers, pushed to the experience
stream when complete; asynchronous (no batch barrier) or synchronous for comparison.

Every episode runs through the one episode runner (:class:`rollout_service.episode.EpisodeRunner`:
lease, provision, act, score, destroy, release). An episode that ends with an env error is
retried up to ``max_env_retries`` times and never becomes training data; a group whose retries
run out is abandoned.

Async mode: every worker runs episodes back to back, taking the next episode of the oldest
open group; a group is pushed (``XADD``) the moment its n-th episode is scored. Admission
control (AReaL-style capacity, nothing thrown away): a new group is only opened while

    groups_admitted < (trainer_version + max_staleness + 1) * groups_per_step

so no group starts more than ``max_staleness`` trainer versions ahead of the version that
will consume it. ``groups_admitted`` counts the groups opened that can still reach the
trainer: groups dropped or abandoned never will, so they give their slot back (counting them
would stall the rollouts while the trainer waits for a group that is never opened). Groups
whose rewards are all equal are counted and, with ``drop_uniform_groups``, not pushed (GRPO
learns nothing from them), unless the trainer's step-level advantages are on (``step_gamma``)
and some turn of the group has a non-zero one (:mod:`consolerl.step_advantage`): then it
is pushed with its turns' page states.

The task of each new group comes from the run's curriculum (``curriculum.py``): by default
sampled by the task's recent success estimate, preferring p near 0.5 (the tasks whose groups
GRPO learns from), with a floor so that no task starves; or each task in turn.

Sync mode: open ``groups_per_step`` groups, run all their episodes, push them, then wait until
the trainer's version moves before the next batch (the batch barrier of verl's colocated loop).

Lost workers: an env worker whose actor died (its process, or its node: ``worker_lost``) ends
its episode as an env error (retried on another worker within the budget above; its lease
expires by TTL) and is parked: it takes no episode until it answers a health probe again
(Ray restarted it, on its node or on another that offers its resources), probed every
``lost_probe_s``; one that Ray reports dead ``lost_probes_dead`` times in a row (no restarts
left) is retired for the run. The other workers carry on.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import re
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import ray
import ray.exceptions
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from consolerl.accounts import Account
from consolerl.config import AtLeast, Between, Checked, OneOf, Regex
from consolerl.errors import ConfigError
from consolerl.experience import Group, Sample, sample_of
from consolerl.step_advantage import has_step_signal
from consolerl.tasks import Task
from env_workers.pool import actor_state
from infra.cloud import CloudClient

from .agent import AgentLoop
from .curriculum import BANDS, CURRICULA, Curriculum
from .episode import (EpisodeOutcome, EpisodePolicy, EpisodeRunner, WorkerSidePolicy,
                      episode_id_seed, model_policy)
from .experience import ExperienceStream
from .policy import call

log = logging.getLogger("rollout_service.orchestrator")


# turn_loop "auto": the turns run on the env workers from this many workers up. Below it the
# rollout actor's per-turn calls cost it under about half a core (~4 ms a turn, 5 turns in a
# ~32 s episode), while turns on the workers cost each worker process the tokenizer (~310 MB
# more: transformers' tokenizer imports torch).
AUTO_WORKER_TURNS = 1000
# The staleness budget should hold this many times the workers' episodes in flight (see
# Orchestrator.admission_short).
ADMISSION_MARGIN = 1.5


@dataclass(frozen=True)
class OrchestratorConfig(Checked):
    group_size: Annotated[int, AtLeast(1)] = 2
    mode: Literal["async", "sync"] = "async"
    max_staleness: Annotated[int, AtLeast(0)] = 1
    groups_per_step: Annotated[int, AtLeast(1)] = 1
    max_env_retries: Annotated[int, AtLeast(0)] = 2
    drop_uniform_groups: bool = True
    split: Literal["train", "heldout", "all"] = "train"
    task_filter: Annotated[str, Regex()] = ""   # over task ids ("": all)
    acquire_timeout_s: float = 300.0
    seed: int = 0
    # Which task each group is opened on (rollout_service/curriculum.py): ``success``
    # samples tasks by their recent success estimate, preferring p near 0.5 (the groups GRPO
    # learns from), after one pass over every task; ``round_robin``, each task in turn
    # (evaluation, which must run every task the same number of times).
    curriculum: Annotated[str, OneOf(CURRICULA)] = "success"
    # The least weight a task keeps against 1 for a task at p = 0.5: 0.1, a task the policy
    # always fails or always solves is still opened a tenth as often, so its estimate follows
    # the policy. In (0, 1]; 1 samples uniformly.
    curriculum_floor: Annotated[float, Between(0, 1, low_open=True)] = 0.1
    # About how many of a task's latest episodes its estimate weighs (each older one by
    # 1 - 1/window once more per newer episode): 32, the last 4 to 8 groups of 4 to 8, so an
    # estimate follows a policy that learns (or unlearns) the task within a few groups.
    curriculum_window: Annotated[int, AtLeast(1)] = 32
    # Threads for the episodes' blocking calls (SDK, audit log, scoring); 0: one per env
    # worker plus 4, so no episode queues behind another's ActionTrail wait.
    io_threads: Annotated[int, AtLeast(0)] = 0
    # A lost env worker (its actor died) is parked and probed this often until it answers
    # again; retired after this many probes in a row find it dead for good.
    lost_probe_s: Annotated[float, Between(0, 3600, low_open=True)] = 5.0
    lost_probes_dead: Annotated[int, AtLeast(1)] = 3
    # Where an episode's turns run: ``worker``, on the env worker (one call per episode from
    # here; the worker calls the policy servers itself), ``orchestrator``, here (one env
    # worker call and one policy call per turn), or ``auto``: on the workers from
    # AUTO_WORKER_TURNS workers up. At 1,000 workers the per-turn calls were most of this
    # actor's CPU; below that, here saves each worker process the tokenizer's memory.
    turn_loop: Literal["auto", "worker", "orchestrator"] = "auto"


def _shipped(agent: AgentLoop, workers: Sequence[Any]) -> Any:
    """What the env workers' ``act`` gets for the agent: the agent itself for workers in this
    process, a reference to one copy in Ray's object store for actors (each worker process
    fetches it once)."""
    over_ray = any(getattr(getattr(w, "act", None), "remote", None) is not None
                   for w in workers)
    if over_ray and ray.is_initialized():
        return [ray.put(agent)]
    return agent


@dataclass(frozen=True)
class EpisodeSummary:
    """What the orchestrator keeps of a finished episode (the trajectory itself goes to the
    stream with its group; keeping every one would grow without bound in a long run)."""

    task_id: str
    env_error: str | None          # its kind
    reward: float | None
    verdict: str | None
    end_reason: str | None
    steps: int
    version: int                   # the policy version of its first turn (-1: no turn)
    leaked: int
    # Its cost: the tokens of its turns' prompts and generations (summed over turns), and
    # the wall seconds it held its account (EpisodeOutcome.episode_s).
    prompt_tokens: int = 0
    completion_tokens: int = 0
    env_s: float = 0.0

    @classmethod
    def of(cls, e: EpisodeOutcome) -> EpisodeSummary:
        traj = e.trajectory
        turns = traj.turns if traj else ()
        return cls(e.task_id, None if e.env_error is None else e.env_error.kind,
                   None if e.reward is None else e.reward.reward,
                   None if e.reward is None else e.reward.verdict,
                   traj.end_reason if traj else None, len(turns),
                   turns[0].version if turns else -1, len(e.leaked),
                   sum(len(t.prompt_ids) for t in turns),
                   sum(len(t.response_ids) for t in turns), round(e.episode_s, 3))


@dataclass
class _Group:
    group_id: str
    task: Task
    n: int
    results: list[EpisodeOutcome | None]
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
        self.curriculum_picks = Counter(
            "consolerl_curriculum_picks_total", "Groups opened, by the success estimate of "
            "their task when it was picked: unscored (no episode scored yet), low (p < 0.2), "
            "mid, high (p > 0.8).", ["estimate"], registry=registry)
        for band in BANDS:
            self.curriculum_picks.labels(band)
        # One series per task of the run (its split and task_filter: the suite's size).
        self.estimated_success = Gauge(
            "consolerl_curriculum_estimated_success_ratio", "Each task's recent success "
            "estimate (about its last orchestrator.curriculum_window episodes, Beta(1, 1) "
            "prior: 0.5 before any).", ["task"], registry=registry)
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
        self.step_signal_groups = Counter(
            "consolerl_rollout_groups_step_signal_total", "Groups whose episodes all scored "
            "alike but whose turns carry a step-level advantage (the trainer's step "
            "advantages on): pushed, not dropped as uniform.", registry=registry)
        for end in ("stop", "report_infeasible", "max_steps", "token_limit", "env_limit",
                    "env_error"):
            self.episodes.labels(end)
        for outcome in ("pushed", "dropped_uniform", "abandoned"):
            self.groups.labels(outcome)
        self.trainer_version = Gauge("consolerl_rollout_trainer_version", "The trainer "
                                     "version the admission control last read.",
                                     registry=registry)
        self.workers_lost = Counter("consolerl_rollout_workers_lost_total", "Env workers "
                                    "lost mid-episode (their actor died with its process or "
                                    "node).", registry=registry)
        self.workers_parked = Gauge("consolerl_rollout_workers_parked", "Env workers taking "
                                    "no episodes now: lost and not answering again, or "
                                    "retired.", registry=registry)


class Orchestrator:
    """Runs groups on ``workers`` (LeasedEnvWorker objects or EnvWorkerActor handles).

    ``accounts``: the accounts the workers lease (their credentials provision and destroy);
    ``endpoint``: the cloud's OpenAPI endpoint; ``scorer``: ``RewardService.score`` or a
    ``RewardActor`` handle's ``score`` (see :class:`~rollout_service.episode.EpisodeRunner`).
    Each group's task is picked by the run's :class:`~rollout_service.curriculum.Curriculum`
    (``config.curriculum``), which hears every complete, scored group. ``step_gamma``: the
    trainer's step-advantage discount when its step-level advantages are on
    (``AlgoConfig.step_signal_gamma``), else None: samples then carry their turns' page states
    and a group uniform in reward with step-level signal is pushed, not dropped.
    """

    def __init__(self, config: OrchestratorConfig, tasks: Sequence[Task],
                 workers: Sequence[Any], accounts: Sequence[Account], endpoint: str,
                 agent: AgentLoop, scorer: Any, stream: ExperienceStream,
                 registry: CollectorRegistry | None = None,
                 client_factory: Callable[[Account], CloudClient] | None = None,
                 executor: concurrent.futures.Executor | None = None,
                 step_gamma: float | None = None):
        if step_gamma is not None and not 0 < step_gamma <= 1:
            raise ConfigError(f"orchestrator: step_gamma must be in (0, 1] or None, "
                              f"got {step_gamma!r}")
        self.config = config
        self.step_gamma = step_gamma
        pick = [t for t in tasks if (config.split == "all" or t.split == config.split)
                and re.search(config.task_filter, t.id)]
        if not pick:
            raise ConfigError(f"orchestrator: no task in split {config.split!r} matches "
                              f"{config.task_filter!r}")
        self.tasks = pick
        self.workers = list(workers)
        if not self.workers:
            raise ConfigError("orchestrator: needs at least one env worker")
        self.executor = executor or concurrent.futures.ThreadPoolExecutor(
            config.io_threads or len(self.workers) + 4, thread_name_prefix="rollout-io")
        self.runner = EpisodeRunner(accounts, endpoint, scorer, client_factory=client_factory,
                                    acquire_timeout_s=config.acquire_timeout_s,
                                    executor=self.executor)
        self.agent = agent
        self.turns_on_workers = config.turn_loop == "worker" or (
            config.turn_loop == "auto" and len(self.workers) >= AUTO_WORKER_TURNS)
        self.policy: EpisodePolicy = (WorkerSidePolicy(agent, _shipped(agent, self.workers))
                                      if self.turns_on_workers else model_policy(agent))
        self.stream = stream
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = RolloutMetrics(self.registry)
        Gauge("consolerl_rollout_max_staleness", "The staleness bound (orchestrator."
              "max_staleness): versions a sample may lag the trainer.",
              registry=self.registry).set(config.max_staleness)
        self.groups_opened = 0
        self.groups_pushed = 0
        self.curriculum = Curriculum([t.id for t in pick], config.curriculum,
                                     config.curriculum_floor, config.curriculum_window,
                                     config.seed)
        self._by_id = {t.id: t for t in pick}
        for t in pick:
            self.metrics.estimated_success.labels(t.id).set(self.curriculum.estimate(t.id))
        self.groups_dropped = 0
        self.groups_abandoned = 0
        self.episodes: list[EpisodeSummary] = []
        self.busy_s: dict[str, float] = {}
        self._stop = asyncio.Event()           # only polled (is_set), never awaited
        self._interrupt = False                # stop episodes in flight at their next step
        self._version, self._version_at = 0, float("-inf")
        self._version_reading = False
        self.workers_lost = 0
        self._parked: set[int] = set()             # id(worker): lost, not answering yet
        self._retired: set[int] = set()            # id(worker): dead for good
        self._dead_in_row: dict[int, int] = {}     # id(worker): probes in a row found dead

    # ---- one episode ---------------------------------------------------------------------------
    async def episode(self, worker: Any, task: Task, trajectory_id: str, seed: int
                      ) -> EpisodeOutcome:
        name = getattr(worker, "name", "") or str(id(worker))
        t0 = time.monotonic()
        self.metrics.busy_workers.inc()
        outcome: EpisodeOutcome | None = None
        try:
            outcome = await self.runner.run(worker, task, self.policy,
                                            max_steps=self.agent.config.max_steps + 1,
                                            trajectory_id=trajectory_id, seed=seed,
                                            interrupted=self._interrupted,
                                            id_seed=episode_id_seed(
                                                self.agent.config.random_ids, trajectory_id,
                                                seed))
            return outcome
        finally:
            self.metrics.busy_workers.dec()
            busy = time.monotonic() - t0
            self.busy_s[name] = self.busy_s.get(name, 0.0) + busy
            self.metrics.seconds.observe(busy)
            if outcome is not None:
                traj = outcome.trajectory
                end = "env_error" if outcome.env_error or traj is None else traj.end_reason
                self.metrics.episodes.labels(end).inc()
                if outcome.reward is not None and outcome.env_error is None:
                    self.metrics.reward.observe(outcome.reward.reward)

    # ---- lost workers ----------------------------------------------------------------------------
    def live_workers(self) -> list[Any]:
        """The workers taking episodes now (not parked after a loss, not retired)."""
        return [w for w in self.workers
                if id(w) not in self._parked and id(w) not in self._retired]

    def _lost(self, worker: Any, outcome: EpisodeOutcome) -> bool:
        """Whether ``outcome`` says its worker was lost (then it is parked)."""
        if outcome.env_error is None or outcome.env_error.kind != "worker_lost":
            return False
        self.workers_lost += 1
        self.metrics.workers_lost.inc()
        self._parked.add(id(worker))
        self._count_parked()
        if not self.live_workers():
            log.warning("every env worker is lost or retired: episodes wait for one to "
                        "answer again")
        return True

    def _count_parked(self) -> None:
        self.metrics.workers_parked.set(len(self._parked | self._retired))

    async def _probe(self, worker: Any) -> bool | None:
        """One health probe of a lost worker: True when it answers (Ray restarted it),
        False when Ray reports it dead (no restarts left), None when it does not answer yet
        (restarting, or waiting for a node with its resources)."""
        health = getattr(worker, "health", None)
        if health is None:
            return True
        # A Ray actor: its state in the GCS first (a call to one that Ray is restarting
        # would only queue until it is back).
        state = await asyncio.to_thread(actor_state, worker)
        if state == "DEAD":
            return False
        if state is not None and state != "ALIVE":
            return None
        try:
            await asyncio.wait_for(call(health), timeout=self.config.lost_probe_s)
            return True
        except ray.exceptions.ActorUnavailableError:
            return None
        except ray.exceptions.RayActorError:
            return False
        except Exception:  # noqa: BLE001 - no answer in time (a queued call) or a hiccup
            return None

    async def _probe_parked(self, worker: Any) -> bool | None:
        """Probe a parked worker once and act on the answer: True, it answers again (back in
        the pool); False, Ray reported it dead ``lost_probes_dead`` times in a row (retired);
        None, still parked."""
        answer = await self._probe(worker)
        name = getattr(worker, "name", "") or id(worker)
        if answer:
            self._parked.discard(id(worker))
            self._dead_in_row.pop(id(worker), None)
            self._count_parked()
            log.info("env worker %s answers again: back in the pool", name)
            return True
        dead = self._dead_in_row.get(id(worker), 0) + 1 if answer is False else 0
        self._dead_in_row[id(worker)] = dead
        if dead >= self.config.lost_probes_dead:
            self._parked.discard(id(worker))
            self._dead_in_row.pop(id(worker), None)
            self._retired.add(id(worker))
            self._count_parked()
            log.warning("env worker %s is dead for good: retired for this run", name)
            return False
        return None

    async def _wait_back(self, worker: Any) -> bool:
        """Park ``worker`` until it answers again (True) or is retired, or the run stops
        (False)."""
        while not self._stop.is_set():
            back = await self._probe_parked(worker)
            if back is not None:
                return back
            await self._sleep_unless_stopped(self.config.lost_probe_s)
        return False

    async def _sleep_unless_stopped(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while not self._stop.is_set() and time.monotonic() < end:
            await asyncio.sleep(min(0.2, end - time.monotonic()))

    # ---- groups ----------------------------------------------------------------------------------
    def _open_group(self) -> _Group:
        task = self._pick_task()
        self.groups_opened += 1
        n = self.config.group_size
        return _Group(f"g-{secrets.token_hex(6)}", task, n, [None] * n, list(range(n)))

    def _pick_task(self) -> Task:
        task_id = self.curriculum.pick()
        self.metrics.curriculum_picks.labels(self.curriculum.band(task_id)).inc()
        return self._by_id[task_id]

    def _note_outcome(self, task_id: str, rewards: list[float]) -> None:
        self.curriculum.note(task_id, rewards)
        self.metrics.estimated_success.labels(task_id).set(self.curriculum.estimate(task_id))

    def _finish(self, group: _Group) -> str:
        """Push or drop a complete group; returns the outcome."""
        results = [r for r in group.results if r is not None]
        rewards = [r.reward.reward for r in results if r.reward is not None]
        trainable = all(r.reward is not None and r.reward.trainable for r in results)
        complete = not group.abandoned and trainable and len(rewards) == group.n
        if complete:
            self._note_outcome(group.task.id, rewards)
        uniform = len(set(rewards)) == 1
        states = self.step_gamma is not None        # the trainer's step advantages are on
        samples: tuple[Sample, ...] = ()
        if complete and (states or not (self.config.drop_uniform_groups and uniform)):
            samples = tuple(sample_of(r.trajectory, r.reward.reward, r.reward.verdict, states)
                            for r in results if r.trajectory is not None)
        # With step advantages on, a group carries signal when any turn's advantage is not 0.
        step_signal = states and uniform and bool(samples) and \
            has_step_signal(samples, self.step_gamma)
        if not complete:
            outcome = "abandoned"
            self.groups_abandoned += 1
        elif self.config.drop_uniform_groups and uniform and not step_signal:
            outcome = "dropped_uniform"
            self.groups_dropped += 1
        else:
            if step_signal:
                self.metrics.step_signal_groups.inc()
            # Where each episode ran (lease, worker process, trajectory times): what an
            # operator or the fault suite needs to tie a trained sample to the outside world.
            episodes = [{"trajectory_id": r.trajectory.trajectory_id,
                         "account_id": r.account_id, "fencing": r.fencing,
                         "worker": r.worker, "worker_pid": r.worker_pid,
                         "started_at": r.trajectory.started_at,
                         "ended_at": r.trajectory.ended_at}
                        for r in results if r.trajectory is not None]
            self.stream.push(Group(group.group_id, group.task.id, samples, time.time(),
                                   {"rewards": rewards, "episodes": episodes}))
            outcome = "pushed"
            self.groups_pushed += 1
        self.metrics.groups.labels(outcome).inc()
        return outcome

    @property
    def groups_admitted(self) -> int:
        """Groups opened that were not dropped or abandoned: pushed, or still running."""
        return self.groups_opened - self.groups_dropped - self.groups_abandoned

    def _limit(self, version: int) -> int:
        return (version + self.config.max_staleness + 1) * self.config.groups_per_step

    async def _trainer_version(self) -> int:
        """The trainer's version, read from Redis at most every 0.2 s however many workers
        ask: one read at a time, the others take the last value."""
        if not self._version_reading and time.monotonic() - self._version_at >= 0.2:
            self._version_at = time.monotonic()
            self._version_reading = True
            try:
                self._version = await self.runner.blocking(self.stream.trainer_version)
            finally:
                self._version_reading = False
            self.metrics.trainer_version.set(self._version)
        return self._version

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
            self._interrupt = False
        wall = time.monotonic() - t0
        return self.summary(wall)

    @property
    def turn_loop_used(self) -> str:
        """Where this run's turns go: ``worker`` or ``orchestrator`` (``auto`` resolved)."""
        return "worker" if self.turns_on_workers else "orchestrator"

    def summary(self, wall_s: float) -> dict[str, Any]:
        n_workers = len(self.workers)
        busy = sum(self.busy_s.values())
        return {
            "mode": self.config.mode, "wall_s": round(wall_s, 2),
            "turn_loop": self.turn_loop_used,
            "episodes": len(self.episodes),
            "env_errors": sum(bool(e.env_error) for e in self.episodes),
            "groups_pushed": self.groups_pushed, "groups_dropped_uniform": self.groups_dropped,
            "groups_abandoned": self.groups_abandoned,
            "episodes_per_min": round(len(self.episodes) / wall_s * 60, 2) if wall_s else 0.0,
            "env_utilization": round(busy / (wall_s * n_workers), 4) if wall_s else 0.0,
            "leaked_resources": sum(e.leaked for e in self.episodes),
            "env_errors_by_kind": {k: sum(e.env_error == k for e in self.episodes)
                                   for k in sorted({e.env_error for e in self.episodes
                                                    if e.env_error})},
            "workers_lost": self.workers_lost,
            "workers_parked": len(self._parked), "workers_retired": len(self._retired),
        }

    def _returned(self, group: _Group, index: int, result: EpisodeOutcome) -> None:
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

    def stop(self, interrupt: bool = False) -> None:
        """Ask :meth:`run` (the one in progress, or else the next) to end: no new episodes
        start; those in flight finish, or with ``interrupt`` stop at their next step (cleaned
        up, their groups not pushed). Turns run on the env workers finish either way."""
        self._interrupt = self._interrupt or interrupt
        self._stop.set()

    def _interrupted(self) -> str:
        return "the run is stopping" if self._interrupt else ""

    def admission_short(self) -> str:
        """Why the staleness bound will keep workers idle, or ``""``. Admission lets
        (max_staleness + 1) x groups_per_step groups past the trainer's version; one
        groups_per_step of them is the batch filling up, the rest must hold the groups in
        flight: about workers / group_size, and half as many again, since a group stays open
        until its slowest episode ends. Measured at 1,000 workers (benchmarks/scale.py, groups
        of 4, max_staleness 2): max_staleness x groups_per_step x group_size at 1.0x the
        workers gave 0.80 of the ideal throughput, at 2.0x 1.01."""
        c = self.config
        covered = c.max_staleness * c.groups_per_step * c.group_size
        workers = len(self.live_workers())
        if c.mode != "async" or covered >= ADMISSION_MARGIN * workers:
            return ""
        return (f"max_staleness x groups_per_step x group_size = {covered} < "
                f"{ADMISSION_MARGIN:g} x {workers} env workers: the staleness bound will leave "
                f"workers idle waiting for the trainer; raise orchestrator.groups_per_step or "
                f"max_staleness")

    async def _run_async(self, max_groups: float, deadline_s: float | None) -> None:
        short = self.admission_short()
        if short:
            log.warning("orchestrator: %s", short)
        open_groups: list[_Group] = []
        finished = 0
        lock = asyncio.Lock()
        stop = self._stop
        deadline = None if deadline_s is None else time.monotonic() + deadline_s

        async def claim() -> tuple[_Group, int] | None:
            """The next sample to run: a pending one of the oldest open group, or the first
            of a new group when staleness capacity allows; waiting re-checks both (a worker
            held at capacity still takes a retry or a sample of a group opened by another)."""
            waited_since = None
            while not stop.is_set():
                version = await self._trainer_version()
                async with lock:
                    for g in open_groups:            # oldest open group first
                        if not g.abandoned and g.pending:
                            g.in_flight += 1
                            return g, g.pending.pop(0)
                    may_open = self.groups_opened < max_groups
                    if may_open and self.groups_admitted < self._limit(version):
                        if waited_since is not None:
                            self.metrics.admission_wait.inc(time.monotonic() - waited_since)
                        g = self._open_group()
                        open_groups.append(g)
                        g.in_flight += 1
                        return g, g.pending.pop(0)
                if not may_open and not open_groups:
                    return None
                if may_open and waited_since is None:
                    waited_since = time.monotonic()
                await asyncio.sleep(0.1)          # a retry, a new group, or capacity
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
                self.episodes.append(EpisodeSummary.of(result))
                async with lock:
                    self._returned(group, i, result)
                    if group.done and group in open_groups:
                        open_groups.remove(group)
                        await self.runner.blocking(self._finish, group)
                        finished += 1
                        if finished >= max_groups:
                            stop.set()
                if self._lost(worker, result) and not await self._wait_back(worker):
                    return

        await asyncio.gather(*(work(w) for w in self.workers if id(w) not in self._retired))

    async def _run_sync(self, max_groups: float, deadline_s: float | None) -> None:
        done = 0
        unconsumed = 0                 # groups pushed that the trainer has not stepped on yet
        version = await self.runner.blocking(self.stream.trainer_version)
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
                    self.episodes.append(EpisodeSummary.of(result))
                    self._returned(group, i, result)
                    if self._lost(worker, result):
                        return                     # parked: probed before the next round
            while not all(g.done for g in batch):
                for w in [w for w in self.workers if id(w) in self._parked]:
                    await self._probe_parked(w)
                live = self.live_workers()
                if not live:
                    if not self._parked:        # none parked, none live: all retired
                        log.error("every env worker is retired: the run stops")
                        return
                    if self._stop.is_set():
                        return
                    await self._sleep_unless_stopped(self.config.lost_probe_s)
                    continue
                await asyncio.gather(*(work(w) for w in live))    # the batch barrier
            for g in batch:
                unconsumed += await self.runner.blocking(self._finish, g) == "pushed"
            done += len(batch)
            steps = unconsumed // self.config.groups_per_step
            if done < max_groups and steps:
                # The barrier: the next batch waits until the trainer has stepped on this one.
                # (Dropped or abandoned groups leave the batch short: generate more first.)
                while not self._stop.is_set() and \
                        await self.runner.blocking(self.stream.trainer_version) < version + steps:
                    await asyncio.sleep(0.2)
                version += steps
                unconsumed -= steps * self.config.groups_per_step
