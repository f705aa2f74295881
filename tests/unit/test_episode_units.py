"""The episode runner's pure parts: a scripted agent as a policy (its turns, how it ended, a
stuck script) and the outcome's status as the task suite and the SFT export read it."""
from __future__ import annotations

import pytest

from consolerl.experience import Trajectory
from consolerl.rewards import RewardResult, RuleOutcome
from consolerl.tasks import TASKS_DIR, load_suite
from consolerl.types import EnvError, Observation, StepResult
from env_workers.driver import DriverError
from rollout_service.episode import EpisodeOutcome, Halt, scripted_policy
from tests.conftest import run_async

TASK = next(t for t in load_suite(TASKS_DIR) if t.id == "ram-create-user-0")


def fake_step():
    taken = []

    async def step(text: str) -> StepResult:
        taken.append(text)
        n = len(taken)
        obs = Observation(f"http://c/{n}", "t", f"page {n}", step=n,
                          last_action_error="no such bid" if "99" in text else "")
        done = text.startswith(("stop", "report_infeasible"))
        return StepResult(obs, done=done,
                          answer=text[6:-2] if text.startswith("stop") else None,
                          infeasible=text[19:-2] if text.startswith("report_inf") else None,
                          action_text=text)
    return step, taken


def play(script):
    step, taken = fake_step()
    policy = scripted_policy(script)
    traj = run_async(policy(TASK, {}, Observation("http://c/0", "t", "page 0"), step,
                            trajectory_id="tr", seed=0))
    return traj, taken


def test_a_script_becomes_a_trajectory_of_text_turns():
    async def script(task, values, step, obs):
        await step("click(99)")
        await step('fill(3, "x")')
        return await step('stop("made it")')
    traj, taken = play(script)
    assert taken == ["click(99)", 'fill(3, "x")', 'stop("made it")']
    assert traj.trajectory_id == "tr" and traj.task_id == TASK.id
    assert traj.end_reason == "stop" and traj.answer == "made it" and traj.infeasible is None
    assert [t.action_text for t in traj.turns] == taken
    assert traj.turns[0].action_error == "no such bid" and traj.turns[1].action_error == ""
    assert all(t.prompt_ids == () and t.response_ids == () for t in traj.turns)
    assert traj.final_observation == "page 3" and traj.ended_at >= traj.started_at


def test_a_reported_infeasible_a_stuck_script_and_one_that_halts():
    async def report(task, values, step, obs):
        return await step('report_infeasible("no such page")')
    traj, _ = play(report)
    assert traj.end_reason == "report_infeasible" and traj.infeasible == "no such page"

    async def stuck(task, values, step, obs):
        await step("click(1)")
        raise DriverError("no button 'Create User' on http://c/1")
    traj, _ = play(stuck)
    assert traj.end_reason == "stuck" and traj.answer is None
    assert "Create User" in traj.end_detail and len(traj.turns) == 1
    assert traj.final_observation == "page 1"

    async def halted(task, values, step, obs):
        await step("click(1)")
        return Halt("rollback to action 1")
    traj, _ = play(halted)
    assert traj.end_reason == "stuck" and traj.end_detail == "rollback to action 1"
    assert traj.answer is None and len(traj.turns) == 1


def outcome(expected: str, *, answer=None, infeasible=None, rule="success", env_error=None):
    traj = Trajectory("t", "task", (), "stop", answer, infeasible)
    reward = RewardResult(1.0, True, rule, "rule", rule_verdict=RuleOutcome(rule))
    return EpisodeOutcome("task", expected, "e0", traj, reward, env_error)


@pytest.mark.parametrize("kwargs,status", [
    (dict(expected="success", answer="done"), "solved"),
    (dict(expected="success", answer="done", rule="failure"), "failed"),
    (dict(expected="success", answer="done", rule="undetermined"), "failed"),
    (dict(expected="success", answer=None), "failed"),
    (dict(expected="infeasible", infeasible="wrong doc", rule="undetermined"),
     "infeasible_reported"),
    (dict(expected="infeasible", infeasible="wrong doc", rule="failure"), "failed"),
    (dict(expected="infeasible", answer="done"), "failed"),
    (dict(expected="success", answer="done", env_error=EnvError("lease_lost", "x")),
     "env_error"),
])
def test_status(kwargs, status):
    assert outcome(**kwargs).status == status
