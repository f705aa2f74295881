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
from cluster.runtime import raise_interrupt


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
    # SIGTERM as the job handles it (cluster.job.main installs raise_interrupt); set here
    # because other tests in the same process may have left other handlers.
    previous = signal.signal(signal.SIGTERM, raise_interrupt)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    timer = threading.Timer(5.0, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            in_child(_slow, 120.0)
    finally:
        timer.cancel()
        signal.signal(signal.SIGTERM, previous)
    assert time.monotonic() - t0 < 60
    time.sleep(0.5)
    left = [p for p in psutil.Process().children(recursive=True)
            if p.pid not in before and p.is_running() and p.status() != psutil.STATUS_ZOMBIE
            and "resource_tracker" not in " ".join(p.cmdline())]
    assert not left, [p.cmdline() for p in left]
