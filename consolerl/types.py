"""Types that cross process (Ray) boundaries between env workers, the rollout service and the
reward service. Frozen, picklable dataclasses; secrets never appear in them."""
from __future__ import annotations

from dataclasses import dataclass, field

from consolerl.page import Page, parse


@dataclass(frozen=True)
class EnvError:
    """An infrastructure failure (not the agent's): the episode is marked env_error and kept
    out of the training signal. ``kind``: signin_failed | signin_locked | browser_crashed |
    navigation_failed | timeout | lease_lost | provision_failed | score_failed |
    worker_failed | worker_lost (the worker's actor died: its process or node was lost) |
    policy_failed | internal."""

    kind: str
    message: str


@dataclass(frozen=True)
class EpisodeSpec:
    """Where an episode starts: a console path (``/console/ecs/instances``) on the cloud's
    console host, the drift profile to sign in with, and the episode's limits. ``id_seed``:
    how the page's elements are numbered (``env_workers.observation.render_snapshot``):
    ``None`` in document order, else from a permutation drawn from this seed, the same for
    the whole episode (an episode that replays another's actions reuses its seed)."""

    start_path: str = "/console/"
    drift: str = ""
    max_steps: int = 30
    max_seconds: float = 600.0
    id_seed: int | None = None


@dataclass(frozen=True)
class Observation:
    """What the agent sees after a step. ``text``: the compact accessibility tree with bids
    (see ``env_workers.observation``); ``screenshot``: image bytes when asked for."""

    url: str
    title: str
    text: str
    focused: str = ""
    last_action_error: str = ""
    step: int = 0
    screenshot: bytes | None = field(default=None, repr=False)
    screenshot_mime: str = ""
    blocked_requests: int = 0       # requests the sandbox refused so far in the episode

    @property
    def page(self) -> Page:
        """The typed page of ``text`` (:func:`consolerl.page.parse`, cached by text); derived,
        so it is no part of what crosses a boundary."""
        return parse(self.text, self.url, self.title)


@dataclass(frozen=True)
class StepResult:
    """The outcome of one action. ``done`` ends the episode: the agent stopped
    (``answer``) or declared the task infeasible (``infeasible``), a limit was hit
    (``truncated``), or the environment failed (``env_error``)."""

    observation: Observation
    done: bool = False
    answer: str | None = None
    infeasible: str | None = None
    truncated: str = ""              # "", "max_steps" or "max_seconds"
    env_error: EnvError | None = None
    action_text: str = ""            # the canonical action that ran ("" when it did not parse)
    elapsed_ms: float = 0.0
