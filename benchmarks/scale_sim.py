"""The scale benchmark's simulated parts: what cannot run here (a thousand browsers, a policy
fleet, the real cloud, a GPU trainer) stands in around the real control plane, each simulated
call drawing its time from the latency model (:class:`~benchmarks.scale_model.Latency`).

- :class:`SimEnvHost`: N real env worker bodies (real leases on a real Redis) in one Ray actor,
  only their browser (:class:`SimBrowser`) simulated; :class:`WorkerProxy` is how the
  orchestrator calls one of them;
- :class:`LeaseProbe`: one env worker process's view of the lease pool, timed;
- :class:`SimPolicyFleet`: the PolicyServers;
- :class:`SimCloud`: an empty cloud account (SDK calls, LookupEvents);
- :class:`SimScorer`: the reward service, through the real per-account ActionTrail limiter;
- :class:`SimTrainer`: a trainer that reads the real experience stream and publishes versions.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import os
import random
import threading
import time
from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import psutil
from prometheus_client import CollectorRegistry

from benchmarks.scale_model import TRAIL_QPS, Latency
from consolerl.accounts import Account
from consolerl.rewards import RewardResult
from consolerl.stats import percentile
from consolerl.types import Observation, StepResult
from env_workers.accounts import PoolConfig
from env_workers.actions import parse_action
from env_workers.leases import AccountPool
from env_workers.pool import LeasedEnvWorker
from env_workers.worker import WorkerConfig
from reward_service.actiontrail import TrailClient, TrailConfig, TrailMetrics
from rollout_service.agent import Generation
from rollout_service.experience import ExperienceStream, StreamConfig
from trainer.stream import ConsumerConfig, ExperienceConsumer


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
            f"w{i}": LeasedEnvWorker(WorkerConfig(), config, f"w{i}", pool=self.pool,
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

