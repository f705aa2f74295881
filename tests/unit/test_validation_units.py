"""The validation set's construction, its metrics and the scripted judges (no browser)."""
from __future__ import annotations

from collections import Counter

import pytest

from consolerl.tasks import TASKS_DIR, load_suite
from reward_service.judges import JudgeChannel, JudgeConfig, render_trajectory
from benchmarks.reward_validate import (BEHAVIOURS, Scored, ScriptedJudge, build_cases, report,
                                     scripted_channel)

TASKS = load_suite(TASKS_DIR)
BY_ID = {t.id: t for t in TASKS}


def test_the_set_is_large_labelled_and_covers_every_behaviour():
    cases = build_cases(TASKS)
    assert len(cases) >= 200
    kinds = Counter(c.behaviour for c in cases)
    assert set(kinds) == set(BEHAVIOURS)
    assert all(n >= 5 for n in kinds.values()), kinds
    labels = Counter(c.label for c in cases)
    assert labels["success"] >= 50 and labels["failure"] >= 50
    for c in cases:
        assert BEHAVIOURS[c.behaviour].applies(c.task)
        if c.task.expected == "infeasible":
            assert c.label == ("success" if c.behaviour in ("infeasible_right",
                                                            "infeasible_lazy") else "failure")
    sample = build_cases(TASKS, sample=True)
    assert sorted(c.behaviour for c in sample) == sorted(BEHAVIOURS)


def scored(task_id: str, label: str, rule: str, judges: str, fused: str) -> Scored:
    return Scored(task_id, "x", label, False, rule, judges, fused, "rule", 0.0)


def test_report_arithmetic():
    feasible, wrongdoc = "ram-create-user-0", "ram-create-accesskey-wrongdoc"
    rows = [
        scored(feasible, "success", "success", "success", "success"),        # all right
        scored(feasible, "failure", "failure", "success", "failure"),        # judge wrong
        scored(feasible, "failure", "undetermined", "undetermined", "undetermined"),
        scored(wrongdoc, "success", "success", "success", "success"),        # rule success on
        scored(wrongdoc, "failure", "undetermined", "failure", "failure"),   # infeasible: not
        Scored(feasible, "x", "success", True, "undetermined", "undetermined",  # decisive
               "undetermined", "env_error", 0.0),
    ]
    r = report(rows, BY_ID)
    assert r["n"] == 5 and r["env_errors"] == 1
    assert r["rule_accuracy_decisive"] == 1.0 and r["rule_coverage"] == 0.4
    assert r["judge_accuracy"] == 0.75 and r["judge_coverage"] == 0.8
    assert r["fused_accuracy"] == 0.8                 # the undetermined one counts as wrong
    assert r["rule"]["precision"] == 1.0 and r["rule"]["recall"] == 0.5
    assert r["judge"]["precision"] == pytest.approx(2 / 3, abs=1e-4)
    assert r["judge"]["recall"] == 1.0
    assert r["rule_errors"] == []


def ask(angle: str, *, actions: list[str], ending: str, page: str, title: str = "Create a user",
        expected: str = "success", reference: str = "") -> str:
    channel = JudgeChannel([ScriptedJudge(angle)], JudgeConfig(k=1))
    text = render_trajectory(title, "1. Open Users.\n2. Click Create User.\n3. Click OK.\n",
                             actions, page, ending if ending.startswith("done") else None,
                             ending[len("infeasible:"):] if ending.startswith("infeasible:")
                             else None)
    messages = channel.messages(0, text, expected, reference)
    return ScriptedJudge(angle).complete(messages)


@pytest.mark.parametrize("angle,kwargs,verdict", [
    ("outcome", dict(actions=["click(3)", "click(9)"], ending="done",
                     page='status "User bob created."'), "success"),
    ("outcome", dict(actions=["click(3)"], ending="done", page="heading Users"), "failure"),
    ("coverage", dict(actions=["click(3)"], ending="done", page=""), "success"),
    ("coverage", dict(actions=[], ending="done", page=""), "failure"),
    ("skeptic", dict(actions=["click(3)", 'click(12) # Delete'], ending="done",
                     page='status "User bob deleted."'), "failure"),     # undone afterwards
    ("skeptic", dict(actions=["click(3)", "click(9)"], ending="done",
                     page='status "User bob created."'), "success"),
    ("outcome", dict(actions=[], ending="infeasible:no such button", page="",
                     expected="infeasible", reference="the console has no such button"),
     "success"),
    ("coverage", dict(actions=[], ending="infeasible:the page was slow", page="",
                      expected="infeasible", reference="the console has no such button"),
     "failure"),
    ("coverage", dict(actions=[], ending="infeasible:there is no such button in the console",
                      page="", expected="infeasible",
                      reference="the console has no such button"), "success"),
    ("outcome", dict(actions=[], ending="done", page="", expected="infeasible",
                     reference="the console has no such button"), "failure"),
])
def test_scripted_judges_read_the_rendering(angle, kwargs, verdict):
    reply = ask(angle, **kwargs)
    assert f'"verdict": "{verdict}"' in reply, reply


def test_the_scripted_channel_is_three_unanimous_judges():
    channel = scripted_channel()
    assert channel.config.k == 3 and channel.config.consensus == "unanimous"
    assert {j.angle for j in channel.clients} == {"outcome", "coverage", "skeptic"}
