"""trainer.algo on tiny hand-computed tensors: verl's advantages per trajectory, the padded
layout, response log-probs, the policy loss (clipping, importance weights, KL) and its exactness
across micro-batches and data-parallel shards."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from consolerl.errors import ConfigError
from consolerl.experience import Turn
from consolerl.experience import Group, Sample
from trainer.algo import (LOSS_AGG_MODES, AlgoConfig, TrainBatch, build_batch, compute_loss,
                          response_entropy, response_logprobs, supported_adv_estimators,
                          trajectory_advantages)

CFG = AlgoConfig()


def close(tensor: torch.Tensor, expected, atol: float = 1e-5) -> None:
    torch.testing.assert_close(tensor.double(), torch.tensor(expected, dtype=torch.float64),
                               atol=atol, rtol=0)


def turn(prompt, response, logprobs=None, mask=None, version=0) -> Turn:
    logprobs = [-0.5] * len(response) if logprobs is None else logprobs
    mask = [1] * len(response) if mask is None else mask
    return Turn(tuple(prompt), tuple(response), tuple(logprobs), tuple(mask), version, "", "")


def group(group_id: str, *samples: tuple[str, float, list[Turn]]) -> Group:
    return Group(group_id, "task", tuple(Sample(tid, tuple(turns), reward)
                                          for tid, reward, turns in samples))


# ----------------------------------------------------------------------------- config


@pytest.mark.parametrize("field, value, words", [
    ("adv_estimator", "gae", ["adv_estimator", "grpo", "rloo"]),
    ("policy_loss", "nope", ["policy_loss", "vanilla", "gspo"]),
    ("policy_loss", "dro", ["policy_loss"]),
    ("loss_agg_mode", "token-sum", ["loss_agg_mode", "seq-mean-token-mean"]),
    ("kl_penalty", "full", ["kl_penalty", "low_var_kl"]),
    ("rollout_is", "seq", ["rollout_is", "token", "none"]),
    ("clip_ratio_c", 1.0, ["clip_ratio_c", "> 1"]),
    ("clip_ratio_low", 1.0, ["clip_ratio_low"]),
    ("rollout_is_cap", 0.5, ["rollout_is_cap", ">= 1"]),
    ("temperature", 0.0, ["temperature", "> 0"]),
    ("epsilon", 0.0, ["epsilon"]),
    ("kl_coef", -0.1, ["kl_coef"]),
    ("norm_adv_by_std", 1, ["norm_adv_by_std"]),
])
def test_config_rejects_bad_values_naming_field(field, value, words):
    with pytest.raises(ConfigError) as err:
        AlgoConfig(**{field: value})
    assert isinstance(err.value, ValueError)
    for word in words:
        assert word in str(err.value)


def test_supported_estimators_are_the_outcome_ones():
    names = supported_adv_estimators()
    assert {"grpo", "rloo", "grpo_vectorized", "rloo_vectorized"} <= set(names)
    assert not {"gae", "remax", "optimal_token_baseline"} & set(names)


# ----------------------------------------------------------------------------- advantages


def test_grpo_advantages_hand_computed_with_unbiased_std():
    adv = trajectory_advantages([1, 0, 0, 1, 1, 1, 1, 1], ["a"] * 4 + ["b"] * 4, CFG)
    std = math.sqrt(1 / 3)      # torch.std is unbiased: sum((r - 0.5)^2) / (4 - 1)
    x = 0.5 / (std + 1e-6)
    assert adv.tolist() == pytest.approx([x, -x, -x, x, 0, 0, 0, 0], abs=1e-6)
    assert x == pytest.approx(0.8660, abs=1e-4)           # not 1.0, the population-std value


def test_advantages_without_std_and_rloo():
    index = ["a"] * 4
    assert trajectory_advantages([1, 0, 0, 1], index, AlgoConfig(norm_adv_by_std=False)) \
        .tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5])
    # RLOO: r_i - mean of the others = (r_i - mean) * n / (n - 1)
    assert trajectory_advantages([1, 0, 0, 1], index, AlgoConfig(adv_estimator="rloo")) \
        .tolist() == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3])


def test_advantages_bad_input():
    with pytest.raises(ConfigError, match="equal length"):
        trajectory_advantages([1.0, 0.0], ["a"], CFG)
    with pytest.raises(ConfigError, match="finite"):
        trajectory_advantages([float("nan"), 0.0], ["a", "a"], CFG)


def test_multi_turn_trajectory_counts_once():
    three = [turn([1, 2], [3]), turn([1, 2, 3, 4], [5, 6]), turn([7], [8])]
    batch = build_batch([group("g", ("A", 1.0, three), ("B", 0.0, [turn([1], [2])]))], 0, CFG)
    # two trajectories [1, 0]: mean 0.5, std sqrt(0.5); counted per turn ([1,1,1,0]) it would
    # be mean 0.75
    x = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert batch.trajectory_ids == ["A", "A", "A", "B"]
    per_row = (batch.advantages_BR.sum(-1) / batch.response_mask_BR.sum(-1)).tolist()
    assert per_row == pytest.approx([x, x, x, -x], abs=1e-6)


# ----------------------------------------------------------------------------- layout


def layout_batch() -> TrainBatch:
    g = group("g1",
              ("t1", 1.0, [turn([5, 6, 7], [8, 9], [-0.1, -0.2], version=3)]),
              ("t2", 0.0, [turn([3], [4, 4, 4], [-0.3, -0.4, -0.5], [1, 0, 1], version=4)]))
    return build_batch([g], pad_token_id=0, config=CFG)


def test_build_batch_layout():
    b = layout_batch()
    assert b.prompt_len == 3 and b.response_len == 3 and b.num_rows == 2
    assert b.input_ids_BT.dtype == torch.long
    assert b.input_ids_BT.tolist() == [[5, 6, 7, 8, 9, 0], [0, 0, 3, 4, 4, 4]]
    assert b.attention_mask_BT.tolist() == [[1, 1, 1, 1, 1, 0], [0, 0, 1, 1, 1, 1]]
    assert b.position_ids_BT.tolist() == [[0, 1, 2, 3, 4, 4], [0, 0, 0, 1, 2, 3]]
    assert b.responses_BR.tolist() == [[8, 9, 0], [4, 4, 4]]
    assert b.response_mask_BR.tolist() == [[1, 1, 0], [1, 0, 1]]
    close(b.rollout_logprobs_BR, [[-0.1, -0.2, 0], [-0.3, -0.4, -0.5]])
    x = 0.5 / (math.sqrt(0.5) + 1e-6)
    close(b.advantages_BR, [[x, x, 0], [-x, 0, -x]])
    assert (b.group_ids, b.trajectory_ids, b.versions) == (["g1", "g1"], ["t1", "t2"], [3, 4])
    assert b.num_tokens() == 4 and b.num_seqs() == 2


def test_rows_retrims_padding_keeping_response_columns():
    b = layout_batch()
    one = b.rows([1])
    assert one.prompt_len == 1 and one.response_len == 3
    assert one.input_ids_BT.tolist() == [[3, 4, 4, 4]]
    assert one.position_ids_BT.tolist() == [[0, 1, 2, 3]]
    assert one.response_mask_BR.tolist() == [[1, 0, 1]]
    first = b.rows([0])
    assert first.input_ids_BT.tolist() == [[5, 6, 7, 8, 9]]
    close(first.rollout_logprobs_BR, [[-0.1, -0.2]])
    assert b.rows([1, 0]).trajectory_ids == ["t2", "t1"]
    with pytest.raises(ConfigError, match="index_list"):
        b.rows([])


@pytest.mark.parametrize("bad_turn, words", [
    (turn([1], []), ["'bad-traj'", "response_ids is empty"]),
    (turn([], [2]), ["'bad-traj'", "prompt_ids is empty"]),
    (turn([1], [2, 3], [-0.1]), ["'bad-traj'", "logprobs (1)", "same length"]),
    (turn([1], [2, 3], None, [1]), ["'bad-traj'", "loss_mask (1)"]),
])
def test_build_batch_bad_turn_names_trajectory(bad_turn, words):
    g = group("g", ("ok", 1.0, [turn([1], [2])]), ("bad-traj", 0.0, [turn([1], [2]), bad_turn]))
    with pytest.raises(ConfigError) as err:
        build_batch([g], 0, CFG)
    for word in words:
        assert word in str(err.value)


def test_build_batch_bad_inputs():
    g = group("g", ("a", 1.0, [turn([1], [2])]))
    with pytest.raises(ConfigError, match="appears twice"):
        build_batch([g, g], 0, CFG)
    with pytest.raises(ConfigError, match="pad_token_id"):
        build_batch([g], -1, CFG)
    with pytest.raises(ConfigError, match="no samples"):
        build_batch([], 0, CFG)
    with pytest.raises(ConfigError, match="no sample has a turn"):
        build_batch([group("g", ("a", 1.0, []))], 0, CFG)


# ----------------------------------------------------------------------------- log-probs


def test_response_logprobs_hand_values():
    b = build_batch([group("g", ("a", 1.0, [turn([0, 2], [1, 2])]))], 0, CFG)   # P=2, R=2
    logits = torch.zeros(1, 4, 3)
    logits[0, 1] = torch.tensor([0.0, math.log(3), 0.0])     # column P-1 predicts token 1
    logits[0, 2] = torch.tensor([0.0, 0.0, math.log(2)])     # column P predicts token 2
    logits[0, 3] = torch.tensor([9.0, 9.0, 9.0])             # the last column is never used
    close(response_logprobs(logits, b, 1.0), [[math.log(3 / 5), math.log(2 / 4)]])
    s3, s2 = math.sqrt(3), math.sqrt(2)                        # temperature 2 halves the logits
    close(response_logprobs(logits, b, 2.0), [[math.log(s3 / (2 + s3)), math.log(s2 / (2 + s2))]])
    ent = response_entropy(logits, b, 1.0)
    p = torch.tensor([1, 3, 1]) / 5
    assert ent[0, 0].item() == pytest.approx(-(p * p.log()).sum().item())


def test_response_logprobs_matches_log_softmax_at_the_right_columns():
    torch.manual_seed(0)
    b = layout_batch()
    logits = torch.randn(2, 6, 10)
    got = response_logprobs(logits, b, 0.7)
    for i in range(2):
        for j in range(3):
            real = b.attention_mask_BT[i, 3 + j].item() == 1
            want = torch.log_softmax(logits[i, 2 + j] / 0.7, -1)[b.responses_BR[i, j]].item()
            assert got[i, j].item() == pytest.approx(want if real else 0.0, abs=1e-6)
    # Only the last R + 1 columns (a model called with logits_to_keep=R+1): the same values.
    assert torch.equal(response_logprobs(logits[:, -4:], b, 0.7), got)
    with pytest.raises(ConfigError, match="logits_BTV"):
        response_logprobs(logits[:, :5], b, 1.0)


# ----------------------------------------------------------------------------- loss


def one_row(adv: list[float], rollout: list[float]) -> TrainBatch:
    b = build_batch([group("g", ("a", 0.0, [turn([1], [2] * len(adv), rollout)]))], 0, CFG)
    return dataclasses.replace(b, advantages_BR=torch.tensor([adv]))


def test_loss_at_ratio_one_is_minus_mean_advantage():
    b = layout_batch()
    lp = b.rollout_logprobs_BR.clone().requires_grad_()
    loss, m = compute_loss(lp, lp.detach(), b, CFG, batch_num_tokens=b.num_tokens())
    want = -(b.advantages_BR * b.response_mask_BR).sum() / b.response_mask_BR.sum()
    assert loss.item() == pytest.approx(want.item(), abs=1e-6)
    assert m["pg_loss"] == pytest.approx(want.item(), abs=1e-6)
    assert (m["pg_clipfrac"], m["ppo_kl"], m["kl"]) == (0.0, 0.0, 0.0)
    assert m["is_weight_mean"] == pytest.approx(1.0)
    loss.backward()                    # d/dlp of -A*exp(lp-old)/N at ratio 1 is -A/N
    close(lp.grad, (-b.advantages_BR / 4).tolist())


def test_loss_clipping_hand_computed():
    old = [-1.0, -1.0, -1.0]
    b = one_row([1.0, -1.0, -1.0], old)
    ratios = torch.tensor([[1.5, 0.5, 4.0]])
    lp = (torch.tensor([old]) + ratios.log()).requires_grad_()
    loss, m = compute_loss(lp, torch.tensor([old]), b, CFG, batch_num_tokens=3)
    # token 0: A=+1, ratio 1.5 clipped to 1.2 -> -1.2; token 1: A=-1, ratio 0.5 -> max(0.5,
    # 0.8) = 0.8; token 2: A=-1, ratio 4 -> max(4, 1.2) = 4, dual-clipped to clip_ratio_c = 3
    assert loss.item() == pytest.approx((-1.2 + 0.8 + 3.0) / 3, abs=1e-5)
    assert m["pg_clipfrac"] == pytest.approx(2 / 3, abs=1e-6)
    assert m["pg_clipfrac_lower"] == pytest.approx(1 / 3, abs=1e-6)
    loss.backward()
    assert lp.grad.abs().max().item() == 0.0      # every token is clipped: no gradient
    wide = AlgoConfig(clip_ratio_low=0.6, clip_ratio_high=0.6, clip_ratio_c=10.0)
    loss, _ = compute_loss(lp, torch.tensor([old]), b, wide, batch_num_tokens=3)
    assert loss.item() == pytest.approx((-1.5 + 0.5 + 4.0) / 3, abs=1e-5)


def test_rollout_importance_weights_are_capped():
    old = torch.tensor([[-1.0, -1.0, -1.0]])
    # exp(old - rollout): 3 (capped to 2), 1.5, and 100 on a masked-out token
    rollout = [-1.0 - math.log(3), -1.0 - math.log(1.5), -1.0 - math.log(100)]
    b = one_row([1.0, 1.0, 1.0], rollout)
    b = dataclasses.replace(b, response_mask_BR=torch.tensor([[1.0, 1.0, 0.0]]),
                            advantages_BR=torch.tensor([[1.0, 1.0, 0.0]]))
    lp = old.clone().requires_grad_()
    loss, m = compute_loss(lp, old, b, CFG, batch_num_tokens=2)
    assert loss.item() == pytest.approx(-(2.0 + 1.5) / 2, abs=1e-5)
    assert m["is_weight_mean"] == pytest.approx(1.75, abs=1e-5)
    assert m["is_capped_frac"] == pytest.approx(0.5)
    loss.backward()
    close(lp.grad, [[-1.0, -0.75, 0.0]])        # the weights are detached
    loss, m = compute_loss(lp, old, b, AlgoConfig(rollout_is="none"), batch_num_tokens=2)
    assert loss.item() == pytest.approx(-1.0, abs=1e-6)
    assert m["is_weight_mean"] == 1.0


def test_kl_term_only_with_positive_coef():
    old = torch.tensor([[-1.0, -2.0]])
    b = one_row([1.0, -1.0], old[0].tolist())
    ref = old + math.log(2)            # low_var_kl per token: 2 - ln 2 - 1
    pg, m0 = compute_loss(old.clone(), old, b, CFG, batch_num_tokens=2, ref_logprobs_BR=ref)
    assert m0["kl"] == 0.0 and pg.item() == pytest.approx(0.0, abs=1e-6)
    cfg = AlgoConfig(kl_coef=0.1)
    loss, m = compute_loss(old.clone(), old, b, cfg, batch_num_tokens=2, ref_logprobs_BR=ref)
    assert m["kl"] == pytest.approx(1 - math.log(2), abs=1e-5)
    assert loss.item() == pytest.approx(pg.item() + 0.1 * (1 - math.log(2)), abs=1e-5)
    k1 = AlgoConfig(kl_coef=0.5, kl_penalty="k1")
    loss, m = compute_loss(old.clone(), old, b, k1, batch_num_tokens=2, ref_logprobs_BR=ref)
    assert m["kl"] == pytest.approx(-math.log(2), abs=1e-5)
    with pytest.raises(ConfigError, match="ref_logprobs_BR"):
        compute_loss(old.clone(), old, b, cfg, batch_num_tokens=2)


def test_loss_bad_arguments():
    b = layout_batch()
    lp = b.rollout_logprobs_BR
    with pytest.raises(ConfigError, match="batch_num_tokens"):
        compute_loss(lp, lp, b, CFG, batch_num_tokens=0)
    with pytest.raises(ConfigError, match="dp_size"):
        compute_loss(lp, lp, b, CFG, batch_num_tokens=4, dp_size=0)
    with pytest.raises(ConfigError, match="old_logprobs_BR"):
        compute_loss(lp, lp[:, :2], b, CFG, batch_num_tokens=4)
    with pytest.raises(ConfigError, match="batch_num_seqs"):
        compute_loss(lp, lp, b, AlgoConfig(loss_agg_mode="seq-mean-token-mean"),
                     batch_num_tokens=4)


# ----------------------------------------------------------------------------- exactness

V = 12


def ragged_batch() -> TrainBatch:
    """Seven rows of assorted prompt/response lengths, masks with holes, random rollout
    log-probs (so importance weights vary and some are capped)."""
    gen = torch.Generator().manual_seed(1)

    def t(p, r, hole=False):
        ids = torch.randint(1, V, (p + r,), generator=gen).tolist()
        lps = (-torch.rand(r, generator=gen) * 8).tolist()
        mask = [0 if hole and k == 1 else 1 for k in range(r)]
        return turn(ids[:p], ids[p:], lps, mask)

    g1 = group("g1", ("a", 1.0, [t(3, 2), t(6, 1)]), ("b", 0.0, [t(2, 4, hole=True)]),
               ("c", 0.5, [t(5, 3)]))
    g2 = group("g2", ("d", 0.0, [t(1, 5)]), ("e", 1.0, [t(4, 2, hole=True), t(7, 3)]))
    return build_batch([g1, g2], 0, CFG)


class Bigram:
    """A model whose logits depend on the token and its position: logits = W[id] + E[pos]."""

    def __init__(self, w: torch.Tensor, e: torch.Tensor):
        self.w, self.e = w, e

    def logprobs(self, batch: TrainBatch, temperature: float) -> torch.Tensor:
        logits_BTV = self.w[batch.input_ids_BT] + self.e[batch.position_ids_BT]
        return response_logprobs(logits_BTV, batch, temperature)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_micro_batches_and_dp_shards_reproduce_full_loss_and_gradient(mode):
    torch.manual_seed(0)
    cfg = AlgoConfig(loss_agg_mode=mode, kl_coef=0.05, temperature=0.8, clip_ratio_high=0.28)
    w = torch.randn(V, V, requires_grad=True)
    e = (0.3 * torch.randn(16, V)).requires_grad_()
    model = Bigram(w, e)
    old_model = Bigram((w + 0.4 * torch.randn(V, V)).detach(), e.detach())
    ref_model = Bigram((w + 0.2 * torch.randn(V, V)).detach(), e.detach())
    full = ragged_batch()
    tokens, seqs = full.num_tokens(), full.num_seqs()

    def loss_of(b: TrainBatch, dp_size: int) -> tuple[torch.Tensor, dict[str, float]]:
        with torch.no_grad():
            old, ref = old_model.logprobs(b, 0.8), ref_model.logprobs(b, 0.8)
        return compute_loss(model.logprobs(b, 0.8), old, b, cfg, batch_num_tokens=tokens,
                            dp_size=dp_size, batch_num_seqs=seqs, ref_logprobs_BR=ref)

    full_loss, metrics = loss_of(full, 1)
    assert 0 < metrics["pg_clipfrac"] < 1 and 0 < metrics["is_capped_frac"] < 1
    assert metrics["kl"] > 0
    full_grad = torch.autograd.grad(full_loss, [w, e])
    assert full_grad[0].abs().sum() > 0 and full_grad[1].abs().sum() > 0

    micro = full.micro_batches(max_tokens=20)
    assert len(micro) >= 3
    micro_loss = sum(loss_of(b, 1)[0] for b in micro)
    micro_grad = torch.autograd.grad(micro_loss, [w, e])
    assert micro_loss.item() == pytest.approx(full_loss.item(), abs=1e-5)
    for a, b in zip(micro_grad, full_grad):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)

    rank_losses, rank_grads = [], []
    for shard in full.split(2):                 # each rank: its own micro-batches, summed
        loss = sum(loss_of(b, 2)[0] for b in shard.micro_batches(max_tokens=20))
        rank_losses.append(loss.item())
        rank_grads.append(torch.autograd.grad(loss, [w, e]))
    assert sum(rank_losses) / 2 == pytest.approx(full_loss.item(), abs=1e-5)
    for k in range(2):                          # DDP averages gradients across ranks
        torch.testing.assert_close((rank_grads[0][k] + rank_grads[1][k]) / 2, full_grad[k],
                                   atol=1e-5, rtol=1e-4)


# ----------------------------------------------------------------------------- partitions


def real_rows(b: TrainBatch) -> list[tuple[tuple[int, ...], tuple[float, ...]]]:
    out = []
    for i in range(b.num_rows):
        ids = b.input_ids_BT[i][b.attention_mask_BT[i].bool()]
        real_R = b.attention_mask_BT[i, b.prompt_len:].bool()
        out.append((tuple(ids.tolist()), tuple(b.advantages_BR[i][real_R].tolist()),
                    tuple(b.response_mask_BR[i][real_R].tolist()), b.trajectory_ids[i]))
    return out


@pytest.mark.parametrize("n", [1, 2, 3, 7])
def test_split_covers_every_row_once(n):
    full = ragged_batch()
    shards = full.split(n)
    assert len(shards) == n
    sizes = [s.num_rows for s in shards]
    assert max(sizes) - min(sizes) <= 1
    assert [r for s in shards for r in real_rows(s)] == real_rows(full)
    assert [t for s in shards for t in s.trajectory_ids] == full.trajectory_ids
    assert sum(s.num_tokens() for s in shards) == full.num_tokens()
    with pytest.raises(ConfigError, match="split"):
        full.split(8)


@pytest.mark.parametrize("max_tokens", [1, 9, 20, 40, 1000])
def test_micro_batches_cover_every_row_once_within_budget(max_tokens):
    full = ragged_batch()
    micro = full.micro_batches(max_tokens)
    assert [r for m in micro for r in real_rows(m)] == real_rows(full)
    assert sum(m.num_tokens() for m in micro) == full.num_tokens()
    for m in micro:
        assert m.num_rows == 1 or m.num_rows * m.input_ids_BT.shape[1] <= max_tokens
    if max_tokens == 1:
        assert len(micro) == full.num_rows
    if max_tokens == 1000:
        assert len(micro) == 1
    with pytest.raises(ConfigError, match="max_tokens"):
        full.micro_batches(0)


@pytest.mark.parametrize("max_tokens", [9, 20, 40])
def test_micro_batches_by_length_cover_every_row_once_with_less_padding(max_tokens):
    full = ragged_batch()
    micro = full.micro_batches(max_tokens, by_length=True)
    assert sorted(r for m in micro for r in real_rows(m)) == sorted(real_rows(full))
    assert sum(m.num_tokens() for m in micro) == full.num_tokens()
    for m in micro:
        assert m.num_rows == 1 or m.num_rows * m.input_ids_BT.shape[1] <= max_tokens
    prompts = [int(m.attention_mask_BT[:, :m.prompt_len].sum(dim=-1).max()) for m in micro]
    assert prompts == sorted(prompts, reverse=True)        # longest prompts first


def test_micro_batches_by_length_pad_less_when_lengths_alternate():
    def t(p):
        return turn(list(range(1, p + 1)), [3], [-1.0], [1])

    b = build_batch([group("g", *[(f"s{i}", float(i % 2), [t(30 if i % 2 else 2)])
                                  for i in range(6)])], 0, CFG)

    def padded(micro):
        return sum(m.input_ids_BT.numel() for m in micro)
    assert padded(b.micro_batches(64)) == 3 * 2 * 31               # (short, long) x 3
    # (long, long), (long, short), (short, short): 2 x 31 + 2 x 31 + 2 x 3
    assert padded(b.micro_batches(64, by_length=True)) == 130


def test_signal_rows_are_the_rows_with_a_nonzero_advantage():
    # g1 rewards 1, 0, 0.5 (all advantages non-zero); g2 all 1.0: advantage 0 everywhere.
    def t(p, r):
        return turn(list(range(1, p + 1)), list(range(1, r + 1)), [-1.0] * r, [1] * r)

    g1 = group("g1", ("a", 1.0, [t(3, 2), t(6, 1)]), ("b", 0.0, [t(2, 4)]))
    g2 = group("g2", ("d", 1.0, [t(1, 5)]), ("e", 1.0, [t(4, 2), t(7, 3)]))
    b = build_batch([g1, g2], 0, CFG)
    assert b.signal_rows() == [0, 1, 2]
    uniform = build_batch([g2], 0, CFG)
    assert uniform.signal_rows() == []


def test_rows_without_signal_left_out_give_the_same_loss_and_gradient():
    """What skip_zero_advantage relies on: the batch's denominators with only the signal
    rows give exactly the whole batch's loss and gradient."""
    torch.manual_seed(0)
    w = torch.randn(V, V, requires_grad=True)
    e = (0.3 * torch.randn(16, V)).requires_grad_()
    model = Bigram(w, e)

    def t(p, r):
        ids = torch.randint(1, V, (p + r,)).tolist()
        return turn(ids[:p], ids[p:], (-torch.rand(r) * 4).tolist(), [1] * r)

    g1 = group("g1", ("a", 1.0, [t(3, 2), t(6, 1)]), ("b", 0.0, [t(2, 4)]))
    g2 = group("g2", ("d", 1.0, [t(1, 5)]), ("e", 1.0, [t(4, 2), t(7, 3)]))
    full = build_batch([g1, g2], 0, CFG)
    tokens, seqs = full.num_tokens(), full.num_seqs()
    for mode in LOSS_AGG_MODES:
        cfg = AlgoConfig(loss_agg_mode=mode)

        def loss(b):
            lp = model.logprobs(b, 1.0)
            return compute_loss(lp, lp.detach(), b, cfg, batch_num_tokens=tokens,
                                batch_num_seqs=seqs)[0]

        whole = loss(full)
        part = loss(full.rows(full.signal_rows()))
        assert part.item() == pytest.approx(whole.item(), abs=1e-6)
        for a, b in zip(torch.autograd.grad(whole, [w, e]), torch.autograd.grad(part, [w, e])):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_micro_batches_by_length_keep_rows_with_one_prompt_together():
    # Two groups whose prompts have the same length but differ; rows interleaved in the batch.
    def t(first, r):
        return turn([first] + list(range(2, 21)), list(range(1, r + 1)), [-1.0] * r, [1] * r)

    b = build_batch([group("a", ("a0", 1.0, [t(7, 3)]), ("a1", 0.0, [t(7, 1)])),
                     group("b", ("b0", 1.0, [t(9, 2)]), ("b1", 0.0, [t(9, 4)]))], 0, CFG)
    order = b.rows([0, 2, 1, 3])                   # a, b, a, b
    micro = order.micro_batches(2 * 24, by_length=True)
    firsts = [{int(m.input_ids_BT[i, m.prompt_len - 20]) for i in range(m.num_rows)}
              for m in micro]
    assert firsts == [{7}, {9}]                    # each chunk one prompt: shared to the end
