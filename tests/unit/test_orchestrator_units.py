"""The orchestrator's group logic with fake episodes (no browser, no cloud): env-error retries
and abandoning, uniform groups dropped, staleness capacity, the sync barrier, and the
curriculum that picks each group's task."""
from __future__ import annotations

import asyncio

import pytest

from consolerl.errors import ConfigError
from consolerl.tasks import TASKS_DIR, load_suite
from consolerl.rewards import RewardResult
from rollout_service.agent import AgentConfig, AgentLoop
from consolerl.experience import Trajectory, Turn
from consolerl.types import EnvError
from rollout_service.episode import EpisodeOutcome
from rollout_service.orchestrator import EpisodeSummary, Orchestrator, OrchestratorConfig
from tests.conftest import run_async

TASKS = [t for t in load_suite(TASKS_DIR) if t.id in ("ram-create-user-0", "ram-grant-policy-0")]


class FakeStream:
    def __init__(self):
        self.pushed = []
        self.version = 0

    def push(self, group):
        self.pushed.append(group)
        return "1-0"

    def trainer_version(self):
        return self.version


def orchestrator(config: OrchestratorConfig, outcomes, stream=None, workers=2):
    """``outcomes``: a function (call number, index in the group) -> reward or 'env_error'."""
    stream = stream or FakeStream()
    orch = Orchestrator(config, TASKS, [object() for _ in range(workers)], [], "127.0.0.1:1",
                        AgentLoop(None, None, AgentConfig()), None, stream)
    calls = [0]

    async def episode(worker, task, trajectory_id, seed):
        calls[0] += 1
        what = outcomes(calls[0], int(trajectory_id.rsplit("-", 1)[1]))
        await asyncio.sleep(0.01)
        if what == "env_error":
            return EpisodeOutcome(task.id, task.expected, "e0",
                                  env_error=EnvError("browser_crashed", "gone"))
        turn = Turn((1,), (2,), (-0.1,), (1,), stream.version, "x", "click(1)")
        traj = Trajectory(trajectory_id, task.id, (turn,), "stop", answer="done")
        return EpisodeOutcome(task.id, task.expected, "e1", traj, RewardResult(
            what, True, "success" if what else "failure", "rule"))
    orch.episode = episode
    return orch, stream, calls


def test_groups_are_pushed_with_their_rewards():
    orch, stream, _ = orchestrator(OrchestratorConfig(group_size=2, max_staleness=5),
                                   lambda n, i: float(i))
    summary = run_async(orch.run(max_groups=3))
    assert summary["groups_pushed"] == 3 and len(stream.pushed) == 3
    for g in stream.pushed:
        assert sorted(g.rewards) == [0.0, 1.0] and len(g.samples) == 2


def test_uniform_groups_are_dropped_and_counted():
    orch, stream, _ = orchestrator(OrchestratorConfig(group_size=2, max_staleness=5),
                                   lambda n, i: 1.0)
    summary = run_async(orch.run(max_groups=2))
    assert stream.pushed == [] and summary["groups_dropped_uniform"] == 2


def test_env_errors_are_retried_then_the_group_is_abandoned():
    orch, stream, calls = orchestrator(
        OrchestratorConfig(group_size=2, max_staleness=5, max_env_retries=1),
        lambda n, i: "env_error" if n == 1 else float(i))
    summary = run_async(orch.run(max_groups=1))
    assert summary["groups_pushed"] == 1 and summary["env_errors"] == 1 and calls[0] == 3
    assert all(s.trajectory_id for s in stream.pushed[0].samples)

    orch, stream, _ = orchestrator(
        OrchestratorConfig(group_size=2, max_staleness=5, max_env_retries=1),
        lambda n, i: "env_error")
    summary = run_async(orch.run(max_groups=1))
    assert stream.pushed == [] and summary["groups_abandoned"] == 1


def test_staleness_capacity_holds_new_groups_until_the_trainer_moves():
    stream = FakeStream()
    orch, stream, calls = orchestrator(
        OrchestratorConfig(group_size=2, max_staleness=0, groups_per_step=1),
        lambda n, i: float(i), stream=stream)

    async def go():
        task = asyncio.create_task(orch.run(max_groups=2))
        await asyncio.sleep(0.5)
        held = (orch.groups_opened, calls[0])     # version 0, staleness 0: one group only
        stream.version = 1
        summary = await asyncio.wait_for(task, 10)
        return held, summary
    held, summary = run_async(go())
    assert held == (1, 2)
    assert summary["groups_pushed"] == 2


def test_workers_held_at_capacity_still_take_samples_of_open_groups():
    # Staleness 0, two groups a step: two groups of 4 may be open at version 0, eight
    # samples for eight workers. All eight start at once: the ones that find no group and
    # no capacity must still take the other samples of the groups opened meanwhile (they
    # used to wait at the capacity check until the trainer moved, with samples pending).
    stream = FakeStream()
    orch, stream, calls = orchestrator(
        OrchestratorConfig(group_size=4, max_staleness=0, groups_per_step=2),
        lambda n, i: float(i), stream=stream, workers=8)
    running, peak = [0], [0]
    fake = orch.episode

    async def episode(*args):
        running[0] += 1
        peak[0] = max(peak[0], running[0])
        await asyncio.sleep(0.3)
        running[0] -= 1
        return await fake(*args)
    orch.episode = episode
    summary = run_async(asyncio.wait_for(orch.run(max_groups=2), 10))
    assert summary["groups_pushed"] == 2 and calls[0] == 8
    assert peak[0] == 8


def test_dropped_groups_give_their_capacity_back():
    # Staleness 0 at version 0 admits one group. The first two groups are uniform (dropped):
    # the trainer never sees them and never moves, so the third group, the first one it can
    # train on, must still be opened (counting dropped groups deadlocked the job).
    stream = FakeStream()
    orch, stream, calls = orchestrator(
        OrchestratorConfig(group_size=2, max_staleness=0, groups_per_step=1),
        lambda n, i: 1.0 if n <= 4 else float(i), stream=stream)
    summary = run_async(asyncio.wait_for(orch.run(max_groups=3), 10))
    assert stream.version == 0
    assert summary["groups_dropped_uniform"] == 2 and summary["groups_pushed"] == 1
    assert len(stream.pushed) == 1 and calls[0] == 6


def test_sync_mode_waits_for_the_trainer_between_batches():
    stream = FakeStream()
    orch, stream, calls = orchestrator(
        OrchestratorConfig(group_size=2, mode="sync", groups_per_step=1),
        lambda n, i: float(i), stream=stream)

    async def go():
        task = asyncio.create_task(orch.run(max_groups=2))
        await asyncio.sleep(0.5)
        held = (len(stream.pushed), calls[0])
        stream.version = 1
        return held, await asyncio.wait_for(task, 10)
    held, summary = run_async(go())
    assert held == (1, 2) and summary["groups_pushed"] == 2


@pytest.mark.parametrize("kwargs,field", [(dict(group_size=0), "group_size"),
                                          (dict(mode="batch"), "mode"),
                                          (dict(task_filter="("), "task_filter"),
                                          (dict(curriculum="uniform"), "curriculum"),
                                          (dict(curriculum_floor=0), "curriculum_floor"),
                                          (dict(curriculum_floor=1.5), "curriculum_floor"),
                                          (dict(curriculum_floor=True), "curriculum_floor"),
                                          (dict(curriculum_window=0), "curriculum_window")])
def test_bad_config(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        OrchestratorConfig(**kwargs)


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_a_stop_before_the_run_starts_ends_that_run_and_only_that_one(mode):
    # An async Ray actor may start stop() before run() (the job stopping right after it
    # started the rollouts): run(None) must still end, not wait for a stop that came and went.
    orch, stream, calls = orchestrator(OrchestratorConfig(group_size=2, mode=mode),
                                       lambda n, i: float(i))
    orch.stop()
    summary = run_async(asyncio.wait_for(orch.run(None), 10))
    assert summary["episodes"] == 0 and calls[0] == 0 and stream.pushed == []
    summary = run_async(asyncio.wait_for(orch.run(max_groups=1), 10))
    assert summary["groups_pushed"] == 1 and calls[0] == 2


THREE = [t for t in load_suite(TASKS_DIR)
         if t.id in ("ram-create-user-0", "ram-delete-user-1", "ram-grant-policy-0")]
MIXED, NEVER, ALWAYS = "ram-create-user-0", "ram-delete-user-1", "ram-grant-policy-0"


def curriculum_orchestrator(**kwargs):
    config = OrchestratorConfig(group_size=4, max_staleness=100, **kwargs)
    return Orchestrator(config, THREE, [object()], [], "127.0.0.1:1",
                        AgentLoop(None, None, AgentConfig()), None, FakeStream())


def open_and_finish(orch, rewards_of):
    """Open one group and finish it at once with ``rewards_of[task id]`` (through
    ``_finish``, as a run does); returns the task id."""
    g = orch._open_group()
    for i, r in enumerate(rewards_of[g.task.id]):
        turn = Turn((1,), (2,), (-0.1,), (1,), 0, "x", "click(1)")
        traj = Trajectory(f"{g.group_id}-{i}", g.task.id, (turn,), "stop", answer="done")
        g.results[i] = EpisodeOutcome(g.task.id, g.task.expected, "e", traj, RewardResult(
            r, True, "success" if r >= 1 else "failure", "rule"))
        g.pending.remove(i)
    orch._finish(g)
    return g.task.id


# Half solved, never solved, always solved.
REWARDS = {MIXED: [0.0, 1.0, 1.0, 0.0], NEVER: [0.0] * 4, ALWAYS: [1.0] * 4}


def test_the_curriculum_opens_each_task_once_then_prefers_tasks_near_half_success():
    orch = curriculum_orchestrator()
    opened = [open_and_finish(orch, REWARDS) for _ in range(1500)]
    assert opened[:3] == [t.id for t in THREE]          # the first pass, in suite order
    counts = {t: opened[3:].count(t) for t in (MIXED, NEVER, ALWAYS)}
    # Weights: 1 at p = 0.5; the other two, their counts near the 32-episode window under
    # the Beta(1, 1) prior, p = 1/34 and 33/34, 4 p (1 - p) = 0.11: about 9 to 1 each.
    assert counts[MIXED] > 5 * counts[NEVER] and counts[MIXED] > 5 * counts[ALWAYS], counts
    assert orch.curriculum.estimate(MIXED) == pytest.approx(0.5, abs=0.01)
    assert orch.curriculum.estimate(NEVER) < 0.05 < 0.95 < orch.curriculum.estimate(ALWAYS)
    registry = orch.registry
    assert registry.get_sample_value("consolerl_curriculum_estimated_success_ratio",
                                     {"task": NEVER}) == orch.curriculum.estimate(NEVER)
    picks = {b: registry.get_sample_value("consolerl_curriculum_picks_total", {"estimate": b})
             for b in ("unscored", "low", "mid", "high")}
    assert picks == {"unscored": 3, "low": counts[NEVER], "mid": counts[MIXED],
                     "high": counts[ALWAYS]}


def test_the_floor_keeps_every_task_in_play():
    # A long window drives the hopeless tasks' 4 p (1 - p) to 0.012: only the floor keeps
    # them picked, at floor / (1 + 2 floor) of the picks.
    def shares(floor):
        orch = curriculum_orchestrator(curriculum_floor=floor, curriculum_window=1000)
        for _ in range(100):                     # the hopeless tasks' estimates near 0 and 1
            for task in (NEVER, ALWAYS):
                orch._note_outcome(task, REWARDS[task])
        for _ in range(3):
            orch._pick_task()                    # past the first pass
        opened = [orch._pick_task().id for _ in range(3000)]
        return {t: opened.count(t) for t in (NEVER, ALWAYS)}
    floored = shares(0.1)                        # expected 3000 x 0.1 / 1.2 = 250 each
    assert min(floored.values()) >= 180, floored
    unfloored = shares(0.001)                    # expected 3000 x 0.012 / 1.024 = 35
    assert max(unfloored.values()) < 80, unfloored


def test_the_curriculum_is_deterministic_for_a_seed():
    def picks(seed):
        orch = curriculum_orchestrator(seed=seed)
        return [open_and_finish(orch, REWARDS) for _ in range(200)]
    assert picks(7) == picks(7)
    assert picks(7) != picks(8)


def test_round_robin_visits_the_tasks_in_order_whatever_their_outcomes():
    orch = curriculum_orchestrator(curriculum="round_robin")
    opened = [open_and_finish(orch, REWARDS) for _ in range(9)]
    assert opened == [t.id for t in THREE] * 3


def test_evaluation_runs_every_task_per_task_times_in_order():
    # Evaluation runs len(selected) x per_task groups of one episode and expects each task
    # per_task times, whatever the training config's curriculum.
    from cluster.evaluate import run_orchestrator
    base = OrchestratorConfig()
    assert base.curriculum == "success"
    config = run_orchestrator(base, "train", "^ram-(create-user|delete-user|grant-policy)-",
                              run=0)
    orch = Orchestrator(config, load_suite(TASKS_DIR), [object()], [], "127.0.0.1:1",
                        AgentLoop(None, None, AgentConfig()), None, FakeStream())
    selected = [t.id for t in orch.tasks]
    assert len(selected) >= 5
    uniform = {t: [0.0] for t in selected}      # every group of one is uniform
    opened = [open_and_finish(orch, uniform) for _ in range(2 * len(selected))]
    assert opened == selected * 2


def test_the_orchestrator_keeps_a_summary_of_each_episode_not_its_trajectory():
    orch, stream, _ = orchestrator(OrchestratorConfig(group_size=2, max_staleness=5),
                                   lambda n, i: "env_error" if n == 1 else float(i))
    stream.version = 3
    summary = run_async(orch.run(max_groups=2))
    assert summary["episodes"] == len(orch.episodes) == 5 and summary["env_errors"] == 1
    first, second = orch.episodes[0], orch.episodes[1]
    assert first.env_error == "browser_crashed" and first.reward is None and first.steps == 0
    assert first.version == -1
    assert second.env_error is None and second.steps == 1 and second.version == 3
    assert second.end_reason == "stop" and second.verdict in ("success", "failure")
    assert not any(hasattr(e, "trajectory") for e in orch.episodes)


def test_an_episode_summary_carries_its_cost():
    turns = (Turn((1, 2, 3), (6, 7), (-0.1, -0.2), (1, 1), 2, "x", "click(1)"),
             Turn((1, 2, 3, 4, 5), (8,), (-0.3,), (1,), 3, "y", "click(2)"))
    traj = Trajectory("t", "ram-create-user-0", turns, "stop", answer="done")
    done = EpisodeSummary.of(EpisodeOutcome("ram-create-user-0", "success", "e", traj,
                                            RewardResult(1.0, True, "success", "rule"),
                                            episode_s=12.3456))
    assert (done.prompt_tokens, done.completion_tokens, done.env_s) == (8, 3, 12.346)
    assert done.steps == 2 and done.version == 2
    broken = EpisodeSummary.of(EpisodeOutcome("ram-create-user-0", "success", "e",
                                              env_error=EnvError("provision_failed", "x")))
    assert (broken.prompt_tokens, broken.completion_tokens, broken.env_s) == (0, 0, 0.0)


def test_blocking_calls_run_in_an_executor_sized_to_the_workers():
    # The runner's SDK, audit-log and scoring calls block a thread each for their whole
    # duration (a scorer may wait out ActionTrail's 2/s): one thread per env worker.
    import threading
    orch, _, _ = orchestrator(OrchestratorConfig(group_size=2), lambda n, i: 1.0, workers=40)
    assert orch.executor._max_workers == 44

    async def names_of_threads():
        return await asyncio.gather(*(orch.runner.blocking(
            lambda: threading.current_thread().name) for _ in range(3)))
    names = run_async(names_of_threads())
    assert all(name.startswith("rollout-io") for name in names)
    sized, _, _ = orchestrator(OrchestratorConfig(group_size=2, io_threads=7),
                               lambda n, i: 1.0, workers=40)
    assert sized.executor._max_workers == 7
    with pytest.raises(ConfigError, match="io_threads"):
        OrchestratorConfig(io_threads=-1)
