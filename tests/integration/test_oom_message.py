"""An actor killed by Ray's memory monitor: the job's message names the actor, how much it
used and the setting to change. Real Ray, a real kill: the monitor's threshold is set just
above this machine's memory use and an actor named like the trainer's workers allocates past
it (in a child process, so the threshold stays with that Ray instance)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r'''
import ray, sys
from trainer.failures import describe_failure

ray.init(num_cpus=1, include_dashboard=False)

@ray.remote(max_restarts=0)
class TrainerWorker:
    def __init__(self):
        self.blocks = []

    def grow(self, mib):
        for _ in range(mib // 64):
            self.blocks.append(bytearray(64 * 2**20))
        return len(self.blocks)

actor = TrainerWorker.remote()
try:
    ray.get(actor.grow.remote(int(sys.argv[1])))
    print("NOT KILLED")
except Exception as exc:
    print("MESSAGE:", describe_failure(exc))
ray.shutdown()
'''


@pytest.mark.slow
def test_an_actor_killed_for_memory_is_named_with_the_setting_to_change(tmp_path):
    vm = psutil.virtual_memory()
    used = (vm.total - vm.available) / vm.total
    headroom = 1.5 * 2**30                     # the threshold: 1.5 GiB above today's use
    threshold = min(0.98, used + headroom / vm.total)
    grow_mib = int(3 * headroom / 2**20)       # the actor goes well past it
    script = tmp_path / "oom.py"
    script.write_text(SCRIPT)
    proc = subprocess.run(
        [sys.executable, str(script), str(grow_mib)], cwd=ROOT, capture_output=True,
        text=True, timeout=300,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT),
             "RAY_memory_usage_threshold": f"{threshold:.3f}",
             "RAY_memory_monitor_refresh_ms": "100"})
    out = proc.stdout + proc.stderr
    line = next((x for x in proc.stdout.splitlines() if x.startswith("MESSAGE:")), "")
    assert line, out[-3000:]
    assert "memory monitor killed TrainerWorker" in line, line
    assert " GB" in line and "with the node at" in line, line
    assert "trainer.engine.micro_batch_tokens" in line, line
