"""benchmarks.dose: a turn's scores equal a plain forward's (tiny model), answer verbs are
scored up to their opening quote, a trajectory's probability is the product of its turns' and
the mixed-group share follows from it; near temperature 0 the predicted success is the greedy
fit."""
from __future__ import annotations

import json
import math

import pytest

torch = pytest.importorskip("torch")

from benchmarks.dose import measure, scored_length, summarize, turn_scores  # noqa: E402
from rollout_service.models import HFChatTokenizer, cached_tiny_model  # noqa: E402
from trainer.sft import IGNORE  # noqa: E402


@pytest.fixture(scope="module")
def tiny():
    from transformers import AutoModelForCausalLM
    path = str(cached_tiny_model())
    return path, AutoModelForCausalLM.from_pretrained(path), HFChatTokenizer(path)


def test_turn_scores_match_a_plain_forward(tiny):
    _, model, _ = tiny
    prompt, response = list(range(5, 17)), [40, 41, 42, 2]
    ids, labels = prompt + response, [IGNORE] * len(prompt) + response
    greedy, logps = turn_scores(model, ids, labels, 2, [1.0, 0.5])
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    rows = logits[len(prompt) - 1:len(ids) - 1]
    for T in (1.0, 0.5):
        lp = torch.log_softmax(rows / T, dim=-1)
        assert logps[T] == pytest.approx(float(lp[0, 40] + lp[1, 41]), abs=1e-3)
    assert greedy == bool((rows.argmax(-1) == torch.tensor(response)).all())


def test_answer_verbs_count_up_to_the_quote(tiny):
    _, _, tokenizer = tiny
    answer = tokenizer.encode('report_infeasible("the Clone button is on no page")')
    k = scored_length(answer, tokenizer)
    assert 0 < k < len(answer)
    assert tokenizer.decode(answer[:k]).startswith('report_infeasible("')
    assert not tokenizer.decode(answer[:k - 1]).startswith('report_infeasible("')
    click = tokenizer.encode("click(12)")
    assert scored_length(click, tokenizer) == len(click)


def test_summary_multiplies_turns_and_predicts_mixed_groups():
    scores = {1: [(True, {1.0: math.log(0.5)}), (True, {1.0: math.log(0.5)})],   # p = 0.25
              2: [(True, {1.0: 0.0})]}                                            # p = 1
    out = summarize(scores, [1, 2], [1.0], 4)["1.0"]
    assert out["predicted_success"] == pytest.approx((0.25 + 1.0) / 2, abs=1e-4)
    mixed_1 = 1 - 0.25 ** 4 - 0.75 ** 4                   # a certain task is never mixed
    assert out["predicted_mixed_groups"] == pytest.approx(mixed_1 / 2, abs=1e-4)
    assert out["turn_p_mean"] == pytest.approx((0.5 + 0.5 + 1.0) / 3, abs=1e-4)


def test_near_zero_temperature_success_is_the_greedy_fit(tiny, tmp_path):
    path, _, _ = tiny
    data = tmp_path / "data.jsonl"
    records = []
    for n, task in enumerate(("ecs-a-0", "ecs-b-1", "oss-c-wrongdoc")):
        turns = [{"messages": [{"role": "user", "content": f"page {n} step {i}"}],
                  "completion": f"click({n + i})"} for i in range(2)]
        records.append({"task_id": task, "reward": 1.0, "turns": turns})
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = measure("tiny", path, data, [0.01, 1.0], 4, 512)
    assert out["turns"] == 6
    assert out["by_source"]["procedure"]["trajectories"] == 2
    assert out["by_source"]["wrong-doc"]["trajectories"] == 1
    cold, warm = out["by_temperature"]["0.01"], out["by_temperature"]["1.0"]
    assert cold["predicted_success"] == pytest.approx(out["greedy_trajectories"], abs=0.01)
    assert cold["predicted_mixed_groups"] == pytest.approx(0.0, abs=0.01)
    for figures in (cold, warm):
        assert 0.0 <= figures["predicted_success"] <= 1.0
        assert 0.0 <= figures["predicted_mixed_groups"] <= 1.0
    # a random tiny model: the teacher's actions are unlikely at temperature 1
    assert warm["turn_p_mean"] < 0.5 and not math.isnan(warm["turn_p_mean"])


def test_the_learning_checks_files_give_turn_fit_and_procedure_following(tiny, tmp_path,
                                                                         capsys):
    from benchmarks.dose import main
    from consolerl.types import Observation
    from rollout_service.agent import COMPACT_SYSTEM_PROMPT, build_messages
    path, _, tokenizer = tiny
    page = ('# Users\n[8] link "Create User"\n[12] link "Refresh"\nform "User":\n'
            ' [20] textbox "Logon Name"\n [21] textbox "Comments"')
    procedure = "1. Click Create User.\n2. Enter bob-7 as the logon name."
    records = []
    for n, completion in enumerate(("click(8)", 'fill(20, "bob-7")')):
        messages = build_messages("Create a user", procedure, [],
                                  Observation(f"http://c/{n}", "Users", page), 2000,
                                  COMPACT_SYSTEM_PROMPT)
        turn = {"messages": messages, "completion": completion, "action_error": "",
                "prompt_ids": tokenizer.apply_chat_template(messages),
                "response_ids": tokenizer.encode(completion)}
        records.append({"task_id": f"ram-create-user-{n}", "agent": {"max_new_tokens": 4},
                        "turns": [turn]})
    run = tmp_path / "learning-check"
    run.mkdir()
    (run / "sft-data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run / "heldout-states.jsonl").write_text(json.dumps(records[1]) + "\n")
    assert main(["--json", "--data", str(run / "sft-data.jsonl"), "--temperatures", "1.0",
                 "--model", f"tiny={path}"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["states"] == str(run / "heldout-states.jsonl")
    assert out["turn_fit"] == out["models"][0]["greedy_turns"] and 0 <= out["turn_fit"] <= 1
    # the fill turn: a label swap (Comments) and a value swap, beside the recorded prompt
    assert out["probe_states"] == {"states": 1, "variants": 2, "label": 1, "value": 1,
                                   "original_ids_match": 1}
    for key in ("procedure_following", "procedure_following_original"):
        assert 0.0 <= out[key] <= 1.0 and out[key] == out["models"][0][key]
    (run / "heldout-states.jsonl").unlink()               # no state file: no probe
    assert main(["--json", "--data", str(run / "sft-data.jsonl"), "--temperatures", "1.0",
                 "--model", f"tiny={path}"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["states"] is None and out["procedure_following"] is None
    assert main(["--json", "--data", str(run / "sft-data.jsonl"), "--model", f"tiny={path}",
                 "--states", str(run / "missing.jsonl")]) == 2
