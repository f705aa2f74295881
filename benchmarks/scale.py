"""Scale benchmark of the control plane: ``python -m benchmarks.scale --workers 1000 --json``.

What cannot run here (a thousand browsers, a policy fleet, the real cloud) is simulated with
latencies measured on this machine; the control plane runs for real:

- the real :class:`~rollout_service.orchestrator.Orchestrator` (groups, async admission, the
  staleness bound, online filtering) and the real :class:`~rollout_service.episode.EpisodeRunner`
  (write-ahead record, provisioning and clean-up calls, the audit-log read, scoring), in this
  process, as they run in the job's rollout actor; the real
  :class:`~rollout_service.agent.AgentLoop` (prompts built and tokenized with the default
  model's tokenizer every turn, the policy called through the real router) where
  ``--turn-loop`` puts it: on the env workers (``act``, one call per episode from here; the job's
  choice from 1,000 workers up) or here (an env worker call and a policy call per turn);
- N real :class:`~env_workers.pool.EnvWorkerBody` (account leases with heartbeats on the real
  :class:`~env_workers.leases.AccountPool`, N accounts, a real Redis) in one Ray actor, called
  over Ray as the orchestrator calls env worker actors; only their browser is simulated
  (:class:`SimBrowser`: sign-in and step latencies, the episode's length);
- the real experience stream: groups are XADDed by the orchestrator and read with the real
  :class:`~trainer.stream.ExperienceConsumer` by a stand-in trainer (a Ray actor) that spends
  ``--train-seconds`` per step and then publishes the next trainer version, which is what the
  staleness control reads;
- simulated: the policy (a Ray actor called as the PolicyServers are; generation time per
  turn), the cloud's SDK answers and LookupEvents
  (per-call latency; an empty account), the reward service (its scoring time; one LookupEvents
  through the real per-account rate limiter of 2 queries/s).

The latencies are samples measured here by ``--calibrate`` (``benchmarks/data/
scale-latency.json``: the real local cloud, Chromium, vLLM on CPU and the reward service, the
oracle solving short tasks); each simulated call draws one.

Per N it reports: ``episodes_per_s`` and ``steps_per_s`` against ``ideal_episodes_per_s`` (N
workers each running episodes back to back at the model's mean episode time, no overhead);
``throughput_vs_ideal``; ``orchestrator_ms_per_step`` (CPU time of this process, which holds
what the job's rollout actor holds, per agent step, and by thread; ``tokenize_ms_per_step`` of
it when the turns run here); ``env_workers_ms_per_step`` (the env worker host's CPU);
``lease_acquire_p50_ms`` / ``lease_acquire_p99_ms`` in the steady window (and the cold start,
when all N workers ask at once); stream XADD and XREADGROUP rates and latencies with the
headroom measured by a burst; LookupEvents per second needed in all and per account against
the 2/s budget; Redis memory and CPU; the event loop's lag, the thread pool's queueing; and
``first_saturated``, the component closest to its limit.
"""
from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import gzip
import json
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import ray
from prometheus_client import CollectorRegistry

from consolerl.accounts import Account
from consolerl.experience import Group, Sample, Turn, encode_group
from consolerl.rewards import RewardResult
from consolerl.stats import percentile
from consolerl.tasks import TASKS_DIR, load_suite
from consolerl.types import Observation, StepResult
from env_workers.accounts import PoolConfig
from env_workers.actions import parse_action
from env_workers.leases import AccountPool
from env_workers.pool import EnvPoolConfig, EnvWorkerBody
from env_workers.worker import WorkerConfig
from infra.redis_local import RedisServer
from reward_service.actiontrail import TrailClient, TrailConfig, TrailMetrics
from rollout_service.agent import AgentConfig, AgentLoop, Generation
from rollout_service.experience import ExperienceStream, StreamConfig
from rollout_service.models import HFChatTokenizer, resolve_model
from rollout_service.orchestrator import Orchestrator, OrchestratorConfig
from rollout_service.policy import PolicyRouter
from trainer.stream import ConsumerConfig, ExperienceConsumer

DATA = Path(__file__).resolve().parent / "data"
LATENCY_FILE = DATA / "scale-latency.json"
STATES_FILE = DATA / "oracle-states.jsonl.gz"
# Tasks with no prerequisites: provisioning is then nothing, as for most tasks of a warm pool.
TASKS = r"^(ram-create-user|oss-create-bucket)-[0-9]+$"
TRAIL_QPS = 2.0                     # ActionTrail's LookupEvents limit per account
ACTION = "click(12)"


# The CPU priority of what has cores of its own on a cluster (Redis, one env worker process
# probing the lease pool) but shares this machine's with the simulated fleet.
PRIORITY_NICE = -10
# What each env worker process is given of a core.
ENV_CPUS_PER_WORKER = EnvPoolConfig.num_cpus_per_worker


def _progress(msg: str) -> None:
    print(f"[scale] {msg}", file=sys.stderr, flush=True)


# ---- the latency model --------------------------------------------------------------------------
@dataclass
class Latency:
    """Samples (seconds, or turns) measured on this machine; ``draw`` picks one at random."""

    reset_s: list[float]
    step_s: list[float]
    generate_s: list[float]
    score_s: list[float]
    sdk_call_s: list[float]
    lookup_s: list[float]
    turns: list[int]
    lookups: list[int]
    episode_cpu_s: list[float]
    source: str = ""

    @classmethod
    def load(cls, path: Path) -> Latency:
        data = json.loads(path.read_text())
        return cls(**{k: data[k] for k in ("reset_s", "step_s", "generate_s", "score_s",
                                           "sdk_call_s", "lookup_s", "turns")},
                   lookups=data.get("lookups", [2]), episode_cpu_s=data.get("episode_cpu_s", [0]),
                   source=data.get("measured", ""))

    def mean_episode_s(self, sdk_calls: float, lookups: float) -> float:
        """The model's mean episode, lease to release, with no overhead at all."""
        mean = statistics.fmean
        return (mean(self.reset_s) + mean(self.turns) * (mean(self.generate_s)
                                                         + mean(self.step_s))
                + mean(self.score_s) + sdk_calls * mean(self.sdk_call_s)
                + lookups * mean(self.lookup_s))


def page_texts(limit: int = 200) -> list[str]:
    """Real console pages (the recorded oracle states' observations) for the prompts."""
    out: list[str] = []
    with gzip.open(STATES_FILE, "rt", encoding="utf-8") as f:
        for line in f:
            text = json.loads(line)["messages"][-1]["content"]
            page = text.split("CURRENT PAGE:", 1)[-1].split("\n\nYour next action", 1)[0]
            out.append(page.split("\n", 2)[-1])
            if len(out) >= limit:
                break
    return out


# ---- simulated parts ----------------------------------------------------------------------------
class SimBrowser:
    """The browser side of an env worker: sign-in and steps take measured latencies; the
    episode ends after a measured number of turns (the agent's answer)."""

    def __init__(self, latency: Latency, pages: list[str], rng: random.Random,
                 tally: dict[str, float]):
        self.latency, self.pages, self.rng, self.tally = latency, pages, rng, tally
        self.left = 0

    def _page(self, step: int) -> Observation:
        return Observation("http://console.local/console/ram/users", "Users",
                           self.rng.choice(self.pages), step=step)

    async def reset(self, spec: Any, account: Any, lease_mark: str) -> Observation:
        delay = self.rng.choice(self.latency.reset_s)
        await asyncio.sleep(delay)
        self.left = self.rng.choice(self.latency.turns)
        return self._page(0)

    async def step(self, text: str) -> StepResult:
        delay = self.rng.choice(self.latency.step_s)
        self.tally["steps"] += 1
        await asyncio.sleep(delay)
        action = parse_action(text)
        self.left -= 1
        done = self.left <= 0
        return StepResult(self._page(1), done=done, answer="done" if done else None,
                          action_text=getattr(action, "to_text", lambda: "")())

    async def close_episode(self) -> None:
        return None

    async def shutdown(self) -> None:
        return None

    def browser_rss_mb(self) -> float:
        return 0.0


class SimEnvHost:
    """N real env worker bodies (real leases, heartbeats, write-ahead records) sharing one
    account pool, with simulated browsers; called over Ray like N env worker actors."""

    def __init__(self, n: int, accounts: list[Account], redis_url: str, prefix: str,
                 latency: Latency, pages: list[str], seed: int):
        import redis as redis_lib
        self.client = redis_lib.Redis.from_url(redis_url, decode_responses=True,
                                               max_connections=None)
        config = PoolConfig(redis_url=redis_url, key_prefix=prefix, lease_ttl_s=60)
        self.pool = AccountPool(accounts, config, client=self.client)
        self.acquires: list[tuple[float, float]] = []        # (when, seconds)
        real = self.pool.acquire_async

        async def timed(holder: str, timeout_s: float | None = None) -> Any:
            t0 = time.perf_counter()
            lease = await real(holder, timeout_s)
            self.acquires.append((time.monotonic(), time.perf_counter() - t0))
            return lease
        self.pool.acquire_async = timed                       # type: ignore[method-assign]
        self.tally: dict[str, float] = defaultdict(float)
        rng = random.Random(seed)
        self.bodies = {
            f"w{i}": EnvWorkerBody(WorkerConfig(), config, f"w{i}", pool=self.pool,
                                   browser=SimBrowser(latency, pages,
                                                      random.Random(rng.random()), self.tally))
            for i in range(n)}
        self.executor_set = False

    async def call(self, name: str, method: str, *args: Any) -> Any:
        if not self.executor_set:
            # Each env worker actor is a process of its own with its own thread pool: here
            # N share one process, so they get a pool that does not make them queue.
            asyncio.get_running_loop().set_default_executor(
                concurrent.futures.ThreadPoolExecutor(max_workers=64))
            self.executor_set = True
        return await getattr(self.bodies[name], method)(*args)

    def stats(self, since: float) -> dict[str, Any]:
        proc = psutil.Process()
        cpu = proc.cpu_times()
        return {"cpu_s": cpu.user + cpu.system, "pid": os.getpid(),
                "acquires": [s for t, s in self.acquires if t >= since],
                "cold_acquires": [s for t, s in self.acquires if t < since],
                "steps": self.tally["steps"],
                "threads": proc.num_threads(), "now": time.monotonic()}

    async def drain(self) -> None:
        await asyncio.gather(*(b.end_episode() for b in self.bodies.values()))


class LeaseProbe:
    """What one env worker process sees of the lease pool: a process of its own that leases
    and releases an account in turn (a thread, blocking calls, as the pool is used), its
    latency timed, while the N workers' load runs. (The env host's own timings add the
    queueing of N workers packed into one process on this machine.)"""

    def __init__(self, accounts: list[Account], redis_url: str, prefix: str, *,
                 holder: str = "lease-probe", nice: int = 0):
        """``nice``: the probing thread's CPU priority (negative: ahead of the simulated
        fleet, as a worker process on a node of its own would be)."""
        config = PoolConfig(redis_url=redis_url, key_prefix=prefix, lease_ttl_s=60)
        self.pool = AccountPool(accounts, config)
        self.holder, self.nice = holder, nice
        self.samples: list[tuple[float, float]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        if self.nice:
            try:
                os.setpriority(os.PRIO_PROCESS, 0, self.nice)    # this thread (Linux)
            except PermissionError:
                self.nice = 0                   # not root: it probes at the fleet's priority
        while not self.stop.is_set():
            t0 = time.perf_counter()
            try:
                lease = self.pool.acquire(self.holder, 30)
            except Exception:             # noqa: BLE001 - a timeout is a sample too
                self.samples.append((time.monotonic(), time.perf_counter() - t0))
                continue
            self.samples.append((time.monotonic(), time.perf_counter() - t0))
            self.pool.release(lease)
            self.stop.wait(0.05)

    def results(self, since: float) -> list[float]:
        self.stop.set()
        self.thread.join(timeout=35)
        return [s for t, s in self.samples if t >= since]


class _Method:
    """An env worker method as the runner sees a Ray actor method (``.remote``)."""

    def __init__(self, host: Any, worker: str, name: str):
        self.host, self.worker, self._method_name = host, worker, name

    def remote(self, *args: Any) -> Any:
        return self.host.call.remote(self.worker, self._method_name, *args)


class WorkerProxy:
    def __init__(self, host: Any, name: str):
        self.name = name
        for method in ("acquire", "begin", "cleaned", "reset", "step", "act", "close_browser",
                       "end_episode"):
            setattr(self, method, _Method(host, name, method))


class SimPolicyFleet:
    """The policy fleet, a Ray actor called as the PolicyServers are (through the agent's
    :class:`~rollout_service.policy.PolicyRouter`, from wherever the turns run): each
    generation takes a measured time (a replica per request: the fleet is sized to the
    workers) and returns the same short action."""

    def __init__(self, latency: Latency, action_ids: list[int], seed: int):
        self.latency, self.ids, self.rng = latency, action_ids, random.Random(seed)
        self.version = 0
        self.calls = 0

    async def generate(self, prompt_ids: Any, sampling: Any) -> Generation:
        self.calls += 1
        await asyncio.sleep(self.rng.choice(self.latency.generate_s))
        return Generation(tuple(self.ids), tuple(-0.1 for _ in self.ids), self.version)

    def set_version(self, version: int) -> None:
        self.version = version

    def stats(self) -> dict[str, Any]:
        cpu = psutil.Process().cpu_times()
        return {"cpu_s": cpu.user + cpu.system, "calls": self.calls}


class SimCloud:
    """An empty account of the cloud as the runner's SDK calls see it, each call a measured
    latency (blocking its thread, as the SDK does); counts LookupEvents per account per
    second. Callable: the ActionTrail client takes it as its client factory."""

    LISTS = {"DescribeInstances": ("Instances", "Instance"),
             "DescribeSecurityGroups": ("SecurityGroups", "SecurityGroup"),
             "DescribeVSwitches": ("VSwitches", "VSwitch"), "DescribeVpcs": ("Vpcs", "Vpc")}

    def __init__(self, account_id: str, latency: Latency, rng: random.Random,
                 lookups: dict[str, list[float]], tally: dict[str, float]):
        self.account_id, self.latency, self.rng = account_id, latency, rng
        self.lookups, self.tally = lookups, tally
        self.user_agent = ""
        self.actiontrail = SimpleNamespace(lookup_events_with_options=self._lookup)

    def __call__(self) -> SimCloud:
        return self

    def _wait(self, samples: list[float]) -> None:
        delay = self.rng.choice(samples)
        time.sleep(delay)

    def rpc(self, product: str, action: str, params: dict[str, Any]) -> dict[str, Any]:
        self._wait(self.latency.sdk_call_s)
        self.tally["sdk_calls"] += 1
        if action in self.LISTS:
            outer, inner = self.LISTS[action]
            return {outer: {inner: []}, "TotalCount": 0}
        if action == "ListUsers":
            return {"Users": {"User": []}, "IsTruncated": False}
        raise ValueError(f"SimCloud: no answer for {product}.{action}")

    def oss_service(self) -> Any:
        def list_buckets(*args: Any, **kwargs: Any) -> Any:
            self._wait(self.latency.sdk_call_s)
            self.tally["sdk_calls"] += 1
            return SimpleNamespace(buckets=[], is_truncated=False, next_marker="")
        return SimpleNamespace(list_buckets=list_buckets)

    def _lookup(self, request: Any, runtime: Any = None) -> Any:
        raise AssertionError("called through call_with_headers")

    def call_with_headers(self, fn: Any, request: Any, action: str) -> tuple[Any, dict]:
        self._wait(self.latency.lookup_s)
        self.lookups[self.account_id].append(time.monotonic())
        return SimpleNamespace(events=[], next_token=None), {}


class SimScorer:
    """The reward service: the measured number of LookupEvents of the episode's window (its
    polls, less the runner's own audit read) through the real per-account token bucket (2
    queries/s), and the rest of a measured scoring time."""

    def __init__(self, clouds: dict[str, SimCloud], latency: Latency, rng: random.Random,
                 tally: dict[str, float]):
        self.clouds, self.latency, self.rng, self.tally = clouds, latency, rng, tally
        self.config = TrailConfig(qps=TRAIL_QPS)
        self.metrics = TrailMetrics(CollectorRegistry())     # one set, as the service has

    def __call__(self, request: Any, task: Any) -> RewardResult:
        cloud = self.clouds[request.account_id]
        trail = TrailClient(cloud, self.config, account_id=request.account_id,
                            metrics=self.metrics)
        polls = max(1, self.rng.choice(self.latency.lookups) - 1)
        t0 = time.perf_counter()
        for _ in range(polls):
            trail.events(request.started_at - 1, time.time() + 1)
        delay = max(0.0, self.rng.choice(self.latency.score_s) - (time.perf_counter() - t0))
        time.sleep(delay)
        win = self.rng.random() < 0.5
        return RewardResult(1.0 if win else 0.0, True, "success" if win else "failure", "rule")


class SimTrainer:
    """The stand-in trainer: the real consumer reads ``groups_per_step`` groups, a step takes
    ``train_s``, the next version is published (the staleness control reads it), the groups
    are acknowledged."""

    def __init__(self, redis_url: str, stream: str, groups_per_step: int, train_s: float):
        self.stream = ExperienceStream(StreamConfig(url=redis_url, stream=stream))
        self.consumer = ExperienceConsumer(StreamConfig(url=redis_url, stream=stream),
                                           ConsumerConfig(block_ms=200))
        self.groups_per_step, self.train_s = groups_per_step, train_s
        self.reads: list[tuple[float, float, int]] = []        # (when, seconds, entries)
        self.steps = 0
        self.version = 0
        self.stop = False

    async def run(self) -> None:
        self.consumer.ensure_group()
        self.stream.set_trainer_version(0)
        while not self.stop:
            batch: list[Any] = []
            while len(batch) < self.groups_per_step and not self.stop:
                t0 = time.perf_counter()
                got = await asyncio.to_thread(self.consumer.read,
                                              self.groups_per_step - len(batch))
                self.reads.append((time.monotonic(), time.perf_counter() - t0, len(got)))
                batch += got
            if self.stop:
                break
            await asyncio.sleep(self.train_s)
            self.version += 1
            self.steps += 1
            await asyncio.to_thread(self.stream.set_trainer_version, self.version)
            await asyncio.to_thread(self.consumer.ack, [d.entry_id for d in batch])

    async def stats(self, since: float) -> dict[str, Any]:
        reads = [(s, n) for t, s, n in self.reads if t >= since and n]
        return {"steps": self.steps, "version": self.version, "reads": len(reads),
                "entries": sum(n for _, n in reads),
                "dead_letters": await asyncio.to_thread(
                    lambda: self.consumer.redis.xlen(self.consumer.dead_letter_stream)),
                "read_p50_ms": 1000 * percentile([s for s, _ in reads], 0.5) if reads else 0.0,
                "now": time.monotonic()}

    async def halt(self) -> None:
        self.stop = True


# ---- measurements in this process ---------------------------------------------------------------
class TimedExecutor(concurrent.futures.ThreadPoolExecutor):
    """The orchestrator's executor for blocking calls (the size it picks itself), timing how
    long work queues."""

    def __init__(self, threads: int) -> None:
        super().__init__(max_workers=threads)
        self.waits: list[tuple[float, float]] = []
        self.busy_s = 0.0
        self.lock = threading.Lock()
        self.native_ids: set[int] = set()

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        queued = time.monotonic()

        def run() -> Any:
            start = time.monotonic()
            self.native_ids.add(threading.get_native_id())
            try:
                return fn(*args, **kwargs)
            finally:
                with self.lock:
                    self.waits.append((start, start - queued))
                    self.busy_s += time.monotonic() - start
        return super().submit(run)


def thread_cpu() -> dict[int, tuple[str, float]]:
    """CPU seconds of each of this process's threads, by native id: (name, seconds)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            stat = (task / "stat").read_text()
            name = (task / "comm").read_text().strip()
        except OSError:                 # the thread ended
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        out[int(task.name)] = (name, (int(fields[11]) + int(fields[12])) / tick)
    return out


def cpu_by_thread(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]],
                  loop_id: int, io_ids: set[int], steps: int) -> dict[str, float]:
    """Milliseconds of CPU per step in the window: the event loop's thread, the blocking-call
    pool's threads, and the rest by thread name (Ray's core worker and gRPC threads)."""
    ms: dict[str, float] = defaultdict(float)
    for tid, (name, sec) in after.items():
        used = sec - before.get(tid, (name, 0.0))[1]
        kind = "event_loop" if tid == loop_id else "io_pool" if tid in io_ids else name
        ms[kind] += 1000 * used / max(1, steps)
    return {k: round(v, 3) for k, v in sorted(ms.items(), key=lambda kv: -kv[1]) if v >= 0.01}


async def loop_lag(samples: list[tuple[float, float]], period_s: float = 0.05) -> None:
    """How late the event loop wakes a sleeper: its lag."""
    while True:
        t0 = time.monotonic()
        await asyncio.sleep(period_s)
        samples.append((t0, time.monotonic() - t0 - period_s))


class TimedTokenizer:
    def __init__(self, tokenizer: HFChatTokenizer):
        self.tokenizer, self.seconds, self.calls = tokenizer, 0.0, 0

    def apply_chat_template(self, *args: Any, **kwargs: Any) -> Any:
        t0 = time.thread_time()
        try:
            return self.tokenizer.apply_chat_template(*args, **kwargs)
        finally:
            self.seconds += time.thread_time() - t0
            self.calls += 1

    def apply_chat_template_stable(self, *args: Any) -> Any:
        t0 = time.thread_time()
        try:
            return self.tokenizer.apply_chat_template_stable(*args)
        finally:
            self.seconds += time.thread_time() - t0
            self.calls += 1

    def decode(self, *args: Any, **kwargs: Any) -> str:
        return self.tokenizer.decode(*args, **kwargs)


def synthetic_accounts(n: int) -> list[Account]:
    return [Account(str(3_000_000_000_000_000 + i), f"bench{i}", "not-a-password-00",
                    f"LTAI5tScale{i:08d}", f"scale-secret-{i:08d}-not-real") for i in range(n)]


def stream_headroom(redis_url: str, fields: dict[str, Any], seconds: float = 2.0
                    ) -> dict[str, float]:
    """The stream's capacity here: XADD of a realistic group, then XREADGROUP of them back,
    one client, one entry per call, for about ``seconds`` each."""
    import redis as redis_lib
    r = redis_lib.Redis.from_url(redis_url)
    key = "scale:headroom"
    r.delete(key)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        r.xadd(key, fields)
        n += 1
    xadd_per_s = n / (time.perf_counter() - t0)
    r.xgroup_create(key, "g", id="0")
    m, t0 = 0, time.perf_counter()
    while m < n and time.perf_counter() - t0 < seconds:
        got = r.xreadgroup("g", "c", {key: ">"}, count=1)
        m += len(got[0][1]) if got else 0
    xread_per_s = m / (time.perf_counter() - t0)
    r.delete(key)
    return {"xadd_max_per_s": round(xadd_per_s), "xreadgroup_max_per_s": round(xread_per_s)}


def sample_group_fields(tokenizer: HFChatTokenizer, pages: list[str],
                        turns: int = 5) -> dict[str, Any]:
    rng = random.Random(0)
    samples = []
    for k in range(4):
        ts = tuple(Turn(tuple(tokenizer.apply_chat_template(
            [{"role": "user", "content": rng.choice(pages)}], tokenize=True,
            add_generation_prompt=True)), (1, 2, 3), (-0.1,) * 3, (1,) * 3, 0, ACTION, ACTION)
            for _ in range(turns))
        samples.append(Sample(f"t{k}", ts, float(k % 2), "success"))
    return encode_group(Group("g-sample", "ram-create-user-0", tuple(samples), time.time()))


def redis_info(client: Any) -> dict[str, Any]:
    info = client.info()
    stats = client.info("commandstats")
    return {"used_memory": info["used_memory"], "cpu_s": info["used_cpu_user"]
            + info["used_cpu_sys"], "commands": {k.removeprefix("cmdstat_"): v
                                                 for k, v in stats.items()}}


# ---- one N --------------------------------------------------------------------------------------
async def run_n(n: int, args: argparse.Namespace, latency: Latency, redis_url: str,
                tokenizer: HFChatTokenizer, pages: list[str]) -> dict[str, Any]:
    import redis as redis_lib
    executor = TimedExecutor(n + 4)           # OrchestratorConfig.io_threads' default
    rng = random.Random(args.seed + n)
    # A tenth more accounts than workers (and one for each lease probe): the probes then time
    # the pool's own cost, not a wait for an account every worker holds.
    accounts = synthetic_accounts(n + n // 10 + 2)
    prefix = f"scale:{n}"
    client = redis_lib.Redis.from_url(redis_url, decode_responses=True)
    for key in client.scan_iter(f"{prefix}:*"):
        client.delete(key)
    stream_name = f"{prefix}:experience"
    tally: dict[str, float] = defaultdict(float)
    lookups: dict[str, list[float]] = defaultdict(list)
    clouds = {a.account_id: SimCloud(a.account_id, latency, random.Random(rng.random()),
                                     lookups, tally) for a in accounts}
    group_size = args.group_size
    # One episode per worker a step by default: the batch the fleet fills in about one
    # episode's time, which max_staleness then covers (orchestrator.admission_short).
    groups_per_step = args.groups_per_step or max(1, n // group_size)
    host = ray.remote(SimEnvHost).options(num_cpus=0, max_concurrency=max(1000, 4 * n)).remote(
        n, accounts, redis_url, f"{prefix}:pool", latency, pages, args.seed + n)
    trainer = ray.remote(SimTrainer).options(num_cpus=0, max_concurrency=8).remote(
        redis_url, stream_name, groups_per_step, args.train_seconds)
    trainer_run = trainer.run.remote()
    # Two probes: one ahead of the simulated fleet for the CPU (a worker process on its own
    # node: what the pool itself costs), one at the fleet's priority (this machine's 2 cores
    # shared by everything: what it costs here).
    probe = ray.remote(LeaseProbe).options(num_cpus=0).remote(
        accounts, redis_url, f"{prefix}:pool", nice=PRIORITY_NICE)
    probe_shared = ray.remote(LeaseProbe).options(num_cpus=0).remote(
        accounts, redis_url, f"{prefix}:pool", holder="lease-probe-shared")
    timed_tok = TimedTokenizer(tokenizer)
    fleet = ray.remote(SimPolicyFleet).options(num_cpus=0, max_concurrency=max(1000, 4 * n)
                                               ).remote(latency, list(tokenizer.tokenizer.encode(
                                                   ACTION)), args.seed + n + 1)
    agent = AgentLoop(PolicyRouter([fleet]), timed_tok, AgentConfig(
        max_steps=max(latency.turns) + 1, system_prompt="compact", history_turns=2,
        max_new_tokens=32, max_prompt_tokens=1024, max_observation_chars=1500))
    stream = ExperienceStream(StreamConfig(url=redis_url, stream=stream_name, max_len=100_000))
    pushes: list[tuple[float, float]] = []
    real_push = stream.push

    def push(group: Group) -> str:
        t0 = time.perf_counter()
        try:
            return real_push(group)
        finally:
            pushes.append((time.monotonic(), time.perf_counter() - t0))
    stream.push = push                                           # type: ignore[method-assign]
    await host.stats.remote(0.0)                                 # the host is up
    tasks = load_suite(TASKS_DIR)
    orch = Orchestrator(
        OrchestratorConfig(group_size=group_size, mode="async", max_staleness=args.max_staleness,
                           groups_per_step=groups_per_step, drop_uniform_groups=False,
                           task_filter=TASKS, acquire_timeout_s=120, seed=args.seed,
                           turn_loop=args.turn_loop),
        tasks, [WorkerProxy(host, f"w{i}") for i in range(n)], accounts, "sim.cloud", agent,
        SimScorer(clouds, latency, random.Random(rng.random()), tally), stream,
        client_factory=lambda a: clouds[a.account_id], executor=executor)

    async def versions() -> None:                   # the policy serves the newest weights
        while True:
            await fleet.set_version.remote(await asyncio.to_thread(stream.trainer_version))
            await asyncio.sleep(0.5)
    lag: list[tuple[float, float]] = []
    side = [asyncio.create_task(loop_lag(lag)), asyncio.create_task(versions())]
    run = asyncio.create_task(orch.run(None))
    proc = psutil.Process()
    _progress(f"N={n}: warming up {args.warmup:g} s ({n} workers lease, sign in, start)")
    await asyncio.sleep(args.warmup)
    t0 = time.monotonic()
    cpu0 = sum(proc.cpu_times()[:2])
    loop0 = time.thread_time()                 # this thread: the event loop's CPU
    threads0 = thread_cpu()
    host0 = await host.stats.remote(t0)
    fleet0 = await fleet.stats.remote()
    redis0 = redis_info(client)
    steps0, eps0, busy0 = host0["steps"], len(orch.episodes), executor.busy_s
    tok0, tokc0 = timed_tok.seconds, timed_tok.calls
    for k in range(int(args.window // 10)):
        await asyncio.sleep(10)
        _progress(f"N={n}: {10 * (k + 1)}/{args.window:g} s of the window, "
                  f"{len(orch.episodes) - eps0} episodes")
    await asyncio.sleep(args.window % 10)
    wall = time.monotonic() - t0
    cpu = sum(proc.cpu_times()[:2]) - cpu0
    loop_busy = (time.thread_time() - loop0) / (time.monotonic() - t0)
    threads1 = thread_cpu()
    host1 = await host.stats.remote(t0)
    fleet1 = await fleet.stats.remote()
    trainer1 = await trainer.stats.remote(t0)
    probed = await probe.results.remote(t0)
    probed_shared = await probe_shared.results.remote(t0)
    ray.kill(probe)
    ray.kill(probe_shared)
    redis1 = redis_info(client)
    episodes = [e for e in orch.episodes[eps0:]]
    steps = host1["steps"] - steps0
    orch.stop()
    for t in side:
        t.cancel()
    try:
        await asyncio.wait_for(run, timeout=120)
    except asyncio.TimeoutError:
        run.cancel()
    await trainer.halt.remote()
    await asyncio.wait_for(trainer_run, timeout=30)
    await asyncio.wait_for(host.drain.remote(), timeout=120)
    ray.kill(host)
    ray.kill(trainer)
    ray.kill(fleet)

    # the figures
    sdk_per_ep = tally["sdk_calls"] / max(1, len(orch.episodes))
    lookups_per_ep = sum(len(v) for v in lookups.values()) / max(1, len(orch.episodes))
    ideal_ep_s = latency.mean_episode_s(sdk_per_ep, lookups_per_ep)
    ideal = n / ideal_ep_s
    achieved = len(episodes) / wall
    window_lookups = [t for ts in lookups.values() for t in ts if t >= t0]
    per_account_peak = max((max(_per_second(ts, t0)) for ts in lookups.values() if ts),
                           default=0)
    acquires = host1["acquires"]
    waits = [w for t, w in executor.waits if t >= t0]
    lags = [x for t, x in lag if t >= t0]
    push_s = [s for t, s in pushes if t >= t0]
    threads = executor._max_workers
    host_cpu = host1["cpu_s"] - host0["cpu_s"]
    util = {
        "orchestrator_cpu": cpu / wall,
        # The N env workers' control-plane CPU (leases, heartbeats, and with the turns on
        # the workers their prompts and policy calls; the browser is simulated), as a share
        # of what they are given: one process each, num_cpus_per_worker of a core.
        "env_worker_cpu": host_cpu / wall / n / ENV_CPUS_PER_WORKER,
        "redis_cpu": (redis1["cpu_s"] - redis0["cpu_s"]) / wall,
        "orchestrator_thread_pool": (executor.busy_s - busy0) / wall / threads,
        # The event loop's thread (one core at most, the GIL's holder): the rollout actor's
        # ceiling; orchestrator_cpu adds its threads (blocking calls).
        "orchestrator_loop": loop_busy,
        # Sustained LookupEvents per account against the budget (a 2/s bucket lets 3 land
        # in one calendar second: the peak is reported, not used for this).
        "actiontrail_per_account": len(window_lookups) / wall / n / TRAIL_QPS,
    }
    # Commands in the window (the server counts since it started), per episode.
    cmds = {k: {"calls": v["calls"] - redis0["commands"].get(k, {}).get("calls", 0),
                "usec_per_call": v["usec_per_call"]}
            for k, v in redis1["commands"].items()}
    cmds = {k: v for k, v in sorted(cmds.items(), key=lambda kv: -kv[1]["calls"])
            if v["calls"] > 0}
    tok_calls = timed_tok.calls - tokc0
    out = {
        "workers": n, "accounts": len(accounts), "window_s": round(wall, 1),
        "turn_loop": orch.turn_loop_used,
        "episodes": len(episodes), "steps": steps,
        "episodes_per_s": round(achieved, 3), "steps_per_s": round(steps / wall, 2),
        "ideal_episodes_per_s": round(ideal, 3),
        "ideal_steps_per_s": round(ideal * statistics.fmean(latency.turns), 2),
        "model_episode_s": round(ideal_ep_s, 2),
        "throughput_vs_ideal": round(achieved / ideal, 4),
        "env_errors": sum(1 for e in episodes if e.env_error is not None),
        "orchestrator_ms_per_step": round(1000 * cpu / max(1, steps), 3),
        "orchestrator_ms_per_step_by_thread": cpu_by_thread(
            threads0, threads1, threading.get_native_id(), executor.native_ids, steps),
        # The tokenizer's share of it (None: the prompts were built on the env workers).
        "tokenize_ms_per_step": round(1000 * (timed_tok.seconds - tok0) / tok_calls, 3)
        if tok_calls else None,
        # Where the turns ran, the env workers' CPU per step (all N of them, this machine's
        # one packed host process) and the simulated fleet's (Ray calls only).
        "env_workers_ms_per_step": round(1000 * host_cpu / max(1, steps), 3),
        "policy_calls_per_s": round((fleet1["calls"] - fleet0["calls"]) / wall, 1),
        "policy_fleet_ms_per_call": round(1000 * (fleet1["cpu_s"] - fleet0["cpu_s"])
                                          / max(1, fleet1["calls"] - fleet0["calls"]), 3),
        # One worker process's view (the probe), and the packed host's (its queueing too).
        "lease_acquire_p50_ms": round(1000 * percentile(probed, 0.5), 2) if probed else None,
        "lease_acquire_p99_ms": round(1000 * percentile(probed, 0.99), 2) if probed else None,
        "lease_probes": len(probed),
        "lease_acquire_shared_cpu_p50_ms": round(1000 * percentile(probed_shared, 0.5), 2)
        if probed_shared else None,
        "lease_acquire_shared_cpu_p99_ms": round(1000 * percentile(probed_shared, 0.99), 2)
        if probed_shared else None,
        "lease_acquire_in_host_p50_ms": round(1000 * percentile(acquires, 0.5), 2)
        if acquires else None,
        "lease_acquire_in_host_p99_ms": round(1000 * percentile(acquires, 0.99), 2)
        if acquires else None,
        "lease_acquires": len(acquires),
        "cold_start_acquire_p99_ms": round(1000 * percentile(host1["cold_acquires"], 0.99), 1)
        if host1["cold_acquires"] else None,
        "stream_xadd_per_s": round(len(push_s) / wall, 2),
        "stream_xadd_p50_ms": round(1000 * percentile(push_s, 0.5), 2) if push_s else None,
        "stream_xreadgroup_per_s": round(trainer1["reads"] / wall, 2),
        "stream_xreadgroup_p50_ms": round(trainer1["read_p50_ms"], 2),
        "trainer_steps": trainer1["steps"], "groups_per_step": groups_per_step,
        "max_staleness": args.max_staleness,
        "admission_short": orch.admission_short(),
        "stream_dead_letters": trainer1["dead_letters"],
        "actiontrail_qps_total": round(len(window_lookups) / wall, 2),
        "actiontrail_qps_per_account_mean": round(len(window_lookups) / wall / n, 4),
        "actiontrail_qps_per_account_peak": per_account_peak,
        "actiontrail_budget_per_account": TRAIL_QPS,
        "redis_used_memory_mb": round(redis1["used_memory"] / 2**20, 1),
        "redis_cpu": round(util["redis_cpu"], 3),
        "redis_commands_per_s": round(sum(v["calls"] for v in cmds.values()) / wall, 1),
        "redis_commands_per_episode": {k: round(v["calls"] / max(1, len(episodes)), 2)
                                       for k, v in cmds.items()},
        "redis_usec_per_call": {k: v["usec_per_call"] for k, v in cmds.items()},
        "event_loop_lag_p99_ms": round(1000 * percentile(lags, 0.99), 1) if lags else None,
        "thread_pool_wait_p99_ms": round(1000 * percentile(waits, 0.99), 1) if waits else None,
        "utilization": {k: round(v, 3) for k, v in util.items()},
    }
    out["first_saturated"] = max(util, key=lambda k: util[k])
    return out


def _per_second(times: list[float], since: float) -> list[int]:
    counts: dict[int, int] = defaultdict(int)
    for t in times:
        if t >= since:
            counts[int(t)] += 1
    return list(counts.values()) or [0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--workers", default="10,100,1000",
                        help="N, or several separated by commas")
    parser.add_argument("--warmup", type=float, default=0.0,
                        help="seconds before the window (default: 10 + N/40)")
    parser.add_argument("--window", type=float, default=0.0,
                        help="seconds measured (default: 60, 90 from N = 500)")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-staleness", type=int, default=2)
    parser.add_argument("--groups-per-step", type=int, default=0,
                        help="the trainer's batch in groups (default: N / group size, one "
                             "episode per worker a step)")
    parser.add_argument("--train-seconds", type=float, default=1.0,
                        help="the stand-in trainer's step (a GPU step; the trainer is not the "
                             "control plane, so it keeps up)")
    parser.add_argument("--turn-loop", default="auto", choices=("auto", "worker", "orchestrator"),
                        help="where episodes' turns run (orchestrator.turn_loop; auto: on the "
                             "env workers from 1,000 workers up, as in the job)")
    parser.add_argument("--latency", default=str(LATENCY_FILE))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--calibrate", action="store_true",
                        help="measure the latency model here and write --latency")
    args = parser.parse_args(argv)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # clean-up on kill
    if args.calibrate:
        from benchmarks.scale_calibrate import calibrate
        calibrate(Path(args.latency))
        return 0
    try:
        ns = [int(x) for x in args.workers.split(",")]
    except ValueError:
        parser.error(f"--workers: integers separated by commas, got {args.workers!r}")
    if any(n < 1 or n > 5000 for n in ns):
        parser.error("--workers: each N in 1..5000")
    if not Path(args.latency).exists():
        parser.error(f"--latency: {args.latency} not found (python -m benchmarks.scale "
                     "--calibrate measures it)")
    latency = Latency.load(Path(args.latency))
    tokenizer = HFChatTokenizer(resolve_model("default"))
    pages = page_texts()
    state = Path(tempfile.mkdtemp(prefix="consolerl-scale-"))
    redis = RedisServer(state / "redis", persistent=False).start()
    # Redis has a core of its own on a cluster; here it shares 2 with the simulated fleet.
    try:
        psutil.Process(redis.proc.pid).nice(PRIORITY_NICE)
    except psutil.AccessDenied:
        _progress("cannot raise Redis's CPU priority here (not root): it shares the fleet's")
    results = []
    t_start = time.monotonic()
    try:
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
                 configure_logging=False)
        headroom = stream_headroom(redis.url, sample_group_fields(tokenizer, pages))
        _progress(f"stream headroom here: {headroom}")
        for n in ns:
            if not args.warmup:
                args_n = argparse.Namespace(**{**vars(args), "warmup": 10 + n / 40})
            else:
                args_n = args
            if not args.window:
                args_n = argparse.Namespace(**{**vars(args_n),
                                               "window": 90.0 if n >= 500 else 60.0})
            result = asyncio.run(run_n(n, args_n, latency, redis.url, tokenizer, pages))
            result.update(headroom)
            _progress(f"N={n}: {result['episodes_per_s']} episodes/s of an ideal "
                      f"{result['ideal_episodes_per_s']} ({result['throughput_vs_ideal']}); "
                      f"{result['orchestrator_ms_per_step']} ms orchestrator CPU per step; "
                      f"lease p99 {result['lease_acquire_p99_ms']} ms; first saturated: "
                      f"{result['first_saturated']}")
            results.append(result)
    finally:
        if ray.is_initialized():
            ray.shutdown()
        redis.stop()
        shutil.rmtree(state, ignore_errors=True)
    out = {"latency_model": {"source": latency.source,
                             "mean_turns": round(statistics.fmean(latency.turns), 2)},
           "runs": results, "wall_s": round(time.monotonic() - t_start, 1)}
    if len(results) == 1:
        out.update(results[0])
    print(json.dumps(out) if args.json else json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
