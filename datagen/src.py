"""Teacher-guided data: Speculative Rollback Correction (SRC) and step-level review, through the
one episode runner.

SRC (``mode: src``), per task attempt: the student (the model, through the agent's own prompt)
acts in speculative segments of ``segment_steps`` actions. After each segment the teacher
reviews it (one query): progress broke when an action failed, the plan got no further, the
teacher cannot tell what to do from the page reached (or only "back to the start page"), or
the student ended the episode where the teacher would not have. Only then does the teacher
localise the first harmful deviation (one query per action it looks at): the first action that
differs from its own and did not move the plan forward. Rollback keeps the useful prefix: the
episode ends (cleaned up as every episode), a new one is provisioned, the kept actions are
replayed in it (their values carried over to the new episode's names; its elements numbered
as in the attempt's first episode: one ``EpisodeSpec.id_seed`` per attempt when the agent's
``random_ids`` is on), and the teacher's correction is sent where the deviation was; the
student goes on from there. ``max_rollbacks`` bounds the corrections of one attempt. Each
episode is a stepped episode of the runner (:class:`rollout_service.stepped.SteppedEpisode`):
the loop here sends every action and ends the episode where it chooses, with a value
(:class:`rollout_service.episode.Halt` for a rollback), the runner scoring and cleaning up as
it does every episode.

Replay fidelity: after a replay, the page must equal the page the deviation was made on,
compared with what differs between two episodes by design taken out (the episode's names and
values, cloud ids, numbers of 5+ digits, times, the signed-in account's name).

Step-level review (``mode: step``, DAgger-style): the teacher labels every state the student
reaches (one query per action); the student's action is the one sent; a label that differs
from it is a correction.

Kept for SFT: every correction (the prompt the student saw at the state, the teacher's action)
and, in a quality-diversity archive, the attempts the verifier passed (the reward service's
rule over the audit log: status ``solved`` or ``infeasible_reported``): per task at most
``archive_per_task`` trajectories with distinct action paths. The JSON lines are those of
:mod:`datagen.export` (``source`` ``src-archive`` | ``step-archive`` | ``correction``),
so :mod:`trainer.sft` trains on them as they are.
"""
from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, Protocol

from consolerl.config import Between, Checked, OneOf
from consolerl.resources import fill
from consolerl.tasks import Task
from consolerl.page import comparable
from consolerl.types import Observation, StepResult
from env_workers.pool import LeasedEnvWorker
from env_workers.worker import WorkerConfig
from reward_service.service import RewardService

from rollout_service.agent import AgentConfig, AgentLoop, SamplingParams, _Step, history_entry, recent_history
from rollout_service.episode import EpisodeOutcome, EpisodeRunner, Halt, episode_id_seed
from rollout_service.stepped import SteppedEpisode
from .export import (ExportConfig, RecordedTurn, Recording, account_secrets, build_record,
                     check_no_secrets, select_tasks, start_services, stop_services)
from rollout_service.models import HFChatTokenizer
from .teacher import ROUTE, OracleTeacher, Proposal, Teacher, TeacherSession, start_url_of

MODES = ("src", "step")
KEPT = ("solved", "infeasible_reported")


@dataclass(frozen=True)
class SRCConfig(Checked):
    """``mode``: src | step; ``segment_steps``: the student's actions between two reviews
    (SRC); ``max_rollbacks``: corrections of one attempt (SRC); ``max_steps``: actions of an
    episode, replayed ones included; ``archive_per_task``: distinct verifier-passing paths
    kept per task."""

    mode: Annotated[str, OneOf(MODES)] = "src"
    segment_steps: Annotated[int, Between(1, 50)] = 2
    max_rollbacks: Annotated[int, Between(0, 20)] = 3
    max_steps: Annotated[int, Between(1, 200)] = 10
    archive_per_task: Annotated[int, Between(1, 100)] = 3


# ---- the student ----------------------------------------------------------------------------
@dataclass(frozen=True)
class StudentAction:
    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0


class Student(Protocol):
    """Chooses the next action from what the agent sees (title, filled procedure, the history
    window, the page); ``seed`` fixes its sampling. ``values`` and ``past`` (every action of
    the episode so far) are for scripted students; a model sees only the agent's prompt."""

    async def act(self, task: Task, procedure: str, history: Sequence[_Step],
                  observation: Observation, seed: int, values: Mapping[str, str],
                  past: Sequence[RecordedTurn]) -> StudentAction: ...


class ModelStudent:
    """The policy through the agent loop's prompt (page cut included) and sampling."""

    def __init__(self, policy: Any, tokenizer: HFChatTokenizer, config: AgentConfig):
        self.loop = AgentLoop(policy, tokenizer, config)
        self.config = config

    async def act(self, task: Task, procedure: str, history: Sequence[_Step],
                  observation: Observation, seed: int, values: Mapping[str, str],
                  past: Sequence[RecordedTurn]) -> StudentAction:
        cfg = self.config
        ids = self.loop.prompt_ids(task.title, procedure, history, observation)
        if ids is None:
            return StudentAction('stop("prompt too long")')
        gen = await self.loop.policy.generate(
            ids, SamplingParams(cfg.max_new_tokens, cfg.temperature, cfg.top_p, seed))
        text = self.loop.tokenizer.decode(list(gen.token_ids), skip_special_tokens=True)
        return StudentAction(text, len(ids), len(gen.token_ids))


class PerturbedOracle:
    """A calibration student: the oracle's next action (read from the page, following every
    action of the episode), except that with probability ``rate`` (seeded per state) it does
    something else: a wrong click, a wrong value, going back, or stopping early. Its
    deviations are known, so what SRC and step-level review make of them can be checked."""

    def __init__(self, rate: float = 0.3):
        self.rate = rate
        self.teacher = OracleTeacher()

    async def act(self, task: Task, procedure: str, history: Sequence[_Step],
                  observation: Observation, seed: int, values: Mapping[str, str],
                  past: Sequence[RecordedTurn]) -> StudentAction:
        first = past[0].observation if past else observation    # the episode's opening page
        session = self.teacher.session(task, values, start_url_of(task, values, first))
        for i, t in enumerate(past):
            after = past[i + 1].observation if i + 1 < len(past) else observation
            session.observe(t.observation, t.action_text,
                            StepResult(replace(after, last_action_error=t.action_error)))
        proposal = session.next_action(observation)
        rng = random.Random(f"{task.id}:{seed}:{len(past)}")
        if proposal is not None and rng.random() >= self.rate:
            return StudentAction(proposal.action)
        controls = [n for n in observation.page.controls() if not n.inline]
        bids = [n.bid for n in controls if n.role in ("link", "button", "textbox")]
        kind = rng.choice(("click", "fill", "back", "stop"))
        if kind == "click" and bids:
            return StudentAction(f"click({rng.choice(bids)})")
        if kind == "fill":
            box = next((n for n in controls if n.role == "textbox"), None)
            if box:
                return StudentAction(f'fill({box.bid}, "wrong-value")')
        if kind == "stop":
            return StudentAction('stop("done")')
        return StudentAction("go_back()")


# ---- replay across episodes -----------------------------------------------------------------
def generalize(text: str, values: Mapping[str, str]) -> str:
    """``text`` with the episode's values (4+ characters, longest first) as ``{name}``."""
    for name, value in sorted(values.items(), key=lambda kv: -len(kv[1])):
        if len(value) >= 4:
            text = text.replace(value, "{" + name + "}")
    return text


def normalize_page(text: str, values: Mapping[str, str]) -> str:
    """A page with what differs between two episodes of the same state taken out: the
    episode's own values (:func:`generalize`), then ids, times, the account and long numbers
    (:func:`consolerl.page.comparable`)."""
    return comparable(generalize(text, values))


# ---- one task -------------------------------------------------------------------------------
@dataclass
class Turn:
    """An action of an attempt: the state it was chosen on and who chose it."""

    turn: RecordedTurn
    source: str                   # replay | student | teacher
    teacher: str | None           # the teacher's proposal on that state (None: none / not asked)
    progress_before: int
    progress_after: int


@dataclass
class Correction:
    task_id: str
    observation: Observation
    history: tuple[_Step, ...]
    action: str                   # the teacher's
    student: str                  # what the student did there
    values: dict[str, str] = field(default_factory=dict)   # its episode's


@dataclass
class TaskRun:
    """What one task attempt produced (possibly over several episodes: rollbacks)."""

    task: Task
    mode: str
    status: str = ""
    episodes: int = 0
    queries: int = 0
    rollbacks: int = 0
    deviated: bool = False
    replays: int = 0
    replay_matches: int = 0
    corrections: list[Correction] = field(default_factory=list)
    final: list[Turn] = field(default_factory=list)
    values: dict[str, str] = field(default_factory=dict)
    outcome: EpisodeOutcome | None = None
    student_tokens: int = 0
    env_s: float = 0.0

    @property
    def passed(self) -> bool:
        return self.status in KEPT and not (self.outcome and self.outcome.broken_prerequisites)


def same_action(a: str | None, b: str) -> bool:
    """Two actions that do the same: equal, or both end the episode the same way (the
    answer's words do not matter)."""
    if a is None:
        return False
    ends = ("stop(", "report_infeasible(")
    return a == b or any(a.startswith(e) and b.startswith(e) for e in ends)


def _ending(result: StepResult) -> StepResult | Halt:
    """How an episode ends on a result that ends it: that result (the agent's answer, a
    limit), or, when the environment broke, a halt there (the episode ends without an answer,
    as a scripted agent's that got stuck)."""
    if result.env_error is not None:
        return Halt(f"environment failed: {result.env_error.kind}")
    return result


class Attempt:
    """One episode of a task attempt (:meth:`play`): replay ``prefix`` (generalized action
    texts with who chose them), send ``correction`` if any, then the student under review,
    until the episode ends or a harmful deviation is to be rolled back (``rollback_at``)."""

    def __init__(self, collector: "Collector", run: TaskRun, prefix: list[tuple[str, str]],
                 correction: str | None, target_page: str | None, seed: int):
        self.c, self.run, self.prefix = collector, run, prefix
        self.correction, self.target_page, self.seed = correction, target_page, seed
        self.turns: list[Turn] = []
        self.history: list[_Step] = []
        self.rollback_at: int | None = None      # index in turns of the harmful deviation
        self.rollback_action: str | None = None

    async def play(self, task: Task, values: Mapping[str, str], observation: Observation,
                   step: Callable[[str], Awaitable[StepResult]]) -> StepResult | Halt:
        """Act in the episode from its start page ``observation`` through ``step``; how it
        ends: the last result, or a :class:`Halt` (a rollback, no correction left, a broken
        environment)."""
        c, run = self.c, self.run
        run.values = dict(values)
        session = c.teacher.session(task, values, start_url_of(task, values, observation))
        obs = [observation]
        last: list[StepResult] = [StepResult(observation)]
        hist_turns = c.agent.history_turns

        async def send(text: str, source: str, teacher: Proposal | None) -> StepResult:
            before = obs[0]
            shown = tuple(recent_history(self.history, hist_turns))
            p0 = session.progress(before)
            result = await step(text)
            session.observe(before, result.action_text, result)   # bookkeeping, not a query
            self.history.append(history_entry(text, result))
            obs[0], last[0] = result.observation, result
            self.turns.append(Turn(RecordedTurn(before, shown, text, result.action_text,
                                                result.observation.last_action_error),
                                   source, teacher.action if teacher else None, p0,
                                   session.progress(result.observation)))
            return result

        # 1. the kept prefix, replayed with this episode's values, then the correction
        for text, source in self.prefix:
            result = await send(fill(text, values), source, None)
            if result.done or result.env_error is not None:
                return _ending(result)
        if self.target_page is not None:          # a rollback: is this its state?
            run.replays += 1
            run.replay_matches += normalize_page(obs[0].text, values) == self.target_page
        if self.correction is not None:
            result = await send(fill(self.correction, values), "teacher", None)
            if result.done or result.env_error is not None:
                return _ending(result)
        # 2. the student, reviewed
        segment: list[int] = []
        while len(self.turns) < c.config.max_steps:
            before = obs[0]
            label = None
            if c.config.mode == "step":
                label = await session.propose(before)
                run.queries += 1
            act = await c.student.act(task, fill(task.procedure, values),
                                      recent_history(self.history, hist_turns), before,
                                      self.seed * 1000 + len(self.turns), values,
                                      [t.turn for t in self.turns])
            run.student_tokens += act.prompt_tokens + act.completion_tokens
            # What the teacher would do here, kept for the review (asked and counted only
            # when the review finds progress broken: see _localise).
            shadow = label if label is not None else await session.propose(before)
            result = await send(act.text, "student", shadow)
            self.turns[-1].teacher = shadow.action if shadow else None
            if result.env_error is not None:
                return _ending(result)
            if c.config.mode == "step":
                if label is not None and not same_action(label.action, result.action_text):
                    run.deviated = True
                    run.corrections.append(Correction(
                        task.id, before, self.turns[-1].turn.history, label.action,
                        result.action_text, dict(values)))
                if result.done:
                    return result
                continue
            segment.append(len(self.turns) - 1)
            if len(segment) < c.config.segment_steps and not result.done and \
                    len(self.turns) < c.config.max_steps:
                continue
            run.queries += 1                                         # the review
            if not await self._broken(session, segment, obs[0], result):
                if result.done:
                    return result
                segment = []
                continue
            at = self._localise(segment)
            if at is None:                      # every action was the teacher's own
                if result.done:
                    return result
                segment = []
                continue
            run.deviated = True
            bad = self.turns[at]
            if bad.teacher is None or run.rollbacks >= c.config.max_rollbacks:
                if result.done:
                    return result
                return Halt(f"harmful deviation at action {at + 1} and no correction left"
                            if bad.teacher is not None else
                            f"harmful deviation at action {at + 1}: the teacher is lost")
            run.corrections.append(Correction(task.id, bad.turn.observation, bad.turn.history,
                                              bad.teacher, bad.turn.action_text or
                                              bad.turn.text, dict(values)))
            self.rollback_at, self.rollback_action = at, bad.teacher
            return Halt(f"rollback to action {at + 1}")
        return last[0]

    async def _broken(self, session: TeacherSession, segment: list[int], now: Observation,
                      result: StepResult) -> bool:
        turns = [self.turns[i] for i in segment]
        if any(t.turn.action_error for t in turns):
            return True
        if result.done:
            # Ended where the teacher would have ended it (its final action) or not.
            last = turns[-1]
            return not same_action(last.teacher, last.turn.action_text)
        followed = all(same_action(t.teacher, t.turn.action_text) for t in turns)
        if turns[-1].progress_after <= turns[0].progress_before and not followed:
            return True
        ahead = await session.propose(now)
        return ahead is None or ahead.op == ROUTE and ahead.action.startswith("goto(")

    def _localise(self, segment: list[int]) -> int | None:
        """The first action of the segment that differs from the teacher's and did not move
        the plan forward (one teacher query per action looked at); ``None`` when the student
        did what the teacher would have done throughout; the last one that differed when each
        of those moved the plan forward."""
        for i in segment:
            t = self.turns[i]
            self.run.queries += 1
            same = same_action(t.teacher, t.turn.action_text)
            if not same and (t.turn.action_error or t.progress_after <= t.progress_before
                             or t.teacher is None or t.teacher.startswith(
                                 ("stop(", "report_infeasible("))
                             or t.turn.action_text.startswith(("stop(", "report_infeasible("))):
                return i
        differed = [i for i in segment
                    if not same_action(self.turns[i].teacher, self.turns[i].turn.action_text)]
        return differed[-1] if differed else None


class Collector:
    """Runs task attempts (SRC or step-level) on an env, each episode of an attempt a
    :class:`SteppedEpisode` of ``runner``."""

    def __init__(self, runner: EpisodeRunner, teacher: Teacher, student: Student,
                 agent: AgentConfig, config: SRCConfig):
        self.runner, self.teacher, self.student = runner, teacher, student
        self.agent, self.config = agent, config

    async def attempt(self, env: Any, task: Task, seed: int = 0) -> TaskRun:
        run = TaskRun(task, self.config.mode)
        prefix: list[tuple[str, str]] = []
        correction: str | None = None
        target: str | None = None
        # One numbering of the page's elements for every episode of the attempt: the kept
        # actions replayed after a rollback name elements by the ids the first episode showed.
        id_seed = episode_id_seed(self.agent.random_ids, f"{self.config.mode}:{task.id}", seed)
        while True:
            attempt = Attempt(self, run, prefix, correction, target, seed)
            t0 = time.monotonic()
            outcome = await self._episode(env, task, seed, attempt, id_seed)
            run.env_s += time.monotonic() - t0
            run.episodes += 1
            if outcome.env_error is not None or attempt.rollback_at is None:
                run.outcome, run.status, run.final = outcome, outcome.status, attempt.turns
                return run
            run.rollbacks += 1
            at = attempt.rollback_at
            kept = attempt.turns[:at]
            prefix = [(generalize(t.turn.action_text or t.turn.text, run.values), t.source)
                      for t in kept]
            correction = generalize(attempt.rollback_action or "", run.values)
            target = normalize_page(attempt.turns[at].turn.observation.text, run.values)

    async def _episode(self, env: Any, task: Task, seed: int, attempt: Attempt,
                       id_seed: int | None = None) -> EpisodeOutcome:
        """One episode of an attempt: opened, played, ended (scored and cleaned up) by the
        runner; ``id_seed``: the attempt's numbering of the page's elements."""
        episode = SteppedEpisode(self.runner, env, task, max_steps=self.config.max_steps + 2,
                                 seed=seed, id_seed=id_seed)
        try:
            opened = await episode.reset()
            if opened is None:                  # the environment failed before the page
                return await episode.end()
            try:
                final = await attempt.play(task, opened.values, opened.observation,
                                           episode.step)
            except Exception as exc:  # noqa: BLE001 - the student or teacher broke, not the agent
                return await episode.fail(exc)
            return await episode.end(final)
        finally:
            await episode.close()


# ---- records --------------------------------------------------------------------------------
def path_key(run: TaskRun) -> tuple[str, ...]:
    return tuple(generalize(t.turn.action_text or t.turn.text, run.values) for t in run.final)


class Archive:
    """Verifier-passing attempts, at most ``per_task`` distinct action paths per task."""

    def __init__(self, per_task: int):
        self.per_task = per_task
        self.paths: dict[str, set[tuple[str, ...]]] = {}
        self.runs: list[TaskRun] = []
        self.drifts: set[str] = set()

    def offer(self, run: TaskRun) -> bool:
        if not run.passed or not run.final:
            return False
        seen = self.paths.setdefault(run.task.id, set())
        key = path_key(run)
        if key in seen or len(seen) >= self.per_task:
            return False
        seen.add(key)
        self.runs.append(run)
        self.drifts.add(run.task.drift or "none")
        return True


def trajectory_record(run: TaskRun, tokenizer: HFChatTokenizer, agent: AgentConfig
                      ) -> dict[str, Any] | None:
    """An archived attempt as an export record (every action of its final episode)."""
    recording = Recording(dict(run.values), [t.turn for t in run.final])
    record = build_record(run.task, run.status, recording, tokenizer, agent)
    if record is None:
        return None
    record["source"] = f"{run.mode}-archive"
    for turn, t in zip(record["turns"], run.final):
        turn["chosen_by"] = t.source
    return record


def correction_record(run: TaskRun, c: Correction, tokenizer: HFChatTokenizer,
                      agent: AgentConfig) -> dict[str, Any] | None:
    """A correction as a one-turn record: the student's prompt there, the teacher's action."""
    recording = Recording(dict(c.values), [RecordedTurn(c.observation, c.history, c.action,
                                                        c.action, "")])
    record = build_record(run.task, "correction", recording, tokenizer, agent)
    if record is None:
        return None
    record["source"] = "correction"
    record["reward"] = 0.0
    record["turns"][0]["student"] = c.student
    return record


def summarize(runs: Sequence[TaskRun], archive: Archive) -> dict[str, Any]:
    """The figures of a collection (see benchmarks.src)."""
    attempts = len(runs)
    passed = [r for r in runs if r.passed]
    deviated = [r for r in runs if r.deviated]
    replays = sum(r.replays for r in runs)
    return {
        "attempts": attempts,
        "trajectories": len(passed),
        "archived": len(archive.runs),
        "archive_drift_kinds": sorted(archive.drifts),
        "archive_tasks": len(archive.paths),
        "corrections": sum(len(r.corrections) for r in runs),
        "teacher_queries": sum(r.queries for r in runs),
        "teacher_queries_per_trajectory": round(sum(r.queries for r in runs) / attempts, 3)
        if attempts else None,
        "teacher_queries_per_passing_trajectory": round(
            sum(r.queries for r in runs) / len(passed), 3) if passed else None,
        "deviated": len(deviated),
        "recovered": sum(r.passed for r in deviated),
        "recovery_rate": round(sum(r.passed for r in deviated) / len(deviated), 3)
        if deviated else None,
        "rollbacks": sum(r.rollbacks for r in runs),
        "episodes": sum(r.episodes for r in runs),
        "replays": replays,
        "replay_fidelity": round(sum(r.replay_matches for r in runs) / replays, 4)
        if replays else None,
        "env_errors": sum(1 for r in runs if r.status == "env_error"),
        "student_tokens": sum(r.student_tokens for r in runs),
        "env_s": round(sum(r.env_s for r in runs), 1),
        "statuses": {s: sum(1 for r in runs if r.status == s)
                     for s in sorted({r.status for r in runs})},
    }




# ---- a collection ---------------------------------------------------------------------------
@dataclass(frozen=True)
class CollectConfig:
    """A collection over tasks: ``split``/``tasks`` select them (as the export does),
    ``attempts_per_task`` student attempts each (seeds 0..n-1), on ``workers`` browsers;
    ``out``: the JSONL of corrections and archived trajectories ("" writes none)."""

    src: SRCConfig = field(default_factory=SRCConfig)
    split: str = "train"
    tasks: str = ""
    attempts_per_task: int = 1
    workers: int = 2
    out: str = ""
    cloud_endpoint: str = ""
    console_url: str = ""                      # "" = http://<cloud endpoint>
    redis_url: str = ""
    accounts_file: str = ""
    lease_prefix: str = "consolerl:src:pool"


def _progress(msg: str) -> None:
    print(f"[src] {msg}", file=sys.stderr, flush=True)


async def run_collection(config: CollectConfig, teacher: Teacher, student: Student,
                         agent: AgentConfig, tokenizer: HFChatTokenizer) -> dict[str, Any]:
    """Run the attempts; write the records (atomically) and return :func:`summarize`'s
    figures with the records written and the wall time."""
    tasks = select_tasks(ExportConfig(out="-", split=config.split, tasks=config.tasks))
    scratch = Path(tempfile.mkdtemp(prefix="src-"))
    started_here: list[Any] = []
    t0 = time.monotonic()
    jobs: asyncio.Queue[tuple[Task, int]] = asyncio.Queue()
    for seed in range(config.attempts_per_task):
        for task in tasks:
            jobs.put_nowait((task, seed))
    total = jobs.qsize()
    runs: list[TaskRun] = []
    archive = Archive(config.src.archive_per_task)
    try:
        endpoint, pool, accounts = start_services(
            scratch, config.cloud_endpoint, config.redis_url, config.accounts_file,
            config.lease_prefix, started_here)
        runner = EpisodeRunner(accounts, endpoint, RewardService(tasks, accounts, endpoint).score,
                               ready_timeout_s=60, acquire_timeout_s=None)
        collector = Collector(runner, teacher, student, agent, config.src)
        secrets = account_secrets(accounts)

        async def work(index: int) -> None:
            env = LeasedEnvWorker(WorkerConfig(
                console_url=config.console_url or f"http://{endpoint}"), pool,
                                  f"src-{os.getpid()}-{index}")
            try:
                while not jobs.empty():
                    task, seed = jobs.get_nowait()
                    run = await collector.attempt(env, task, seed)
                    runs.append(run)
                    archive.offer(run)
                    _progress(f"{len(runs)}/{total} {task.id}: {run.status}, "
                              f"{len(run.corrections)} corrections, {run.rollbacks} rollbacks, "
                              f"{run.queries} queries ({time.monotonic() - t0:.0f} s)")
            finally:
                await env.drain()
        workers = [asyncio.create_task(work(i)) for i in range(config.workers)]
        try:
            await asyncio.gather(*workers)
        except BaseException:
            for w in workers:
                w.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            raise
        written = {"trajectories": 0, "corrections": 0, "turns": 0}
        if config.out:
            lines = []
            for run in archive.runs:
                rec = trajectory_record(run, tokenizer, agent)
                if rec is not None:
                    lines.append(rec)
                    written["trajectories"] += 1
            for run in runs:
                for c in run.corrections:
                    rec = correction_record(run, c, tokenizer, agent)
                    if rec is not None:
                        lines.append(rec)
                        written["corrections"] += 1
            written["turns"] = sum(len(r["turns"]) for r in lines)
            write_jsonl(Path(config.out), lines, secrets)
    finally:
        stop_services(started_here, scratch)
    return {**summarize(runs, archive), "written": written, "out": config.out,
            "wall_s": round(time.monotonic() - t0, 1)}


def write_jsonl(out: Path, records: Sequence[dict[str, Any]], secrets: Mapping[str, str]
                ) -> None:
    """All the records or nothing: written beside ``out`` and renamed; no line may hold an
    account secret."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for rec in records:
                line = json.dumps(rec, ensure_ascii=False)
                check_no_secrets(line, secrets)
                f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
