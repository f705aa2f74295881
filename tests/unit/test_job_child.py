"""The job's SFT stage runs in a child process (cluster.job.in_child): its result and errors
come back, and an interrupt kills the child at once instead of waiting for the SFT to end."""
from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import pytest

from cluster.job import in_child


def _slow(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


def _fails() -> None:
    raise ValueError("bad SFT data")


def test_in_child_returns_the_result_from_another_process():
    assert in_child(_slow, 0.0) != os.getpid()


def test_in_child_raises_the_childs_error():
    with pytest.raises(ValueError, match="bad SFT data"):
        in_child(_fails)


def test_an_interrupt_kills_the_child_at_once():
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    timer = threading.Timer(5.0, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        in_child(_slow, 300.0)
    assert time.monotonic() - t0 < 60
    time.sleep(0.5)
    left = [p for p in psutil.Process().children(recursive=True)
            if p.pid not in before and p.is_running() and p.status() != psutil.STATUS_ZOMBIE
            and "resource_tracker" not in " ".join(p.cmdline())]
    assert not left, [p.cmdline() for p in left]
