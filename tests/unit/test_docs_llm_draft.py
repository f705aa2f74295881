"""LLM drafting (doccheck.llm_draft) through a fake OpenAI-compatible endpoint on
loopback that serves canned replies: the draft parses, the fixed fields are the project's, a
refused answer is repaired once, and failures are reasons."""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from consolerl.tasks import parse_task
from doccheck.llm_draft import inventory_text, llm_draft
from tests import docs_fixture as fx
from tests.docs_fixture import GOOD, PROSE, FakeChat, fenced

@pytest.fixture
def chat() -> Iterator:
    made = []

    def make(*replies: str) -> FakeChat:
        made.append(FakeChat(list(replies)))
        return made[-1]
    yield make
    for c in made:
        c.close()


def test_a_canned_draft_becomes_a_task(chat):
    good = {k: v for k, v in GOOD.items() if k != "oracle"}
    fake = chat(fenced(good))
    d = llm_draft(PROSE, fx.inventory(), fake.client, task_id="llm-ram", drift="rename")
    assert d.source == "llm" and d.task is not None, d.reason
    task = parse_task(d.task, "llm")
    assert (task.id, task.split, task.expected, task.drift) == ("llm-ram", "heldout", "success",
                                                                "rename")
    assert task.procedure.startswith("1. Teammates who need the console")
    assert "(Use `{user_name}` as the logon name.)" in task.procedure
    assert task.success.required_events[0].event == "CreateUser"
    # The model saw the procedure as data and the inventory's actions and field names.
    (path, body), = fake.requests
    assert path == "/v1/chat/completions" and body["model"] == "fake"
    user = body["messages"][1]["content"]
    assert "<<<\n1. Teammates" in user and "-> Ram:CreateUser" in user
    assert "field UserName \"Logon Name\" text required" in user


def test_a_refused_answer_is_repaired_once(chat):
    fake = chat(fenced(GOOD), fenced({k: v for k, v in GOOD.items() if k != "oracle"}))
    d = llm_draft(PROSE, fx.inventory(), fake.client, task_id="llm-ram")
    assert d.task is not None
    assert len(fake.requests) == 2
    repair = fake.requests[1][1]["messages"][-1]["content"]
    assert "refused" in repair and "oracle" in repair


def test_answers_that_never_parse_are_a_reason(chat):
    fake = chat("I cannot help with that.", fenced({"product": "ram", "start_page": "/nope"}))
    d = llm_draft(PROSE, fx.inventory(), fake.client, task_id="llm-ram")
    assert d.task is None and d.source == "llm"
    assert d.reason.startswith("the model's draft was refused:") and "start_page" in d.reason


def test_an_endpoint_failure_is_a_reason(chat):
    fake = chat()                        # answers 503
    d = llm_draft(PROSE, fx.inventory(), fake.client, task_id="llm-ram")
    assert d.task is None and d.reason.startswith("the LLM endpoint failed:")


def test_the_inventory_text_names_option_values():
    text = inventory_text(fx.inventory())
    assert "options: Private=private, Public Read=public-read" in text
    assert "button \"OK\" -> Ecs:StopInstance" in text
