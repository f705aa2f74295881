"""An episode's turns on the env worker (``orchestrator.turn_loop: worker``): the worker's
``act`` runs the agent loop with its own step, a broken or hung step ends the trajectory as an
env error, an agent that raises is a failure value (never the agent's doing), the episode
runner calls ``act`` once instead of ``step`` per turn unless an observer must see every
step, the orchestrator picks where the turns run, routers that each see little load spread
their sessions over the replicas, and a staleness budget that cannot cover the workers is
named."""
from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from consolerl.types import Observation, StepResult
from env_workers import pool as pool_module
from env_workers.accounts import PoolConfig
from env_workers.pool import LeasedEnvWorker
from env_workers.worker import WorkerConfig
from rollout_service.agent import AgentConfig, AgentLoop, Generation
from rollout_service.episode import PolicyFailed, WorkerSidePolicy
from rollout_service.orchestrator import AUTO_WORKER_TURNS, Orchestrator, OrchestratorConfig
from rollout_service.policy import PolicyRouter
from tests.conftest import run_async
from tests.unit.test_agent_loop import START, ByteTokenizer, FakeEnv, ScriptedPolicy
from tests.unit.test_orchestrator_units import TASKS, FakeStream

VALUES = TASKS[0].values("e1", {})


class Browser(FakeEnv):
    """The browser side of an env worker (``step`` as the worker's browser answers it)."""

    def __init__(self, fail_at=None, raise_at=None, hang_at=None):
        super().__init__(fail_at)
        self.raise_at, self.hang_at = raise_at, hang_at

    async def step(self, text):
        if self.raise_at == self.steps + 1:
            raise RuntimeError("page crashed")
        if self.hang_at == self.steps + 1:
            await asyncio.sleep(3600)
        return await super().step(text)

    async def close_episode(self):
        return None

    def browser_rss_mb(self):
        return 0.0


def body(browser) -> LeasedEnvWorker:
    return LeasedEnvWorker(WorkerConfig(), PoolConfig(redis_url="redis://127.0.0.1:1/0"), "w0",
                         pool=object(), browser=browser)


def agent(outputs) -> AgentLoop:
    return AgentLoop(ScriptedPolicy(outputs), ByteTokenizer(), AgentConfig(max_prompt_tokens=4000,
                                                                           max_steps=4))


def act(worker, loop):
    return run_async(worker.act(loop, "t-1", "Create a user", "1. Click Create.", START, 3,
                                "tr-1"))


def test_act_runs_the_turns_with_the_workers_own_step():
    browser = Browser()
    trajectory, failure = act(body(browser), agent(["click(1)", 'stop("made")']))
    assert failure == ""
    assert browser.seen == ["click(1)", 'stop("made")']
    assert trajectory.trajectory_id == "tr-1" and trajectory.end_reason == "stop"
    assert trajectory.answer == "made" and len(trajectory.turns) == 2
    # token-faithful as on the rollout side: the sampled ids and their log-probs, version 7
    assert all(t.version == 7 and len(t.response_ids) == len(t.logprobs) for t in
               trajectory.turns)


@pytest.mark.parametrize("kind", ["raise", "hang"])
def test_a_step_that_breaks_or_hangs_ends_the_trajectory_as_an_env_error(monkeypatch, kind):
    monkeypatch.setattr(pool_module, "ACT_STEP_TIMEOUT_S", 0.2)
    browser = Browser(**{f"{kind}_at": 2})
    trajectory, failure = act(body(browser), agent(["click(1)", "click(1)", "click(1)"]))
    assert failure == "" and trajectory.end_reason == "env_error"
    assert trajectory.env_error.kind == "worker_failed"
    assert ("page crashed" if kind == "raise" else "did not answer within 0.2 s") in \
        trajectory.env_error.message
    assert len(trajectory.turns) == 2


def test_an_agent_that_raises_is_a_failure_value():
    class Gone:
        async def generate(self, *args, **kwargs):
            raise ConnectionError("replica p0 is gone")
    loop = AgentLoop(Gone(), ByteTokenizer(), AgentConfig(max_prompt_tokens=4000))
    trajectory, failure = act(body(Browser()), loop)
    assert trajectory is None and failure == "ConnectionError: replica p0 is gone"


class ActingEnv:
    """An env worker seen from the runner's side: ``act`` or ``step``, counted."""

    def __init__(self):
        self.calls = Counter()
        self.browser = Browser()

    async def act(self, shipped, task_id, title, procedure, observation, seed, tid):
        self.calls["act"] += 1
        return await LeasedEnvWorker.act(self, shipped, task_id, title, procedure,
                                       observation, seed, tid)

    async def step(self, text):
        self.calls["step"] += 1
        return await self.browser.step(text)

    name = "w0"


def test_the_worker_side_policy_makes_one_call_for_all_the_turns():
    env = ActingEnv()
    policy = WorkerSidePolicy(agent(["click(1)", "click(1)", 'stop("ok")']))
    trajectory = run_async(policy.on_worker(env, TASKS[0], VALUES, START, trajectory_id="tr-2",
                                            seed=1))
    assert env.calls == Counter(act=1, step=3) and trajectory.answer == "ok"
    # As a plain policy (an observer watches every step) the turns run on this side.
    env2 = ActingEnv()

    async def step(text):
        return await env2.step(text)
    trajectory = run_async(WorkerSidePolicy(agent(['stop("ok")']))(
        TASKS[0], VALUES, START, step, trajectory_id="tr-3", seed=1))
    assert env2.calls == Counter(step=1) and trajectory.answer == "ok"


def test_an_agent_failure_on_the_worker_is_raised_as_policy_failed():
    class Gone:
        async def generate(self, *args, **kwargs):
            raise ConnectionError("replica p0 is gone")
    policy = WorkerSidePolicy(AgentLoop(Gone(), ByteTokenizer(), AgentConfig()))
    with pytest.raises(PolicyFailed, match="replica p0 is gone"):
        run_async(policy.on_worker(ActingEnv(), TASKS[0], VALUES, START, trajectory_id="t",
                                   seed=0))


@pytest.mark.parametrize("turn_loop, workers, on_workers", [
    ("auto", AUTO_WORKER_TURNS - 1, False), ("auto", AUTO_WORKER_TURNS, True),
    ("worker", 1, True), ("orchestrator", 100, False)])
def test_the_orchestrator_picks_where_the_turns_run(turn_loop, workers, on_workers):
    orch = Orchestrator(OrchestratorConfig(turn_loop=turn_loop), TASKS,
                        [object() for _ in range(workers)], [], "127.0.0.1:1",
                        agent([]), None, FakeStream())
    assert orch.turns_on_workers is on_workers
    assert isinstance(orch.policy, WorkerSidePolicy) is on_workers
    assert orch.summary(1.0)["turn_loop"] == ("worker" if on_workers else "orchestrator")


def test_a_bad_turn_loop_is_named():
    with pytest.raises(Exception, match="OrchestratorConfig.turn_loop: must be one of auto, "
                                        "worker, orchestrator"):
        OrchestratorConfig(turn_loop="env")


def test_routers_that_see_no_load_spread_sessions_by_their_hash():
    class Replica:
        def __init__(self):
            self.sessions = 0

        async def generate(self, ids, sampling):
            self.sessions += 1
            return Generation((1,), (-0.1,), 0)
    replicas = [Replica() for _ in range(4)]

    async def one_router_per_worker():
        for i in range(400):                 # each env worker's own router, idle when asked
            await PolicyRouter(replicas).generate([1], None, session=f"traj-{i}")
    run_async(one_router_per_worker())
    assert all(60 <= r.sessions <= 140 for r in replicas), [r.sessions for r in replicas]


def test_the_agent_loop_releases_its_session_on_the_router():
    router = PolicyRouter([ScriptedPolicyReplica(['stop("x")'])])
    loop = AgentLoop(router, ByteTokenizer(), AgentConfig(max_prompt_tokens=4000))

    async def step(text):
        return StepResult(Observation("u", "t", "p"), done=True, answer="x", action_text=text)
    run_async(loop.run("t", "title", "proc", START, step, trajectory_id="s-1"))
    assert router.sticky == {} and router.load == [0]


class ScriptedPolicyReplica(ScriptedPolicy):
    """A replica as the router calls it (no session argument)."""

    async def generate(self, prompt_ids, sampling, session=""):
        return await super().generate(prompt_ids, sampling)


@pytest.mark.parametrize("staleness, groups, workers, short", [
    (1, 2, 8, True), (2, 2, 8, True), (3, 2, 8, False), (1, 8, 8, False), (0, 8, 8, True)])
def test_a_staleness_budget_that_cannot_cover_the_workers_is_named(staleness, groups, workers,
                                                                   short):
    orch = Orchestrator(OrchestratorConfig(group_size=2, max_staleness=staleness,
                                           groups_per_step=groups), TASKS,
                        [object() for _ in range(workers)], [], "127.0.0.1:1", agent([]),
                        None, FakeStream())
    message = orch.admission_short()
    assert bool(message) is short
    if short:
        assert f"= {staleness * groups * 2} < 1.5 x {workers} env workers" in message
        assert "orchestrator.groups_per_step or max_staleness" in message
