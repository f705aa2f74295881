"""SRC and step-level review end to end: real Chromium against a local cloud, every episode
through the episode runner, a student whose deviations are known (the oracle's action replaced
with probability 0.5 by a wrong click, value, going back or stopping). SRC rolls harmful
deviations back by re-provisioning and replaying, the page after a replay equals the page
before, the teacher's corrections and the verifier-passing trajectories are written as SFT
records that the SFT trainer reads; step-level review asks the teacher at every step."""
from __future__ import annotations

import json

import pytest

from consolerl.tasks import TASKS_DIR, load_suite
from env_workers.actions import ActionError, parse_action
from rollout_service.agent import AgentConfig
from rollout_service.models import HFChatTokenizer, end_of_turn_id, resolve_model
from datagen.src import (CollectConfig, PerturbedOracle, SRCConfig, run_collection)
from datagen.teacher import OracleTeacher
from tests.conftest import run_async
from trainer.sft import load_examples

FAMILIES = ("ram_delete_user", "oss_set_acl", "vpc_create_vpc", "ram_create_user",
            "ecs_instance_op")
AGENT = AgentConfig(max_steps=6, history_turns=2, max_prompt_tokens=1024,
                    max_observation_chars=1500, system_prompt="compact")


def _tasks() -> list[str]:
    chosen: dict[str, str] = {}
    for t in load_suite(TASKS_DIR):
        if t.split == "train" and t.oracle_family in FAMILIES:
            chosen.setdefault(t.oracle_family, t.id)
    return sorted(chosen.values())


@pytest.mark.timeout(900)
def test_src_rolls_back_and_corrects_a_deviating_student_and_step_review_labels_every_step(
        tmp_path):
    tasks = _tasks()
    assert len(tasks) == len(FAMILIES)
    pattern = "^(" + "|".join(tasks) + ")$"
    tokenizer = HFChatTokenizer(resolve_model("default"))
    student = PerturbedOracle(rate=0.5)
    results = {}
    for mode in ("src", "step"):
        config = CollectConfig(src=SRCConfig(mode=mode, segment_steps=2, max_rollbacks=3,
                                             max_steps=10),
                               split="train", tasks=pattern, attempts_per_task=2, workers=2,
                               out=str(tmp_path / f"{mode}.jsonl"))
        results[mode] = run_async(run_collection(config, OracleTeacher(), student, AGENT,
                                                 tokenizer))
    src, step = results["src"], results["step"]
    for r in (src, step):
        assert r["attempts"] == 2 * len(tasks) and r["env_errors"] == 0
        assert r["corrections"] >= 1 and r["deviated"] >= 1
    # SRC: deviations rolled back, replays faithful, most attempts end verifier-passing.
    assert src["rollbacks"] >= 1 and src["replays"] == src["rollbacks"]   # every one checked
    assert src["replay_fidelity"] >= 0.99
    assert src["episodes"] == src["attempts"] + src["rollbacks"]
    assert src["trajectories"] >= src["attempts"] * 0.7
    assert src["recovered"] >= 1
    # Step-level review asks at every step; SRC only at reviews and localisations.
    assert step["teacher_queries_per_trajectory"] > src["teacher_queries_per_trajectory"]
    # The records train as they are.
    for mode in ("src", "step"):
        path = tmp_path / f"{mode}.jsonl"
        lines = [json.loads(x) for x in path.read_text().splitlines()]
        assert {r["source"] for r in lines} >= {"correction"}
        for rec in lines:
            if rec["source"] == "correction":
                assert not isinstance(parse_action(rec["turns"][0]["completion"]), ActionError)
                assert rec["turns"][0]["student"] != rec["turns"][0]["completion"]
        examples, stats = load_examples(path, tokenizer, 4096,
                                        end_of_turn_id(tokenizer))
        assert examples and stats["records"] == len(lines)
    archived = [json.loads(x) for x in (tmp_path / "src.jsonl").read_text().splitlines()
                if json.loads(x)["source"] == "src-archive"]
    assert len(archived) == src["written"]["trajectories"] >= 1
    assert any(t["chosen_by"] == "teacher" for r in archived for t in r["turns"]) or \
        src["recovered"] == 0
