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
from cluster import runtime


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


@pytest.fixture
def stop_signals():
    """The job's signal handling (cluster.runtime.handle_stop_signals), undone afterwards:
    other tests in the same process keep their handlers."""
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    runtime._STOP_SIGNAL[0], runtime._STOPPING[0] = 0, False
    runtime.handle_stop_signals()
    yield
    runtime._STOP_SIGNAL[0], runtime._STOPPING[0] = 0, False
    for s, handler in previous.items():
        signal.signal(s, handler)


def test_an_interrupt_kills_the_child_at_once(stop_signals):
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    timer = threading.Timer(5.0, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            in_child(_slow, 120.0)
    finally:
        timer.cancel()
    assert time.monotonic() - t0 < 60
    time.sleep(0.5)
    left = [p for p in psutil.Process().children(recursive=True)
            if p.pid not in before and p.is_running() and p.status() != psutil.STATUS_ZOMBIE
            and "resource_tracker" not in " ".join(p.cmdline())]
    assert not left, [p.cmdline() for p in left]


def test_the_first_signal_interrupts_and_a_repeat_while_stopping_does_not(stop_signals):
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)                    # the handler runs before this ends
    os.kill(os.getpid(), signal.SIGINT)  # the clean-up is not cut short
    time.sleep(0.2)
    assert runtime.stop_exit_code() == 128 + signal.SIGTERM
