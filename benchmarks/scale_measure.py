"""The scale benchmark's instruments in the measuring process: a thread pool that times its
queueing, per-thread CPU, the event loop's lag, a timed tokenizer, the stream's headroom, Redis's
counters, and the synthetic accounts the workers lease.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import os
import random
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from benchmarks.scale_model import ACTION
from consolerl.accounts import Account
from consolerl.experience import Group, Sample, Turn, encode_group
from rollout_service.models import HFChatTokenizer


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



def per_second(times: list[float], since: float) -> list[int]:
    counts: dict[int, int] = defaultdict(int)
    for t in times:
        if t >= since:
            counts[int(t)] += 1
    return list(counts.values()) or [0]

