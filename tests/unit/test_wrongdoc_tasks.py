"""The wrong-documentation tasks (``expected: infeasible``): they cover the products, splits
and kinds of wrongness; each reason names what the procedure documents and the console lacks
(the evidence channel's contract); and their oracles walk to the page and check it before they
report (a fake console here; the real one: ``benchmarks.suite --tasks wrongdoc``)."""
from __future__ import annotations

from tests.conftest import run_async
import json
import re
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from consolerl.tasks import TASKS_DIR, load_suite
from consolerl.types import Observation, StepResult
from env_workers.driver import DriverError
from datagen.oracle import FAMILIES, run_oracle

INVENTORY = Path(__file__).resolve().parents[2] / "docs" / "inventory"
WRONGDOC = [t for t in load_suite(TASKS_DIR) if t.expected == "infeasible"]
KINDS = {"wrongdoc_missing", "wrongdoc_field", "wrongdoc_option", "wrongdoc_refused"}


def test_the_wrong_documentation_tasks_cover_products_splits_and_kinds():
    assert len(WRONGDOC) >= 18
    assert all(t.id.endswith("-wrongdoc") for t in WRONGDOC)
    assert {t.product for t in WRONGDOC} == {"ecs", "vpc", "ram", "oss"}
    splits = Counter(t.split for t in WRONGDOC)
    assert splits["heldout"] >= 4 and splits["train"] >= 4
    assert set(Counter(t.oracle_family for t in WRONGDOC)) == KINDS
    assert KINDS <= set(FAMILIES)
    # Only drifts with a console inventory (the evidence channel looks names up there).
    assert {t.drift for t in WRONGDOC} <= {"", "rename"}
    for t in WRONGDOC:
        assert t.success.forbidden_events, f"{t.id}: nothing protects its prerequisites"
        assert not t.success.required_events, t.id


def _labels(drift: str) -> str:
    path = INVENTORY / ("local.json" if not drift else f"local-{drift}.json")
    return json.dumps(json.loads(path.read_text())["pages"]).lower()


@pytest.mark.parametrize("task", WRONGDOC, ids=lambda t: t.id)
def test_a_reason_names_what_the_procedure_documents_and_the_console_lacks(task):
    """The reason names the missing control, field or option exactly as the procedure writes
    it, and the console's inventory (every page, control, field and option of its crawl) has
    no such name; a refused step's reason quotes the error code the oracle waits for."""
    args = dict(task.oracle_args)
    reason, procedure = task.infeasible_reason.lower(), task.procedure.lower()
    if task.oracle_family == "wrongdoc_refused":
        assert re.fullmatch(r"[A-Z][A-Za-z]+(\.[A-Za-z]+)*", args["code"])
        assert args["code"].lower() in reason
        return
    names = [args["option"]] if task.oracle_family == "wrongdoc_option" else \
        args["absent"].split("|")
    labels = _labels(task.drift)
    for name in names:
        assert name.lower() in procedure, f"{task.id}: {name!r} is not in the procedure"
        assert name.lower() in reason, f"{task.id}: the reason does not name {name!r}"
        assert name.lower() not in labels, f"{task.id}: the console has {name!r}"


@pytest.mark.parametrize("task", WRONGDOC, ids=lambda t: t.id)
def test_a_wrong_doc_oracle_fits_the_learning_checks_step_limit(task):
    steps = [s for s in dict(task.oracle_args).get("steps", "").split(";") if s.strip()]
    assert len(steps) + 1 <= 5         # one action a step (no wizard drift), then the report


def _page(text: str, error: str = "") -> Observation:
    return Observation("http://console/console/x", "x", text, last_action_error=error)


def _run(task_id: str, pages: list[Observation], values: dict[str, str]) -> list[str]:
    """The oracle against a console that answers the n-th action with ``pages[n]``."""
    task = next(t for t in WRONGDOC if t.id == task_id)
    sent: list[str] = []

    async def step(action: str) -> StepResult:
        sent.append(action)
        done = action.startswith("report_infeasible")
        return StepResult(pages[min(len(sent), len(pages) - 1)], done=done,
                          infeasible=action if done else None, action_text=action)
    run_async(run_oracle(task, values, step, pages[0]))
    return sent


USERS = """table "Users":
  - Logon Name | User ID | Actions
  - [13]dev-1 dev-1 | 67 | [14]Manage [15]Add Permissions [16]Delete"""
DEV = {"dev": "dev-1"}


def test_the_missing_oracle_opens_the_page_then_reports_the_reason():
    user_page = _page('# dev-1\n[20] link "Add Permissions"\n[21] button "Delete"')
    sent = _run("ram-create-accesskey-wrongdoc", [_page(USERS), user_page], DEV)
    assert sent[0] == "click(13)"                    # the user's page, as the doc says
    assert sent[1].startswith("report_infeasible(") and "Create AccessKey" in sent[1]
    assert len(sent) == 2


def test_the_missing_oracle_does_not_report_what_the_page_has():
    user_page = _page('# dev-1\n[20] tab "Authentication"\n[21] button "Create AccessKey"')
    with pytest.raises(DriverError, match="Authentication"):
        _run("ram-create-accesskey-wrongdoc", [_page(USERS), user_page], DEV)


def test_the_option_oracle_reads_the_forms_choices():
    form = '[30] radio "ReadOnlyAccess"\n[31] radio "AdministratorAccess"\n[32] button "Confirm"'
    renamed = USERS.replace("Add Permissions", "Grant Permission")     # the rename drift
    sent = _run("ram-grant-slb-policy-wrongdoc", [_page(renamed), _page(form)], DEV)
    assert sent[0] == "click(15)" and "AliyunSLBFullAccess" in sent[-1]
    offered = form + '\n[33] radio "AliyunSLBFullAccess"'
    with pytest.raises(DriverError, match="is offered"):
        _run("ram-grant-slb-policy-wrongdoc", [_page(renamed), _page(offered)], DEV)


def test_the_refused_oracle_submits_and_reports_only_the_error_the_console_shows():
    dialog = _page(USERS + '\ndialog:\n [40] button "Cancel"\n [41] button "OK"')
    refused = _page(USERS + "\nalert:\n The user has attached policies; detach them before "
                    "deleting the user. (DeleteConflict.User.Policy)")
    sent = _run("ram-delete-user-with-policy-wrongdoc", [_page(USERS), dialog, refused], DEV)
    assert sent[:2] == ["click(16)", "click(41)"]
    assert sent[2].startswith("report_infeasible(") and "DeleteConflict.User.Policy" in sent[2]
    with pytest.raises(DriverError, match="did not answer"):
        _run("ram-delete-user-with-policy-wrongdoc", [_page(USERS), dialog, _page(USERS)], DEV)


def test_an_infeasible_task_without_an_oracle_family_reports_from_the_start_page():
    task = next(t for t in WRONGDOC if t.id == "ram-user-groups-wrongdoc")
    bare = replace(task, oracle_family="", oracle_args=())
    sent: list[str] = []

    async def step(action: str) -> StepResult:
        sent.append(action)
        return StepResult(_page(USERS), done=True, infeasible=action, action_text=action)
    run_async(run_oracle(bare, {}, step, _page(USERS)))
    assert len(sent) == 1 and sent[0].startswith("report_infeasible(")
