"""An episode of the one runner, stepped from outside: ``reset`` (lease, provision, open the
start page), ``step`` (one action), ``end`` (score, clean up, release: the outcome).

For loops that are not one policy call from the first page to the last: SRC (:mod:`datagen.src`)
interleaves the student's segments, the teacher's reviews and rollbacks over episodes it ends
where it chooses. The episode still runs through :meth:`EpisodeRunner.run` (a scripted policy
that passes on what the loop sends), so provisioning, scoring and clean-up are the runner's and
nothing else's::

    episode = SteppedEpisode(runner, env, task, max_steps=12)
    try:
        opened = await episode.reset()            # None: the episode could not start
        if opened is None:
            outcome = await episode.end()
        else:
            result = await episode.step("click(4)")
            outcome = await episode.end(result)   # or Halt("why"): ends without an answer
    finally:
        await episode.close()

A broken env worker is a value too: ``step`` answers a result with ``env_error`` (done), and
``end`` gives the runner's outcome, which says what broke.
"""
from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from consolerl.tasks import Task
from consolerl.types import EnvError, Observation, StepResult

from .episode import EpisodeOutcome, EpisodeRunner, Halt, StepFn, _WorkerFailed, scripted_policy


@dataclass(frozen=True)
class Opened:
    """An episode's start: its values (prerequisites' names and ids) and the start page."""

    values: Mapping[str, str]
    observation: Observation


@dataclass(frozen=True)
class _Act:
    text: str
    reply: asyncio.Future[StepResult]


@dataclass(frozen=True)
class _End:
    final: StepResult | Halt | None
    failure: Exception | None = None


class SteppedEpisode:
    """One episode of ``runner`` on ``env`` for ``task``, driven a step at a time (see the
    module docstring). ``max_steps``: the env worker's step limit; ``seed``: the episode's;
    ``id_seed``: how the page's elements are numbered (``EpisodeSpec.id_seed``): an episode
    that replays another's actions passes that episode's, so their ids name the same
    elements."""

    def __init__(self, runner: EpisodeRunner, env: Any, task: Task, *, max_steps: int,
                 seed: int = 0, id_seed: int | None = None):
        self.runner, self.env, self.task = runner, env, task
        self.max_steps, self.seed, self.id_seed = max_steps, seed, id_seed
        self._inbox: asyncio.Queue[_Act | _End] = asyncio.Queue()
        self._opened: asyncio.Future[Opened] | None = None
        self._run: asyncio.Task[EpisodeOutcome] | None = None
        self._last: Observation | None = None

    async def reset(self) -> Opened | None:
        """Start the episode: its values and start page, or ``None`` when it ended before the
        page opened (no account, a provisioning error: :meth:`end` gives the outcome)."""
        if self._run is not None:
            raise RuntimeError("SteppedEpisode.reset: the episode has already started")
        self._opened = asyncio.get_running_loop().create_future()
        self._run = asyncio.create_task(self.runner.run(
            self.env, self.task, scripted_policy(self._script), max_steps=self.max_steps,
            seed=self.seed, id_seed=self.id_seed))
        await asyncio.wait({self._opened, self._run}, return_when=asyncio.FIRST_COMPLETED)
        if not self._opened.done():
            return None
        opened = self._opened.result()
        self._last = opened.observation
        return opened

    async def step(self, action_text: str) -> StepResult:
        """Send one action; its result. The episode over (a broken env worker): a result with
        ``env_error``."""
        run = self._started("step")
        reply: asyncio.Future[StepResult] = asyncio.get_running_loop().create_future()
        self._inbox.put_nowait(_Act(action_text, reply))
        await asyncio.wait({reply, run}, return_when=asyncio.FIRST_COMPLETED)
        if reply.done():
            result = reply.result()
            self._last = result.observation
            return result
        return self._broken(EnvError("internal", "the episode ended before the step"))

    async def end(self, final: StepResult | Halt | None = None) -> EpisodeOutcome:
        """End the episode: ``final`` is the last step's result (the agent's stop or report, a
        limit) or a :class:`Halt` (no answer); scored and cleaned up by the runner."""
        return await self._finish(_End(final))

    async def fail(self, error: Exception) -> EpisodeOutcome:
        """End the episode because the loop driving it broke (``error``): the runner records it
        as it records a policy that raised (an env error, never the agent's failure)."""
        return await self._finish(_End(None, error))

    async def close(self) -> None:
        """Stop an episode that was not ended (the loop was cancelled): the runner's clean-up
        runs as it does for any cancelled episode."""
        if self._run is not None and not self._run.done():
            self._run.cancel()
            await asyncio.gather(self._run, return_exceptions=True)

    # ---- inside the runner ------------------------------------------------------------------
    async def _script(self, task: Task, values: Mapping[str, str], step: StepFn,
                      observation: Observation) -> StepResult | Halt:
        assert self._opened is not None
        self._opened.set_result(Opened(dict(values), observation))
        last = StepResult(observation)
        while True:
            message = await self._inbox.get()
            if isinstance(message, _End):
                if message.failure is not None:
                    raise message.failure
                return message.final if message.final is not None else last
            try:
                last = await step(message.text)
            except BaseException as exc:
                # The runner decides what a failed step means (a lost worker, a cancelled
                # episode); the loop hears that the episode is over.
                error = exc.error if isinstance(exc, _WorkerFailed) else EnvError(
                    "internal", f"{type(exc).__name__}: {str(exc)[:300]}")
                message.reply.set_result(self._broken(error))
                raise
            message.reply.set_result(last)

    def _started(self, what: str) -> asyncio.Task[EpisodeOutcome]:
        if self._run is None:
            raise RuntimeError(f"SteppedEpisode.{what}: reset first")
        return self._run

    def _broken(self, error: EnvError) -> StepResult:
        assert self._last is not None
        return StepResult(self._last, done=True, env_error=error)

    async def _finish(self, message: _End) -> EpisodeOutcome:
        run = self._started("end")
        if not run.done():
            self._inbox.put_nowait(message)
        return await run
