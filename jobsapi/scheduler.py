"""Runs the API's jobs: their episodes on env workers, through the one episode runner.

The scheduler is the only writer of a job's progress; everything it knows is in Redis
(:class:`~.store.JobStore`), so the API can restart freely, and a scheduler that restarts picks
up where it was: finished episodes are kept and never re-run, an episode that was running is
recorded as an interrupted attempt and runs again.

Which episode runs next, when a worker is free:
- the share of the pool: at most ``share_during_training`` of the workers while a training
  run is active (it keeps a key alive in Redis), all of them when none is; training leases from
  the same account pool, so neither side can take every account;
- fair share between teams: the team with the fewest episodes running goes first (ties: the
  one served longest ago), within its quota of concurrent episodes and env-minutes per day;
- priority within a team (higher first), then the oldest job, then the job's next episode.

Who acts is the job's ``model``: the agent loop over the live policy or a registered model
(``agent_for``), or ``oracle``, the scripted teacher (:mod:`datagen.oracle`), which
needs no model; either way through the same runner, records and report.

Only infrastructure errors are retried (``max_attempts`` in all); each attempt is recorded on
the rollout. A cancelled or expired job stops its running episodes between two steps (the
runner destroys what they made and releases their accounts) and never starts the rest.

Crash sweeps: each episode's lease (account, fencing number) is written to the store under
this scheduler's instance as soon as the runner has it, before anything is provisioned, and
dropped once the runner has cleaned up; the runner's own write-ahead record in the account
(:meth:`~env_workers.leases.AccountPool.episode_begun`, also before provisioning) names what
to destroy, by the provisioner's episode tag and names. A scheduler that starts first
(:meth:`JobScheduler.sweep`, before it takes any work) finds the episodes of instances whose
heartbeat has lapsed, ends their leases at once (:meth:`~env_workers.leases.AccountPool.
reclaim`: their holders died with the scheduler), and leases those accounts (they come first)
to destroy what the episodes left, until none of them is recorded in its account any more;
their rollouts then go back to the queue as interrupted attempts.
"""
from __future__ import annotations

import asyncio
import logging
import math
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Annotated, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from consolerl.config import AtLeast, Between, Checked
from consolerl.errors import ConfigError, EpisodeCancelled
from consolerl.page import parse
from consolerl.tasks import Task
from consolerl.types import StepResult
from env_workers.leases import AccountPool, UnknownAccount

from rollout_service.agent import AgentConfig, AgentLoop
from rollout_service.episode import (EpisodeLease, EpisodeOutcome, EpisodePolicy, EpisodeRunner,
                                     episode_id_seed, model_policy, scripted_policy)
from datagen.oracle import ORACLE_MAX_STEPS, run_oracle
from .schema import (SCRIPTED_MODELS, TERMINAL, Attempt, AuditEvent, ClaimCheck, EpisodeCounts,
                     Job, JobCompletedEvent, JobStatusEvent, Rollout, RolloutCompletedEvent,
                     RolloutStartedEvent, RolloutStepEvent, Step, TaskSummaryEvent, Usage,
                     VerdictCounts, spec_tasks)
from .store import JobStore

log = logging.getLogger("jobsapi.scheduler")
AgentFactory = Callable[[str, AgentConfig], Awaitable[AgentLoop]]
QuotaOf = Callable[[str], Any]          # team -> TeamQuota
_BID = re.compile(r"^\w+\(\s*\"?(\d+)\"?")


@dataclass(frozen=True)
class SchedulerConfig(Checked):
    share_during_training: Annotated[float, Between(0, 1, low_open=True)] = 0.5
    max_attempts: Annotated[int, AtLeast(1)] = 3
    tick_s: float = 0.5                 # longest wait between looks at the queue
    step_event_interval_s: float = 1.0  # rollout.step events, at most one per rollout per this
    screenshots: bool = True            # keep each step's screenshot as an artifact
    heartbeat_ttl_s: float = 10.0
    # How long the start-up sweep may take (waiting for accounts that others hold or clean);
    # what is left then stays recorded, in its account too, for the account's next holder.
    sweep_timeout_s: Annotated[float, AtLeast(0)] = 180.0


@dataclass(frozen=True)
class SweepReport:
    """What the start-up sweep found of dead predecessors' episodes: how many (``episodes``),
    how many of those no account records any more (``cleaned``: destroyed, by the sweep or
    by another holder of the account), the resources the sweep destroyed (of those and of
    any other dead holder's episodes in the accounts it leased), the leases it ended, the
    episodes still recorded when it gave up (``left``), and how long it took."""

    episodes: int = 0
    cleaned: int = 0
    resources: int = 0
    leases: int = 0
    left: tuple[str, ...] = ()
    seconds: float = 0.0


def verdict_of(outcome: EpisodeOutcome) -> str:
    """A completed episode's verdict: success | failure | infeasible | undetermined."""
    traj = outcome.trajectory
    if traj is not None and traj.infeasible is not None:
        return "infeasible"
    if outcome.reward is None:
        return "undetermined"
    if outcome.reward.verdict == "success" and traj is not None and traj.answer is not None:
        return "success"
    return "undetermined" if outcome.reward.verdict == "undetermined" else "failure"


def deciding_events(outcome: EpisodeOutcome) -> list[AuditEvent]:
    """The audit events that decided a completed episode, for its rollout (at most 10): those
    its reward names as evidence, or else the refused calls (what a failure shows)."""
    evidence = set(outcome.reward.evidence) if outcome.reward else set()
    events = outcome.audit_events
    deciding = [e for e in events if e.event_id in evidence] or [e for e in events if e.refused]
    return [AuditEvent(event_id=e.event_id, event_name=e.event_name, event_time=e.event_time,
                       error_code=e.error_code) for e in deciding[:10]]


def completed_fields(outcome: EpisodeOutcome) -> dict[str, Any]:
    """What a completed episode sets on its rollout: the verdict, the reward and the channel
    that decided it, the evidence channel's check of a claim, how the trajectory ended, its
    tokens and policy version, the deciding audit events and the reasons (also what
    ``benchmarks.docs --run`` keeps of a replay)."""
    traj = outcome.trajectory
    out: dict[str, Any] = {"verdict": verdict_of(outcome),
                           "reward": outcome.reward.reward if outcome.reward else None}
    if outcome.reward is not None:
        out["reward_verdict"] = outcome.reward.verdict
        out["decided_by"] = outcome.reward.decided_by
        ev = outcome.reward.evidence_verdict
        if ev is not None and ev.kind != "no_claim":
            out["claim"] = ClaimCheck(
                kind=ev.kind, verdict=ev.verdict,   # type: ignore[arg-type]
                reasons=[r[:500] for r in ev.reasons[:5]],
                missing=list(ev.missing[:10]), present=[p[:300] for p in ev.present[:10]])
    if traj is not None:
        versions = [t.version for t in traj.turns if t.version >= 0]
        out.update(end_reason=traj.end_reason, end_detail=traj.end_detail or None,
                   answer=traj.answer, infeasible_reason=traj.infeasible,
                   tokens=sum(len(t.prompt_ids) + len(t.response_ids) for t in traj.turns),
                   policy_version=max(versions) if versions else None)
    out["deciding_events"] = deciding_events(outcome)
    out["reasons"] = [r[:300] for r in outcome.reasons[:10]]
    return out


def target_of(action: str, page: str) -> str:
    """The label of the element an action named (``click("12")`` -> ``button "Save"``)."""
    m = _BID.match(action or "")
    if not m:
        return ""
    return parse(page).text_after(m.group(1)).strip()[:120]


def counts(rollouts: list[Rollout]) -> tuple[EpisodeCounts, VerdictCounts]:
    e, v = EpisodeCounts(), VerdictCounts()
    for r in rollouts:
        setattr(e, r.state, getattr(e, r.state) + 1)
        if r.verdict is not None:
            setattr(v, r.verdict, getattr(v, r.verdict) + 1)
    return e, v


class SchedulerMetrics:
    def __init__(self, registry: CollectorRegistry):
        self.jobs = Gauge("consolerl_api_jobs", "API jobs not yet finished, by state.",
                          ["state"], registry=registry)
        self.finished = Counter("consolerl_api_jobs_finished_total", "API jobs that ended, "
                                "by final state.", ["state"], registry=registry)
        self.queue_wait = Histogram("consolerl_api_queue_wait_seconds", "From a job's "
                                    "submission to its first episode.", registry=registry,
                                    buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800))
        self.episodes = Counter("consolerl_api_episodes_total", "API episodes ended, by state "
                                "(completed, failed, cancelled, retried).", ["state"],
                                registry=registry)
        self.running = Gauge("consolerl_api_running_episodes", "API episodes running, by "
                             "team.", ["team"], registry=registry)
        self.limit = Gauge("consolerl_api_episode_limit", "Episodes API jobs may run at once "
                           "now (the share of the pool).", registry=registry)
        self.swept = Counter("consolerl_api_swept_resources_total", "Cloud resources the "
                             "scheduler destroyed at start, before taking work, that dead "
                             "holders' episodes (a predecessor killed mid-episode) had "
                             "provisioned.", registry=registry)
        self.reclaimed = Counter("consolerl_api_reclaimed_leases_total", "Account leases of a "
                                 "dead predecessor's episodes the scheduler ended at start "
                                 "(instead of at their TTL).", registry=registry)


@dataclass
class RunningJob:
    """A job the scheduler works on: its tasks and rollouts, kept in memory."""

    job: Job
    tasks: dict[str, Task]
    rollouts: dict[str, Rollout]
    running: set[str] = field(default_factory=set)
    stop: str = ""                      # cancelled | expired: stop between steps
    # Held while an episode's end is recorded: episodes that end together are recorded one
    # after the other, so a task's summary is sent once, the counts are whole, and the job
    # ends (job.completed) after the last episode's events.
    recording: asyncio.Lock = field(default_factory=asyncio.Lock)


class JobScheduler:
    """``workers``: env workers (LeasedEnvWorker or their actors) API jobs may use;
    ``catalog``: the task suite by id; ``agent_for``: an AgentLoop for a model name and agent
    config; ``quota_of``: a team's :class:`~.auth.TeamQuota`; ``leases``: the account pool
    the workers lease from (None: no crash sweep at start)."""

    def __init__(self, config: SchedulerConfig, store: JobStore, runner: EpisodeRunner,
                 workers: list[Any], catalog: Mapping[str, Task], agent_for: AgentFactory,
                 quota_of: QuotaOf, base_agent: AgentConfig | None = None,
                 registry: CollectorRegistry | None = None, leases: AccountPool | None = None):
        self.config = config
        self.store = store
        self.runner = runner
        self.free = list(workers)
        self.n_workers = len(workers)
        self.catalog = dict(catalog)
        self.agent_for = agent_for
        self.quota_of = quota_of
        self.base_agent = base_agent or AgentConfig()
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = SchedulerMetrics(self.registry)
        self.live: dict[str, RunningJob] = {}
        self.served: dict[str, float] = {}
        self.tasks: set[asyncio.Task] = set()
        self._stopping = False
        self._wake = asyncio.Event()
        self.leases = leases
        self.instance = f"s{secrets.token_hex(6)}"      # this run of the scheduler
        self.last_sweep: SweepReport | None = None

    # ---- loading jobs ---------------------------------------------------------------------------
    async def _load(self, job: Job) -> RunningJob | None:
        spec = await self.store.job_spec(job.id)
        try:
            tasks = spec_tasks(spec, self.catalog)
        except (KeyError, ConfigError) as exc:
            await self._finish(job.id, "failed", f"the job's tasks cannot be loaded: {exc}")
            return None
        stored = {r.id: r for r in await self.store.rollouts(job.id)}
        fresh = []
        for r in stored.values():
            if r.state == "running":     # a scheduler before this one died mid-episode
                if r.attempts and r.attempts[-1].ended_at is None:
                    r.attempts[-1].ended_at = time.time()
                    r.attempts[-1].env_error = "interrupted: the scheduler restarted"
                r.state = "queued" if len(r.attempts) < self.config.max_attempts else "failed"
                fresh.append(r)
        for tid in job.task_ids:
            for k in range(job.samples_per_task):
                rid = f"r{job.task_ids.index(tid):04d}s{k:03d}"
                if rid not in stored:
                    stored[rid] = Rollout(id=rid, job_id=job.id, task_id=tid, sample=k)
                    fresh.append(stored[rid])
        await self.store.put_rollouts(fresh)
        return RunningJob(job, tasks, stored)

    async def refresh(self) -> None:
        """Take in new jobs and cancellations; expire jobs past their deadline."""
        now = time.time()
        await self.store.instance_beat(self.instance, self.config.heartbeat_ttl_s)
        active = {j.id: j for j in await self.store.active_jobs()}
        for jid, job in active.items():
            live = self.live.get(jid)
            if live is None:
                live = await self._load(job)
                if live is None:
                    continue
                self.live[jid] = live
            live.job = job
            if job.expires_at is not None and now > job.expires_at and not live.stop:
                live.stop = "expired"
            elif job.cancel_requested and not live.stop:
                live.stop = "cancelled"
        for jid in list(self.live):
            if jid in active:
                continue
            if self.live[jid].running:     # ended behind our back (a queued job cancelled
                self.live[jid].stop = self.live[jid].stop or "cancelled"   # as it started)
            else:
                del self.live[jid]
        for live in list(self.live.values()):
            if live.stop and not live.running:
                async with live.recording:       # after an episode's end being recorded
                    if live.job.id in self.live:  # (which may have closed the job itself)
                        await self._close(live)
        states: dict[str, int] = {"queued": 0, "running": 0}
        for live in self.live.values():
            if live.job.state in states:
                states[live.job.state] += 1
        for s, n in states.items():
            self.metrics.jobs.labels(s).set(n)

    # ---- the start-up sweep ---------------------------------------------------------------------
    async def _beat(self) -> None:
        await self.store.instance_beat(self.instance, self.config.heartbeat_ttl_s)

    async def _dead_episodes(self, deadline: float) -> list[tuple[str, str, dict[str, Any]]]:
        """The recorded episodes of other scheduler instances that are dead: their heartbeat
        has lapsed. One still beating (a predecessor killed a moment ago) is waited for, for
        one heartbeat TTL; one beating after that is alive (another scheduler on this
        prefix, which is not supported) and its episodes are left alone."""
        records = [r for r in await self.store.episode_records() if r[0] != self.instance]
        alive = {i for i in {r[0] for r in records} if await self.store.instance_alive(i)}
        until = min(deadline, time.monotonic() + self.config.heartbeat_ttl_s + 1.0)
        while alive and time.monotonic() < until and not self._stopping:
            await asyncio.sleep(0.5)
            await self._beat()
            alive = {i for i in alive if await self.store.instance_alive(i)}
        if alive:
            log.warning("scheduler instances %s on this prefix are alive: their episodes are "
                        "not swept", sorted(alive))
        return [r for r in records if r[0] not in alive]

    async def sweep(self) -> SweepReport:
        """Before any work: end the leases of dead predecessors' episodes and destroy what
        those episodes provisioned (see the module docstring), within ``sweep_timeout_s``.
        An episode is swept once its account no longer records it; what is left when time
        runs out stays recorded (here and in its account, whose next holder destroys it)."""
        t0 = time.monotonic()
        deadline = t0 + self.config.sweep_timeout_s
        await self._beat()
        if self.leases is None:
            return SweepReport()
        pool = self.leases
        dead = await self._dead_episodes(deadline)
        leases = resources = 0
        pending = []
        for instance, episode, rec in dead:
            try:
                if await asyncio.to_thread(pool.reclaim, rec["account_id"], rec["fencing"]):
                    leases += 1
                pending.append((instance, episode, rec))
            except UnknownAccount:
                log.warning("episode %s of dead scheduler %s: account %s is not in the pool "
                            "any more; not swept", episode, instance, rec["account_id"])
                await self.store.drop_episode(instance, episode)
        self.metrics.reclaimed.inc(leases)
        while True:
            await self._beat()
            unfinished: dict[str, set[str]] = {}
            left = []
            for instance, episode, rec in pending:
                account = rec["account_id"]
                if account not in unfinished:
                    unfinished[account] = set(await asyncio.to_thread(
                        pool.unfinished_episodes, account))
                if episode in unfinished[account]:
                    left.append((instance, episode, rec))
                else:
                    await self.store.drop_episode(instance, episode)
            pending = left
            if not pending or time.monotonic() > deadline or self._stopping:
                break
            # Each free worker leases an account (those with orphans come first, as the ones
            # just reclaimed do) and destroys what dead holders left there.
            got = await asyncio.gather(*(self.runner.sweep_orphans(w) for w in self.free),
                                       return_exceptions=True)
            for x in got:
                if isinstance(x, BaseException):
                    log.warning("sweeping an account: %s: %s", type(x).__name__, x)
            swept = [x for x in got if not isinstance(x, BaseException)]
            found = sum(x.resources for x in swept)
            resources += found
            self.metrics.swept.inc(found)
            if not any(x.episodes for x in swept):
                await asyncio.sleep(1.0)     # held by someone else: it lapses or they clean
        report = SweepReport(len(dead), len(dead) - len(pending), resources, leases,
                             tuple(f"{r[2]['account_id']}/{r[1]}" for r in pending),
                             round(time.monotonic() - t0, 3))
        if dead:
            log.info("swept what dead schedulers left: %s", report)
        if pending:
            log.error("the sweep ran out of time (%g s): episodes %s stay recorded for their "
                      "accounts' next holders", self.config.sweep_timeout_s, report.left)
        return report

    async def _sweep_first(self) -> None:
        """:meth:`sweep`, retried while the store fails (a Redis restart), for at most
        ``sweep_timeout_s``; the scheduler goes on then, whatever is left."""
        deadline = time.monotonic() + self.config.sweep_timeout_s
        while not self._stopping:
            try:
                self.last_sweep = await self.sweep()
                return
            except Exception:        # noqa: BLE001 - Redis away (PoolUnavailable), or a bug
                log.exception("the start-up sweep failed")
                if time.monotonic() > deadline:
                    log.error("going on without the start-up sweep")
                    return
                await asyncio.sleep(max(self.config.tick_s, 1.0))

    # ---- choosing -------------------------------------------------------------------------------
    async def limit(self) -> int:
        if await self.store.training_active():
            return max(1, math.floor(self.n_workers * self.config.share_during_training))
        return self.n_workers

    async def pick(self) -> tuple[RunningJob, Rollout] | None:
        running_by_team: dict[str, int] = {}
        for live in self.live.values():
            running_by_team[live.job.team] = running_by_team.get(live.job.team, 0) + \
                len(live.running)
        if sum(running_by_team.values()) >= await self.limit():
            return None
        candidates: dict[str, list[RunningJob]] = {}
        for live in self.live.values():
            if live.stop or live.job.state in TERMINAL:
                continue
            if any(r.state == "queued" for r in live.rollouts.values()):
                candidates.setdefault(live.job.team, []).append(live)
        teams = sorted(candidates, key=lambda t: (running_by_team.get(t, 0),
                                                  self.served.get(t, 0.0)))
        for team in teams:
            quota = self.quota_of(team)
            if running_by_team.get(team, 0) >= quota.concurrent_episodes:
                continue
            if await self.store.usage_today(team) >= quota.env_minutes_per_day * 60:
                continue
            jobs = sorted(candidates[team], key=lambda lv: (-lv.job.priority,
                                                            lv.job.created_at))
            live = jobs[0]
            rollout = min((r for r in live.rollouts.values() if r.state == "queued"),
                          key=lambda r: (r.sample, r.id))
            self.served[team] = time.monotonic()
            return live, rollout
        return None

    # ---- the loop -------------------------------------------------------------------------------
    def wake(self) -> None:
        self._wake.set()

    async def run(self, until: Callable[[], bool] | None = None) -> None:
        """Sweep what dead predecessors left (:meth:`sweep`), then schedule until
        :meth:`stop` (or ``until()`` is true), then wait for the running episodes (after a
        stop: interrupted at their next step)."""
        await self._sweep_first()
        while not self._stopping and not (until and until()):
            try:
                await self.refresh()
                while self.free:
                    chosen = await self.pick()
                    if chosen is None:
                        break
                    await self._start(*chosen)
            except Exception:        # a Redis outage or a bug must not kill the loop
                log.exception("scheduler tick failed; retrying")
            self._wake.clear()
            wake = asyncio.ensure_future(self._wake.wait())
            blpop = asyncio.ensure_future(self.store.wait_wake(self.config.tick_s))
            done, pending = await asyncio.wait({wake, blpop}, timeout=self.config.tick_s + 1,
                                               return_when=asyncio.FIRST_COMPLETED)
            for f in pending:
                f.cancel()
            for f in done:
                if not f.cancelled() and f.exception() is not None:
                    log.warning("waiting for work: %s", f.exception())
                    await asyncio.sleep(self.config.tick_s)
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)
        try:
            await self.store.instance_gone(self.instance)
        except Exception as exc:  # noqa: BLE001 - its heartbeat lapses by itself
            log.warning("could not mark scheduler %s gone: %s", self.instance, exc)

    def stop(self) -> None:
        """Stop scheduling; running episodes stop at their next step (cleaned up, accounts
        released) and go back to the queue, with the attempt recorded as interrupted."""
        self._stopping = True
        self._wake.set()

    async def _start(self, live: RunningJob, rollout: Rollout) -> None:
        worker = self.free.pop(0)
        rollout.state = "running"
        rollout.model = live.job.model
        rollout.attempts.append(Attempt(attempt=len(rollout.attempts) + 1,
                                        started_at=time.time(),
                                        worker=getattr(worker, "name", "")))
        rollout.started_at = rollout.started_at or time.time()
        live.running.add(rollout.id)
        self.metrics.running.labels(live.job.team).inc()
        await self.store.put_rollout(rollout)
        if live.job.state == "queued":
            self.metrics.queue_wait.observe(time.time() - live.job.created_at)
            await self._state(live, "running")
        await self.store.add_event(live.job.id, RolloutStartedEvent(
            rollout_id=rollout.id, task_id=rollout.task_id, sample=rollout.sample,
            attempt=len(rollout.attempts)))
        task = asyncio.ensure_future(self._episode(live, rollout, worker))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _state(self, live: RunningJob, state: str, error: str | None = None) -> None:
        def change(job: Job) -> Job | None:
            if job.state == state or job.state in TERMINAL:
                return None
            now = time.time()
            return job.model_copy(update={
                "state": state, "error": error,
                "started_at": job.started_at or (now if state == "running" else None),
                "finished_at": now if state in TERMINAL else None})
        job = await self.store.update_job(live.job.id, change)
        if job is not None and job.state == state:
            live.job = job
            await self.store.add_event(job.id, JobStatusEvent(state=state, error=error))

    # ---- one episode ----------------------------------------------------------------------------
    async def _policy(self, job: Job) -> tuple[EpisodePolicy, int, bool]:
        """Who acts in the job's episodes, the env worker's step limit and whether the page's
        ids are drawn per episode: the scripted oracle (no model: as many steps as its script
        needs, ids in document order), or the job's model through the agent loop with the
        job's sampling (one step more than the agent's limit, for its final action; ids as
        its agent config's ``random_ids`` says)."""
        if job.model in SCRIPTED_MODELS:     # the oracle, or a drafted task's replay
            return scripted_policy(run_oracle), ORACLE_MAX_STEPS, False
        s = job.sampling
        agent = await self.agent_for(job.model, replace(
            self.base_agent, temperature=s.temperature, top_p=s.top_p,
            max_steps=s.max_steps, max_new_tokens=s.max_new_tokens))
        return model_policy(agent), s.max_steps + 1, agent.config.random_ids

    async def _episode(self, live: RunningJob, rollout: Rollout, worker: Any) -> None:
        job = live.job
        task = live.tasks[rollout.task_id]
        steps: list[Step] = []
        last_event = [0.0]
        page = [""]
        t0 = time.monotonic()

        async def observer(index: int, result: StepResult) -> None:
            if live.stop:
                raise EpisodeCancelled(f"the job was {live.stop}")
            if self._stopping:
                raise EpisodeCancelled("the scheduler is stopping")
            obs = result.observation
            shot = None
            if self.config.screenshots and obs.screenshot:
                shot = await self.store.put_artifact(job.team, job.id,
                                                     obs.screenshot_mime or "image/jpeg",
                                                     obs.screenshot)
            steps.append(Step(index=index, action=result.action_text,
                              target=target_of(result.action_text, page[0]), url=obs.url,
                              title=obs.title, error=obs.last_action_error or "",
                              screenshot=shot, elapsed_ms=round(result.elapsed_ms, 1)))
            page[0] = obs.text
            now = time.monotonic()
            if index and now - last_event[0] >= self.config.step_event_interval_s:
                last_event[0] = now
                await self.store.add_event(job.id, RolloutStepEvent(
                    rollout_id=rollout.id, step=index, action=result.action_text,
                    url=obs.url, error=obs.last_action_error or ""))

        recorded: list[str] = []                # the episode id, once its lease is recorded

        async def on_lease(lease: EpisodeLease) -> None:
            await self.store.record_episode(self.instance, lease.episode_id, {
                "account_id": lease.account_id, "fencing": lease.fencing,
                "worker": lease.worker, "job_id": job.id, "rollout_id": rollout.id,
                "attempt": len(rollout.attempts), "at": time.time()})
            recorded.append(lease.episode_id)

        outcome: EpisodeOutcome | None = None
        try:
            s = job.sampling
            policy, max_steps, random_ids = await self._policy(job)
            trajectory_id = f"{job.id}-{rollout.id}-{len(rollout.attempts)}"
            seed = (s.seed * 1_000_003 + rollout.sample) % 2**31
            outcome = await self.runner.run(
                worker, task, policy, max_steps=max_steps, trajectory_id=trajectory_id,
                seed=seed, observer=observer, on_lease=on_lease,
                id_seed=episode_id_seed(random_ids, trajectory_id, seed))
        except Exception as exc:           # the runner never raises for the env; a bug might
            log.exception("episode %s of %s", rollout.id, job.id)
            error = f"internal: {type(exc).__name__}: {str(exc)[:200]}"
        else:
            error = None
        finally:
            self.free.append(worker)
            live.running.discard(rollout.id)
            self.metrics.running.labels(job.team).dec()
        env_s = time.monotonic() - t0
        for wait_s in (0.5, 1, 2, 4, 8, 16, 30, 30, 30, 30):
            # Redis may be restarting (AOF brings it back): the result must not be lost.
            try:
                for episode_id in recorded:     # cleaned up and released by the runner
                    await self.store.drop_episode(self.instance, episode_id)
                async with live.recording:
                    await self._record(live, rollout, outcome, error, steps, env_s)
                await self.store.add_usage(job.team, env_s)
                break
            except Exception:
                log.exception("recording episode %s of %s; retrying in %s s", rollout.id,
                              job.id, wait_s)
                await asyncio.sleep(wait_s)
        self.wake()

    async def _record(self, live: RunningJob, rollout: Rollout, outcome: EpisodeOutcome | None,
                      error: str | None, steps: list[Step], env_s: float) -> None:
        attempt = rollout.attempts[-1]
        attempt.ended_at = time.time()
        rollout.env_seconds = round(rollout.env_seconds + env_s, 3)
        if outcome is not None and outcome.env_error is not None and not outcome.cancelled:
            error = f"{outcome.env_error.kind}: {outcome.env_error.message}"[:300]
        if outcome is not None:
            rollout.leaked = list(outcome.leaked)
        if outcome is not None and outcome.cancelled and not live.stop:
            # Stopped by a shutdown, not by the job: it runs again when a scheduler is back.
            attempt.env_error = "interrupted: the scheduler stopped"
            rollout.state = "queued"
            await self.store.put_rollout(rollout)
            await self._progress(live)
            return
        if outcome is not None and outcome.cancelled:
            rollout.state = "cancelled"
        elif error is not None:
            attempt.env_error = error
            retry = len(rollout.attempts) < self.config.max_attempts and not live.stop
            rollout.state = "queued" if retry else ("cancelled" if live.stop else "failed")
            self.metrics.episodes.labels("retried" if retry else rollout.state).inc()
            if retry:
                await self.store.put_rollout(rollout)
                await self._progress(live)
                return
        else:
            assert outcome is not None
            rollout.state = "completed"
            for name, value in completed_fields(outcome).items():
                setattr(rollout, name, value)
        if rollout.state != "queued":
            rollout.steps = steps
            rollout.finished_at = time.time()
            self.metrics.episodes.labels(rollout.state).inc()
        await self.store.put_rollout(rollout)
        await self.store.add_event(live.job.id, RolloutCompletedEvent(
            rollout_id=rollout.id, task_id=rollout.task_id, state=rollout.state,
            verdict=rollout.verdict, attempts=len(rollout.attempts)))
        same = [r for r in live.rollouts.values() if r.task_id == rollout.task_id]
        if all(r.state in ("completed", "failed", "cancelled") for r in same):
            passes = sum(r.verdict == "success" for r in same)
            done = sum(r.state == "completed" for r in same)
            await self.store.add_event(live.job.id, TaskSummaryEvent(
                task_id=rollout.task_id, samples=len(same), completed=done, passes=passes))
        await self._progress(live)

    async def _progress(self, live: RunningJob) -> None:
        rollouts = list(live.rollouts.values())
        episodes, verdicts = counts(rollouts)
        versions = [r.policy_version for r in rollouts if r.policy_version is not None]
        tokens = sum(r.tokens for r in rollouts)
        env_s = round(sum(r.env_seconds for r in rollouts), 3)

        def change(job: Job) -> Job:
            return job.model_copy(update={
                "episodes": episodes, "verdicts": verdicts,
                "policy_version": max(versions) if versions else job.policy_version,
                "usage": Usage(env_seconds=env_s, tokens=tokens)})
        job = await self.store.update_job(live.job.id, change)
        if job is not None:
            live.job = job
        if not live.running and all(r.state in ("completed", "failed", "cancelled")
                                    for r in rollouts):
            if live.stop:
                await self._close(live)
            elif live.job.state not in TERMINAL:
                await self._finish(live.job.id, "completed")

    async def _close(self, live: RunningJob) -> None:
        """A cancelled or expired job whose episodes have stopped: the rest never run."""
        left = [r for r in live.rollouts.values() if r.state == "queued"]
        for r in left:
            r.state = "cancelled"
        await self.store.put_rollouts(left)
        episodes, verdicts = counts(list(live.rollouts.values()))
        await self.store.update_job(live.job.id, lambda j: j.model_copy(update={
            "episodes": episodes, "verdicts": verdicts}))
        await self._finish(live.job.id, live.stop)
        self.live.pop(live.job.id, None)

    async def _finish(self, job_id: str, state: str, error: str | None = None) -> None:
        now = time.time()
        job = await self.store.update_job(job_id, lambda j: None if j.state in TERMINAL else
                                          j.model_copy(update={"state": state, "error": error,
                                                               "finished_at": now}))
        if job is None or job.state != state:
            return
        self.metrics.finished.labels(state).inc()
        await self.store.add_event(job_id, JobStatusEvent(state=state, error=error))
        await self.store.add_event(job_id, JobCompletedEvent(
            state=state, episodes=job.episodes, verdicts=job.verdicts))
