"""The jobs scheduler's choices against a real Redis: fair share between teams, priority within
a team, the share of the pool beside training, per-team concurrency quotas, retries of
infrastructure errors only (each attempt recorded), deadlines, a restarted scheduler that
never re-runs a finished episode, and episodes that end together recorded one after the other. Episodes are played by a stand-in for the episode runner
(what is checked here is which episode runs when, not the episode itself: the real runner is
exercised by test_jobs_api_stack)."""
from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest
from prometheus_client import generate_latest

from consolerl.errors import EpisodeCancelled
from consolerl.experience import Trajectory
from consolerl.rewards import RewardResult, RuleOutcome
from consolerl.tasks import TASKS_DIR, load_suite
from consolerl.types import EnvError, Observation, StepResult
from tests.conftest import run_async
from rollout_service.agent import AgentConfig
from rollout_service.episode import EpisodeOutcome, episode_id_seed
from jobsapi.auth import TeamQuota
from jobsapi.schema import Job, Sampling
from jobsapi.scheduler import JobScheduler, SchedulerConfig
from jobsapi.store import JobStore, TrainingBeacon

SUITE = {t.id: t for t in load_suite(TASKS_DIR)}
TASKS = ["ram-create-user-0", "ecs-add-rule-0", "vpc-create-vpc-0"]


class Episodes:
    """Plays episodes: each takes ``seconds``; ``env_errors[task]`` of them fail for the
    environment first. Records starts, ends and the most running at once."""

    def __init__(self, seconds: float = 0.2, env_errors: dict[str, int] | None = None):
        self.seconds = seconds
        self.env_errors = dict(env_errors or {})
        self.starts: list[str] = []
        self.id_seeds: list[int | None] = []
        self.finished: list[str] = []
        self.running = 0
        self.most = 0

    async def run(self, worker, task, policy, *, max_steps, trajectory_id, seed, observer,
                  on_lease=None, id_seed=None):
        self.starts.append(trajectory_id)
        self.id_seeds.append(id_seed)
        self.running += 1
        self.most = max(self.most, self.running)
        outcome = EpisodeOutcome(task.id, task.expected, "e1", worker=str(worker))
        try:
            try:
                await observer(0, StepResult(Observation("http://x/", "t",
                                                         "[1] button \"Go\"", 0)))
                await asyncio.sleep(self.seconds)
                await observer(1, StepResult(Observation("http://x/2", "t2", "", 1),
                                             action_text='click("1")'))
            except EpisodeCancelled:            # as the episode runner does
                outcome.cancelled = True
                return outcome
            if self.env_errors.get(task.id, 0) > 0:
                self.env_errors[task.id] -= 1
                outcome.env_error = EnvError("browser_crashed", "the browser went away")
                return outcome
            outcome.trajectory = Trajectory(trajectory_id, task.id, (), "stop", "done")
            outcome.reward = RewardResult(1.0, True, "success", "rule",
                                          RuleOutcome("success"))
            self.finished.append(trajectory_id)
            return outcome
        finally:
            self.running -= 1


@pytest.fixture
def store(redis_server):
    redis_server.client().flushall()
    s = JobStore(redis_server.url, "t:sched")
    yield s


async def make_job(store: JobStore, team: str, tasks: list[str], samples: int = 1,
                   priority: int = 5, deadline_s: float | None = None) -> str:
    now = time.time()
    job = Job(id=await store.new_job_id(), team=team, state="queued", created_at=now,
              expires_at=None if deadline_s is None else now + deadline_s, model="live",
              samples_per_task=samples, sampling=Sampling(), priority=priority,
              task_ids=tasks)
    await store.create_job(job, {"tasks": [{"id": t} for t in tasks]})
    return job.id


def scheduler(store, episodes, workers=2, quotas=None, **config) -> JobScheduler:
    quotas = quotas or {}
    return JobScheduler(SchedulerConfig(tick_s=0.05, **config), store, episodes,
                        [f"w{i}" for i in range(workers)], SUITE, _agent,
                        lambda team: quotas.get(team, TeamQuota(concurrent_episodes=8)))


async def _agent(model, config):
    return SimpleNamespace(config=config)      # an agent loop, as far as the scheduler looks


async def run_until_done(sched: JobScheduler, store: JobStore, jobs: list[str],
                         timeout_s: float = 30) -> list[Job]:
    async def finished() -> bool:
        got = [await store.get_job(j) for j in jobs]
        return all(j.state in ("completed", "failed", "cancelled", "expired") for j in got)
    task = asyncio.ensure_future(sched.run())
    deadline = time.monotonic() + timeout_s
    while not await finished():
        assert time.monotonic() < deadline, "jobs did not finish"
        await asyncio.sleep(0.05)
    sched.stop()
    await task
    return [await store.get_job(j) for j in jobs]


def team_of(trajectory_id: str, owners: dict[str, str]) -> str:
    return owners[trajectory_id.split("-")[0]]


def test_fair_share_between_teams_and_priority_within(store):
    async def go():
        eps = Episodes()
        big = await make_job(store, "a", TASKS, samples=2, priority=9)
        low = await make_job(store, "b", TASKS[:1], samples=2, priority=0)
        high = await make_job(store, "b", TASKS[:1], samples=2, priority=9)
        owners = {big: "a", low: "b", high: "b"}
        done = await run_until_done(scheduler(store, eps), store, [big, low, high])
        assert {j.state for j in done} == {"completed"}
        teams = [team_of(t, owners) for t in eps.starts]
        # Team a's priority does not let it take the pool: the teams alternate while both wait.
        assert teams[:4].count("a") == 2 and teams[:4].count("b") == 2, teams
        # Within team b the higher-priority (newer) job goes first.
        b_jobs = [t.split("-")[0] for t in eps.starts if owners[t.split("-")[0]] == "b"]
        assert b_jobs[:2] == [high, high], b_jobs
    run_async(go())


def test_ids_are_drawn_per_episode_for_an_agent_with_random_ids(store):
    """A job's episodes open with an id seed of their own when the agent's ``random_ids`` is
    on (the oracle's, and every episode without it, in document order)."""
    async def go():
        plain = Episodes(seconds=0.01)
        job = await make_job(store, "a", TASKS[:1], samples=2)
        await run_until_done(scheduler(store, plain), store, [job])
        assert plain.id_seeds == [None, None]
        drawn = Episodes(seconds=0.01)
        job = await make_job(store, "a", TASKS[:1], samples=2)
        sched = JobScheduler(SchedulerConfig(tick_s=0.05), store, drawn, ["w0"], SUITE, _agent,
                             lambda team: TeamQuota(concurrent_episodes=8),
                             AgentConfig(random_ids=True))
        await run_until_done(sched, store, [job])
        assert len(set(drawn.id_seeds)) == 2 and None not in drawn.id_seeds
        # Each from its episode's trajectory id and seed (samples 0 and 1: seeds 0 and 1).
        assert set(drawn.id_seeds) <= {episode_id_seed(True, t, seed)
                                       for t in drawn.starts for seed in (0, 1)}
    run_async(go())


def test_share_of_the_pool_while_training(store):
    async def go():
        eps = Episodes(seconds=0.3)
        beacon = TrainingBeacon(store.url, store.p, ttl_s=60).start()
        try:
            job = await make_job(store, "a", TASKS, samples=2)
            sched = scheduler(store, eps, workers=4, share_during_training=0.5)
            await run_until_done(sched, store, [job])
        finally:
            beacon.stop()
        assert eps.most == 2                       # half of 4 workers while training runs
        eps2 = Episodes(seconds=0.3)
        job2 = await make_job(store, "a", TASKS, samples=2)
        await run_until_done(scheduler(store, eps2, workers=4), store, [job2])
        assert eps2.most == 4                      # all of them when it does not
    run_async(go())


def test_team_quota_of_concurrent_episodes(store):
    async def go():
        eps = Episodes(seconds=0.2)
        job = await make_job(store, "a", TASKS, samples=2)
        sched = scheduler(store, eps, workers=4,
                          quotas={"a": TeamQuota(concurrent_episodes=1)})
        await run_until_done(sched, store, [job])
        assert eps.most == 1 and len(eps.finished) == 6
    run_async(go())


def test_only_env_errors_are_retried_and_attempts_recorded(store):
    async def go():
        eps = Episodes(seconds=0.05, env_errors={"ram-create-user-0": 1,
                                                 "ecs-add-rule-0": 5})
        job = await make_job(store, "a", TASKS[:2])
        (done,) = await run_until_done(scheduler(store, eps, max_attempts=3), store, [job])
        assert done.state == "completed"
        assert done.episodes.completed == 1 and done.episodes.failed == 1
        rollouts = {r.task_id: r for r in await store.rollouts(job)}
        ok, lost = rollouts["ram-create-user-0"], rollouts["ecs-add-rule-0"]
        assert ok.state == "completed" and ok.verdict == "success"
        assert [a.env_error is not None for a in ok.attempts] == [True, False]
        assert lost.state == "failed" and lost.verdict is None and len(lost.attempts) == 3
        assert all("browser_crashed" in a.env_error for a in lost.attempts)
        assert ok.steps and ok.steps[-1].target == 'button "Go"'
    run_async(go())


def test_deadline_expires_the_job_and_keeps_what_finished(store):
    async def go():
        eps = Episodes(seconds=0.4)
        job = await make_job(store, "a", TASKS, samples=3, deadline_s=0.6)
        (done,) = await run_until_done(scheduler(store, eps, workers=1), store, [job])
        assert done.state == "expired"
        states = [r.state for r in await store.rollouts(job)]
        assert "completed" in states and "cancelled" in states and "queued" not in states
        assert "running" not in states
    run_async(go())


def test_a_restarted_scheduler_never_reruns_a_finished_episode(store):
    async def go():
        eps = Episodes(seconds=0.1)
        job = await make_job(store, "a", TASKS, samples=2)
        first = scheduler(store, eps, workers=1)
        await asyncio.wait_for(first.run(until=lambda: len(eps.finished) >= 2), 30)
        done_before = {t.rsplit("-", 1)[0] for t in eps.finished}
        # A crash mid-episode: one rollout left "running" with an open attempt.
        rollouts = await store.rollouts(job)
        queued = next(r for r in rollouts if r.state == "queued")
        queued.state = "running"
        from jobsapi.schema import Attempt
        queued.attempts.append(Attempt(attempt=1, started_at=time.time()))
        await store.put_rollout(queued)
        eps2 = Episodes(seconds=0.05)
        (done,) = await run_until_done(scheduler(store, eps2), store, [job])
        assert done.state == "completed" and done.episodes.completed == 6
        again = {t.rsplit("-", 1)[0] for t in eps2.starts}
        assert not again & done_before               # finished episodes never ran again
        interrupted = await store.get_rollout(job, queued.id)
        assert interrupted.attempts[0].env_error.startswith("interrupted")
        assert len(interrupted.attempts) == 2
    run_async(go())


def test_a_stopped_scheduler_puts_running_episodes_back(store):
    async def go():
        eps = Episodes(seconds=1.0)
        job = await make_job(store, "a", TASKS[:2])
        first = scheduler(store, eps, workers=2)
        task = asyncio.ensure_future(first.run())
        while len(eps.starts) < 2:
            await asyncio.sleep(0.02)
        first.stop()                          # a shutdown mid-episode
        await asyncio.wait_for(task, 10)
        rollouts = await store.rollouts(job)
        assert [r.state for r in rollouts] == ["queued", "queued"]
        assert all(r.attempts[0].env_error.startswith("interrupted") for r in rollouts)
        assert (await store.get_job(job)).state == "running"
        (done,) = await run_until_done(scheduler(store, Episodes(seconds=0.05)), store, [job])
        assert done.state == "completed" and done.episodes.completed == 2
    run_async(go())


def test_job_completed_is_the_last_event_when_episodes_end_together(store):
    """Episodes that end at the same moment record one after the other: the job ends after
    the last one's events, with every episode counted."""
    async def go():
        for _ in range(3):
            eps = Episodes(seconds=0.2)
            job = await make_job(store, "a", TASKS[:1], samples=4)
            (done,) = await run_until_done(scheduler(store, eps, workers=4), store, [job])
            kinds = [k for _, k, _ in await store.read_events(job, "0", 0, 1000)]
            assert kinds[-1] == "job.completed" and kinds.count("job.completed") == 1, kinds
            assert kinds.count("rollout.completed") == 4 and kinds.count("task.summary") == 1
            assert done.episodes.completed == 4, done.episodes
    run_async(go())


class SweepingEpisodes(Episodes):
    """Episodes, plus the runner's orphan sweep over a real account pool: each call leases an
    account (orphans first), "destroys" what dead holders recorded there, releases it. Every
    call, sweep or episode, is logged in order."""

    def __init__(self, pool, **kw):
        super().__init__(**kw)
        self.pool = pool
        self.log: list[str] = []

    async def sweep_orphans(self, worker, acquire_timeout_s=5.0):
        from rollout_service.episode import OrphanSweep
        lease = await asyncio.to_thread(self.pool.acquire, str(worker), 1.0)
        try:
            orphans = self.pool.unfinished_episodes(lease.account_id)
            for episode in orphans:
                self.pool.episode_cleaned(lease.account_id, episode)
                self.log.append(f"destroyed {episode}")
            return OrphanSweep(lease.account_id, tuple(orphans), 2 * len(orphans))
        finally:
            self.pool.release(lease)

    async def run(self, worker, task, policy, **kw):
        self.log.append(f"episode {kw['trajectory_id']}")
        return await super().run(worker, task, policy, **kw)


def test_a_dead_schedulers_episodes_are_swept_before_any_work(store, redis_server, accounts):
    """A scheduler killed mid-episode left its lease and its episode's record: its successor
    ends the lease (long before its TTL), destroys what the episode left, and only then
    starts an episode; a live scheduler's episodes are left alone."""
    from env_workers.accounts import PoolConfig
    from env_workers.leases import AccountPool
    pool = AccountPool(accounts[:2], PoolConfig(redis_url=redis_server.url,
                                                key_prefix="t:sched:pool", lease_ttl_s=600))

    async def go():
        job = await make_job(store, "a", TASKS[:1])
        dead = pool.acquire("dead-worker", timeout_s=0)       # never renewed, never released
        pool.episode_begun(dead.account_id, "deadbeef")
        await store.record_episode("sdead", "deadbeef", {
            "account_id": dead.account_id, "fencing": dead.fencing, "worker": "dead-worker",
            "job_id": job, "rollout_id": "r0000s000", "attempt": 1, "at": time.time()})
        await store.record_episode("salive", "cafef00d", {
            "account_id": "nobody", "fencing": 1, "worker": "w", "job_id": job,
            "rollout_id": "r0000s000", "attempt": 1, "at": time.time()})
        await store.instance_beat("salive", 60)               # another scheduler, alive
        eps = SweepingEpisodes(pool, seconds=0.05)
        sched = JobScheduler(SchedulerConfig(tick_s=0.05, heartbeat_ttl_s=0.5), store, eps,
                             ["w0", "w1"], SUITE, _agent,
                             lambda team: TeamQuota(concurrent_episodes=8), leases=pool)
        t0 = time.monotonic()
        (done,) = await run_until_done(sched, store, [job])
        assert done.state == "completed"
        assert eps.log[0] == "destroyed deadbeef" and eps.log[1].startswith("episode"), eps.log
        report = sched.last_sweep
        assert (report.episodes, report.cleaned, report.leases, report.left) == (1, 1, 1, ())
        assert report.resources == 2 and report.seconds < time.monotonic() - t0 < 60
        assert pool.unfinished_episodes(dead.account_id) == []
        left = {(i, e) for i, e, _ in await store.episode_records()}
        assert left == {("salive", "cafef00d")}               # the live one's stays
        text = generate_latest(sched.registry).decode()
        assert "consolerl_api_swept_resources_total 2.0" in text
        assert "consolerl_api_reclaimed_leases_total 1.0" in text
        assert not await store.instance_alive(sched.instance)  # a clean stop says so
    try:
        run_async(go())
    finally:
        pool.close()
