"""The evaluation's figures: which intervals :func:`cluster.evaluate.compare` reports and how
episodes are paired (the intervals themselves: ``test_stats.py``); pass@1 over runs, pass@3
over tasks, success by family and by product, the cost per episode and the summary table."""
from __future__ import annotations

import pytest

from cluster.evaluate import (compare, cost_per_episode, episode_pairs, family_of, pass_at,
                              pass_at_1, success_by_expected, success_by_group, summary_table)


def test_compare_reports_both_intervals_over_common_tasks():
    before = {"per_task": {"a": [0.0, 0.0, 1.0], "b": [0.0, 1.0, 1.0]}}
    after = {"per_task": {"a": [1.0, 1.0, 1.0], "b": [0.0, 1.0, 1.0], "c": [1.0]}}
    out = compare(before, after)
    assert out["tasks"] == ["a", "b"]
    assert out["success_diff"] == pytest.approx((2 / 3 + 0) / 2)
    lo, hi = out["success_diff_ci95"]
    assert lo <= out["success_diff"] <= hi
    tlo, thi = out["success_diff_ci95_resampling_tasks"]
    assert (tlo, thi) == (0.0, pytest.approx(2 / 3))


def test_episode_pairs_follow_task_and_run_and_skip_the_unpaired():
    before = {"a": [[0.0], [1.0]], "b": [[0.0], []], "only-before": [[1.0]]}
    after = {"a": [[1.0], [1.0]], "b": [[1.0], [1.0]]}
    assert episode_pairs(before, after) == [(0.0, 1.0), (1.0, 1.0), (0.0, 1.0)]


def test_compare_adds_the_paired_interval_when_runs_are_known():
    before = {"per_task": {"a": [0.0, 1.0]}, "per_task_runs": {"a": [[0.0], [1.0]]}}
    after = {"per_task": {"a": [1.0, 1.0]}, "per_task_runs": {"a": [[1.0], [1.0]]}}
    out = compare(before, after)
    assert out["pairs"] == 2 and out["paired_diff"] == pytest.approx(0.5)
    assert "paired_diff" not in compare({"per_task": before["per_task"]},
                                        {"per_task": after["per_task"]})


def test_success_is_reported_separately_for_tasks_expected_infeasible():
    per_task = {"a": [1.0, 0.0], "b": [1.0, 1.0], "a-wrongdoc": [0.0, 0.0, 1.0]}
    expected = {"a": "success", "b": "success", "a-wrongdoc": "infeasible"}
    out = success_by_expected(per_task, expected)
    assert out["success"]["tasks"] == 2 and out["success"]["episodes"] == 4
    assert out["success"]["success"] == pytest.approx(0.75)
    assert out["infeasible"] == {"tasks": 1, "episodes": 3,
                                 "success": pytest.approx(1 / 3),
                                 "success_ci95": out["infeasible"]["success_ci95"]}
    lo, hi = out["infeasible"]["success_ci95"]
    assert lo <= 1 / 3 <= hi
    # A group without tasks says so instead of a made-up 0.
    empty = success_by_expected({"a": [1.0]}, {"a": "success"})["infeasible"]
    assert empty == {"tasks": 0, "episodes": 0, "success": None, "success_ci95": [None, None]}


def test_compare_reports_the_difference_per_expected_outcome():
    expected = {"a": "success", "w": "infeasible"}
    before = {"per_task": {"a": [1.0, 1.0], "w": [0.0, 0.0]},
              "per_task_runs": {"a": [[1.0], [1.0]], "w": [[0.0], [0.0]]},
              "expected": expected}
    after = {"per_task": {"a": [1.0, 0.0], "w": [1.0, 1.0]},
             "per_task_runs": {"a": [[1.0], [0.0]], "w": [[1.0], [1.0]]},
             "expected": expected}
    out = compare(before, after)
    assert out["success_diff"] == pytest.approx((-0.5 + 1.0) / 2)
    groups = out["by_expected"]
    assert groups["success"]["tasks"] == ["a"] and groups["infeasible"]["tasks"] == ["w"]
    assert groups["success"]["success_diff"] == pytest.approx(-0.5)
    assert groups["infeasible"]["success_diff"] == pytest.approx(1.0)
    assert groups["infeasible"]["paired_diff"] == pytest.approx(1.0)
    assert groups["infeasible"]["pairs"] == 2
    # Results without the expected outcomes (older records) compare as before.
    assert "by_expected" not in compare({"per_task": before["per_task"]},
                                        {"per_task": after["per_task"]})


def test_pass_at_1_is_the_mean_and_std_of_the_runs_success():
    # Run 3 lost every episode to env errors: no rate, not a made-up 0.
    out = pass_at_1([[1.0, 0.0], [1.0, 1.0], []], {"a": [1.0, 1.0], "b": [0.0, 1.0]})
    assert out["per_run"] == [0.5, 1.0, None]
    assert out["mean"] == pytest.approx(0.75)
    assert out["std"] == pytest.approx(0.5 ** 0.5 / 2)          # sqrt(2 * 0.25**2 / 1)
    assert out["over_tasks"] == pytest.approx((1.0 + 0.5) / 2)
    one = pass_at_1([[1.0, 0.0, 0.0, 0.0]], {"a": [1.0, 0.0, 0.0, 0.0]})
    assert (one["mean"], one["std"]) == (0.25, None)


def test_pass_at_3_averages_the_estimator_over_tasks_with_three_episodes():
    per_task = {"a": [1.0, 0.0, 0.0, 0.0, 0.0],     # 1 - C(4,3)/C(5,3) = 0.6
                "b": [0.0, 0.0, 0.0],                # 0
                "c": [1.0, 1.0],                     # two episodes: left out
                "d": []}                             # all env errors: left out
    assert pass_at(per_task, 3) == {"value": pytest.approx(0.3), "tasks": 2, "tasks_short": 2}
    assert pass_at({"c": [1.0, 1.0]}, 3) == {"value": None, "tasks": 0, "tasks_short": 1}
    assert pass_at(per_task, 1)["value"] == pytest.approx((0.2 + 0 + 1.0) / 3)


def test_family_is_the_oracle_family_else_the_id_without_its_index():
    assert family_of("ram-create-user-3", "ram_create_user", "ram") == "ram_create_user"
    assert family_of("ram-create-user-3", "", "ram") == "ram-create-user"
    assert family_of("ecs-add-rule-ssh-wrongdoc", "", "ecs") == "ecs-wrongdoc"
    assert family_of("oss-list-buckets", "", "oss") == "oss-list-buckets"


def test_success_is_pooled_per_group_and_a_task_without_episodes_still_counts():
    per_task = {"u-0": [1.0, 0.0], "u-1": [1.0, 1.0, 1.0], "p-0": [0.0], "x-0": []}
    group = {"u-0": "user", "u-1": "user", "p-0": "policy", "x-0": "broken"}
    out = success_by_group(per_task, group)
    assert list(out) == ["broken", "policy", "user"]
    assert out["user"] == {"success": pytest.approx(4 / 5), "episodes": 5, "tasks": 2}
    assert out["policy"] == {"success": 0.0, "episodes": 1, "tasks": 1}
    assert out["broken"] == {"success": None, "episodes": 0, "tasks": 1}
    assert list(success_by_group({"z": [1.0]}, {})) == ["z"]     # ungrouped: its own


def test_cost_counts_only_episodes_that_carry_it():
    results = [{"task_id": "a", "prompt_tokens": 1000, "completion_tokens": 50, "env_s": 20.0},
               {"task_id": "a", "prompt_tokens": 3000, "completion_tokens": 150, "env_s": 40.0},
               {"task_id": "b"},                           # recorded before the cost was kept
               {"task_id": "c", "prompt_tokens": 0, "completion_tokens": 0, "env_s": None}]
    out = cost_per_episode(results)
    assert out["episodes"] == 4
    assert out["prompt_tokens"] == {"mean": pytest.approx(4000 / 3), "total": 4000,
                                    "episodes": 3}
    assert out["completion_tokens"]["mean"] == pytest.approx(200 / 3)
    assert out["env_s"] == {"mean": pytest.approx(30.0), "total": pytest.approx(60.0),
                            "episodes": 2}
    none = cost_per_episode([{"task_id": "b"}])["env_s"]
    assert none == {"mean": None, "total": None, "episodes": 0}


def test_summary_table_has_a_row_per_model_and_dashes_for_missing_figures():
    new = {"model": "runs/x/final", "success_per_run": [0.5, 1.0, 0.0],
           "pass_at_1": {"mean": 0.5, "std": 0.5, "per_run": [0.5, 1.0, 0.0]},
           "pass_at_3": {"value": 0.8125, "tasks": 4, "tasks_short": 0},
           "by_expected": {"success": {"success": 0.75, "episodes": 8},
                           "infeasible": {"success": None, "episodes": 0}},
           "cost": {"episodes": 12, "prompt_tokens": {"mean": 12345.6},
                    "completion_tokens": {"mean": 678.2}, "env_s": {"mean": 41.26}}}
    old = {"model": "base", "success_per_run": [0.25, 0.75]}      # an older saved result
    lines = summary_table({"baseline": old, "model": new, "difference": {}}).splitlines()
    assert len(lines) == 4 and lines[0].startswith("| | model | pass@1")
    assert lines[2] == "| baseline | `base` | 0.50 ± 0.35 (2 runs) | – | – | – | – | – |"
    assert lines[3] == ("| model | `runs/x/final` | 0.50 ± 0.50 (3 runs) | 0.81 | 0.75 (8) "
                        "| – (0) | 12,346 + 678 | 41.3 |")
    single = summary_table(new).splitlines()
    assert len(single) == 3 and single[2] == lines[3]
