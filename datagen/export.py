"""Teacher trajectories for SFT: the oracle solves tasks in real episodes, every action becomes
one training turn whose prompt is exactly what the policy would see there.

:func:`run_export` (``ExportConfig -> summary``) starts the local cloud and a Redis for the
account leases (unless ``cloud_endpoint`` / ``redis_url`` name running ones: the leases are then
shared with a running orchestrator's workers, same key prefix), and runs each selected task
``episodes_per_task`` times through :class:`rollout_service.episode.EpisodeRunner` (the runner
RL rollouts go through) with the oracle as the policy, on ``workers`` env workers in parallel
(each its own Chromium and account lease, as the Ray env worker actors hold them). A wrapper
around the oracle's ``step`` (:func:`recording_policy`) records, per action, the observation it
was chosen on, the actions before it (as the agent loop keeps its history: canonical action,
error only when the text did not parse) and the action's error. ``split`` ``test`` is the
suite's ``heldout`` split; ``model`` names whose tokenizer makes the ids (the policy's; the tiny
test models share SmolLM2's).

Kept: episodes whose rule outcome is ``solved`` and, for tasks whose documentation is wrong,
``infeasible_reported``; not kept: failures, env errors, episodes that broke a prerequisite, and
episodes with a turn whose prompt cannot fit ``max_prompt_tokens`` (the policy would stop
there). One JSON line per kept trajectory (:func:`build_record`)::

    {"trajectory_id", "task_id", "source": "oracle", "reward": 1.0, "status",
     "agent": {the AgentConfig settings a model keeps: rollout_service.agent.MODEL_SETTINGS},
     "turns": [{"messages": [system, user], "completion": action, "prompt_ids": [...],
                "response_ids": [...], "action_error": ""}]}

``messages`` is the output of :func:`rollout_service.agent.build_messages` that
:meth:`AgentLoop.prompt_ids` tokenized (page cut included), ``prompt_ids`` those ids,
``completion`` the canonical action text the env worker ran (for ``AgentConfig.response``
``grounded``, the quoted label of its element on the line before it:
:func:`rollout_service.agent.grounded_response`), ``response_ids`` its tokens then
the chat template's end-of-turn token (SmolLM2: ``<|im_end|>``), i.e. what the policy samples
when it stops; ``action_error`` what the action got back ("" normally; SFT skips turns that
have one). No line may hold an account password or AccessKey secret
(:func:`check_no_secrets`, checked on every line before it is written). The file is written to
a temporary name beside ``out`` and renamed when complete. Progress goes to stderr; the summary
counts episodes, kept trajectories and turns, statuses, dropped episodes by reason, and
``over_agent_max_steps`` (kept trajectories longer than the agent's step limit).

The command, ``python -m cluster.export``, builds an :class:`ExportConfig` from its flags and
the run config's ``agent`` section and calls :func:`run_export`.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

from consolerl.accounts import Account
from consolerl.config import Between, Checked, NonEmpty, OneOf, Regex
from consolerl.errors import ConfigError, ConsoleRLError
from consolerl.resources import fill
from consolerl.tasks import TASKS_DIR, Task, load_suite
from consolerl.types import Observation, StepResult
from env_workers.accounts import PoolConfig, load_pool_accounts
from env_workers.pool import LeasedEnvWorker
from env_workers.worker import WorkerConfig
from infra.local_cloud import LocalCloud
from infra.redis_local import RedisServer
from reward_service.service import RewardService

from rollout_service.agent import (MODEL_SETTINGS, AgentConfig, AgentLoop, _Step,
                                   grounded_response, history_entry, recent_history)
from rollout_service.episode import (EpisodeRunner, Script, StepFn, episode_id_seed,
                                     scripted_policy)
from rollout_service.models import HFChatTokenizer, end_of_turn_id, resolve_model
from .oracle import run_oracle

KEPT = ("solved", "infeasible_reported")
SPLITS = {"train": ("train",), "heldout": ("heldout",), "test": ("heldout",),
          "all": ("train", "heldout")}


class SecretLeak(ConsoleRLError, RuntimeError):
    """A line about to be written holds an account secret (the message names the account and
    the kind of secret, never the value)."""


@dataclass(frozen=True)
class ExportConfig(Checked):
    """``split``: train | heldout (alias test) | all; ``tasks``: a regular expression over task
    ids; ``model``: whose tokenizer builds the prompts (the policy's); ``cloud_endpoint`` /
    ``redis_url``: "" starts a local one (``console_url``: the console's scheme://host:port when
    it is not the endpoint's); ``max_steps``: the oracle's step limit per episode."""

    out: Annotated[str, NonEmpty()]
    split: Annotated[str, OneOf(tuple(SPLITS))] = "train"
    tasks: Annotated[str, Regex()] = ""
    episodes_per_task: Annotated[int, Between(1, 1000)] = 1
    workers: Annotated[int, Between(1, 8)] = 2
    agent: AgentConfig = field(default_factory=lambda: AgentConfig(
        history_turns=4, max_prompt_tokens=3072, max_observation_chars=6000))
    model: str = "default"
    suite: str = str(TASKS_DIR)
    cloud_endpoint: str = ""
    console_url: str = ""                      # "" = http://<cloud endpoint>
    redis_url: str = ""
    accounts_file: str = ""
    lease_prefix: str = "consolerl:pool"
    max_steps: Annotated[int, Between(1, 200)] = 40


@dataclass(frozen=True)
class RecordedTurn:
    """One oracle action: the observation and history it was chosen on, what it sent, the
    canonical action the env ran ("" if it did not parse) and the error it got."""

    observation: Observation
    history: tuple[_Step, ...]            # the last history_turns steps, as the agent shows them
    text: str
    action_text: str
    action_error: str


@dataclass
class Recording:
    """What :func:`recording_policy` saw of one episode: the task's filled values (the
    procedure's placeholders) and every action."""

    values: dict[str, str] = field(default_factory=dict)
    turns: list[RecordedTurn] = field(default_factory=list)


def recording_policy(config: AgentConfig, recording: Recording,
                     teacher: Script = run_oracle) -> Script:
    """A scripted agent that runs ``teacher`` and records each of its actions in
    ``recording``; the history follows :meth:`AgentLoop.run` (same entries, same window)."""
    async def policy(task: Task, values: Mapping[str, str], step: StepFn,
                     observation: Observation) -> StepResult:
        recording.values = dict(values)
        turns = recording.turns
        history: list[_Step] = []
        current = [observation]

        async def recorded(text: str) -> StepResult:
            shown = tuple(recent_history(history, config.history_turns))
            result = await step(text)
            turns.append(RecordedTurn(current[0], shown, text, result.action_text,
                                      result.observation.last_action_error))
            history.append(history_entry(text, result))
            current[0] = result.observation
            return result
        return await teacher(task, values, recorded, observation)
    return policy


class _Capture:
    """A chat tokenizer that remembers the messages it tokenized last, so the messages of a
    prompt are exactly those :meth:`AgentLoop.prompt_ids` settled on (page cut included)."""

    def __init__(self, tokenizer: HFChatTokenizer):
        self.tokenizer = tokenizer
        self.messages: list[dict[str, str]] = []

    def apply_chat_template(self, messages, *, tokenize=True, add_generation_prompt=True):
        self.messages = messages
        return self.tokenizer.apply_chat_template(messages, tokenize=tokenize,
                                                  add_generation_prompt=add_generation_prompt)

    def decode(self, ids, skip_special_tokens=True):
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


def build_record(task: Task, status: str, recording: Recording, tokenizer: HFChatTokenizer,
                 config: AgentConfig) -> dict[str, Any] | None:
    """The JSONL record of a kept episode, or ``None`` when a prompt cannot fit."""
    capture = _Capture(tokenizer)
    loop = AgentLoop(None, capture, config)        # type: ignore[arg-type]  (no policy needed)
    procedure = fill(task.procedure, recording.values)
    eot = end_of_turn_id(tokenizer)
    turns = []
    for r in recording.turns:
        ids = loop.prompt_ids(task.title, procedure, list(r.history), r.observation)
        if ids is None:
            return None
        completion = r.action_text or r.text
        if config.response == "grounded" and r.action_text:
            completion = grounded_response(r.action_text, r.observation.text)
        turns.append({"messages": capture.messages, "completion": completion,
                      "prompt_ids": ids, "response_ids": tokenizer.encode(completion) + [eot],
                      "action_error": r.action_error})
    return {"trajectory_id": uuid.uuid4().hex, "task_id": task.id, "source": "oracle",
            "reward": 1.0, "status": status,
            "agent": {k: getattr(config, k) for k in MODEL_SETTINGS},
            "turns": turns}


def account_secrets(accounts: Sequence[Account]) -> dict[str, str]:
    """Secret value -> a label naming whose and what it is (never the value)."""
    found = {}
    for a in accounts:
        found[a.password] = f"the password of account {a.login_name}"
        found[a.access_key_secret] = f"the AccessKey secret of account {a.login_name}"
    return found


def check_no_secrets(line: str, secrets: Mapping[str, str]) -> None:
    """Raise :class:`SecretLeak` if ``line`` holds any secret, raw or JSON-escaped."""
    for value, label in secrets.items():
        if value and (value in line or json.dumps(value, ensure_ascii=False)[1:-1] in line):
            raise SecretLeak(f"refusing to write a trajectory that contains {label}")


def select_tasks(config: ExportConfig) -> list[Task]:
    splits = SPLITS[config.split]
    tasks = [t for t in load_suite(Path(config.suite))
             if t.split in splits and re.search(config.tasks, t.id)]
    if not tasks:
        raise ConfigError(f"no task of split {config.split!r} matches {config.tasks!r}")
    return tasks


def _progress(msg: str) -> None:
    print(f"[export] {msg}", file=sys.stderr, flush=True)


@dataclass
class _Tally:
    total: int
    episodes: int = 0
    written: int = 0
    turns: int = 0
    action_errors: int = 0
    longest: int = 0
    over_agent_max_steps: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)


class _Exporter:
    """The shared state of the export's workers: the episode runner, the open output file and
    the tally."""

    def __init__(self, config: ExportConfig, endpoint: str, pool_config: PoolConfig,
                 accounts: list[Account], tasks: list[Task], tokenizer: HFChatTokenizer, sink,
                 tally: _Tally,
                 on_record: Callable[[dict[str, Any], Recording], None] | None):
        self.config, self.endpoint, self.pool_config = config, endpoint, pool_config
        self.tokenizer, self.sink, self.tally, self.on_record = tokenizer, sink, tally, on_record
        self.secrets = account_secrets(accounts)
        scorer = RewardService(tasks, accounts, endpoint).score
        self.runner = EpisodeRunner(accounts, endpoint, scorer, ready_timeout_s=60,
                                    acquire_timeout_s=None)
        # One fast tokenizer shared by worker threads: HF tokenizers may refuse concurrent use.
        self.tokenize_lock = threading.Lock()
        self.started = time.monotonic()

    def _record(self, task: Task, status: str, recording: Recording) -> dict[str, Any] | None:
        with self.tokenize_lock:
            return build_record(task, status, recording, self.tokenizer, self.config.agent)

    async def work(self, index: int, jobs: asyncio.Queue[Task]) -> None:
        env = LeasedEnvWorker(WorkerConfig(
            console_url=self.config.console_url or f"http://{self.endpoint}"),
            self.pool_config, f"export-{os.getpid()}-{index}")
        try:
            while not jobs.empty():
                await self.episode(env, jobs.get_nowait())
        finally:
            await env.drain()

    async def episode(self, env: LeasedEnvWorker, task: Task) -> None:
        recording = Recording()
        policy = scripted_policy(recording_policy(self.config.agent, recording))
        try:
            # With random_ids the oracle sees the numbering the policy will see.
            id_seed = episode_id_seed(self.config.agent.random_ids,
                                      f"export:{task.id}:{uuid.uuid4().hex}", 0)
            outcome = await self.runner.run(env, task, policy, max_steps=self.config.max_steps,
                                            id_seed=id_seed)
            status = outcome.status
        except Exception as exc:      # noqa: BLE001  one broken episode must not end the export
            status = f"error: {type(exc).__name__}"
            _progress(f"{task.id}: {type(exc).__name__}: {str(exc)[:300]}")
            outcome = None
        tally = self.tally
        tally.episodes += 1
        tally.statuses[status] = tally.statuses.get(status, 0) + 1
        record, reason = None, ""
        if status not in KEPT:
            reason = status
        elif outcome is not None and outcome.broken_prerequisites:
            reason = "broke a prerequisite"
        else:
            record = await asyncio.to_thread(self._record, task, status, recording)
            reason = "" if record is not None else "prompt too long"
        if record is not None:
            line = json.dumps(record, ensure_ascii=False)
            check_no_secrets(line, self.secrets)
            self.sink.write(line + "\n")
            self.sink.flush()
            turns = record["turns"]
            tally.written += 1
            tally.turns += len(turns)
            tally.action_errors += sum(bool(t["action_error"]) for t in turns)
            tally.longest = max(tally.longest, len(turns))
            tally.over_agent_max_steps += len(turns) > self.config.agent.max_steps
            if self.on_record is not None:
                self.on_record(record, recording)
        else:
            tally.dropped[reason] = tally.dropped.get(reason, 0) + 1
        solved = tally.statuses.get("solved", 0)
        _progress(f"{tally.episodes}/{tally.total} episodes, {solved} solved, {tally.written} "
                  f"kept; {task.id}: {status}, {len(recording.turns)} actions"
                  + ("" if record is not None else f" (dropped: {reason})")
                  + f" ({time.monotonic() - self.started:.0f} s)")


def start_services(scratch: Path, cloud_endpoint: str, redis_url: str, accounts_file: str,
                   lease_prefix: str, started: list[Any]
                   ) -> tuple[str, PoolConfig, list[Account]]:
    """The cloud and the lease Redis an offline collection runs against: the running ones
    named, else a local cloud and a Redis under ``scratch`` (appended to ``started``, for
    :func:`stop_services`). Returns the cloud endpoint, the lease pool and its accounts."""
    endpoint = cloud_endpoint
    if not endpoint:
        args = ("--lookup-qps", "0", "--transition", "1", "--network-ready", "0.3")
        if accounts_file:
            args += ("--accounts", accounts_file)
        (scratch / "cloud").mkdir()
        cloud = LocalCloud(scratch / "cloud", args).start()
        started.append(cloud)
        endpoint = cloud.endpoint
    if not redis_url:
        redis_server = RedisServer(scratch / "redis").start()
        started.append(redis_server)
        redis_url = redis_server.url
    pool_config = PoolConfig(redis_url=redis_url, key_prefix=lease_prefix,
                             accounts_source="file" if accounts_file else "local",
                             accounts_file=accounts_file or None)
    return endpoint, pool_config, load_pool_accounts(pool_config)


def stop_services(started: list[Any], scratch: Path) -> None:
    for server in reversed(started):
        server.stop()
    shutil.rmtree(scratch, ignore_errors=True)


async def run_export(config: ExportConfig, *, on_record: Callable[[dict[str, Any],
                     Recording], None] | None = None) -> dict[str, Any]:
    """Run the export; returns the summary. ``on_record(record, recording)`` sees each kept
    trajectory with the observations it was built from (tests check the prompts)."""
    tasks = select_tasks(config)
    tokenizer = HFChatTokenizer(resolve_model(config.model))
    end_of_turn_id(tokenizer)                    # fail early on a template without one
    out = Path(config.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="export-"))
    started_here: list[Any] = []
    fd, tmp_name = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    sink = os.fdopen(fd, "w", encoding="utf-8")
    started = time.monotonic()
    jobs: asyncio.Queue[Task] = asyncio.Queue()
    for _ in range(config.episodes_per_task):
        for task in tasks:
            jobs.put_nowait(task)
    tally = _Tally(total=jobs.qsize())
    try:
        endpoint, pool_config, accounts = start_services(
            scratch, config.cloud_endpoint, config.redis_url, config.accounts_file,
            config.lease_prefix, started_here)
        _progress(f"{tally.total} episodes of {len(tasks)} tasks against http://{endpoint}, "
                  f"{config.workers} browsers")
        exporter = _Exporter(config, endpoint, pool_config, accounts, tasks, tokenizer, sink,
                             tally, on_record)
        workers = [asyncio.create_task(exporter.work(i, jobs)) for i in range(config.workers)]
        try:
            await asyncio.gather(*workers)
        except BaseException:
            for w in workers:                    # stop the others before the cloud goes away
                w.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            raise
        sink.flush()
        os.fsync(sink.fileno())
        sink.close()
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp_name, 0o666 & ~umask)      # mkstemp made it 0600; a normal file instead
        os.replace(tmp_name, out)
    except BaseException:
        sink.close()
        Path(tmp_name).unlink(missing_ok=True)
        raise
    finally:
        stop_services(started_here, scratch)
    summary = asdict(tally)
    summary.pop("total")
    return {"out": str(out), "tasks": len(tasks), **summary,
            "agent_max_steps": config.agent.max_steps,
            "wall_s": round(time.monotonic() - started, 1)}
