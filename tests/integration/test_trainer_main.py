"""End to end: ``python -m cluster.job --config configs/smoke.yaml`` as a user runs it, in its
own process: embedded Ray, Redis and local cloud, 2 env workers (Chromium), a tiny model, 2
GRPO steps on 2 data-parallel trainer workers. The policy version reaches 2 on every replica,
the stream has no pending entries, every account is released, nothing leaks, the process
exits 0 and leaves nothing running."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


_OURS = ("redis-server", "infra.console_sim", "raylet", "gcs_server", "chromium",
         "vllm_server", "ray::")


def _left_behind(started: float) -> list[str]:
    """Redis, local cloud, Ray, Chromium or policy processes created since ``started`` that are
    still alive, leaving out those that belong to an older such process (another job running on
    the machine at the same time, e.g. a browser a concurrent evaluation's Ray worker opens)."""
    left = []
    for p in psutil.process_iter(["cmdline", "create_time"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if p.info["create_time"] < started or not any(n in cmd for n in _OURS):
            continue
        try:
            owners = p.parents()
            raylet = p.environ().get("RAY_RAYLET_PID")     # daemons reparented to init
            if raylet and psutil.pid_exists(int(raylet)):
                owners.append(psutil.Process(int(raylet)))
            older = [a for a in owners
                     if a.create_time() < started and any(n in " ".join(a.cmdline())
                                                          for n in _OURS)]
        except psutil.Error:             # it or an owner ended meanwhile
            continue
        if not older:
            left.append(cmd[:200])
    return left


def test_smoke_config_trains_two_steps_and_stops_everything(tmp_path):
    run_dir = tmp_path / "run"
    started = time.time() - 1
    proc = subprocess.run(
        [sys.executable, "-m", "cluster.job", "--config", "configs/smoke.yaml",
         "--run-dir", str(run_dir)],
        cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["completed"] and summary["steps"] == 2 and summary["version"] == 2
    assert summary["replica_versions"] == [2]
    assert summary["pending_entries"] == 0 and summary["leases_held"] == 0
    assert summary["rollout"]["leaked_resources"] == 0
    assert summary["rollout"]["groups_pushed"] >= 2
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2]
    assert all(m["version"] == m["step"] and m["tokens"] > 0 for m in lines)
    assert (run_dir / "curves.png").stat().st_size > 1000
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()
                  if p.name.startswith("step-")) == ["step-000001", "step-000002"]
    assert "step 2: reward" in proc.stderr                  # per-step progress
    # The trained weights as a model folder: the last checkpoint's tensors, with config and
    # tokenizer, loadable as a policy.
    from safetensors.torch import load_file

    from rollout_service.models import HFChatTokenizer
    assert summary["stopped_by"] == "steps"
    final = Path(summary["final_model"])
    assert final == run_dir / "final"
    weights = load_file(str(final / "model.safetensors"))
    ckpt = load_file(str(run_dir / "checkpoints" / "step-000002" / "model.safetensors"))
    common = set(weights) & set(ckpt)
    assert len(common) >= len(ckpt) - 1 and common
    assert all(torch.equal(weights[k], ckpt[k]) for k in common)
    text = "click(12) then fill(8, \"user1\")"
    assert (HFChatTokenizer(str(final)).tokenizer.encode(text) ==
            HFChatTokenizer(summary["start_model"]).tokenizer.encode(text))
    # Nothing it started is left: no Redis, local cloud, Ray, Chromium or policy process
    # created since the run began is still alive.
    left = _left_behind(started)
    assert not left, left


def test_no_experience_in_time_is_a_clear_error_and_stops_everything(tmp_path):
    # The trainer gives up on the stream after trainer.read_timeout_s (here 1 s, before any
    # group can finish): exit 1 with a message that says what the rollouts did, no
    # traceback, the summary written, and nothing left running. The job stops the rollouts
    # right after starting them, so this also covers a stop that reaches the orchestrator
    # actor before its run does (that hung the job for read_timeout + 10 min).
    run_dir = tmp_path / "run"
    started = time.time() - 1
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "cluster.job", "--config", "configs/smoke.yaml",
         "--run-dir", str(run_dir), "trainer.read_timeout_s=1"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stderr[-4000:]
    assert time.monotonic() - t0 < 300
    assert "Traceback" not in proc.stderr
    assert ("error: the experience stream gave 0 of 1 groups within 1 s "
            "(trainer.read_timeout_s); the rollouts ran") in proc.stderr
    assert "done with problems" in proc.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert not summary["completed"] and summary["steps"] == 0
    assert summary["error"].startswith("the experience stream gave 0 of 1 groups")
    assert summary["pending_entries"] == 0 and summary["leases_held"] == 0
    assert "rollout" in summary and "drain_error" not in summary
    assert not (run_dir / "final").exists()
    left = _left_behind(started)
    assert not left, left


@pytest.mark.slow
def test_sigterm_during_grpo_stops_everything(tmp_path):
    # What `kill`, a job scheduler or `ray job stop` sends: the job stops its rollouts, actors,
    # Ray, Redis and the local cloud within 30 s, and exits 143 (128 + SIGTERM, the signal's
    # conventional code) with its checkpoints resumable (ray.init had replaced the handler,
    # and the signal aborted the process leaving them all running).
    run_dir = tmp_path / "run"
    log_path = tmp_path / "stderr.log"
    started = time.time() - 1
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cluster.job", "--config", "configs/smoke.yaml",
             "--run-dir", str(run_dir)], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log)
        try:
            deadline = time.monotonic() + 600
            while "GRPO:" not in log_path.read_text(errors="replace"):
                assert proc.poll() is None, log_path.read_text()[-4000:]
                assert time.monotonic() < deadline, "GRPO never started"
                time.sleep(1)
            time.sleep(5)                                # rollouts are in flight
            proc.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            rc = proc.wait(timeout=300)
            stop_s = time.monotonic() - signalled
        finally:
            if proc.poll() is None:
                proc.kill()
    err = log_path.read_text(errors="replace")
    assert rc == 128 + signal.SIGTERM, err[-4000:]
    assert stop_s < 30, (stop_s, err[-4000:])
    assert "interrupted: stopped everything" in err
    assert "SIGTERM received" not in err                 # Ray's abort handler did not run
    deadline = time.monotonic() + 30                     # children exit after the parent
    while True:
        left = _left_behind(started)
        if not left or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert not left, left
