"""PeakMemory: the peak of the summed PSS of a process tree, and which kinds of process made
it up at that moment."""
from __future__ import annotations

import subprocess
import sys
import time

from cluster.runtime import PeakMemory, process_kind


def test_the_peak_and_its_breakdown_include_children():
    memory = PeakMemory(interval_s=0.2)
    child = subprocess.Popen([sys.executable, "-c",
                              "import time; x = bytearray(300 * 2**20); time.sleep(3)"])
    try:
        time.sleep(2.0)
    finally:
        child.wait(timeout=30)
    peak = memory.stop()
    kinds = memory.breakdown_gib()
    assert peak >= 0.29                               # the child's 300 MiB were counted
    assert "driver" in kinds and any(k.startswith("python") for k in kinds)
    assert abs(sum(kinds.values()) - peak) < 0.05


def test_process_kinds():
    assert process_kind(["ray::TrainerWorker.step"]) == "ray::TrainerWorker"
    assert process_kind(["ray::IDLE"]) == "ray workers"
    assert process_kind(["/usr/lib/chromium/chromium", "--type=renderer"]) == "chromium"
    assert process_kind([".venv-vllm/bin/python", "-m", "rollout_service.vllm_server"]) == "vllm"
    assert process_kind(["/usr/bin/redis-server", "127.0.0.1:6379"]) == "redis"
    assert process_kind(["python", "-m", "infra.console_sim", "--port", "1"]) == "local cloud"
    assert process_kind(["/x/ray/core/src/ray/gcs/gcs_server", "--a"]) == "ray"
    assert process_kind(["anything"], is_driver=True) == "driver"
