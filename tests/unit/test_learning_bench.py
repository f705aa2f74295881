"""benchmarks.learning's parts on the tiny model: the shared-prefill sampler gives the same
log-likelihoods and greedy replies as plain forwards, rewards compare parsed actions (its
paired bootstrap interval is tested with the other statistics, ``test_stats.py``)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from benchmarks.learning import Sampler, State, reward, spread  # noqa: E402
from rollout_service.models import HFChatTokenizer, cached_tiny_model  # noqa: E402


@pytest.fixture(scope="module")
def tiny():
    from transformers import AutoModelForCausalLM
    path = str(cached_tiny_model())
    return AutoModelForCausalLM.from_pretrained(path), HFChatTokenizer(path)


def test_shared_prefill_matches_plain_forwards(tiny):
    model, tokenizer = tiny
    torch.manual_seed(0)
    prompts = [tuple(range(5, 5 + n)) for n in (7, 3, 11)]
    targets = [(40, 41, 2), (50,), (60, 61)]
    sampler = Sampler(model, tokenizer, eot=2, max_new_tokens=5)
    replies, logliks = sampler.sample(prompts, 2, 1.0, seed=1, greedy=True, targets=targets)
    for p, t, ll, per in zip(prompts, targets, logliks, replies):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([p + t])).logits[0].float()
        lp = torch.log_softmax(logits, dim=-1)
        expected = sum(float(lp[len(p) - 1 + j, tok]) for j, tok in enumerate(t))
        assert ll == pytest.approx(expected, abs=1e-3)
        assert len(per) == 3                              # two samples, then the greedy one
        ids, lps = per[2]
        seq = list(p)
        for tok, l in zip(ids, lps):                      # greedy, step by step, no cache
            with torch.no_grad():
                row = model(input_ids=torch.tensor([seq])).logits[0, -1].float()
            assert tok == int(row.argmax())
            assert l == pytest.approx(float(torch.log_softmax(row, -1)[tok]), abs=1e-3)
            seq.append(tok)


def test_reward_compares_parsed_actions():
    assert reward("I will click it.\nclick(12)", "click(12)") == 1.0
    assert reward("fill(3, 'alice')", 'fill(3, "alice")') == 1.0
    assert reward("click(13)", "click(12)") == 0.0
    assert reward("not an action", "click(12)") == 0.0


def test_rows_that_finish_early_leave_the_cache_without_disturbing_the_others(tiny):
    model, tokenizer = tiny
    sampler = Sampler(model, tokenizer, eot=2, max_new_tokens=6)
    vocab = model.config.vocab_size
    sampler.stop = set(range(0, vocab, 3))           # rows end at different steps
    prompts = [tuple(range(5, 5 + n)) for n in (4, 9, 6, 2)]
    replies, _ = sampler.sample(prompts, 3, 1.0, seed=2, greedy=True)
    lengths = [len(ids) for per in replies for ids, _ in per]
    assert min(lengths) < max(lengths)                # some finished early
    for p, per in zip(prompts, replies):
        ids, lps = per[3]                             # the greedy reply, checked without cache
        seq = list(p)
        for k, (tok, l) in enumerate(zip(ids, lps)):
            with torch.no_grad():
                row = model(input_ids=torch.tensor([seq])).logits[0, -1].float()
            assert tok == int(row.argmax())
            assert l == pytest.approx(float(torch.log_softmax(row, -1)[tok]), abs=1e-3)
            assert (tok in sampler.stop) == (k == len(ids) - 1) or len(ids) == 6
            seq.append(tok)
        for ids, lps in per[:3]:
            assert len(ids) == len(lps) and all(x <= 0 for x in lps)


def test_spread_takes_states_from_every_task_in_turn():
    states = [State(task, "heldout", (i,), "click(1)", (2,))
              for i, task in enumerate("aaaabbc")]
    picked = spread(states, 4)
    assert [s.task_id for s in picked] == ["a", "b", "c", "a"]
    assert [s.prompt_ids for s in picked] == [(0,), (4,), (6,), (1,)]   # file order per task
    assert spread(states, 0) == states and spread(states, 99) == states
