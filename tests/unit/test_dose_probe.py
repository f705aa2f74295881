"""benchmarks.dose_probe: a swap replaces the procedure's mention only (page, history and title
untouched), the expected bid is the swapped-in control's, a fill gets a value variant, turns
without a usable mention give nothing; a follower scores 1.0 and a repeater 0.0; and the
agent's prompt layout splits back into procedure and page."""
from __future__ import annotations

from consolerl.types import Observation
from rollout_service.agent import COMPACT_SYSTEM_PROMPT, _Step, build_messages

from benchmarks.dose_probe import (Variant, follows, probe, record_variants, shifted,
                                   split_prompt, turn_variants)
from env_workers.actions import Click

PAGE = "\n".join([
    '[1] link "Skip to content"',
    '[4] button "Sign Out"',
    "# Users",
    'region "Users":',
    ' [8] link "Create User"',
    ' [12] link "Refresh"',
    ' [13] link "Export"',
    ' form "Create User":',
    '  [20] textbox "Logon Name"',
    '  [21] textbox "Display Name"',
    '  [22] textbox "Comments"',
    '  [23] button "OK"',
    '  [24] button "Cancel"',
])
PROCEDURE = ("1. Open the RAM console and choose Identities > Users.\n2. Click Create User.\n"
             "3. Enter alice-01 as the logon name.\n4. Click OK to create the user.")


def _turn(completion: str, procedure: str = PROCEDURE, page: str = PAGE,
          history: tuple[_Step, ...] = (), title: str = "Create User",
          error: str = "") -> dict:
    observation = Observation("http://console/ram/users", "Users - RAM", page,
                              last_action_error=error)
    messages = build_messages(title, procedure, list(history), observation, 8000,
                              COMPACT_SYSTEM_PROMPT)
    return {"messages": messages, "completion": completion, "prompt_ids": [1, 2, 3],
            "response_ids": [4], "action_error": ""}


def _by_kind(variants: list[Variant]) -> dict[str, Variant]:
    return {v.kind: v for v in variants}


def test_the_agents_prompt_splits_into_its_procedure_and_its_page():
    for history, error in (((), ""), ((_Step("click(8)", ""),), ""), ((), "no such element")):
        user = _turn("click(8)", history=history, error=error)["messages"][1]["content"]
        prompt = split_prompt(user)
        assert prompt is not None
        assert prompt.procedure == PROCEDURE and prompt.page == PAGE
        assert prompt.head + prompt.procedure + prompt.tail == user
    assert split_prompt("no layout here") is None


def test_a_label_swap_replaces_the_procedures_mention_only():
    turn = _turn("click(8)", history=(_Step("goto(x)", ""),), title="Create User")
    variants = _by_kind(turn_variants(turn, "t#0"))
    assert set(variants) == {"original", "label"}
    swap = variants["label"]
    assert (swap.bid, swap.mention, swap.replacement) == ("12", "Create User", "Refresh")
    before, after = turn["messages"][1]["content"], swap.messages[1]["content"]
    assert after == before.replace("2. Click Create User.", "2. Click Refresh.")
    assert after.startswith("TASK: Create User\n")            # the title keeps its words
    assert swap.messages[0] == turn["messages"][0]
    assert variants["original"].messages == tuple(turn["messages"])
    assert variants["original"].recorded == Click("8") and variants["original"].bid == "8"
    assert variants["original"].recorded_ids == (1, 2, 3)


def test_the_swapped_in_control_takes_the_same_action_and_is_not_in_the_procedure():
    # OK's mention: the other button on the page, not the top bar's Sign Out
    ok = _by_kind(turn_variants(_turn("click(23)"), "t#1"))["label"]
    assert (ok.bid, ok.replacement) == ("24", "Cancel")
    assert "4. Click Cancel to create the user." in ok.messages[1]["content"]
    # a fill's label goes to another text field; Display Name is taken by the procedure
    procedure = PROCEDURE + "\n5. Enter Al as the display name."
    fill = _by_kind(turn_variants(_turn('fill(20, "alice-01")', procedure), "t#2"))
    assert (fill["label"].bid, fill["label"].replacement) == ("22", "Comments")
    assert "3. Enter alice-01 as the Comments." in fill["label"].messages[1]["content"]
    value = fill["value"]
    assert (value.bid, value.value) == ("20", shifted("alice-01")) == ("20", "bmjdf-12")
    assert "3. Enter bmjdf-12 as the logon name." in value.messages[1]["content"]
    assert "alice-01" not in split_prompt(value.messages[1]["content"]).procedure


def test_the_grounded_reply_is_read_from_its_action_line():
    variants = _by_kind(turn_variants(_turn('"Create User"\nclick(8)'), "t#0"))
    assert variants["label"].bid == "12" and variants["original"].recorded == Click("8")


def test_turns_without_a_usable_mention_give_no_variant():
    assert turn_variants(_turn("click(13)"), "t") == []                 # Export: not mentioned
    assert turn_variants(_turn('press("Enter")'), "t") == []            # names no element
    assert turn_variants(_turn("click(99)"), "t") == []                 # not on the page
    failed = {**_turn("click(8)"), "action_error": "element 8 is not visible"}
    assert turn_variants(failed, "t") == []
    lonely = '# Users\n[8] link "Create User"\n[9] link "Users"'        # Users is in it
    assert turn_variants(_turn("click(8)", page=lonely), "t") == []
    assert turn_variants({"messages": [{"role": "user", "content": "hi"}],
                          "completion": "click(8)"}, "t") == []


def test_record_variants_take_max_new_tokens_from_the_agent_settings():
    record = {"task_id": "ram-create-user-1", "agent": {"max_new_tokens": 7},
              "turns": [_turn("click(8)"), _turn("click(13)"), _turn("click(23)")]}
    variants = record_variants(record)
    assert [v.state for v in variants] == ["ram-create-user-1#0"] * 2 + ["ram-create-user-1#2"] * 2
    assert {v.max_new_tokens for v in variants} == {7}
    assert {v.max_new_tokens for v in record_variants({**record, "agent": {}})} == {48}


def _variants() -> list[Variant]:
    """Three turns of one episode (each prompt its own: the history grows)."""
    steps = [_Step("click(5)", "")]
    return (turn_variants(_turn("click(8)", history=()), "a")
            + turn_variants(_turn('fill(20, "alice-01")', history=tuple(steps)), "b")
            + turn_variants(_turn("click(23)", history=tuple(steps * 2)), "c"))


def test_a_follower_scores_one_and_a_repeater_zero():
    variants = _variants()
    answer = {v.messages[1]["content"]: (f'fill({v.bid}, "{v.value}")' if v.value else
                                         v.recorded.to_text() if v.kind == "original" else
                                         f"click({v.bid})") for v in variants}
    seen: list[int] = []

    def follower(messages, max_new_tokens):
        seen.append(max_new_tokens)
        return "thinking\n" + answer[messages[1]["content"]]
    out = probe(variants, follower)
    assert out["procedure_following"] == 1.0 and out["procedure_following_original"] == 1.0
    assert out["probe_states"] == {"states": 3, "variants": 4, "label": 3, "value": 1}
    assert seen == [48] * len(variants)

    recorded = {v.messages[1]["content"]: v.recorded.to_text() for v in variants}
    out = probe(variants, lambda messages, _: recorded[messages[1]["content"]])
    assert out["procedure_following"] == 0.0 and out["procedure_following_original"] == 1.0
    assert probe([], follower)["procedure_following"] is None


def test_follows_checks_the_bid_and_a_value_variants_value():
    fill = _by_kind(turn_variants(_turn('fill(20, "alice-01")'), "c"))
    assert follows(fill["value"], 'fill(20, "bmjdf-12")')
    assert not follows(fill["value"], 'fill(20, "alice-01")')
    assert not follows(fill["value"], "click(20)")
    assert fill["label"].bid == "21" and follows(fill["label"], 'fill(21, "alice-01")')
    assert not follows(fill["original"], 'fill(20, "alice")')
    assert not follows(fill["label"], "not an action")
