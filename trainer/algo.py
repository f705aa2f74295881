"""GRPO's algorithm as pure functions over tensors: advantages, the training batch, log-probs and
the policy loss. The math is verl's (``verl.trainer.ppo.core_algos``); this module only shapes
console-rl's experience into verl's layout and calls it.

Layout (verl's): one row per turn of every trajectory. Prompts are LEFT-padded to the longest
prompt ``P``, responses RIGHT-padded to the longest response ``R``, so every response starts at
column ``P`` of ``input_ids_BT`` (``T = P + R``) and response token ``j`` is predicted by the
logits at column ``P - 1 + j``. A multi-turn episode is trained turn by turn; every turn carries
its trajectory's advantage on its response tokens (plus its step-level advantage, weighted, when
``AlgoConfig.step_advantage_weight`` is on).

Exactness of the loss across micro-batches and data-parallel ranks (token-mean): each
micro-batch loss is ``sum(loss * mask) / batch_num_tokens * dp_size`` where
``batch_num_tokens`` counts the response tokens of the whole global step (all micro-batches,
all ranks). Summing micro-batch gradients on a rank and averaging across ranks (DDP) then gives
exactly the gradient of the token-mean over the global batch. The seq-mean modes work the same
way with ``batch_num_seqs`` (rows with at least one response token, global).

Shape suffixes: ``N`` trajectories, ``B`` rows (turns), ``T`` columns, ``R`` response columns,
``V`` vocabulary.
"""
from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Annotated

import numpy as np
import torch
import verl.utils.torch_functional as verl_F
from verl.trainer.config import AlgoConfig as VerlAlgoConfig
from verl.trainer.ppo import core_algos
from verl.workers.config import ActorConfig, PolicyLossConfig

from consolerl.config import AtLeast, Between, Checked, OneOf
from consolerl.errors import ConfigError
from consolerl.experience import Group
from consolerl.step_advantage import StepAdvantages, step_advantages

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")
KL_PENALTIES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "k1+", "k3+",
                "low_var_kl+")
ROLLOUT_IS_MODES = ("token", "none")
_ADV_INPUTS = {"token_level_rewards", "response_mask", "index"}
_UNSUPPORTED_POLICY_LOSSES = ("dro",)     # needs policy_loss.dro_beta, which we do not carry


def supported_adv_estimators() -> tuple[str, ...]:
    """verl's registered advantage estimators that need nothing beyond (token_level_rewards,
    response_mask, index): outcome-reward estimators (grpo, rloo, opo, ...); not gae, remax or
    the token-baseline ones, which need values, baselines or log-probs."""
    names = []
    for name, fn in core_algos.ADV_ESTIMATOR_REGISTRY.items():
        params = inspect.signature(fn).parameters.values()
        required = {p.name for p in params if p.default is inspect.Parameter.empty
                    and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
        if required <= _ADV_INPUTS:
            names.append(name)
    return tuple(names)


# verl's registered policy losses this trainer can run.
POLICY_LOSSES = tuple(name for name in core_algos.POLICY_LOSS_REGISTRY
                      if name not in _UNSUPPORTED_POLICY_LOSSES)


@dataclass(frozen=True)
class AlgoConfig(Checked):
    """The GRPO algorithm's knobs (names follow verl's actor/algorithm config).

    ``adv_estimator``: a name from :func:`supported_adv_estimators`; ``norm_adv_by_std``: GRPO's
    division by the group std (False = Dr.GRPO). ``policy_loss``: a name in verl's policy-loss
    registry (all but "dro"); ``clip_ratio_low`` / ``clip_ratio_high``: the PPO clip range ``[1-low, 1+high]``;
    ``clip_ratio_c``: dual-clip bound for negative advantages (> 1). ``loss_agg_mode``: one of
    :data:`LOSS_AGG_MODES`. ``kl_coef`` / ``kl_penalty``: a KL-to-reference loss term (0 = off).
    ``rollout_is``: "token" multiplies each token's loss by the truncated importance weight
    ``min(exp(old - rollout), rollout_is_cap)`` that corrects for the sampler's staleness
    (rollout log-probs come from an older policy version); "none" trusts the recomputed old
    log-probs alone. ``temperature``: the sampling temperature (log-probs are computed under
    ``softmax(logits / temperature)`` to match the rollout's); None, in a root config, is the
    agent's, which the composition root hands in; alone, None is 1. ``epsilon``: the advantage std
    floor.

    Step-level advantages (GiGPO, :mod:`consolerl.step_advantage`): with
    ``step_advantage_weight`` ``w > 0`` a turn's advantage is its trajectory's plus ``w`` times
    its step advantage (its return ``step_gamma ** turns_left * reward`` less the mean return
    of the group's turns taken from the same page state, divided by their std when
    ``norm_adv_by_std``; 0 for a state no other turn of the group was taken from). 0 (the
    default) leaves every advantage exactly the trajectory's. Turns need their states
    (:attr:`~consolerl.experience.Sample.states`, recorded by the orchestrator when the
    setting is on); a sample without them adds no step group.
    """

    adv_estimator: Annotated[str, OneOf(supported_adv_estimators())] = "grpo"
    norm_adv_by_std: bool = True
    policy_loss: Annotated[str, OneOf(POLICY_LOSSES)] = "vanilla"
    clip_ratio_low: Annotated[float, Between(0, 1, high_open=True)] = 0.2
    clip_ratio_high: Annotated[float, AtLeast(0)] = 0.2
    clip_ratio_c: Annotated[float, AtLeast(1, open=True)] = 3.0
    loss_agg_mode: Annotated[str, OneOf(LOSS_AGG_MODES)] = "token-mean"
    kl_coef: Annotated[float, AtLeast(0)] = 0.0
    kl_penalty: Annotated[str, OneOf(KL_PENALTIES)] = "low_var_kl"
    rollout_is: Annotated[str, OneOf(ROLLOUT_IS_MODES)] = "token"
    rollout_is_cap: Annotated[float, AtLeast(1)] = 2.0
    temperature: Annotated[float, AtLeast(0, open=True)] | None = None
    epsilon: Annotated[float, AtLeast(0, open=True)] = 1e-6
    step_advantage_weight: Annotated[float, AtLeast(0)] = 0.0
    step_gamma: Annotated[float, Between(0, 1, low_open=True)] = 0.95

    @property
    def sampling_temperature(self) -> float:
        return 1.0 if self.temperature is None else self.temperature

    @property
    def step_signal_gamma(self) -> float | None:
        """The discount under which a group's turns carry step-level signal (what the
        orchestrator keeps groups for); None when step advantages are off."""
        return self.step_gamma if self.step_advantage_weight > 0 else None


def group_step_advantages(groups: Sequence[Group], config: AlgoConfig
                          ) -> list[StepAdvantages] | None:
    """Each group's :func:`~consolerl.step_advantage.step_advantages` under ``config``'s
    discount and normalisation; None when ``step_advantage_weight`` is 0."""
    if config.step_advantage_weight == 0:
        return None
    return [step_advantages(g.samples, config.step_gamma, config.norm_adv_by_std,
                            config.epsilon) for g in groups]


def trajectory_advantages(rewards_N: torch.Tensor | Sequence[float],
                          group_index_N: Sequence[str], config: AlgoConfig) -> torch.Tensor:
    """One advantage per trajectory from verl's registered estimator ``config.adv_estimator``.

    ``rewards_N``: each trajectory's scalar reward; ``group_index_N``: its group id (trajectories
    of one group share a baseline). The rewards go to verl as a ``[N, 1]`` token_level_rewards
    with a ones response_mask, so each trajectory counts once whatever its number of turns.
    GRPO: ``(r - mean_g) / (std_g + epsilon)`` with torch's unbiased std (without the division
    when ``norm_adv_by_std`` is false); a group whose rewards are all equal gets zeros; note
    that verl gives a group of one sample mean 0 and std 1 (advantage = reward).
    Returns a float32 ``[N]`` tensor.
    """
    rewards = torch.as_tensor(rewards_N, dtype=torch.float32).reshape(-1)
    if rewards.numel() == 0 or rewards.numel() != len(group_index_N):
        raise ConfigError(f"trajectory_advantages: rewards_N ({rewards.numel()}) and "
                          f"group_index_N ({len(group_index_N)}) must be non-empty and of "
                          "equal length")
    if not torch.isfinite(rewards).all():
        raise ConfigError("trajectory_advantages: rewards_N must be finite")
    fn = core_algos.get_adv_estimator_fn(config.adv_estimator)
    params = inspect.signature(fn).parameters
    index = np.empty(len(group_index_N), dtype=object)
    index[:] = list(group_index_N)
    kwargs = {"token_level_rewards": rewards.unsqueeze(-1),
              "response_mask": torch.ones(rewards.numel(), 1), "index": index}
    if "epsilon" in params:
        kwargs["epsilon"] = config.epsilon
    if "norm_adv_by_std_in_grpo" in params:
        kwargs["norm_adv_by_std_in_grpo"] = config.norm_adv_by_std
    if "config" in params:      # estimators without the keyword read it from verl's config
        kwargs["config"] = VerlAlgoConfig(adv_estimator=config.adv_estimator,
                                          norm_adv_by_std_in_grpo=config.norm_adv_by_std)
    advantages, _returns = fn(**kwargs)
    return advantages.reshape(-1).to(torch.float32)


@dataclass(frozen=True)
class TrainBatch:
    """One row per turn, in verl's padded layout (see the module docstring).

    Tensors: ``input_ids_BT`` (long), ``attention_mask_BT`` (long, 1 on real tokens),
    ``position_ids_BT`` (long, ``cumsum(attention) - 1`` clamped at 0: a left-padded row's
    positions equal the unpadded ones), ``responses_BR`` (long), ``response_mask_BR`` (float,
    the turn's loss mask, 0 on padding), ``rollout_logprobs_BR`` (float, the sampler's
    log-probs, 0 on padding), ``advantages_BR`` (float, the turn's advantage times the
    response mask). Per row: ``group_ids``, ``trajectory_ids``, ``versions`` (the policy version
    that sampled the turn). ``prompt_len``: ``P``.

    :meth:`rows`, :meth:`split` and :meth:`micro_batches` re-trim padding columns, keeping the
    response columns' indices: a tensor ``x_BR`` aligned with this batch becomes
    ``x_BR[index][:, :child.response_len]`` for a child built from ``index``.
    """

    input_ids_BT: torch.Tensor
    attention_mask_BT: torch.Tensor
    position_ids_BT: torch.Tensor
    responses_BR: torch.Tensor
    response_mask_BR: torch.Tensor
    rollout_logprobs_BR: torch.Tensor
    advantages_BR: torch.Tensor
    group_ids: list[str]
    trajectory_ids: list[str]
    versions: list[int]
    prompt_len: int

    @property
    def num_rows(self) -> int:
        return int(self.input_ids_BT.shape[0])

    @property
    def response_len(self) -> int:
        return int(self.responses_BR.shape[1])

    def num_tokens(self) -> int:
        """Trained response tokens (the response mask's sum)."""
        return int(self.response_mask_BR.sum().item())

    def num_seqs(self) -> int:
        """Rows with at least one trained token (verl's seq-mean denominator)."""
        return int((self.response_mask_BR.sum(dim=-1) > 0).sum().item())

    def to(self, device: torch.device | str) -> TrainBatch:
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        for name, value in moved.items():
            if isinstance(value, torch.Tensor):
                moved[name] = value.to(device)
        return TrainBatch(**moved)

    def _lengths(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's real prompt and response lengths."""
        p = self.prompt_len
        return (self.attention_mask_BT[:, :p].sum(dim=-1),
                self.attention_mask_BT[:, p:].sum(dim=-1))

    def rows(self, index_list: Sequence[int]) -> TrainBatch:
        """The rows ``index_list`` (in that order), with padding columns no row uses dropped."""
        index = [int(i) for i in index_list]
        if not index or min(index) < -self.num_rows or max(index) >= self.num_rows:
            raise ConfigError(f"TrainBatch.rows: index_list must be non-empty row indices "
                              f"in 0..{self.num_rows - 1}, got {index_list!r}")
        idx = torch.tensor(index, dtype=torch.long)
        prompt_lens, response_lens = self._lengths()
        new_p = int(prompt_lens[idx].max().item())
        new_r = int(response_lens[idx].max().item())
        cols = slice(self.prompt_len - new_p, self.prompt_len + new_r)
        return TrainBatch(
            input_ids_BT=self.input_ids_BT[idx][:, cols],
            attention_mask_BT=self.attention_mask_BT[idx][:, cols],
            position_ids_BT=self.position_ids_BT[idx][:, cols],
            responses_BR=self.responses_BR[idx][:, :new_r],
            response_mask_BR=self.response_mask_BR[idx][:, :new_r],
            rollout_logprobs_BR=self.rollout_logprobs_BR[idx][:, :new_r],
            advantages_BR=self.advantages_BR[idx][:, :new_r],
            group_ids=[self.group_ids[i] for i in index],
            trajectory_ids=[self.trajectory_ids[i] for i in index],
            versions=[self.versions[i] for i in index],
            prompt_len=new_p)

    def split(self, n: int) -> list[TrainBatch]:
        """``n`` shards of consecutive whole rows, sizes differing by at most one (one per
        data-parallel rank). Every rank must get a row, so ``n`` may not exceed the rows."""
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= self.num_rows:
            raise ConfigError(f"TrainBatch.split: n must be an integer in 1..{self.num_rows} "
                              f"(the rows), got {n!r}")
        return [self.rows(part.tolist()) for part in np.array_split(np.arange(self.num_rows), n)]

    def micro_batches(self, max_tokens: int, by_length: bool = False) -> list[TrainBatch]:
        """Row chunks whose padded size ``rows * T`` (after re-trimming) stays within
        ``max_tokens``; a row longer than that alone still makes a chunk of one. Rows in order,
        or with ``by_length`` sorted by their real prompt length first (longest first; then by
        the prompt's tokens, then the response's length), so that rows of like length share a
        chunk and little of it is padding, and rows with the same prompt (a group's samples)
        sit together: a chunk then has a long common prefix for the engine to run once."""
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ConfigError(f"TrainBatch.micro_batches: max_tokens must be an integer >= 1, "
                              f"got {max_tokens!r}")
        prompt_lens, response_lens = (x.tolist() for x in self._lengths())
        order = list(range(self.num_rows))
        if by_length:
            p = self.prompt_len
            prompts = [tuple(self.input_ids_BT[i, p - prompt_lens[i]:p].tolist()) for i in order]
            order.sort(key=lambda i: (-prompt_lens[i], prompts[i], -response_lens[i]))
        chunks: list[list[int]] = []
        max_p = max_r = 0
        for i in order:
            p, r = max(max_p, prompt_lens[i]), max(max_r, response_lens[i])
            if chunks and (len(chunks[-1]) + 1) * (p + r) <= max_tokens:
                chunks[-1].append(i)
                max_p, max_r = p, r
            else:
                chunks.append([i])
                max_p, max_r = prompt_lens[i], response_lens[i]
        return [self.rows(chunk) for chunk in chunks]

    def signal_rows(self) -> list[int]:
        """Rows with a non-zero advantage on some trained token: the only rows whose policy
        loss has a gradient (a group whose samples all scored alike has advantage 0)."""
        live = ((self.advantages_BR != 0) & (self.response_mask_BR > 0)).any(dim=-1)
        return [int(i) for i in torch.nonzero(live).flatten().tolist()]


def build_batch(groups: Sequence[Group], pad_token_id: int, config: AlgoConfig,
                steps: Sequence[StepAdvantages] | None = None) -> TrainBatch:
    """The training batch of ``groups``: one row per turn, advantages from
    :func:`trajectory_advantages` over all samples of all groups at once (index = group id),
    plus ``step_advantage_weight`` times each turn's step advantage when that is > 0
    (``steps``: :func:`group_step_advantages` of ``groups``, computed here when not given).

    A sample without turns still counts in its group's baseline but adds no row. Raises
    :class:`ConfigError` naming the trajectory for a turn with an empty prompt or response, or
    whose response ids, log-probs and loss mask differ in length; and for a repeated group id.
    """
    if isinstance(pad_token_id, bool) or not isinstance(pad_token_id, int) or pad_token_id < 0:
        raise ConfigError(f"build_batch: pad_token_id must be an integer >= 0, "
                          f"got {pad_token_id!r}")
    seen: set[str] = set()
    rewards, index = [], []
    for group in groups:
        if group.group_id in seen:
            raise ConfigError(f"build_batch: group_id {group.group_id!r} appears twice")
        seen.add(group.group_id)
        for sample in group.samples:
            rewards.append(sample.reward)
            index.append(group.group_id)
    if not rewards:
        raise ConfigError("build_batch: groups hold no samples")
    advantages_N = trajectory_advantages(rewards, index, config).tolist()
    if config.step_advantage_weight == 0:
        steps = None
    elif steps is None:
        steps = group_step_advantages(groups, config)
    elif len(steps) != len(groups):
        raise ConfigError(f"build_batch: steps ({len(steps)}) must hold one entry per group "
                          f"({len(groups)})")

    turns, row_adv, group_ids, trajectory_ids, versions = [], [], [], [], []
    n = 0
    for g, group in enumerate(groups):
        for j, sample in enumerate(group.samples):
            for k, turn in enumerate(sample.turns):
                where = f"trajectory {sample.trajectory_id!r} turn {k}"
                if not turn.prompt_ids:
                    raise ConfigError(f"build_batch: {where}: prompt_ids is empty")
                if not turn.response_ids:
                    raise ConfigError(f"build_batch: {where}: response_ids is empty")
                if not len(turn.response_ids) == len(turn.logprobs) == len(turn.loss_mask):
                    raise ConfigError(
                        f"build_batch: {where}: response_ids ({len(turn.response_ids)}), "
                        f"logprobs ({len(turn.logprobs)}) and loss_mask "
                        f"({len(turn.loss_mask)}) must have the same length")
                turns.append(turn)
                row_adv.append(advantages_N[n] if steps is None else advantages_N[n]
                               + config.step_advantage_weight * steps[g].per_sample[j][k])
                group_ids.append(group.group_id)
                trajectory_ids.append(sample.trajectory_id)
                versions.append(int(turn.version))
            n += 1
    if not turns:
        raise ConfigError("build_batch: no sample has a turn")

    b = len(turns)
    p = max(len(t.prompt_ids) for t in turns)
    r = max(len(t.response_ids) for t in turns)
    input_ids = torch.full((b, p + r), pad_token_id, dtype=torch.long)
    attention = torch.zeros((b, p + r), dtype=torch.long)
    mask = torch.zeros((b, r), dtype=torch.float32)
    rollout_lp = torch.zeros((b, r), dtype=torch.float32)
    for i, turn in enumerate(turns):
        lp, lr = len(turn.prompt_ids), len(turn.response_ids)
        input_ids[i, p - lp:p] = torch.tensor(turn.prompt_ids, dtype=torch.long)
        input_ids[i, p:p + lr] = torch.tensor(turn.response_ids, dtype=torch.long)
        attention[i, p - lp:p + lr] = 1
        mask[i, :lr] = torch.tensor(turn.loss_mask, dtype=torch.float32)
        rollout_lp[i, :lr] = torch.tensor(turn.logprobs, dtype=torch.float32)
    return TrainBatch(
        input_ids_BT=input_ids, attention_mask_BT=attention,
        position_ids_BT=(attention.cumsum(dim=-1) - 1).clamp(min=0),
        responses_BR=input_ids[:, p:].clone(), response_mask_BR=mask,
        rollout_logprobs_BR=rollout_lp,
        advantages_BR=torch.tensor(row_adv, dtype=torch.float32).unsqueeze(-1) * mask,
        group_ids=group_ids, trajectory_ids=trajectory_ids, versions=versions, prompt_len=p)


def _response_logits(logits_BTV: torch.Tensor, batch: TrainBatch,
                     temperature: float) -> torch.Tensor:
    """The logits that predict the response tokens. ``logits_BTV`` covers every column, or only
    the last ``R + 1`` (a model called with ``logits_to_keep=R + 1``: the full ``[B, T, V]``
    of a long prompt is most of a step's memory)."""
    b, t = batch.input_ids_BT.shape
    p, r = batch.prompt_len, batch.response_len
    if not temperature > 0:
        raise ConfigError(f"temperature: must be > 0, got {temperature!r}")
    if tuple(logits_BTV.shape[:2]) == (b, t):
        # the logits at column c predict the token at column c + 1
        return logits_BTV[:, p - 1:p + r - 1, :] / temperature
    if tuple(logits_BTV.shape[:2]) == (b, r + 1):
        return logits_BTV[:, :r, :] / temperature
    raise ConfigError(f"logits_BTV: shape {tuple(logits_BTV.shape)} matches neither the "
                      f"batch's [B, T] = {(b, t)} nor its last R + 1 columns {(b, r + 1)}")


def response_logprobs(logits_BTV: torch.Tensor, batch: TrainBatch,
                      temperature: float) -> torch.Tensor:
    """``log softmax(logits / temperature)`` of each response token, ``[B, R]``, from the logits
    at columns ``P-1 .. P+R-2``; 0 on response padding. Differentiable (verl's
    ``logprobs_from_logits``: flash-attn's cross-entropy kernel where installed)."""
    logits_BRV = _response_logits(logits_BTV, batch, temperature)
    logprobs_BR = verl_F.logprobs_from_logits(logits_BRV, batch.responses_BR)
    real_BR = batch.attention_mask_BT[:, batch.prompt_len:].bool()
    return torch.where(real_BR, logprobs_BR, torch.zeros_like(logprobs_BR))


def response_entropy(logits_BTV: torch.Tensor, batch: TrainBatch,
                     temperature: float) -> torch.Tensor:
    """Entropy of ``softmax(logits / temperature)`` at each response position, ``[B, R]``."""
    return verl_F.entropy_from_logits(_response_logits(logits_BTV, batch, temperature))


def _actor_config(config: AlgoConfig, batch: TrainBatch, dp_size: int,
                  batch_num_tokens: int, batch_num_seqs: int | None) -> ActorConfig:
    """verl's actor config for the policy-loss function; ``global_batch_info`` is what verl's
    ``ppo_loss`` fills before calling it, and the loss passes it on to ``agg_loss``."""
    actor = ActorConfig(strategy="fsdp", rollout_n=1,
                        ppo_micro_batch_size_per_gpu=batch.num_rows,
                        clip_ratio=config.clip_ratio_low, clip_ratio_low=config.clip_ratio_low,
                        clip_ratio_high=config.clip_ratio_high,
                        clip_ratio_c=config.clip_ratio_c, loss_agg_mode=config.loss_agg_mode,
                        policy_loss=PolicyLossConfig(loss_mode=config.policy_loss))
    actor.global_batch_info.update(dp_size=dp_size, batch_num_tokens=batch_num_tokens,
                                   global_batch_size=batch_num_seqs, loss_scale_factor=None)
    return actor


def compute_loss(logprobs_BR: torch.Tensor, old_logprobs_BR: torch.Tensor, batch: TrainBatch,
                 config: AlgoConfig, *, batch_num_tokens: int, dp_size: int = 1,
                 batch_num_seqs: int | None = None, ref_logprobs_BR: torch.Tensor | None = None,
                 entropy_BR: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """One micro-batch's share of the global step's loss, and metrics.

    ``logprobs_BR``: :func:`response_logprobs` under the weights being trained (with grad);
    ``old_logprobs_BR``: the same recomputed under the weights before this step's first update
    (the PPO ratio's denominator); ``batch.rollout_logprobs_BR``: the sampler's. The loss is
    verl's ``config.policy_loss`` with ``rollout_is_weights = min(exp(old - rollout), cap)``
    (detached, 0 off the mask; ``rollout_is="token"`` only), plus, when ``kl_coef > 0``,
    ``kl_coef * agg_loss(kl_penalty(logprobs, ref_logprobs_BR))`` (``ref_logprobs_BR`` then
    required).

    ``batch_num_tokens``: response tokens of the whole global step (every micro-batch of every
    rank, :meth:`TrainBatch.num_tokens` of the global batch); ``dp_size``: data-parallel ranks;
    ``batch_num_seqs``: the global :meth:`TrainBatch.num_seqs` (required by the seq-mean
    modes). With them, summing the losses (or gradients) of a rank's micro-batches and averaging
    across ranks equals the loss over the global batch.

    Metrics: ``loss``, ``pg_loss`` and ``kl`` are this micro-batch's shares (sum them over
    micro-batches and average over ranks for the step's value); ``pg_clipfrac``, ``ppo_kl``,
    ``rollout_kl`` (sampler vs. old log-probs), ``is_weight_mean``, ``is_capped_frac`` and
    ``entropy`` (when ``entropy_BR`` is given) are
    means over this micro-batch's tokens.
    """
    shape = tuple(batch.response_mask_BR.shape)
    named = {"logprobs_BR": logprobs_BR, "old_logprobs_BR": old_logprobs_BR,
             "ref_logprobs_BR": ref_logprobs_BR, "entropy_BR": entropy_BR}
    for name, value in named.items():
        if value is not None and tuple(value.shape) != shape:
            raise ConfigError(f"compute_loss: {name} has shape {tuple(value.shape)}, the "
                              f"batch's [B, R] is {shape}")
    if isinstance(dp_size, bool) or not isinstance(dp_size, int) or dp_size < 1:
        raise ConfigError(f"compute_loss: dp_size must be an integer >= 1, got {dp_size!r}")
    if isinstance(batch_num_tokens, bool) or not isinstance(batch_num_tokens, int) \
            or batch_num_tokens < 1:
        raise ConfigError(f"compute_loss: batch_num_tokens must be an integer >= 1 (the "
                          f"global step's response tokens), got {batch_num_tokens!r}")
    if config.loss_agg_mode.startswith("seq-mean") and (
            isinstance(batch_num_seqs, bool) or not isinstance(batch_num_seqs, int)
            or batch_num_seqs < 1):
        raise ConfigError(f"compute_loss: batch_num_seqs must be an integer >= 1 (the global "
                          f"step's rows) with loss_agg_mode {config.loss_agg_mode!r}, "
                          f"got {batch_num_seqs!r}")
    if config.kl_coef > 0 and ref_logprobs_BR is None:
        raise ConfigError("compute_loss: ref_logprobs_BR is required when kl_coef > 0")

    mask_BR = batch.response_mask_BR.to(logprobs_BR.dtype)
    old_BR = old_logprobs_BR.detach()
    with torch.no_grad():
        raw_BR = torch.exp((old_BR - batch.rollout_logprobs_BR).clamp(-20.0, 20.0)) * mask_BR
        is_weights_BR = raw_BR.clamp(max=config.rollout_is_cap)
    actor = _actor_config(config, batch, dp_size, batch_num_tokens, batch_num_seqs)
    pg_loss, pg_metrics = core_algos.get_policy_loss_fn(config.policy_loss)(
        old_log_prob=old_BR, log_prob=logprobs_BR, advantages=batch.advantages_BR,
        response_mask=mask_BR, loss_agg_mode=config.loss_agg_mode, config=actor,
        rollout_is_weights=is_weights_BR if config.rollout_is == "token" else None)
    loss = pg_loss
    metrics = {key.removeprefix("actor/"): float(value) for key, value in pg_metrics.items()}
    metrics["pg_loss"] = float(pg_loss.detach())
    metrics["kl"] = 0.0
    if config.kl_coef > 0:
        kld_BR = core_algos.kl_penalty(logprob=logprobs_BR, ref_logprob=ref_logprobs_BR.detach(),
                                       kl_penalty=config.kl_penalty)
        kl = core_algos.agg_loss(loss_mat=kld_BR, loss_mask=mask_BR,
                                 loss_agg_mode=config.loss_agg_mode, **actor.global_batch_info)
        loss = loss + config.kl_coef * kl
        metrics["kl"] = float(kl.detach())
    metrics["loss"] = float(loss.detach())
    metrics["is_weight_mean"] = float(verl_F.masked_mean(is_weights_BR, mask_BR)) \
        if config.rollout_is == "token" else 1.0
    # KL(sampler || trainer before the step), k1 estimate on the sampled tokens.
    metrics["rollout_kl"] = float(verl_F.masked_mean(batch.rollout_logprobs_BR - old_BR,
                                                     mask_BR))
    metrics["is_capped_frac"] = float(verl_F.masked_mean(
        (raw_BR > config.rollout_is_cap).float(), mask_BR))
    if entropy_BR is not None:
        metrics["entropy"] = float(verl_F.masked_mean(entropy_BR.detach(), mask_BR))
    return loss, metrics
