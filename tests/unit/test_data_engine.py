"""datagen.engine: walks read from the committed inventories, pages written from them read and
drafted by the documentation pipeline into valid tasks with a replay plan, the evaluation's
families and wording kept out, wrong documents that name a label no console has, and the
task folder written only where the engine owns it."""
from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
import yaml

from consolerl.errors import ConsoleRLError
from consolerl.tasks import load_suite, parse_task
from datagen.engine import (FOREIGN, STYLES, _sentences, evaluation_exclusions, singular,
                            synthesise, walks, write_page, write_tasks, wrong_doc)
from doccheck import DocsService, labels_by_drift


@pytest.fixture(scope="module")
def service() -> DocsService:
    return DocsService.default()


@pytest.mark.parametrize("title, noun", [("Security Groups", "security group"),
                                         ("VPCs", "VPC"), ("vSwitches", "vSwitch"),
                                         ("Users", "user"), ("Buckets", "bucket"),
                                         ("Instances", "instance")])
def test_singular(title: str, noun: str) -> None:
    assert singular(title) == noun


def test_walks_cover_forms_dialogs_details_and_tabs(service: DocsService) -> None:
    found = walks(service.inventories[""])
    by = {(w.action, w.control, w.detail, w.row, w.tab) for w in found}
    # a toolbar link to a form
    assert ("Ram:CreateUser", "Create User", False, False, "") in by
    # a row's button opening a confirmation
    dialog = [w for w in found if w.action == "Ram:DeleteUser" and w.row]
    assert dialog and dialog[0].confirm == "OK" and dialog[0].noun == "user"
    # the resource's own page first
    assert ("Ecs:ModifyInstanceAttribute", "Rename", True, False, "") in by
    # a control on the second of two tabs
    assert ("Ecs:AuthorizeSecurityGroupEgress", "Add Rule", True, False, "Outbound") in by
    assert ("Ecs:AuthorizeSecurityGroup", "Add Rule", True, False, "Inbound") in by
    # a search form causes no API action and is no walk
    assert all(w.action for w in found)


def test_a_drifted_console_keeps_the_resource_noun(service: DocsService) -> None:
    base = service.inventories[""]
    nouns = {p.pattern: singular(p.title) for p in base.pages if p.menu_path}
    renamed = walks(service.inventories["rename"], nouns)
    deletes = [w for w in renamed if w.action == "Ecs:DeleteInstance" and w.row]
    assert deletes and deletes[0].noun == "instance"
    assert deletes[0].menu == ("ECS", "Instance List")


def test_a_page_reads_as_one_procedure_that_checks_and_drafts(service: DocsService) -> None:
    walk = next(w for w in walks(service.inventories[""])
                if w.action == "Ecs:AuthorizeSecurityGroupEgress")
    drafted = set()
    for style in STYLES:
        page = write_page(walk, style, random.Random(3), "ECS")
        assert page is not None and page.style == style.name
        from doccheck import PageIn
        [result] = service.read([PageIn("p.md", page.text)], "")[0].procedures
        assert all(str(c.label) in ("ok", "label_differs") for c in result.checks), \
            (style.name, page.text, [str(c.label) for c in result.checks])
        assert result.task is not None and result.task["oracle"]["family"] == "replay"
        drafted.add(result.task["success"]["required_events"][0]["event"])
    # The reader misses "Switch to the X tab" (guide): that page drafts as the first tab's
    # operation, which synthesise drops ("drafted as another operation").
    assert "AuthorizeSecurityGroupEgress" in drafted


def test_synthesise_makes_valid_tasks_outside_the_evaluation(service: DocsService) -> None:
    banned = {"Ram:CreateUser", "Ecs:DeleteInstance"}
    syn = synthesise(service, 12, seed=5, exclude_actions=banned)
    assert len(syn.tasks) == 12 and syn.dropped["evaluation family"] > 0
    assert syn.dropped["drafted as another operation"] >= 0
    for task in syn.tasks:
        event = task["success"]["required_events"][0]
        assert f"{event['service']}:{event['event']}" == task["engine"]["action"]
        parsed = parse_task({k: v for k, v in task.items() if k != "engine"}, task["id"])
        assert parsed.split == "train" and parsed.oracle_family == "replay"
        assert task["engine"]["action"] not in banned
    # several products, drifts and styles, not one walk many times
    assert len({t["product"] for t in syn.tasks}) >= 3
    assert len({t["engine"]["drift"] for t in syn.tasks}) >= 3
    assert len({t["engine"]["style"] for t in syn.tasks}) >= 3
    # a function of the seed
    again = synthesise(service, 12, seed=5, exclude_actions=banned)
    assert [t["procedure"] for t in again.tasks] == [t["procedure"] for t in syn.tasks]


def test_evaluation_wording_is_kept_out(service: DocsService) -> None:
    actions, sentences, _ = evaluation_exclusions(tasks=r"^ram-create-user-[0-9]+$")
    assert actions == {"Ram:CreateUser"}
    held = [t for t in load_suite(Path(__file__).parents[2] / "tasks")
            if re.match(r"^ram-create-user-[0-9]+$", t.id) and t.split == "heldout"]
    assert held and _sentences(held[0].procedure) <= sentences
    syn = synthesise(service, 10, seed=2, exclude_texts=sentences)
    for page in syn.pages:
        assert not _sentences(page.text) & sentences


def test_wrong_doc_names_a_label_no_console_has(service: DocsService) -> None:
    syn = synthesise(service, 10, seed=9)
    known = set().union(*labels_by_drift().values())
    rng = random.Random(1)
    made = [w for w in (wrong_doc(t, rng, (), known) for t in syn.tasks) if w is not None]
    assert len(made) >= 5
    for w in made:
        task = parse_task({k: v for k, v in w.items() if k != "engine"}, w["id"])
        assert task.expected == "infeasible" and task.split == "train"
        new = w["engine"]["to"]
        assert new in FOREIGN[w["engine"]["wrong"]] and new not in known
        assert new in task.procedure and new in task.infeasible_reason
        assert task.oracle_family in ("wrongdoc_missing", "wrongdoc_option")
        assert not task.success.required_events


def test_wrong_doc_avoids_labels_the_evaluation_uses(service: DocsService) -> None:
    syn = synthesise(service, 4, seed=9)
    taken = [x for values in FOREIGN.values() for x in values]
    assert all(wrong_doc(t, random.Random(0), taken) is None for t in syn.tasks)


def test_write_tasks_owns_its_folder(tmp_path: Path, service: DocsService) -> None:
    syn = synthesise(service, 3, seed=1)
    root = tmp_path / "tasks"
    write_tasks(syn.tasks, root)
    assert len(load_suite(root)) == 3
    prov = [json.loads(line) for line in (root / "provenance.jsonl").read_text().splitlines()]
    assert [p["id"] for p in prov] == [t["id"] for t in syn.tasks]
    assert "engine" not in yaml.safe_load(next(root.rglob("*.yaml")).read_text())
    write_tasks(syn.tasks[:1], root)              # its own output is replaced
    assert len(load_suite(root)) == 1
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep")
    with pytest.raises(ConsoleRLError, match="not written by the engine"):
        write_tasks(syn.tasks, other)
    assert (other / "notes.txt").read_text() == "keep"


def test_the_sft_stage_adds_the_engines_confirmed_trajectories(tmp_path: Path,
                                                                monkeypatch) -> None:
    """With sft.engine_tasks the SFT data is the oracle's records then the engine's (the
    export itself, on a real console, is tests/integration/test_data_engine_export.py)."""
    from dataclasses import replace as replaced

    import cluster.job as job
    from cluster.config import EvalSection, JobConfig, SftSection

    data = tmp_path / "sft-data.jsonl"
    data.write_text('{"task_id": "ram-create-user-3"}\n')
    plain = replaced(JobConfig(), sft=SftSection(enabled=True))
    assert job.engine_sft_data(plain, tmp_path, str(data), "default") == str(data)
    calls = []

    def export(config, out, split, tasks, episodes, model, suite=""):
        calls.append((split, tasks, suite))
        ids = sorted(p.stem for p in Path(suite).rglob("*.yaml"))
        Path(out).write_text("".join(json.dumps({"task_id": i}) + "\n" for i in ids[:2]))
        return {"written": 2, "turns": 7, "wall_s": 1.0}

    monkeypatch.setattr(job, "export_oracle", export)
    config = replaced(JobConfig(), sft=SftSection(enabled=True, engine_tasks=4, engine_wrong=1),
                      eval=EvalSection(tasks=r"^ram-create-user-[0-9]+$"))
    said: list[str] = []
    combined = job.engine_sft_data(config, tmp_path, str(data), "default", said.append)
    assert combined == str(tmp_path / "sft-data-engine.jsonl")
    lines = [json.loads(line) for line in Path(combined).read_text().splitlines()]
    assert lines[0] == {"task_id": "ram-create-user-3"} and len(lines) == 3
    assert all(line["task_id"].startswith("eng-") for line in lines[1:])
    assert calls == [("all", "", str(tmp_path / "engine" / "tasks"))]
    summary = json.loads((tmp_path / "engine" / "summary.json").read_text())
    assert summary["tasks"] == 4 and summary["wrong_docs"] == 1
    assert "Ram:CreateUser" in summary["excluded_actions"]
    assert "4 tasks and 1 wrong documents" in said[0]
