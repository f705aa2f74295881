"""The state-aware teacher on pages of the console (as the env worker renders them): it picks
the plan's op from wherever the agent is, follows the actions sent, routes through wizards and
More menus, goes back to the start page when lost; and a model teacher's replies are checked
before they count. (Live, every train task from its start page and after deviations:
tests/integration/test_src.py and ``python -m benchmarks.src``.)"""
from __future__ import annotations

import json
import re
from dataclasses import replace

import httpx

from consolerl.tasks import TASKS_DIR, load_suite
from consolerl.types import Observation, StepResult
from infra.llm import OpenAIChatClient
from datagen.src import generalize, normalize_page, same_action
from datagen.teacher import FINAL, ROUTE, ChatTeacher, OracleTeacher
from tests.conftest import run_async

SUITE = {t.id: t for t in load_suite(TASKS_DIR)}
HOST = "http://127.0.0.1:18080"
HEADER = """[1] link "Skip to content"
[2] button "Products": Products
Global
alice
ID 1000000000000001
[3] button "Sign Out"
"""


def obs(path: str, body: str, error: str = "") -> Observation:
    return Observation(url=f"{HOST}{path}", title="t", text=HEADER + body,
                       last_action_error=error)


def filled(task, values: dict[str, str]) -> dict[str, str]:
    """``values`` plus a value for every other placeholder the task's texts name."""
    names = set(re.findall(r"\{(\w+)\}", task.procedure + json.dumps(task.oracle_args)))
    return {**{n: f"{n}-x" for n in names}, **values}


def session(task_id: str, values: dict[str, str], drift: str | None = None):
    task = SUITE[task_id]
    if drift is not None:
        task = replace(task, drift=drift)
    return OracleTeacher().session(task, filled(task, values), f"{HOST}{task.start_page}")


USERS = """# Users
region "Users":
 [4] link "Create User"
 table "Users":
  - Logon Name | User ID | Actions
  - [5]dev-1 dev-1 | 7628855302631105 | [6]Manage [7]Add Permissions [8]Delete
"""
DELETE_DIALOG = USERS + """dialog "Delete":
 ## Delete
 Delete user dev-1?
 [9] button "Cancel"
 [10] button "OK"
"""


def test_a_dialog_over_the_list_is_confirmed_not_the_row_clicked_again():
    s = session("ram-delete-user-0", {"dev": "dev-1"})
    list_page, dialog = obs("/console/ram/users", USERS), obs("/console/ram/users",
                                                            DELETE_DIALOG)
    assert s.next_action(list_page).action == "click(8)"
    s.observe(list_page, "click(8)", StepResult(dialog))
    p = s.next_action(dialog)
    assert p.action == "click(10)" and p.op == 1
    done = obs("/console/ram/users", USERS.replace(
        "  - [5]dev-1 dev-1 | 7628855302631105 | [6]Manage [7]Add Permissions [8]Delete\n",
        "  - No data.\n"))
    s.observe(dialog, "click(10)", StepResult(done))
    assert s.next_action(done).action == 'stop("done")' and s.next_action(done).op == FINAL
    assert s.progress(done) == 2


FORM = """# Create User
form "Create User":
 [4] textbox "Logon Name"{logon}
 [5] textbox "Display Name"{display}
 [6] button "Create"
 [7] link "Cancel"
"""


def test_a_form_is_filled_first_empty_field_first_then_submitted():
    s = session("ram-create-user-0", {"user_name": "u-1", "display_name": "Deploy Bot"})
    name = s.plan[1].args[1]
    display = s.plan[2].args[1]
    empty = obs("/console/ram/users/create", FORM.format(logon="", display=""))
    # The teacher may be asked on the form without having seen the click that opened it.
    assert s.next_action(empty).action == f'fill(4, "{name}")'
    half = obs("/console/ram/users/create", FORM.format(logon=f": {name}", display=""))
    assert s.next_action(half).action == f'fill(5, "{display}")'
    wrong = obs("/console/ram/users/create", FORM.format(logon=": wrong", display=f": {display}"))
    assert s.next_action(wrong).action == f'fill(4, "{name}")'
    full = obs("/console/ram/users/create", FORM.format(logon=f": {name}",
                                                        display=f": {display}"))
    assert s.next_action(full).action == "click(6)"
    assert s.progress(full) == 3 > s.progress(half) == 2 > s.progress(empty) == 0


MORE_ROW = """# Users
region "Users":
 [4] link "Create User"
 table "Users":
  - Logon Name | User ID | Actions
  - [5]dev-1 dev-1 | 7628855302631105 | [6]Manage [7]More
"""


def test_a_row_action_in_a_more_menu_is_reached_through_it():
    s = session("ram-grant-policy-0", {"dev": "dev-1"}, drift="more_menu")
    closed = obs("/console/ram/users", MORE_ROW)
    p = s.next_action(closed)
    assert p.action == "click(7)" and p.op == ROUTE         # opening the menu is not the op
    opened = obs("/console/ram/users", MORE_ROW.replace(
        "[7]More", "[7]More [8]Add Permissions [9]Delete"))
    s.observe(closed, "click(7)", StepResult(opened))
    assert 0 not in s.done_ops
    assert s.next_action(opened).action == "click(8)"


def test_off_the_path_it_goes_back_to_the_start_page_and_is_lost_only_there():
    s = session("ram-delete-user-0", {"dev": "dev-1"})
    elsewhere = obs("/console/vpc/vpcs", "# VPCs\n [4] link \"Create VPC\"\n")
    p = s.next_action(elsewhere)
    assert p.op == ROUTE and p.action == f'goto("{HOST}/console/ram/users")'
    start_without_row = obs("/console/ram/users", USERS.replace(
        "  - [5]dev-1 dev-1 | 7628855302631105 | [6]Manage [7]Add Permissions [8]Delete\n",
        ""))
    assert s.next_action(start_without_row) is None


def test_a_failed_click_is_not_done():
    s = session("ram-delete-user-0", {"dev": "dev-1"})
    list_page = obs("/console/ram/users", USERS)
    s.observe(list_page, "click(8)", StepResult(obs("/console/ram/users", USERS,
                                                    error="element 8 is not visible")))
    assert not s.done_ops and s.next_action(list_page).action == "click(8)"


def test_a_wrong_document_is_reported_once_its_check_holds_on_the_page():
    task = next(t for t in SUITE.values() if t.oracle_family == "wrongdoc_missing"
                and not dict(t.oracle_args).get("steps"))
    s = OracleTeacher().session(task, {}, f"{HOST}{task.start_page}")
    absent = dict(task.oracle_args)["absent"].split("|")[0]
    clean = obs("/console/x", "# Page\n [4] link \"Other\"\n")
    p = s.next_action(clean)
    assert p.op == FINAL and p.action.startswith("report_infeasible(")
    assert s.next_action(obs("/console/x", f"# Page\n [4] link \"{absent}\"\n")) is None


def test_pages_of_two_episodes_of_the_same_state_normalize_equal():
    a = obs("/console/vpc/vpcs", "  - [15]vpc-bp1yb1qjex8exi4xai5z net-5dba5802 | 2026-11-26T04:33:53Z"
            " | 7628855302631105\n").text
    b = obs("/console/vpc/vpcs", "  - [15]vpc-bp9zz1qjex8exi4xai00 net-77aa0011 | 2026-11-26T05:01:02Z"
            " | 1111155302631999\n").text.replace("alice\nID 1000000000000001",
                                                   "bob\nID 1000000000000002")
    assert normalize_page(a, {"vpc": "net-5dba5802"}) == normalize_page(b, {"vpc": "net-77aa0011"})
    assert normalize_page(a, {"vpc": "net-5dba5802"}) != normalize_page(
        a.replace("[15]", "[16]"), {"vpc": "net-5dba5802"})
    assert generalize('fill(8, "net-5dba5802")', {"vpc": "net-5dba5802"}) == 'fill(8, "{vpc}")'
    assert same_action('stop("done")', 'stop("all done")')
    assert not same_action('stop("done")', "click(3)") and not same_action(None, "click(3)")


def _chat_teacher(reply: str) -> tuple[ChatTeacher, list[dict]]:
    seen: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, json={"choices": [{"message": {"content": reply}}]})
    client = OpenAIChatClient("http://teacher.test", "frontier", api_key_env=None,
                              transport=httpx.MockTransport(handler))
    return ChatTeacher(client), seen


def test_a_model_teachers_reply_counts_only_when_it_parses_and_names_an_element_on_the_page():
    task = SUITE["ram-delete-user-0"]
    page = obs("/console/ram/users", DELETE_DIALOG)
    good, seen = _chat_teacher("The dialog asks to confirm.\nclick(10)")
    p = run_async(good.session(task, filled(task, {"dev": "dev-1"}), "").propose(page))
    assert p is not None and p.action == "click(10)"
    assert "CURRENT PAGE" in seen[0]["messages"][-1]["content"]
    for reply in ("click(99)", "I would click OK", "fill(4, 'x'); import os"):
        bad, _ = _chat_teacher(reply)
        s = bad.session(task, filled(task, {"dev": "dev-1"}), "")
        assert run_async(s.propose(page)) is None, reply
        assert s.failures == 1


def test_the_jobs_src_section_names_its_teacher_and_refuses_a_half_configured_one():
    import pytest  # noqa: PLC0415

    from cluster.config import SrcSection
    from cluster.job import src_teacher
    from consolerl.errors import ConfigError

    assert isinstance(src_teacher(SrcSection(enabled=True)), OracleTeacher)
    chat = src_teacher(SrcSection(enabled=True, teacher="http://127.0.0.1:9/v1",
                                  teacher_model="frontier"))
    assert isinstance(chat, ChatTeacher) and chat.client.model == "frontier"
    with pytest.raises(ConfigError, match="src.teacher_model"):
        SrcSection(teacher="https://api.example/v1")
    with pytest.raises(ConfigError, match="src.teacher"):
        SrcSection(teacher="gpt-5")
    with pytest.raises(ConfigError, match="segment_steps"):
        SrcSection(segment_steps=0)
