"""datagen.augment: each transform keeps a turn consistent (the completion names the same
control, the procedure and the completion agree on a value, labels stay), the ids are the
export's, the output is a function of the seed, and no rewritten step is a sentence of the
held-out documentation corpus."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from consolerl.errors import ConfigError
from consolerl.page import parse, render
from consolerl.tasks import TASKS_DIR, load_suite
from consolerl.types import Observation, StepResult
from datagen.augment import (KINDS, RULES, AugmentConfig, Style, augment_file,
                             augment_record, fresh_value, heldout_sentences, read_prompt,
                             read_turn, rewrite_procedure, rewrite_sentence, sentences,
                             value_shape)
from datagen.export import Recording, SecretLeak, build_record, recording_policy
from env_workers.actions import parse_action
from rollout_service.agent import AgentConfig, build_messages, grounded_response
from rollout_service.models import HFChatTokenizer, default_model, end_of_turn_id
from tests.conftest import run_async

USERS = """[1] link "Skip to content"
Workbench
[2] button "Sign Out"
navigation "Resource Access Management":
 [3] link "Users"
# Users
region "Users":
 [4] link "Create User"
 table "Users":
  - Logon Name | Display Name | Actions
  - [5]dev-1a2b3c4d | Dev | [6]Delete
  - [7]ops-9f8e7d6c | Ops Team | [8]Delete
 [9] combobox "Items per page": 10* | 20"""

CREATE = """[1] link "Skip to content"
Workbench
[2] button "Sign Out"
navigation "Resource Access Management":
 [3] link "Users"
# Create User
form "Create User":
 group "Basic Settings":
  Logon Name *
  [10] textbox "Logon Name"{logon}
  [11] textbox "Display Name"{display}
 [12] button "Create"
 [13] link "Cancel\""""


def create_page(logon: str = "", display: str = "") -> str:
    return CREATE.format(logon=f": {logon}" if logon else "",
                         display=f": {display}" if display else "")


VALUES = {"user_name": "user3-5cf258aa", "display_name": "Deploy Bot"}
SENT = [("click(4)", USERS), ('fill(10, "user3-5cf258aa")', create_page()),
        ('fill(11, "Deploy Bot")', create_page("user3-5cf258aa")),
        ("click(12)", create_page("user3-5cf258aa", "Deploy Bot")),
        ('stop("done")', USERS.replace(
            "  - [7]ops", "  - [14]user3-5cf258aa | Deploy Bot | [15]Delete\n  - [7]ops"))]


@pytest.fixture(scope="module")
def tokenizer() -> HFChatTokenizer:
    return HFChatTokenizer(default_model())


def exported(tokenizer, grounded: bool) -> dict:
    """A record as datagen.export writes it, of an oracle run through SENT."""
    task = next(t for t in load_suite(TASKS_DIR) if t.id == "ram-create-user-0")
    config = AgentConfig(system_prompt="grounded" if grounded else "compact",
                         response="grounded" if grounded else "action", history_turns=2,
                         max_prompt_tokens=1024, max_observation_chars=2300)
    texts = [a for a, _ in SENT]

    async def step(text: str) -> StepResult:
        n = texts.index(text) + 1
        page = SENT[n][1] if n < len(SENT) else SENT[-1][1]
        return StepResult(Observation("http://h/console/ram/users", "Users", page, step=n),
                          done=n == len(SENT), action_text=text,
                          answer="done" if n == len(SENT) else None)

    async def teacher(task, values, step_fn, observation):
        for text in texts:
            result = await step_fn(text)
        return result

    recording = Recording()
    run_async(recording_policy(config, recording, teacher=teacher)(
        task, VALUES, step, Observation("http://h/console/ram/users", "Users", USERS)))
    record = build_record(task, "solved", recording, tokenizer, config)
    for turn, recorded in zip(record["turns"], recording.turns):
        if grounded and "\n" not in turn["completion"]:        # as the export writes them
            turn["completion"] = grounded_response(turn["completion"],
                                                   recorded.observation.text)
            turn["response_ids"] = tokenizer.encode(turn["completion"]) + [
                end_of_turn_id(tokenizer)]
    return record


def variants(record, tokenizer, kinds, copies=3, seed=0):
    stats = {"records_unreadable": 0, "values_swapped": 0, "decoy_rows": 0,
             "turns_too_long": 0}
    config = AugmentConfig(copies, kinds, seed)
    eot = end_of_turn_id(tokenizer)
    out = [augment_record(record, c, config, tokenizer, eot, stats) for c in range(copies)]
    assert all(v is not None for v in out)
    return out, stats


def page_of(turn) -> str:
    prompt = read_prompt(turn["messages"][1]["content"])
    assert prompt is not None
    return prompt.page


def target(turn):
    """(role, label) of the control the completion's action names, on the turn's page."""
    action = parse_action(turn["completion"])
    bid = getattr(action, "bid", None)
    if bid is None:
        return None
    node = parse(page_of(turn)).by_bid(bid)
    assert node is not None, (bid, page_of(turn))
    return node.role, node.label


def labels(page: str) -> list[tuple[str, str]]:
    return [(n.role, n.label) for n in parse(page).nodes if n.bid and not n.inline]


@pytest.mark.parametrize("grounded", [False, True])
def test_the_user_message_reads_back_to_the_same_text(tokenizer, grounded):
    record = exported(tokenizer, grounded)
    for turn in record["turns"]:
        content = turn["messages"][1]["content"]
        prompt = read_prompt(content)
        assert prompt is not None and prompt.text() == content
    cut = build_messages("T", "1. Click Create.", [], Observation("http://h/", "T", USERS), 200)
    prompt = read_prompt(cut[1]["content"])
    assert prompt is not None and prompt.cut.startswith("\n[... ")
    assert read_prompt("TASK: x\n\nsomething else") is None


@pytest.mark.parametrize("grounded", [False, True])
def test_renumbered_completions_name_the_same_control(tokenizer, grounded):
    record = exported(tokenizer, grounded)
    out, _ = variants(record, tokenizer, ("ids",))
    moved = 0
    for variant in out:
        mapping: dict[str, str] = {}
        for old, new in zip(record["turns"], variant["turns"]):
            assert target(new) == target(old)
            assert labels(page_of(new)) == labels(page_of(old))
            assert render(parse(page_of(new))) == page_of(new)
            assert [n.role for n in parse(page_of(new)).lines()] == \
                [n.role for n in parse(page_of(old)).lines()]
            old_bids = [n.bid for n in parse(page_of(old)).nodes if n.bid]
            new_bids = [n.bid for n in parse(page_of(new)).nodes if n.bid]
            for a, b in zip(old_bids, new_bids):
                assert mapping.setdefault(a, b) == b          # one bijection per trajectory
            moved += old_bids != new_bids
            old_label, _, old_action = old["completion"].rpartition("\n")
            new_label, _, new_action = new["completion"].rpartition("\n")
            assert new_label == old_label                      # the label line stays
            if grounded and getattr(parse_action(old_action), "bid", None):
                assert new_label
            # The history shows the variant's own earlier actions.
            history = read_prompt(new["messages"][1]["content"]).history
            earlier = [t["completion"].rpartition("\n")[2] for t in variant["turns"]]
            index = variant["turns"].index(new)
            assert [a for a, _ in history] == earlier[max(0, index - 2):index]
        assert len(set(mapping.values())) == len(mapping)
    assert moved


def test_a_swapped_value_agrees_in_procedure_page_history_and_completion(tokenizer):
    record = exported(tokenizer, True)
    out, stats = variants(record, tokenizer, ("values",))
    assert stats["values_swapped"] == 2 * len(out)
    seen = set()
    for variant in out:
        for old, new in zip(record["turns"], variant["turns"]):
            text = new["messages"][1]["content"] + new["completion"]
            assert "user3-5cf258aa" not in text and "Deploy Bot" not in text
            prompt = read_prompt(new["messages"][1]["content"])
            action = parse_action(new["completion"])
            if getattr(action, "text", None):
                assert action.text in prompt.procedure
                assert value_shape(action.text) == value_shape(
                    parse_action(old["completion"]).text)
            assert target(new) == target(old)
            assert labels(page_of(new)) == labels(page_of(old))
        final = read_prompt(variant["turns"][-1]["messages"][1]["content"])
        name = next(parse_action(t["completion"]).text for t in variant["turns"]
                    if 'fill(10, ' in t["completion"])
        assert f"[14]{name} |" in final.page            # the created user's row follows
        assert f'textbox "Logon Name": {name}' in page_of(variant["turns"][3])
        seen.add(name)
    assert len(seen) == len(out)


def test_a_chosen_option_changes_in_the_select_and_the_procedure(tokenizer):
    page = ('# Create vSwitch\nform "Create vSwitch":\n [3] combobox "VPC": vpc-1a2b3c4d* | '
            'vpc-5e6f7a8b\n [4] textbox "IPv4 CIDR Block"\n [5] button "OK"')
    procedure = "1. Select vpc-5e6f7a8b.\n2. Enter 10.0.1.0/24 as the IPv4 CIDR block."
    turns = []
    for action in ('select(3, "vpc-5e6f7a8b")', 'fill(4, "10.0.1.0/24")'):
        messages = build_messages("Create a vSwitch", procedure, [],
                                  Observation("http://h/vsw", "vSwitch", page), 2300)
        turns.append({"messages": messages, "completion": action,
                      "prompt_ids": tokenizer.apply_chat_template(messages),
                      "response_ids": [1], "action_error": ""})
    record = {"trajectory_id": "t1", "task_id": "x", "source": "oracle", "turns": turns,
              "agent": {"max_prompt_tokens": 1024}}
    out, stats = variants(record, tokenizer, ("values",), copies=2)
    assert stats["values_swapped"] == 4
    for variant in out:
        select, fill = (parse_action(t["completion"]) for t in variant["turns"])
        prompt = read_prompt(variant["turns"][0]["messages"][1]["content"])
        node = parse(prompt.page).by_bid("3")
        assert select.option in node.options and "vpc-5e6f7a8b" not in node.options
        assert node.options[0] == "vpc-1a2b3c4d" and node.selected == "vpc-1a2b3c4d"
        assert select.option in prompt.procedure and fill.text in prompt.procedure
        assert value_shape(fill.text) == "cidr" and fill.text.endswith("/24")


def test_fresh_values_keep_their_shape():
    rng = random.Random(1)
    for value in ("user3-5cf258aa", "sg-web-0a1b2c3d4e", "192.168.0.0/16", "10.0.0.0/8",
                  "172.20.0.0/24", "100", "Deploy Bot", "Ops"):
        for _ in range(20):
            new = fresh_value(value, rng)
            assert value_shape(new) == value_shape(value), (value, new)
            assert new.count(" ") == value.count(" ") and len(new.split("/")[0]) > 0
    assert value_shape("Public Read*") is None and value_shape("10.0.0.1/8") is None


def test_decoy_rows_are_fresh_and_leave_the_target_row(tokenizer):
    record = exported(tokenizer, False)
    # The first turn acts outside the table; make one act in it: click Delete of dev-...
    out, stats = variants(record, tokenizer, ("decoys",), copies=4)
    assert stats["decoy_rows"] > 0
    all_old = {n.bid for t in record["turns"] for n in parse(page_of(t)).nodes if n.bid}
    for variant in out:
        for old, new in zip(record["turns"], variant["turns"]):
            assert target(new) == target(old)
            old_page, new_page = parse(page_of(old)), parse(page_of(new))
            old_rows = [r.label for r in old_page.rows()]
            new_rows = [r.label for r in new_page.rows()]
            assert [r for r in new_rows if r in old_rows] == old_rows   # kept, in order
            for row in set(new_rows) - set(old_rows):
                bids = [n.bid for n in new_page.nodes if n.inline and n.row == row]
                assert bids and not set(bids) & all_old
                assert not any(name in row for name in ("dev-1a2b3c4d", "ops-9f8e7d6c",
                                                        "user3-5cf258aa"))
            assert len(new_page.controls()) == len({n.bid for n in new_page.controls()})


def test_no_decoy_lands_in_the_row_the_action_targets(tokenizer):
    messages = build_messages("Delete a RAM user", "1. Click Delete in the row of user "
                              "dev-1a2b3c4d.", [], Observation("http://h/", "Users", USERS),
                              2300)
    record = {"trajectory_id": "t2", "turns": [{
        "messages": messages, "completion": "click(6)", "prompt_ids": [1],
        "response_ids": [1], "action_error": ""}], "agent": {"max_observation_chars": 2300}}
    out, _ = variants(record, tokenizer, ("decoys",), copies=6)
    for variant in out:
        page = parse(page_of(variant["turns"][0]))
        assert page.in_row("dev-1a2b3c4d", "Delete").bid == "6"
        assert sum("dev-1a2b3c4d" in r.label for r in page.rows()) == 1


def test_wording_changes_words_not_names():
    """Every part a rule reads out of a step (a control's label, a value, a field, the row it
    names) is in the rewritten sentence, as written (a field name may change case)."""
    tasks = [t for t in load_suite(TASKS_DIR) if t.split == "train"]
    changed = read = 0
    for task in tasks:
        steps = task.procedure.strip().split("\n")
        for seed in range(6):
            style = Style(bold=seed % 2 == 0, code=seed % 3 == 0)
            new = rewrite_procedure(task.procedure.strip(), random.Random(seed), style)
            changed += new != task.procedure.strip()
            assert [s.partition(". ")[0] for s in new.split("\n")] == \
                [s.partition(". ")[0] for s in steps]
            for index, step in enumerate(steps):
                for sentence in sentences(step.partition(". ")[2]):
                    rule = next((p for p, _ in RULES if p.fullmatch(sentence)), None)
                    if rule is None:
                        continue
                    read += 1
                    out = rewrite_sentence(sentence, random.Random(index), style)
                    plain = out.replace("**", "").replace("`", "")
                    for name, part in rule.fullmatch(sentence).groupdict().items():
                        if part and name.startswith("f"):
                            assert part.lower() in plain.lower(), (sentence, out)
                        elif part and name != "confirm":
                            assert part.strip() in plain, (sentence, out)
    assert changed > len(tasks) * 3 and read > len(tasks)


def test_rewritten_steps_are_never_held_out_corpus_sentences():
    heldout = heldout_sentences()
    assert len(heldout) > 100
    assert "Click **Create VPC**." in heldout            # what a bold "Click {L}." would be
    for _, templates in RULES:
        for template in templates:
            assert not set(sentences(template)) & heldout, template
    procedures = {t.procedure.strip() for t in load_suite(TASKS_DIR)}
    for procedure in procedures:
        for seed in range(8):
            for bold in (False, True):
                new = rewrite_procedure(procedure, random.Random(seed), Style(bold, bold))
                for line in new.split("\n"):
                    assert not set(sentences(line.partition(". ")[2])) & heldout, line
    kept = {rewrite_sentence("Click Create VPC.", random.Random(s), Style(True, False))
            for s in range(30)}
    assert "Click **Create VPC**." not in kept and len(kept) > 1


def test_output_is_a_function_of_the_seed_and_ids_are_the_exports(tokenizer, tmp_path):
    record = exported(tokenizer, True)
    data = tmp_path / "sft-data.jsonl"
    data.write_text(json.dumps(record) + "\n")
    runs = []
    for seed in (0, 0, 1):
        out = tmp_path / f"aug-{len(runs)}.jsonl"
        summary = augment_file(data, out, AugmentConfig(2, KINDS, seed), tokenizer,
                               progress=lambda _: None)
        assert summary["records_out"] == 2 and summary["turns_out"] == 2 * len(record["turns"])
        runs.append(out.read_text())
    assert runs[0] == runs[1] and runs[0] != runs[2]
    eot = end_of_turn_id(tokenizer)
    for line in runs[0].splitlines():
        variant = json.loads(line)
        assert variant["source"] == "augment"
        assert variant["augment_of"] == record["trajectory_id"]
        assert variant["trajectory_id"] != record["trajectory_id"]
        for turn in variant["turns"]:
            assert turn["prompt_ids"] == tokenizer.apply_chat_template(turn["messages"])
            assert turn["response_ids"] == tokenizer.encode(turn["completion"]) + [eot]
            assert read_turn(turn) is not None
    # A turn a transform left as it was has the export's own ids.
    out, _ = variants(record, tokenizer, ("decoys",), copies=1)
    same = [(new, old) for new, old in zip(out[0]["turns"], record["turns"])
            if new["messages"] == old["messages"]]
    assert same and len(same) < len(record["turns"])
    assert all(new["prompt_ids"] == old["prompt_ids"] and
               new["response_ids"] == old["response_ids"] for new, old in same)


def test_a_secret_in_a_record_is_refused(tokenizer, tmp_path):
    record = exported(tokenizer, False)
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps(record) + "\n")
    with pytest.raises(SecretLeak, match="the password of"):
        augment_file(data, tmp_path / "o.jsonl", AugmentConfig(1, ("ids",)), tokenizer,
                     {"Deploy Bot": "the password of account x"}, progress=lambda _: None)
    assert not (tmp_path / "o.jsonl").exists()


def test_bad_settings_are_named():
    with pytest.raises(ConfigError, match="kinds"):
        AugmentConfig(1, ("ids", "colours"))
    with pytest.raises(ConfigError, match="copies"):
        AugmentConfig(-1)


def test_the_sft_stage_trains_on_the_originals_and_their_variants(tokenizer, tmp_path):
    from dataclasses import replace as replaced

    from cluster.config import JobConfig, SftSection
    from cluster.job import augmented_sft_data
    from trainer.sft import load_examples

    record = exported(tokenizer, False)
    data = tmp_path / "sft-data.jsonl"
    data.write_text(json.dumps(record) + "\n")
    plain = replaced(JobConfig(), sft=SftSection(enabled=True))
    assert augmented_sft_data(plain, tmp_path, str(data), "default") == str(data)
    assert not (tmp_path / "sft-augment.jsonl").exists()
    config = replaced(JobConfig(), sft=SftSection(enabled=True, augment_copies=2,
                                                  augment_kinds="ids,wording"))
    said: list[str] = []
    train = augmented_sft_data(config, tmp_path, str(data), "default", said.append)
    assert train == str(tmp_path / "sft-train.jsonl")
    variants_ = [json.loads(line) for line in
                 (tmp_path / "sft-augment.jsonl").read_text().splitlines()]
    lines = [json.loads(line) for line in Path(train).read_text().splitlines()]
    assert lines == [record, *variants_] and len(variants_) == 2
    assert all(v["augment_kinds"] == ["ids", "wording"] for v in variants_)
    examples, stats = load_examples(train, tokenizer, 4096)
    assert stats["records"] == 3 and len(examples) == 3 * len(record["turns"])
    assert "2 augmented trajectories" in said[0]


def test_the_sft_section_names_a_bad_augment_setting():
    from cluster.config import SftSection
    with pytest.raises(ConfigError, match="sft.augment_kinds"):
        SftSection(augment_copies=1, augment_kinds="ids,colours")
    with pytest.raises(ConfigError, match="augment_copies"):
        SftSection(augment_copies=-1)
    assert SftSection().augment().copies == 0


def test_a_decoy_row_gets_its_own_ids_and_stays_in_its_table(tokenizer):
    page = ("# VPCs\ntable \"VPCs\":\n - Name | ID | Actions\n"
            " - [3]net-1a2b3c4d | vpc-bp1x9k2m4n5q7r | [4]Delete\n"
            "table \"Quotas\":\n - Resource | Used\n - VPCs | 1\n[5] button \"Refresh\"")
    messages = build_messages("Delete a VPC", "1. Click Refresh.", [],
                              Observation("http://h/", "VPCs", page), 2300)
    record = {"trajectory_id": "t3", "turns": [{
        "messages": messages, "completion": "click(5)", "prompt_ids": [1],
        "response_ids": [1], "action_error": ""}], "agent": {"max_observation_chars": 2300}}
    out, stats = variants(record, tokenizer, ("decoys",), copies=4)
    assert stats["decoy_rows"] >= 4
    for variant in out:
        lines = page_of(variant["turns"][0]).split("\n")
        vpcs = lines[lines.index('table "VPCs":') + 1:lines.index('table "Quotas":')]
        assert lines[lines.index('table "Quotas":'):] == page.split("\n")[4:]
        assert len(vpcs) > 2 and vpcs[0] == " - Name | ID | Actions"
        ids = [row.split(" | ")[1] for row in vpcs[1:]]
        assert len(set(ids)) == len(ids) and "vpc-bp1x9k2m4n5q7r" in ids
        assert all(len(i) == len("vpc-bp1x9k2m4n5q7r") and i.startswith("vpc-") for i in ids)
