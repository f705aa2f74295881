"""Which task the orchestrator opens its next group on.

GRPO learns from a group only when its rewards differ: a task the policy always solves, or
never does, gives groups with zero advantage everywhere. A task solved with probability p
gives rewards of variance p(1 - p), largest at p = 0.5 and zero at 0 and 1 (a group of n
binary rewards is mixed with probability 1 - p^n - (1 - p)^n). So ``success`` samples tasks
by their recent success estimate, preferring p near 0.5:

- estimate: per task, success (reward >= 1) and failure counts over its recent episodes,
  each older episode weighed by ``1 - 1/window`` once more for every newer one (about the
  last ``window`` episodes count), under a Beta(1, 1) prior:
  ``p = (successes + 1) / (successes + failures + 2)``. A task with no scored episode has
  p = 0.5: as attractive as a task can be.
- weight: ``max(floor, 4 p (1 - p))``, 1 at p = 0.5; a task is picked with probability
  proportional to its weight, with the orchestrator's seeded RNG (the same seed and the same
  outcomes give the same picks). The floor keeps every task in play: one the policy always
  fails (or always solves) is still opened at least ``floor`` times as often as a task at
  p = 0.5, so its estimate follows the policy as it changes.
- first pass: each task is opened once, in suite order, before any is sampled (its prior
  weight is the highest anyway; in order, the groups opened at a run's start, before any
  outcome, cover distinct tasks instead of repeating some).

``round_robin``: the tasks in suite order, each in turn (evaluation: every selected task once
per pass). Estimates are kept in both modes (the metrics show them).
"""
from __future__ import annotations

import random
from collections.abc import Iterable, Sequence

from consolerl.rewards import is_success

CURRICULA = ("success", "round_robin")
# Estimate bands for the metrics: "low" and "high" are where 4 p (1 - p) < 0.64.
LOW, HIGH = 0.2, 0.8
BANDS = ("unscored", "low", "mid", "high")


class Curriculum:
    """Per-run task choice over ``task_ids`` (at least one). ``mode``: one of
    :data:`CURRICULA`; ``floor`` in (0, 1]; ``window`` >= 1 episodes; ``seed`` for the
    sampling (:class:`~rollout_service.orchestrator.OrchestratorConfig` validates them)."""

    def __init__(self, task_ids: Sequence[str], mode: str, floor: float, window: int,
                 seed: int):
        self.task_ids = list(task_ids)
        self.mode = mode
        self.floor = floor
        self.keep = 1.0 - 1.0 / window           # an episode's weight per newer episode
        self.rng = random.Random(seed)
        self._next = 0                           # round robin; the first pass in success mode
        self.successes = dict.fromkeys(self.task_ids, 0.0)
        self.failures = dict.fromkeys(self.task_ids, 0.0)
        self.scored = dict.fromkeys(self.task_ids, 0)   # episodes ever counted, by task

    def estimate(self, task_id: str) -> float:
        """The recent success estimate of ``task_id`` (the Beta posterior's mean)."""
        s, f = self.successes[task_id], self.failures[task_id]
        return (s + 1.0) / (s + f + 2.0)

    def weight(self, task_id: str) -> float:
        p = self.estimate(task_id)
        return max(self.floor, 4.0 * p * (1.0 - p))

    def band(self, task_id: str) -> str:
        """Where the estimate of ``task_id`` lies (one of :data:`BANDS`)."""
        if not self.scored[task_id]:
            return "unscored"
        p = self.estimate(task_id)
        return "low" if p < LOW else "high" if p > HIGH else "mid"

    def pick(self) -> str:
        """The task of the next group."""
        if self.mode == "round_robin" or self._next < len(self.task_ids):
            task_id = self.task_ids[self._next % len(self.task_ids)]
            self._next += 1
            return task_id
        weights = [self.weight(t) for t in self.task_ids]
        return self.rng.choices(self.task_ids, weights)[0]

    def note(self, task_id: str, rewards: Iterable[float]) -> None:
        """Count the scored episodes of a finished group of ``task_id``."""
        for reward in rewards:
            won = is_success(reward)
            self.successes[task_id] = self.successes[task_id] * self.keep + won
            self.failures[task_id] = self.failures[task_id] * self.keep + (not won)
            self.scored[task_id] += 1
