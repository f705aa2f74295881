"""The grounded agent's page view and reply: consolerl.page.compact, grounded_response, the
settings that go with them, and the export writing grounded completions."""
from __future__ import annotations

import pytest

from consolerl.errors import ConfigError
from consolerl.page import compact, parse
from consolerl.tasks import TASKS_DIR, load_suite
from consolerl.types import Observation, StepResult
from datagen.export import Recording, build_record, recording_policy
from env_workers.actions import parse_action
from rollout_service.agent import (MODEL_SETTINGS, AgentConfig, build_messages,
                                   grounded_response)
from rollout_service.models import HFChatTokenizer, default_model
from tests.conftest import run_async

# A RAM page as the env worker renders it (the console's top bar, product navigation,
# breadcrumb, a form and a status).
PAGE = """[1] link "Skip to content"
[2] button "Products": \u2630 Products
[3] link "Alibaba Cloud console home"
Workbench
[4] combobox "Region": China (Hangzhou)* | Singapore
carol
ID 1000000000000003
[5] button "Sign Out"
navigation "Resource Access Management":
 ## Resource Access Management
 [6] link "Users"
 [7] link "Groups"
navigation "Breadcrumb":
 [8] link "Home"
 /
 [9] link "RAM"
 /Create User
# Create User
form "Create User":
 group "User Account Information":
  ## User Account Information
  Logon Name *
  [10] textbox "Logon Name"
 [11] button "Create"
 [12] link "Cancel"
  group "Type":
   [15] radio "Basic" (checked)
   Basic
   Instances can reach each other.
table "Users":
 - [13]ops Ops Team | [14]Delete
status:
 User ops created."""


def test_compact_takes_out_the_chrome_and_keeps_every_line_an_action_needs():
    view = compact(PAGE)
    lines = view.split("\n")
    original = PAGE.split("\n")
    # Only the page's own lines, in order.
    positions = [original.index(line) for line in lines]
    assert positions == sorted(positions)
    gone = {"Skip to content", "Products", "console home", "Workbench", "carol",
            "1000000000000003", "Sign Out", "Breadcrumb", '[8] link "Home"'}
    assert not any(word in view for word in gone), view
    assert "## Resource Access Management" not in view      # repeats its navigation's name
    assert "## User Account Information" not in view
    assert "\n   Basic\n" not in view and "Instances can reach each other." in view
    kept = {n.bid for n in parse(view).controls()}
    assert kept == {"4", "6", "7", "10", "11", "12", "13", "14", "15"}
    # Every bid shown still names the same control as on the whole page.
    for bid in kept:
        assert parse(view).by_bid(bid).label == parse(PAGE).by_bid(bid).label
    assert compact(view) == view                             # a compact page stays as it is
    assert compact("") == ""


def test_compact_keeps_a_page_without_a_top_bar_whole():
    page = '# Users\n[3] link "Create User"\ntable "Users":\n - [4]alice | [5]Delete'
    assert compact(page) == page


def test_grounded_response_names_the_element_acted_on():
    assert grounded_response("click(11)", PAGE) == '"Create"\nclick(11)'
    assert grounded_response('fill(10, "bob")', PAGE) == '"Logon Name"\nfill(10, "bob")'
    assert grounded_response("click(14)", PAGE) == '"Delete"\nclick(14)'
    assert grounded_response('select(4, "Singapore")', PAGE) == \
        '"Region"\nselect(4, "Singapore")'
    for plain in ('stop("done")', 'report_infeasible("no Create button")', 'press("Enter")',
                  "click(99)", "go_back()"):
        assert grounded_response(plain, PAGE) == plain
    quoted = '[3] button "Say \\"hi\\""'
    assert grounded_response("click(3)", quoted).startswith('"Say \\"hi\\""\n')
    # The env worker reads the action line; the label line is not an action.
    for action in ("click(11)", 'fill(10, "bob")', "click(3)"):
        reply = grounded_response(action, PAGE + "\n" + quoted)
        assert parse_action(reply).to_text() == action


def test_the_grounded_reply_goes_with_its_prompt():
    AgentConfig(system_prompt="grounded", response="grounded", page_view="compact",
                random_ids=True)
    with pytest.raises(ConfigError, match="AgentConfig.response"):
        AgentConfig(response="grounded")
    with pytest.raises(ConfigError, match="AgentConfig.response"):
        AgentConfig(system_prompt="grounded")
    with pytest.raises(ConfigError, match="page_view"):
        AgentConfig(page_view="short")
    assert {"page_view", "response", "random_ids", "system_prompt"} <= set(MODEL_SETTINGS)
    assert set(MODEL_SETTINGS) <= set(AgentConfig.__dataclass_fields__)


def test_the_prompt_shows_the_page_in_the_configured_view():
    obs = Observation("http://h/console/ram/users/create", "Create User", PAGE)
    full = build_messages("T", "1. Click Create.", [], obs, 10_000)[1]["content"]
    small = build_messages("T", "1. Click Create.", [], obs, 10_000, view="compact")[1]["content"]
    assert "Sign Out" in full and "Sign Out" not in small
    assert compact(PAGE) in small
    assert len(small) < len(full)


def test_the_export_writes_grounded_completions():
    tokenizer = HFChatTokenizer(default_model())
    task = next(t for t in load_suite(TASKS_DIR) if t.id == "ram-create-user-0")
    config = AgentConfig(system_prompt="grounded", response="grounded", page_view="compact",
                         history_turns=2, max_prompt_tokens=1024)
    sent = ['fill(10, "u1")', "click(11)", 'stop("done")']

    async def step(text: str) -> StepResult:
        n = sent.index(text) + 1
        return StepResult(Observation("http://h/console/ram/users", "Users", PAGE, step=n),
                          done=n == len(sent), action_text=text,
                          answer="done" if n == len(sent) else None)

    async def teacher(task, values, step_fn, observation):
        for text in sent:
            result = await step_fn(text)
        return result

    recording = Recording()
    run_async(recording_policy(config, recording, teacher=teacher)(
        task, {"user_name": "u1", "display_name": "D"}, step,
        Observation("http://h/console/ram/users/create", "Create User", PAGE)))
    record = build_record(task, "solved", recording, tokenizer, config)
    assert [t["completion"] for t in record["turns"]] == \
        ['"Logon Name"\nfill(10, "u1")', '"Create"\nclick(11)', 'stop("done")']
    assert all(tokenizer.decode(t["response_ids"]) == t["completion"] for t in record["turns"])
    user = record["turns"][0]["messages"][1]["content"]
    assert "Sign Out" not in user and "[10] textbox" in user
    assert record["agent"]["response"] == "grounded"
    assert set(record["agent"]) == set(MODEL_SETTINGS)
