"""The replay (doccheck.replay): a procedure's steps, as the static check resolved them, turned
into the oracle driver's plan in the console's labels with the drafted task's values; and the
driver's side (datagen.oracle): the plan parsed, filled and carried out, a failure naming its
step. The replay in a real browser against the local cloud: tests/integration/
test_docs_replay.py."""
from __future__ import annotations

import dataclasses
import json

import pytest

from consolerl.tasks import parse_task
from consolerl.types import Observation, StepResult
from datagen.oracle import REPLAY_VERBS, plan_of, replay_ops, run_oracle
from datagen.plan import Op
from doccheck.check import Checker
from doccheck.draft import draft_task
from doccheck.replay import attach_replay, replay_plan
from env_workers.driver import DriverError
from tests import docs_fixture as fx
from tests.conftest import run_async


def plan(proc, inventory=None) -> tuple[list[tuple[str, ...]], dict]:
    inv = inventory or fx.inventory()
    walked = Checker(inv).walk(proc)
    d = draft_task(proc, [c for c, _ in walked], inv, task_id="replay-test")
    assert d.task is not None, d.reason
    return replay_plan(proc, walked, d.task, inv), d.task


def user_task(replay: bool = True) -> dict:
    """The drafted task of creating a RAM user, with its replay plan attached."""
    proc, inv = fx.ram_create_user(), fx.inventory()
    task = draft_task(proc, Checker(inv).check(proc), inv, task_id="replay-test").task
    if replay:
        assert attach_replay(task, proc, inv) == ""
    return task


def test_a_form_procedure_in_the_consoles_labels_with_the_tasks_values():
    ops, task = plan(fx.ram_create_user("deploy-bot"))
    # Already on the Users page (the task's start): no navigation; the doc's name is the
    # task's per-episode placeholder, the display name the doc's value.
    assert ops == [("3", "press", "Create User"), ("4", "field", "Logon Name", "{user_name}"),
                   ("4", "field", "Display Name", "Deploy Bot"), ("5", "submit", "Create")]
    assert task["parameters"] == {"user_name": "deploy-bot-{episode}"}


def test_a_name_the_doc_leaves_to_the_reader_is_the_generated_one():
    ops, task = plan(fx.vpc_create("10.0.0.0/8"))
    assert ("4", "field", "VPC Name", "{vpc_name}") in ops and "vpc_name" in task["parameters"]
    assert ops[-1] == ("6", "submit", "Create")


def test_row_actions_are_keyed_by_the_prerequisite_the_row_shows():
    ops, task = plan(fx.ecs_stop_instance())
    assert ops == [("2", "row", "{vm}", "Stop"), ("3", "confirm", "{vm}", "OK")]
    assert "vm" in {p["id"] for p in task["prerequisites"]}
    ops, _ = plan(fx.oss_set_acl())
    assert ops == [("3", "row", "{b}", "Change ACL"), ("4", "choose", "Public Read"),
                   ("5", "submit", "Save")]


def test_a_confirmation_the_doc_leaves_out_is_still_confirmed():
    proc = fx.ecs_stop_instance()
    ops, _ = plan(dataclasses.replace(proc, steps=proc.steps[:2]))
    assert ops == [("2", "row", "{vm}", "Stop"), ("2", "confirm", "{vm}", "")]


def test_navigation_tabs_and_select_options():
    ops, _ = plan(fx.ecs_add_rule())
    assert ops == [("2", "press", "Security Groups"), ("3", "row", "{sg}", "Manage Rules"),
                   ("4", "tab", "Inbound"), ("4", "press", "Add Rule"), ("5", "choose", "Allow"),
                   ("5", "select", "Protocol", "Custom TCP"), ("5", "field", "Port Range", "22/22"),
                   ("5", "field", "Authorization Object", "10.0.0.0/8"), ("6", "submit", "Save")]
    assert all(op[1] in REPLAY_VERBS for op in ops)


def test_attach_puts_a_json_plan_the_task_parser_and_the_oracle_accept():
    task = user_task()
    assert task["oracle"]["family"] == "replay"
    parsed = parse_task(task, "drafted")
    ops = plan_of(parsed, {"user_name": 'a"b|c;d'})     # filled after parsing: any value
    assert ops[1] == Op("field", ("Logon Name", 'a"b|c;d'))


def test_attach_refuses_a_plan_naming_what_the_task_does_not_define():
    task = user_task(replay=False)
    task.pop("parameters")
    why = attach_replay(task, fx.ram_create_user(), fx.inventory())
    assert "user_name" in why and "oracle" not in task


@pytest.mark.parametrize("text,match", [
    ("not json", "not JSON"), ('{"a": 1}', "must be a list"), ('[["1"]]', "op 0"),
    ('[["1", "press", 3]]', "op 0"), ('[["1", "absent", "X"]]', "unknown verb 'absent'")])
def test_a_malformed_plan_is_refused_naming_what_is_wrong(text, match):
    with pytest.raises(DriverError, match=match):
        replay_ops(text)


PAGE = "[1] button \"Create User\"\n"


def test_the_replay_names_the_step_it_could_not_do():
    task = user_task()
    parsed = parse_task(task, "drafted")
    sent: list[str] = []
    start = Observation("http://c/console/ram/users", "Users", PAGE)

    async def step(text: str) -> StepResult:
        sent.append(text)          # the form never opens: the page stays the same
        return StepResult(observation=start)

    with pytest.raises(DriverError, match=r"^step 4: no field 'Logon Name'"):
        run_async(run_oracle(parsed, {"user_name": "u-1"}, step, start))
    assert sent == ["click(1)"]
    assert json.loads(task["oracle"]["args"]["plan"])[0] == ["3", "press", "Create User"]


def test_the_open_tabs_control_of_several_of_one_name_is_the_one_done():
    """The security group's page has an Add Rule per tab: after "On the Outbound tab" the
    check follows the outbound one (the draft requires the egress event) and the replay
    clicks the last Add Rule, the open tab's."""
    from pathlib import Path

    from doccheck import DocsService, PageIn
    path = Path(__file__).resolve().parents[2] / "docs/corpus/ecs/add-security-group-rules.md"
    (page,) = DocsService.default().read([PageIn(path.name, path.read_text())])
    out = next(p for p in page.procedures if p.procedure.title == "Add an outbound rule")
    assert out.task["success"]["required_events"][0]["event"] == \
        "AuthorizeSecurityGroupEgress"
    ops = json.loads(out.task["oracle"]["args"]["plan"])
    assert ["4", "tab", "Outbound"] in ops and ["5", "last_link", "Add Rule"] in ops
    inbound = next(p for p in page.procedures if p.procedure.title == "Add an inbound rule")
    assert inbound.task["success"]["required_events"][0]["event"] == "AuthorizeSecurityGroup"
    assert ["4", "press", "Add Rule"] in json.loads(inbound.task["oracle"]["args"]["plan"])


def test_a_rules_delete_is_the_rules_not_the_security_groups():
    """The security group's page has a Delete of its own and one per rule: "Delete an inbound
    rule" is drafted as the rule's revoke (what the title says), and the replay finds the
    provisioned rule's row by the port range the doc names."""
    from pathlib import Path

    from doccheck import DocsService, PageIn
    path = Path(__file__).resolve().parents[2] / "docs/corpus/ecs/delete-security-group-rule.html"
    (page,) = DocsService.default().read([PageIn(path.name, path.read_text(), "text/html")])
    (proc,) = [p for p in page.procedures if p.task is not None]
    assert proc.task["success"]["required_events"][0]["event"] == "RevokeSecurityGroup"
    (rule,) = [p for p in proc.task["prerequisites"] if p["type"] == "security_group_rule"]
    assert rule["properties"]["port_range"] == "22/22"
    ops = json.loads(proc.task["oracle"]["args"]["plan"])
    assert ["4", "row", "22/22", "Delete"] in ops


def test_a_row_of_another_resource_on_a_resources_page_is_keyed_by_that_resource():
    """A vSwitch's Delete on its VPC's details page: the row is the vSwitch's, not the VPC's."""
    from pathlib import Path

    from doccheck import DocsService, PageIn
    path = Path(__file__).resolve().parents[2] / "docs/corpus/vpc/delete-vswitch.html"
    (page,) = DocsService.default().read([PageIn(path.name, path.read_text(), "text/html")])
    (proc,) = [p for p in page.procedures if p.title.endswith("on the VPC details page")]
    ops = json.loads(proc.task["oracle"]["args"]["plan"])
    assert ops == [["3", "link", "{net}"], ["4", "row", "{sw}", "Delete"],
                   ["5", "confirm", "{sw}", "OK"]]


def test_a_choice_the_doc_leaves_to_the_reader_is_made():
    """"On the Instance Type page, select an instance type": the replay picks one the wizard
    offers, not none (the console would ask for it)."""
    from pathlib import Path

    from doccheck import DocsService, PageIn
    path = Path(__file__).resolve().parents[2] / "docs/corpus-blind-4/ecs/create-instance.md"
    (page,) = DocsService.default().read([PageIn(path.name, path.read_text(), "text/markdown")])
    (proc,) = [p for p in page.procedures if p.title == "Create an instance"]
    ops = json.loads(proc.task["oracle"]["args"]["plan"])
    assert ["6", "choose", "ecs.t6-c1m1.large"] in ops


def test_a_wizard_is_filled_in_the_order_of_its_steps_and_never_sent_on_early():
    """The instance wizard: the doc's "click Next" adds nothing (each value op goes through
    Next to the step that shows it), and values named late (the instance type and image in
    the doc's last step) move to their wizard step, before the network's."""
    from pathlib import Path

    from doccheck import DocsService, PageIn
    path = Path(__file__).resolve().parents[2] / "docs/corpus/ecs/create-instance.md"
    (page,) = DocsService.default().read([PageIn(path.name, path.read_text())])
    (proc,) = [p for p in page.procedures if p.task is not None]
    ops = [tuple(op[1:]) for op in json.loads(proc.task["oracle"]["args"]["plan"])]
    assert ("press", "Next") not in ops
    verbs = [op[0] for op in ops]
    assert verbs.index("choose") < verbs.index("pick") and ops[-1][0] == "submit"


def test_a_refusal_of_the_documented_values_is_reported_quoting_the_console():
    task = user_task()
    parsed = parse_task(task, "drafted")
    form = ('[1] textbox "Logon Name"\n[2] textbox "Display Name"\n[3] button "Create"\n')
    refused = ('alert:\n Operation failed.\n The name is not valid. (InvalidUserName)\n'
               '# Create User\n' + form)
    pages = {"click(1)": form, "click(3)": refused}
    sent: list[str] = []
    start = Observation("http://c/console/ram/users", "Users", PAGE)
    now = [start]

    async def step(text: str) -> StepResult:
        sent.append(text)
        if text in pages:
            now[0] = Observation("http://c/console/ram/users/create", "Create", pages[text])
        return StepResult(observation=now[0])

    run_async(run_oracle(parsed, {"user_name": "Bad Name"}, step, start))
    assert sent[:2] == ["click(1)", 'fill(1, "Bad Name")']
    assert sent[-1].startswith('report_infeasible("the console refused the documented values: '
                               'Operation failed. The name is not valid. (InvalidUserName)')


def test_steps_of_a_conditional_part_are_marked_and_skipped_when_they_cannot_be_done():
    proc = fx.ram_create_user()
    steps = list(proc.steps)
    steps.insert(3, dataclasses.replace(steps[2], number="3.1",
                                        text="If the Users page shows a notice, close it:"))
    ops, _ = plan(dataclasses.replace(proc, steps=tuple(steps)))
    assert {op[0] for op in ops if op[0].startswith("3.1")} <= {"3.1?"}
    # a parent whose last sentence is the condition ("Find it. If it runs, stop it first:")
    steps[2] = dataclasses.replace(steps[2], text="Find the user. If it has a notice, close it:")
    steps[3] = dataclasses.replace(steps[3], number="3.2", text="Click Create User.")
    ops, _ = plan(dataclasses.replace(proc, steps=tuple(steps)))
    assert {op[0] for op in ops if op[0].startswith("3.2")} == {"3.2?"}
    # the steps of a loop ("Repeat until none is left") may run no time at all
    steps[2] = dataclasses.replace(steps[2], text="Open the user and remove its policies:")
    steps.insert(4, dataclasses.replace(steps[3], number="3.3", text="Repeat until none is left.",
                                        mentions=()))
    ops, _ = plan(dataclasses.replace(proc, steps=tuple(steps)))
    assert {op[0] for op in ops if op[0].startswith("3.2")} == {"3.2?"}
    task = user_task()
    task["oracle"]["args"]["plan"] = json.dumps([["3.1?", "press", "Close"],
                                                 ["3", "press", "Create User"]])
    sent: list[str] = []
    start = Observation("http://c/console/ram/users", "Users", PAGE)

    async def step(text: str) -> StepResult:
        sent.append(text)
        return StepResult(observation=start)
    run_async(run_oracle(parse_task(task, "drafted"), {"user_name": "u-1"}, step, start))
    assert sent[0] == "click(1)"          # no Close here: skipped, and Create User clicked


def test_a_replay_clicks_a_tab_where_the_doc_says_or_stops():
    task = user_task()
    task["oracle"]["args"]["plan"] = json.dumps([["3", "tab", "Outbound"]])
    start = Observation("http://c/console/ram/users", "Users", PAGE)

    async def step(text: str) -> StepResult:
        return StepResult(observation=start)
    with pytest.raises(DriverError, match=r"^step 3: no tab with 'Outbound'"):
        run_async(run_oracle(parse_task(task, "drafted"), {"user_name": "u-1"}, step, start))


def test_a_console_error_asking_for_a_value_is_the_replays_gap_not_a_refusal():
    task = user_task()
    form = ('[1] textbox "Logon Name"\n[2] textbox "Display Name"\n[3] button "Create"\n')
    asks = ('alert:\n Operation failed.\n MissingParameter: The input parameter "UserName" '
            'that is mandatory for processing this request is not supplied.\n' + form)
    pages = {"click(1)": form, "click(3)": asks}
    start = Observation("http://c/console/ram/users", "Users", PAGE)
    now = [start]

    async def step(text: str) -> StepResult:
        if text in pages:
            now[0] = Observation("http://c/console/ram/users/create", "Create", pages[text])
        return StepResult(observation=now[0])
    with pytest.raises(DriverError, match="asks for a value the replay did not give"):
        run_async(run_oracle(parse_task(task, "drafted"), {"user_name": "u-1"}, step, start))
