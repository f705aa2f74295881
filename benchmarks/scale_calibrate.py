"""The scale benchmark's latency model, measured on this machine:
``python -m benchmarks.scale --calibrate`` writes ``benchmarks/data/scale-latency.json``.

- ``reset_s``, ``step_s``: a real env worker (Chromium, an account lease) while the oracle
  solves the benchmark's tasks (no prerequisites) on the real local cloud: sign-in and start
  page, then each action with its observation;
- ``sdk_call_s``: the episode runner's own SDK calls (clean-up listings) to the local cloud,
  signed as the official SDK signs them;
- ``lookup_s``: one LookupEvents of an episode's window;
- ``score_s``: the reward service scoring those episodes from the audit log;
- ``generate_s``: one turn's generation, the policy (vLLM on this CPU where ``.venv-vllm``
  exists, else transformers; SmolLM2-135M) on the recorded agent prompts
  (``oracle-states.jsonl.gz``: the compact system prompt, 2 history turns, pages of up to
  1,200 characters) with up to 32 new tokens at temperature 1, one request at a time;
- ``turns``: the oracle's actions per task over the whole suite (the recorded states);
- ``lookups``: LookupEvents calls per episode (the reward service's polls and the runner's
  audit read), each against ActionTrail's budget of 2 per second per account;
- ``episode_cpu_s``: CPU seconds per episode of the env worker, runner and reward service
  (this process) and Chromium: the browser side's cost, for sizing.
"""
from __future__ import annotations

import asyncio
import gzip
import json
import platform
import re
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil

from benchmarks.scale_model import STATES_FILE, TASKS
from benchmarks.services import cloud_and_redis
from consolerl.accounts import load_accounts
from consolerl.tasks import TASKS_DIR, load_suite
from env_workers.accounts import PoolConfig
from env_workers.pool import LeasedEnvWorker
from env_workers.worker import WorkerConfig
from infra.cloud import CloudClient, CloudConfig, Credentials
from infra.console_sim.config import DEFAULT_ACCOUNTS_FILE
from reward_service.actiontrail import TrailClient, TrailConfig
from reward_service.service import RewardService
from rollout_service.agent import SamplingParams
from rollout_service.episode import EpisodeRunner, scripted_policy
from rollout_service.models import HFChatTokenizer, resolve_model
from datagen.oracle import run_oracle
from rollout_service.policy import PolicyConfig, make_engine

EPISODES = 12
PROMPTS = 40


def _progress(msg: str) -> None:
    print(f"[scale-calibrate] {msg}", file=sys.stderr, flush=True)


class _TimedEnv:
    """An env worker whose reset and step calls are timed."""

    def __init__(self, body: LeasedEnvWorker, out: dict[str, list[float]]):
        self.body, self.out, self.name = body, out, body.name
        for name in ("acquire", "begin", "cleaned", "close_browser", "end_episode"):
            setattr(self, name, getattr(body, name))

    async def reset(self, spec: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return await self.body.reset(spec)
        finally:
            self.out["reset_s"].append(time.perf_counter() - t0)

    async def step(self, text: str) -> Any:
        t0 = time.perf_counter()
        try:
            return await self.body.step(text)
        finally:
            self.out["step_s"].append(time.perf_counter() - t0)


class _TimedClient(CloudClient):
    def __init__(self, *args: Any, out: dict[str, list[float]]):
        super().__init__(*args)
        self._out = out

    def rpc(self, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return super().rpc(*args, **kwargs)
        finally:
            self._out["sdk_call_s"].append(time.perf_counter() - t0)


def suite_turns(states: Path) -> list[int]:
    counts: Counter[str] = Counter()
    with gzip.open(states, "rt", encoding="utf-8") as f:
        for line in f:
            counts[json.loads(line)["task_id"]] += 1
    return sorted(counts.values())


async def _episodes(cloud: Any, redis_url: str, out: dict[str, list[float]]) -> None:
    accounts = load_accounts(DEFAULT_ACCOUNTS_FILE)
    tasks = [t for t in load_suite(TASKS_DIR) if t.split == "train" and re.search(TASKS, t.id)]
    service = RewardService(tasks, accounts, cloud.endpoint,
                            TrailConfig(qps=20, settle_s=15, poll_s=0.25, clock_skew_s=5))

    def score(request: Any, task: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return service.score(request, task)
        finally:
            out["score_s"].append(time.perf_counter() - t0)
    lookups = [0]
    real_call = CloudClient.call_with_headers

    def counted(client: Any, fn: Any, request: Any, action: str = "") -> Any:
        if action == "LookupEvents":
            lookups[0] += 1
        return real_call(client, fn, request, action)
    CloudClient.call_with_headers = counted                    # type: ignore[method-assign]
    runner = EpisodeRunner(accounts, cloud.endpoint, score, client_factory=lambda a: _TimedClient(
        CloudConfig(endpoint=cloud.endpoint), Credentials(a.access_key_id, a.access_key_secret),
        out=out))
    body = LeasedEnvWorker(WorkerConfig(console_url=cloud.url),
                         PoolConfig(redis_url=redis_url, key_prefix="calibrate"), "calibrate")
    env = _TimedEnv(body, out)
    me = psutil.Process()
    try:
        for k in range(EPISODES):
            task = tasks[k % len(tasks)]
            before, cpu0 = lookups[0], _tree_cpu_s(me)
            outcome = await runner.run(env, task, scripted_policy(run_oracle), max_steps=20)
            # This process (the env worker, the runner, the reward service) and Chromium.
            out["episode_cpu_s"].append(_tree_cpu_s(me) - cpu0)
            out["lookups"].append(lookups[0] - before)
            _progress(f"episode {k + 1}/{EPISODES} {task.id}: {outcome.status}")
            account = accounts[k % len(accounts)]
            trail = TrailClient(CloudClient(CloudConfig(endpoint=cloud.endpoint), Credentials(
                account.access_key_id, account.access_key_secret)), TrailConfig(qps=100),
                account_id=account.account_id)
            t0 = time.perf_counter()
            trail.events(time.time() - 60, time.time() + 1)
            out["lookup_s"].append(time.perf_counter() - t0)
    finally:
        CloudClient.call_with_headers = real_call              # type: ignore[method-assign]
        await body.drain()


def _tree_cpu_s(proc: psutil.Process) -> float:
    """CPU seconds of ``proc`` and its children (Chromium), dead ones included."""
    total = sum(proc.cpu_times()[:4])
    for child in proc.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.Error:
            pass
    return total


def _generation(out: dict[str, list[float]]) -> str:
    from rollout_service.vllm_engine import vllm_python
    from consolerl.errors import ConfigError
    try:
        vllm_python()
        backend = "vllm"
    except ConfigError:
        backend = "transformers"
    path = resolve_model("default")
    tokenizer = HFChatTokenizer(path)
    engine = make_engine(PolicyConfig(model=str(path), backend=backend, kv_cache_gib=0.5,
                                      max_model_len=2048, enforce_eager=True))
    try:
        prompts = []
        with gzip.open(STATES_FILE, "rt", encoding="utf-8") as f:
            for line in f:
                rec = json.loads(line)
                prompts.append(tokenizer.apply_chat_template(rec["messages"], tokenize=True,
                                                             add_generation_prompt=True))
        step = max(1, len(prompts) // PROMPTS)
        picked = prompts[::step][:PROMPTS]
        engine.generate(picked[0], SamplingParams(8, 1.0, seed=0))        # warm up
        for i, p in enumerate(picked):
            t0 = time.perf_counter()
            engine.generate(p, SamplingParams(32, 1.0, seed=i))
            out["generate_s"].append(time.perf_counter() - t0)
    finally:
        close = getattr(engine, "close", None)
        if close is not None:
            close()
    return backend


def calibrate(path: Path) -> dict[str, Any]:
    out: dict[str, list[float]] = {k: [] for k in ("reset_s", "step_s", "generate_s",
                                                   "score_s", "sdk_call_s", "lookup_s",
                                                   "lookups", "episode_cpu_s")}
    with cloud_and_redis("scale-calibrate-", ("--lookup-qps", "0", "--transition", "0.5",
                                              "--network-ready", "0.2")) as (cloud, redis):
        _progress(f"{EPISODES} oracle episodes in Chromium on the local cloud")
        asyncio.run(_episodes(cloud, redis.url, out))
    _progress(f"{PROMPTS} generations")
    backend = _generation(out)
    data = {"measured": f"{time.strftime('%Y-%m-%d')} on {platform.node() or 'this host'} "
                        f"({platform.processor() or platform.machine()}): "
                        f"python -m benchmarks.scale --calibrate; policy {backend}",
            **{k: [round(v, 4) for v in vs] for k, vs in out.items()},
            "turns": suite_turns(STATES_FILE)}
    path.write_text(json.dumps(data, indent=1) + "\n")
    _progress(f"wrote {path}: " + ", ".join(
        f"{k} mean {sum(v) / len(v):.3f} ({len(v)})" for k, v in data.items()
        if isinstance(v, list) and v))
    return data
