"""The typed page: ``render(parse(text)) == text`` on real console pages and on anything else,
typed queries on small hand-written pages, and an Observation that carries no page on the wire.

``tests/data/pages.json``: console pages of ``infra.console_sim`` as Chromium showed them
(Playwright's aria snapshot) and as :func:`env_workers.observation.render_snapshot` renders
them, list pages with rows, forms, a wizard step, a row's More menu and confirmation dialogs.
"""
from __future__ import annotations

import dataclasses
import json
import pickle
import re
from pathlib import Path

import pytest

from consolerl.page import Page, PageNode, Region, parse, render
from consolerl.types import Observation
from env_workers.observation import render_snapshot
from tests.unit.test_observation import SNAPSHOT

PAGES = json.loads((Path(__file__).parents[1] / "data" / "pages.json").read_text())


@pytest.mark.parametrize("page", PAGES, ids=[p["name"] for p in PAGES])
def test_real_console_pages_render_back_byte_for_byte(page):
    assert render_snapshot(page["snapshot"]).text == page["text"]      # the renderer's golden
    assert render(parse(page["text"])) == page["text"]


def test_every_enabled_control_of_a_real_page_is_a_node_with_its_bid():
    for page in PAGES:
        rendered = render_snapshot(page["snapshot"])
        typed = parse(rendered.text)
        assert sorted(n.bid for n in typed.controls()) == sorted(rendered.bids, key=str), \
            page["name"]


def test_rendered_snapshots_of_the_observation_tests_render_back():
    for snapshot in (SNAPSHOT, '- textbox "Port Range" [ref=f2e1]:\n  - text: 443/443\n'
                     '- alert [ref=f2e2]: Saved\n- dialog "Delete" [ref=f2e3]:\n'
                     '  - button "OK" [ref=f2e4]\n  - checkbox "Sure" [checked=mixed] '
                     '[ref=f2e5]\n- heading "Deep" [level=3] [ref=f2e6]'):
        text = render_snapshot(snapshot).text
        assert render(parse(text)) == text


@pytest.mark.parametrize("text", [
    "", "\n", "just text", "  indented\n\n- \n- a | | b\n#\n# \n[1]\n[x] link \"y\"",
    '[1] link "a "quoted" label"', '[2] textbox "Name": ', '[3] combobox "S": ',
    '[4] combobox "S": a* | a*', 'alert:', 'alert: ', 'dialog "x" (expanded):',
    '[5] button "cut mid-li', "http://c/console/x\n[1] link \"X\"", "tab\t\"x\"",
])
def test_any_text_renders_back(text):
    assert render(parse(text)) == text


PAGE = """\
[1] link "Create User"
[2] combobox "Region": China (Hangzhou)* | Singapore
# Users
table "Users":
 - Logon Name | Actions
 - [3]ops Ops Team | [4]Delete [5]Start(checked)
dialog "Delete User":
 [6] textbox "To confirm, type ops": ops
 [7] radio "Now" (checked)
 button "OK" (disabled)
 Read the [8]guide first
alert: Deleted"""


def test_typed_queries():
    page = parse(PAGE)
    assert render(page) == PAGE
    assert page.bid("link", "Create User") == "1" and page.has("combobox", "Region")
    assert page.bid("button", "OK") is None and not page.has("button", "OK")
    ok = page.find("button", "OK")[0]
    assert ok.disabled and ok.region is Region.DIALOG and ok.depth == 1
    region = page.control("combobox", "Region")
    assert region.options == ("China (Hangzhou)", "Singapore")
    assert region.selected == "China (Hangzhou)"
    box = page.by_bid("6")
    assert (box.role, box.value, box.region) == ("textbox", "ops", Region.DIALOG)
    assert page.control("radio", "Now").checked
    assert page.bid("textbox", re.compile("To confirm")) == "6"
    assert [n.label for n in page.find(contains="Delete", inline=False)] == [
        "[3]ops Ops Team | [4]Delete [5]Start(checked)", "Delete User", "Deleted"]
    assert [n.label for n in page.headings()] == ["Users"]
    assert [n.level for n in page.headings()] == [1]
    assert [n.bid for n in page.controls()] == [str(i) for i in range(1, 9)]
    assert page.find("alert")[0].label == "Deleted"
    assert page.find("dialog", "Delete User")[0].opens


def test_rows_and_their_inline_controls():
    page = parse(PAGE)
    header, row = page.rows()
    assert header.cells == ("Logon Name", "Actions") and header.region is Region.ROW
    assert row.cells == ("[3]ops Ops Team", "[4]Delete [5]Start(checked)")
    ops = page.by_bid("3")
    assert ops.inline and ops.row == row.label and ops.label == "ops Ops Team"
    assert page.in_row("ops", "ops").bid == "3"              # the link, then the row's text
    assert page.in_row("ops", "Delete").bid == "4"
    start = page.in_row("Ops Team", "Start")
    assert start.bid == "5" and start.checked and start.label == "Start"
    assert page.in_row("ops", "Del") is None and page.in_row("nobody", "Delete") is None
    guide = page.by_bid("8")
    assert guide.inline and not guide.row and guide.region is Region.DIALOG
    assert page.text_after("4") == "Delete [5]Start(checked)"
    assert page.text_after("1") == ' link "Create User"'
    assert page.text_after("99") == ""


def test_a_line_that_does_not_read_back_stays_text():
    page = parse('[4] combobox "S": a | a*\n[2] textbox "Name": ')
    assert [n.role for n in page.nodes] == ["text", "text"]
    assert page.controls() == []


def test_hand_built_pages_render():
    page = Page((PageNode("heading", "Users", level=2),
                 PageNode("button", "Save", bid="3", flags=("disabled",)),
                 PageNode("form", "New", opens=True),
                 PageNode("textbox", "Name", bid="4", value="x", depth=1),
                 PageNode("row", "a | b", cells=("a", "b"), depth=1)))
    assert render(page) == '## Users\n[3] button "Save" (disabled)\nform "New":\n' \
        ' [4] textbox "Name": x\n - a | b'


def test_the_observation_page_is_derived_not_carried():
    obs = Observation("http://c/console/ram/users", "Users", PAGE)
    before = pickle.dumps(obs)
    assert obs.page.bid("link", "Create User") == "1" and obs.page.url == obs.url
    assert pickle.dumps(obs) == before
    assert [f.name for f in dataclasses.fields(Observation)][:3] == ["url", "title", "text"]
    assert "page" not in dataclasses.asdict(obs)


def _fixture(name: str) -> Page:
    return parse(next(p["text"] for p in PAGES if p["name"] == name))


def test_real_pages_read_as_typed_nodes():
    users = _fixture("ram users with rows@")
    assert users.bid("link", "Create User") == "8"
    search = users.control("combobox", "Search by")
    assert search.selected == "Logon name" and search.region is Region.SEARCH
    assert users.in_row("cap-plain", "Delete").bid == "16"
    assert users.by_bid("13").label == "cap-plain Captured"
    assert [n.level for n in users.headings()] == [2, 1]
    assert users.control("link", "Users").region is Region.NAV

    menu = _fixture("ram row more@more_menu")
    more = menu.in_row("cap-more_menu", "More")
    assert more.bid == "15" and more.flags == ("expanded",)
    assert menu.in_row("cap-more_menu", "Delete").bid == "17"
    assert menu.in_row("cap-plain", "Delete") is None

    dialog = _fixture("ram delete dialog@extra_confirm")
    box = dialog.control("textbox", re.compile("To confirm, type"))
    assert box.region is Region.DIALOG and box.value == ""
    ok = dialog.find("button", "OK")[0]
    assert ok.disabled and not ok.bid and ok.region is Region.DIALOG
    assert dialog.find("dialog", "Delete")[0].opens

    form = _fixture("ram create filled@")
    assert form.control("textbox", "Logon Name").value == "cap-plain"
    assert form.control("textbox", "Logon Name").region is Region.FORM

    wizard = _fixture("/console/ecs/instances@wizard > Next")
    radios = wizard.find("radio", actionable=True)
    assert radios and sum(r.checked for r in radios) <= 2


def test_comparable_takes_out_what_differs_between_two_visits_of_one_state():
    from consolerl.page import comparable
    a = ("main-account\nID 1234567890\n# Instances\n- [7]i-bp5uo7w6g51i0cvguwpf web | Running"
         " | 2026-11-28T15:02:54Z | 12345678")
    b = ("other-account\nID 999\n# Instances\n- [7]i-bp1aaaaaaaaaaaaaaaaa web | Running"
         " | 2026-11-27 09:00:00+08:00 | 87654321")
    assert comparable(a) == comparable(b) == (
        "{account}\n# Instances\n- [7]{id} web | Running | {time} | {n}")
    assert comparable("[3] button \"Create\"") == "[3] button \"Create\""
