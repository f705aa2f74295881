"""Fault injection over the whole running system, and the invariants checked from outside.

One case is a short real training run (``configs/smoke.yaml``: a tiny model, 2 env workers on
Chromium, the local cloud, Redis, an embedded Ray cluster, 2 GRPO steps) with one fault
injected at a point drawn from a fixed seed, then checked from the outside:

- ``finished``: the run (resumed once where the fault ends it) reaches its final step count;
- ``lost``: every experience entry the trainer acknowledged was trained (or dead-lettered),
  read from the stream's consumer group in Redis;
- ``twice``: no group id is in two training steps of the run's ``metrics.jsonl`` lineage;
- ``exclusive``: no account was used under two leases at once, from the local cloud's audit
  log: every call done under a lease carries the lease's mark (account, fencing number) in
  its user agent, and an older lease's last call never comes after a newer lease's first;
- ``leftover``: no cloud resource created during the run is still there (the cloud's store);
- ``env_error``: no trained episode was running on a component the fault broke at the time
  (its trajectory's interval, worker process and the fault time, from the stream entries);
- ``running``: no process of the run (they carry ``CONSOLERL_FAULT_CASE`` in their
  environment) is still alive at the end.

``python -m tests.faults.harness FAULT SEED`` runs one case and prints its result;
``python -m tests.faults.report`` prints the table of every case run so far.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis

from consolerl.accounts import parse_lease_agent
from consolerl.errors import ConfigError
from consolerl.experience import decode_group
from infra.local_cloud import LocalCloud, free_port
from infra.redis_local import RedisServer

ROOT = Path(__file__).resolve().parents[2]
WORK = ROOT / "var" / "faults"
RESULTS = WORK / "results.jsonl"
MARK = "CONSOLERL_FAULT_CASE"
STEPS = 2
STREAM = "consolerl:smoke:experience"
LEASES = "consolerl:smoke:pool"
DEAD_SUFFIX = ":dead"
JOB_TIMEOUT_S = 480
WINDOW_S = 20.0            # the fault lands this long at most after the first lease


@dataclass
class Proc:
    pid: int
    ppid: int
    cmdline: str


def processes(marker: str) -> list[Proc]:
    """Live processes whose environment carries ``MARK=marker``."""
    out = []
    needle = f"{MARK}={marker}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            state, ppid = stat.rsplit(")", 1)[1].split()[:2]
            if state == "Z":
                continue
            out.append(Proc(int(entry), int(ppid), cmd))
        except (OSError, ValueError, IndexError):
            continue
    return out


def ancestors(pid: int) -> list[int]:
    chain = []
    while pid > 1:
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        chain.append(pid)
    return chain


@dataclass
class Injection:
    at: float = 0.0                      # wall clock of the fault
    after_first_lease_s: float = 0.0     # drawn from the seed; then when it really landed
    step: int = 0                        # trainer steps done when it landed
    detail: str = ""
    victim_pid: int = 0                  # the env worker process a worker fault hit
    affects: str = ""                    # "worker" | "all" | "" (which episodes must not train)


@dataclass
class CaseResult:
    fault: str
    seed: int
    injected: bool = False
    survived: bool = False
    resumed: bool = False
    exit_codes: list[int] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    injection: dict[str, Any] = field(default_factory=dict)
    checks: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0


class Case:
    """One run with one fault; :meth:`run` returns the :class:`CaseResult`."""

    def __init__(self, fault: str, seed: int):
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; known: {', '.join(FAULTS)}")
        self.fault, self.seed = fault, seed
        self.spec = FAULTS[fault]
        self.rng = random.Random(f"{fault}:{seed}")
        self.dir = WORK / f"{fault}-{seed}"
        self.marker = f"{fault}-{seed}-{os.getpid()}"
        self.redis: RedisServer | None = None
        self.cloud: LocalCloud | None = None
        self.job: subprocess.Popen | None = None
        self.injection = Injection(affects=self.spec.affects)
        self.result = CaseResult(fault, seed)
        self.mounted = False

    # ---- services ----------------------------------------------------------------------------
    def start_services(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True)
        self.redis = RedisServer(self.dir / "redis", port=free_port()).start()
        self.redis_fsync_always()
        self.cloud = LocalCloud(self.dir / "cloud", port=free_port(),
                                args=("--lookup-qps", "20")).start()

    def restart_redis(self, down_s: float) -> None:
        assert self.redis is not None and self.redis.proc is not None
        self.redis.proc.kill()
        self.redis.proc.wait()
        time.sleep(down_s)
        self.redis.start()
        self.redis_fsync_always()

    def redis_fsync_always(self) -> None:
        """Every write on disk before Redis answers: what a Redis that must not lose
        acknowledged experience runs with."""
        self.r().config_set("appendfsync", "always")

    def restart_cloud(self, down_s: float) -> None:
        assert self.cloud is not None and self.cloud.proc is not None
        self.cloud.proc.kill()
        self.cloud.proc.wait()
        time.sleep(down_s)
        self.cloud.start()

    def cloud_faults(self, **settings: float) -> None:
        """The local cloud's fault settings file (read on each request)."""
        path = self.dir / "cloud" / "faults.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(settings))
        tmp.replace(path)

    def r(self) -> redis.Redis:
        assert self.redis is not None
        return redis.Redis(host="127.0.0.1", port=self.redis.port, decode_responses=True)

    # ---- the job -----------------------------------------------------------------------------
    def job_args(self, resume: bool) -> list[str]:
        assert self.cloud is not None and self.redis is not None
        args = [sys.executable, "-m", "cluster.job", "--config", "configs/smoke.yaml",
                "--run-dir", str(self.dir / "run"),
                f"cloud.endpoint={self.cloud.endpoint}",
                f"env.worker.console_url={self.cloud.url}",
                f"stream.url={self.redis.url}", f"trainer.steps={STEPS}",
                # A dead worker's lease frees its account after 20 s (the default 60 s
                # would only make the cases longer).
                "env.pool.lease_ttl_s=20", "observe.enabled=false", "run.redis=false"]
        if self.spec.checkpoint_dir:
            args.append(f"trainer.checkpoint.dir={self.dir / 'ckpt'}")
        if resume:
            args.append("--resume")
        return args

    def run_job(self, resume: bool) -> int:
        log = open(self.dir / ("resume.log" if resume else "job.log"), "ab")
        self.job = subprocess.Popen(self.job_args(resume), cwd=ROOT, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True,
                                    env={**os.environ, MARK: self.marker,
                                         "PYTHONUNBUFFERED": "1"})
        try:
            return self.job.wait(timeout=JOB_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill_job()
            return -9

    def kill_job(self) -> None:
        for p in processes(self.marker):
            try:
                os.kill(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.job is not None:
            self.job.wait()

    def steps_done(self) -> int:
        path = self.dir / "run" / "metrics.jsonl"
        try:
            lines = path.read_text().splitlines()
        except OSError:
            return 0
        return sum(1 for line in lines if line.strip() and '"stage": "grpo"' in line
                   or '"group_ids"' in line)

    # ---- injection ---------------------------------------------------------------------------
    def injector(self) -> None:
        """Wait for the first lease, then a seeded delay, then the fault (unless the job is
        over by then)."""
        client = self.r()
        t_start = time.monotonic()
        first = None
        while self.job is None or self.job.poll() is None:
            try:
                if first is None and next(client.scan_iter(f"{LEASES}:lease:*"), None):
                    first = time.monotonic()
                    delay = self.rng.uniform(0.0, WINDOW_S)
                    self.injection.after_first_lease_s = round(delay, 1)
                if first is not None and time.monotonic() >= first + \
                        self.injection.after_first_lease_s:
                    break
            except redis.RedisError:
                pass
            if time.monotonic() - t_start > JOB_TIMEOUT_S:
                return
            time.sleep(0.2)
        else:
            return
        # The first moment at or after the drawn point when the fault has something to hit
        # (a browser open, say), while the job runs.
        while True:
            self.injection.at = time.time()
            self.injection.step = self.steps_done()
            self.injection.after_first_lease_s = round(time.monotonic() - first, 1)
            try:
                self.injection.detail = self.spec.inject(self)
                self.result.injected = True
                return
            except NoVictim as exc:
                self.injection.detail = f"no victim: {exc}"
            if self.job is not None and self.job.poll() is not None:
                return
            time.sleep(0.2)

    # ---- the case ----------------------------------------------------------------------------
    def run(self) -> CaseResult:
        t0 = time.monotonic()
        try:
            self.start_services()
            if self.spec.checkpoint_dir:
                self.mounted = mount_small_tmpfs(self.dir / "ckpt")
            baseline = self.resources()
            thread = threading.Thread(target=self.injector, daemon=True)
            self.job = None
            thread.start()
            code = self.run_job(resume=False)
            thread.join(timeout=60)
            self.result.exit_codes.append(code)
            self.spec.after(self)
            if not self.finished():
                self.wait_gone(20)
                self.result.resumed = True
                self.result.exit_codes.append(self.run_job(resume=True))
            self.check(baseline)
        finally:
            self.cleanup()
        self.result.injection = asdict(self.injection)
        self.result.survived = self.result.injected and not self.result.violations
        self.result.wall_s = round(time.monotonic() - t0, 1)
        WORK.mkdir(parents=True, exist_ok=True)
        with open(RESULTS, "a") as f:
            f.write(json.dumps(asdict(self.result)) + "\n")
        return self.result

    def finished(self) -> bool:
        try:
            summary = json.loads((self.dir / "run" / "summary.json").read_text())
        except (OSError, ValueError):
            return False
        return bool(summary.get("completed")) and summary.get("steps") == STEPS

    def wait_gone(self, timeout_s: float) -> list[Proc]:
        deadline = time.monotonic() + timeout_s
        left = processes(self.marker)
        while left and time.monotonic() < deadline:
            time.sleep(0.5)
            left = processes(self.marker)
        return left

    def cleanup(self) -> None:
        self.kill_job()                  # whatever of the run is still alive
        if self.redis is not None:
            self.redis.stop()
        if self.cloud is not None:
            self.cloud.stop()
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.dir / "ckpt")], check=False)

    # ---- invariants --------------------------------------------------------------------------
    def resources(self) -> set[tuple[str, str, str]]:
        db = self.dir / "cloud" / "cloud.db"
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as c:
            return {tuple(row) for row in c.execute(
                "SELECT account_id, rtype, rid FROM resources WHERE rtype != 'client_token'")}

    def check(self, baseline: set[tuple[str, str, str]]) -> None:
        v = self.result.violations
        checks = self.result.checks
        if not self.finished():
            v.append(f"finished: the run did not reach step {STEPS} "
                     f"(exit codes {self.result.exit_codes})")
        left = self.wait_gone(30)
        if left:
            v.append("running: " + "; ".join(f"{p.pid} {p.cmdline[:80]}" for p in left[:5]))
        # The lineage of trained groups.
        trained: list[str] = []
        try:
            for line in (self.dir / "run" / "metrics.jsonl").read_text().splitlines():
                row = json.loads(line) if line.strip() else {}
                if row.get("stage", "grpo") == "grpo" and "group_ids" in row:
                    trained += row["group_ids"]
        except OSError:
            pass
        checks["trained_groups"] = len(trained)
        twice = sorted({g for g in trained if trained.count(g) > 1})
        if twice:
            v.append(f"twice: groups trained in two steps: {twice}")
        client = self.r()
        raw = redis.Redis(host="127.0.0.1", port=self.redis.port)   # entries are binary
        entries = [(e.decode(), f) for e, f in raw.xrange(STREAM)]
        by_group: dict[str, tuple[str, Any]] = {}
        for entry_id, fields in entries:
            try:
                group = decode_group(fields)
            except ConfigError:
                continue                  # a malformed entry is the dead letter's business
            by_group.setdefault(group.group_id, (entry_id, group))
        checks["stream_entries"] = len(entries)
        # Acknowledged: delivered to the consumer group and no longer pending.
        acked = set()
        groups = client.xinfo_groups(STREAM) if entries else []
        for info in groups:
            last = info["last-delivered-id"]
            pending = {p["message_id"] for p in client.xpending_range(
                STREAM, info["name"], "-", "+", 10_000)}
            acked |= {e for e, _ in entries if _id_le(e, last) and e not in pending}
        dead = set()
        for _, fields in raw.xrange(STREAM + DEAD_SUFFIX):
            try:
                dead.add(decode_group(fields).group_id)
            except ConfigError:
                pass
        lost = [gid for gid, (eid, _) in by_group.items()
                if eid in acked and gid not in trained and gid not in dead]
        checks["acked_entries"] = len(acked)
        if lost:
            v.append(f"lost: acknowledged groups never trained: {lost}")
        self.check_exclusive(checks, v)
        now = self.resources() - baseline
        if now:
            v.append(f"leftover: {sorted(now)[:10]}")
        # Env errors kept out of training.
        if self.injection.affects and self.result.injected:
            hit = []
            episodes = 0
            for gid in trained:
                _eid, group = by_group.get(gid, (None, None))
                if group is None:
                    v.append(f"env_error: trained group {gid} is not in the stream")
                    continue
                for ep in group.meta.get("episodes", []):
                    episodes += 1
                    on_victim = (self.injection.affects == "all"
                                 or ep.get("worker_pid") == self.injection.victim_pid)
                    if on_victim and ep["started_at"] <= self.injection.at <= ep["ended_at"]:
                        hit.append(ep["trajectory_id"])
            checks["trained_episodes"] = episodes
            if trained and not episodes:
                v.append("env_error: trained groups carry no episode records (check vacuous)")
            if hit:
                v.append(f"env_error: episodes the fault broke were trained: {hit}")

    def check_exclusive(self, checks: dict[str, Any], v: list[str]) -> None:
        db = self.dir / "cloud" / "cloud.db"
        spans: dict[tuple[str, int], list[int]] = {}
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as c:
            # Ordered by the cloud's append order (seq), not event_ms: a fault moves the
            # cloud's clock, and a clock moved back would reorder the times.
            for account, ms, body in c.execute(
                    "SELECT account_id, seq, body FROM events ORDER BY seq"):
                mark = parse_lease_agent(json.loads(body).get("userAgent", ""))
                if mark is None:
                    continue
                if mark[0] != account:
                    v.append(f"exclusive: lease of {mark[0]} acted on account {account}")
                    continue
                span = spans.setdefault(mark, [ms, ms])
                span[0], span[1] = min(span[0], ms), max(span[1], ms)
        checks["leases_in_audit_log"] = len(spans)
        if not spans:
            v.append("exclusive: no audit event carries a lease mark (check vacuous)")
        by_account: dict[str, list[tuple[int, int, int]]] = {}
        for (account, fencing), (lo, hi) in spans.items():
            by_account.setdefault(account, []).append((fencing, lo, hi))
        for account, leases in by_account.items():
            leases.sort()
            for i, (f_old, _lo, hi) in enumerate(leases):
                for f_new, lo_new, _ in leases[i + 1:]:
                    if hi > lo_new:
                        v.append(f"exclusive: account {account}: lease {f_old} acted (event "
                                 f"{hi}) after lease {f_new} began (event {lo_new})")


def _id_le(a: str, b: str) -> bool:
    pa, pb = a.split("-"), b.split("-")
    return (int(pa[0]), int(pa[1])) <= (int(pb[0]), int(pb[1]))


def mount_small_tmpfs(path: Path) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", str(path)],
                          capture_output=True, check=False)
    return done.returncode == 0


class NoVictim(Exception):
    """Nothing to inject into at the drawn point (e.g. no browser open)."""


# ---- the faults ----------------------------------------------------------------------------------
def _kill(case: Case, title: str) -> tuple[Proc, str]:
    victims = [p for p in processes(case.marker) if p.cmdline.startswith(title)]
    if not victims:
        raise NoVictim(f"no process titled {title}")
    victim = case.rng.choice(sorted(victims, key=lambda p: p.pid))
    os.kill(victim.pid, signal.SIGKILL)
    return victim, f"SIGKILL {victim.cmdline[:60]} (pid {victim.pid})"


def kill_chromium(case: Case) -> str:
    procs = processes(case.marker)
    browsers = [p for p in procs if "--remote-debugging-pipe" in p.cmdline
                and "--type=" not in p.cmdline]
    if not browsers:
        raise NoVictim("no Chromium running")
    victim = case.rng.choice(sorted(browsers, key=lambda p: p.pid))
    workers = {p.pid for p in procs if p.cmdline.startswith("ray::LeasedEnvWorker")}
    case.injection.victim_pid = next((a for a in ancestors(victim.pid) if a in workers), 0)
    os.kill(victim.pid, signal.SIGKILL)
    return f"SIGKILL Chromium pid {victim.pid} of env worker pid {case.injection.victim_pid}"


def kill_env_worker(case: Case) -> str:
    victim, text = _kill(case, "ray::LeasedEnvWorker")
    case.injection.victim_pid = victim.pid
    return text


def kill_policy(case: Case) -> str:
    return _kill(case, "ray::PolicyServer")[1]


def kill_trainer_worker(case: Case) -> str:
    return _kill(case, "ray::TrainerWorker")[1]


def restart_redis(case: Case) -> str:
    down = round(case.rng.uniform(1.0, 5.0), 1)
    case.restart_redis(down)
    return f"Redis SIGKILLed, restarted from its AOF after {down} s"


def restart_cloud(case: Case) -> str:
    down = round(case.rng.uniform(1.0, 5.0), 1)
    case.restart_cloud(down)
    return f"local cloud SIGKILLed, restarted on its state after {down} s"


def trail_storm(case: Case) -> str:
    """A storm passes: LookupEvents throttled hard and audit delivery late, for a while."""
    qps = 0.2
    delay = round(case.rng.uniform(5.0, 15.0), 1)
    lasts = round(case.rng.uniform(20.0, 40.0), 1)
    case.cloud_faults(lookup_qps=qps, delivery_delay_s=delay)
    timer = threading.Timer(lasts, lambda: (case.dir / "cloud" / "faults.json").unlink(
        missing_ok=True))
    timer.daemon = True
    timer.start()
    return (f"LookupEvents throttled to {qps}/s per account and audit delivery delayed "
            f"{delay} s, for {lasts} s")


def kill_job(case: Case) -> str:
    case.kill_job()
    return "SIGKILL every process of the job"


def fill_disk(case: Case) -> str:
    if not case.mounted:
        raise NoVictim("no tmpfs for the checkpoints (mount needs root)")
    filler = case.dir / "ckpt" / "filler"
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * (1 << 20))
        except OSError:
            pass
    return "the checkpoints' filesystem filled up"


def skew_clock(case: Case) -> str:
    minutes = case.rng.choice([-1, 1]) * round(case.rng.uniform(2.0, 10.0), 1)
    case.cloud_faults(clock_offset_s=minutes * 60)
    return f"the cloud's clock moved {minutes:+} min"


def _free_disk(case: Case) -> None:
    (case.dir / "ckpt" / "filler").unlink(missing_ok=True)


@dataclass(frozen=True)
class Fault:
    inject: Callable[[Case], str]
    affects: str = ""                     # which in-flight episodes the fault breaks
    checkpoint_dir: bool = False
    cleanup: Callable[[Case], None] | None = None

    def after(self, case: Case) -> None:
        if self.cleanup is not None:
            self.cleanup(case)


FAULTS: dict[str, Fault] = {
    "chromium": Fault(kill_chromium, affects="worker"),
    "env_worker": Fault(kill_env_worker, affects="worker"),
    "policy": Fault(kill_policy, affects="all"),
    "trainer_worker": Fault(kill_trainer_worker),
    "redis": Fault(restart_redis),
    "cloud": Fault(restart_cloud, affects="all"),
    "trail_storm": Fault(trail_storm),
    "job_kill": Fault(kill_job),
    "disk_full": Fault(fill_disk, checkpoint_dir=True, cleanup=_free_disk),
    "clock_skew": Fault(skew_clock),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults.harness")
    parser.add_argument("fault", choices=sorted(FAULTS))
    parser.add_argument("seed", type=int)
    args = parser.parse_args(argv)
    result = Case(args.fault, args.seed).run()
    print(json.dumps(asdict(result), indent=2))
    return 0 if result.survived else 1


if __name__ == "__main__":
    sys.exit(main())
