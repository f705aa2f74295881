"""Step-level advantages of a GRPO group (GiGPO: Feng et al. 2025, "Group-in-Group Policy
Optimization for LLM Agent Training"), as pure functions over a group's samples.

Within one group, the turns taken from the same environment state (an *anchor state*: equal
:attr:`consolerl.experience.Sample.states` keys, whichever episode and however often) form a
*step group*. A turn's *step return* is its episode's reward discounted by the turns left:
``gamma ** (T - 1 - k) * reward`` for turn ``k`` of ``T`` (the last turn gets the reward).
Its *step advantage* is that return normalised within its step group, as GRPO normalises
episode rewards: ``(R - mean) / (std + epsilon)`` with the unbiased std (``R - mean`` without
``norm_by_std``).

- A step group of one turn (a state no other turn was taken from) has no baseline: its step
  advantage is 0, as is that of a turn whose state is unknown (empty key).
- A step group whose returns are all equal gets zeros exactly (no rounding residue).

So a group whose episodes all scored alike still carries a step signal where two episodes
pass through one state and then take paths of different lengths to the same reward (with
``gamma < 1``), or where episodes with different rewards share a state.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from consolerl.errors import ConfigError
from consolerl.experience import Sample


@dataclass(frozen=True)
class StepAdvantages:
    """``per_sample``: one step advantage per turn of each sample, in order; ``group_sizes``:
    the size of each step group of two or more turns formed; ``turns``: the turns counted;
    ``nonzero``: the turns whose step advantage is not 0."""

    per_sample: tuple[tuple[float, ...], ...]
    group_sizes: tuple[int, ...]
    turns: int
    nonzero: int


def step_returns(turns: int, reward: float, gamma: float) -> list[float]:
    """Each turn's discounted return, ``gamma ** (turns - 1 - k) * reward``."""
    return [reward * gamma ** (turns - 1 - k) for k in range(turns)]


def _states(sample: Sample) -> tuple[str, ...]:
    if not sample.states:
        return ("",) * len(sample.turns)
    if len(sample.states) != len(sample.turns):
        raise ConfigError(f"step advantages: trajectory {sample.trajectory_id!r} has "
                          f"{len(sample.states)} states for {len(sample.turns)} turns")
    return sample.states


def step_advantages(samples: Sequence[Sample], gamma: float, norm_by_std: bool = True,
                    epsilon: float = 1e-6) -> StepAdvantages:
    """The step advantages of one group's ``samples`` (see the module docstring)."""
    if not 0 < gamma <= 1:
        raise ConfigError(f"step advantages: gamma must be in (0, 1], got {gamma!r}")
    returns = [step_returns(len(s.turns), s.reward, gamma) for s in samples]
    members: dict[str, list[tuple[int, int]]] = {}
    for i, sample in enumerate(samples):
        for k, key in enumerate(_states(sample)):
            if key:
                members.setdefault(key, []).append((i, k))
    out = [[0.0] * len(s.turns) for s in samples]
    sizes = []
    for where in members.values():
        if len(where) < 2:
            continue
        sizes.append(len(where))
        values = [returns[i][k] for i, k in where]
        if max(values) == min(values):
            continue
        mean = math.fsum(values) / len(values)
        std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))
        for (i, k), v in zip(where, values):
            out[i][k] = (v - mean) / (std + epsilon) if norm_by_std else v - mean
    flat = [a for row in out for a in row]
    return StepAdvantages(tuple(tuple(row) for row in out), tuple(sizes), len(flat),
                          sum(a != 0 for a in flat))


def has_step_signal(samples: Sequence[Sample], gamma: float) -> bool:
    """Whether some turn of the group has a non-zero step advantage (normalising changes
    no zero into a non-zero, so ``norm_by_std`` does not matter)."""
    return step_advantages(samples, gamma, norm_by_std=False).nonzero > 0
