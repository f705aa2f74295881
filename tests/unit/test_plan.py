"""One reading of a plan op against a page (:func:`datagen.plan.resolve`), and the oracle and the
teacher agreeing on it: on the same pages the oracle sends what the teacher proposes."""
from __future__ import annotations

from dataclasses import replace

from consolerl.drift import Drift
from consolerl.drift import parse as parse_drift
from consolerl.tasks import TASKS_DIR, load_suite
from consolerl.types import Observation, StepResult
from datagen.oracle import run_oracle
from datagen.plan import op, resolve
from datagen.teacher import ROUTE, OracleTeacher
from tests.conftest import run_async

HOST = "http://127.0.0.1:18080"
NONE = Drift(parse_drift(""))
MORE = Drift(parse_drift("more_menu"))


def page(body: str, path: str = "/console/ram/users") -> Observation:
    return Observation(url=f"{HOST}{path}", title="t", text=body)


FORM = """form "Create User":
 [4] textbox "Logon Name": u-1
 [5] combobox "Zone": cn-a | cn-b*
 [6] button "Next"
"""


def test_a_value_op_is_present_satisfied_or_routed_to():
    form = page(FORM)
    name = resolve(op("field", "Logon Name", "u-1"), form, NONE)
    assert name.present and name.satisfied and name.action == 'fill(4, "u-1")'
    zone = resolve(op("select", "Zone", "cn-a"), form, NONE)
    assert zone.present and not zone.satisfied and zone.action == 'select(5, "cn-a")'
    picked = resolve(op("pick", "Zone", "-b", ""), form, NONE)
    assert picked.satisfied and picked.action == 'select(5, "cn-b")'
    later = resolve(op("field", "Display Name", "Bot"), form, NONE)
    assert not later.present and later.action is None and later.route == "click(6)"
    assert "Display Name" in later.missing


ROW_MORE = """table "Users":
  - [5]dev-1 dev-1 | 76288 | [6]Manage [7]More
"""
DIALOG = """dialog "Delete":
 [9] textbox "To confirm, type dev-1"{typed}
 [10] button "OK"
"""


def test_a_click_is_prepared_on_its_page_first_when_it_hides():
    hidden = resolve(op("row", "dev-1", "Delete"), page(ROW_MORE), MORE)
    assert hidden.present and hidden.action is None and hidden.prepare == "click(7)"
    assert resolve(op("row", "dev-1", "Delete"), page(ROW_MORE), NONE).present is False
    typed = resolve(op("confirm", "dev-1"), page(DIALOG.format(typed="")), NONE)
    assert typed.prepare == 'fill(9, "dev-1")' and typed.action == "click(10)"
    assert resolve(op("confirm", "dev-1"), page(DIALOG.format(typed=": dev-1")),
                   NONE).prepare is None
    press = resolve(op("press", "Create User"), page(' [3] button "More"\n'), MORE)
    assert not press.present and press.route == "click(3)"


def test_the_oracle_sends_on_each_page_what_the_teacher_proposes_there():
    task = next(t for t in load_suite(TASKS_DIR) if t.id == "ram-delete-user-0")
    task = replace(task, drift="more_menu,extra_confirm")
    values = {"dev": "dev-1"}
    pages = [page(ROW_MORE), page(ROW_MORE.replace("[7]More", "[7]More [8]Delete")),
             page(ROW_MORE + DIALOG.format(typed="")),
             page(ROW_MORE + DIALOG.format(typed=": dev-1")),
             page('table "Users":\n  - No data.\n')]
    sent: list[str] = []

    async def step(text: str) -> StepResult:
        sent.append(text)
        return StepResult(pages[min(len(sent), len(pages) - 1)],
                          done=text.startswith("stop("), action_text=text)
    run_async(run_oracle(task, values, step, pages[0]))
    assert sent == ["click(7)", "click(8)", 'fill(9, "dev-1")', "click(10)", 'stop("done")']

    session = OracleTeacher().session(task, values, f"{HOST}/console/ram/users")
    proposed = []
    for before, after, action in zip(pages, pages[1:] + pages[-1:], sent):
        p = session.next_action(before)
        proposed.append((p.action, p.op == ROUTE))
        session.observe(before, action, StepResult(after, action_text=action))
    assert [a for a, _ in proposed] == sent
    assert [r for _, r in proposed] == [True, False, True, False, False]
