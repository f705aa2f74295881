"""A ``python -m infra.console_sim`` process on a free port (of loopback, or of ``host``) with
its own state dir, for benchmarks, the suite runner and the job's embedded local cloud (tests
have their own, restartable ``CloudServer``)."""
from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def service_process() -> dict:
    """``subprocess.Popen`` options for a service a run starts and stops itself (Redis, the
    local cloud): a process group of its own, so a signal to the run's group (Ctrl-C, make's
    group) leaves it serving until the run stops it last. (No PR_SET_PDEATHSIG: the kernel
    ties it to the starting thread, and a service restarted from a helper thread would die
    with that thread.)"""
    return {"process_group": 0}


def stop_process(proc: subprocess.Popen | None, timeout_s: float = 10.0) -> None:
    """Terminate a child process, killing it if it does not exit within ``timeout_s``."""
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass
class LocalCloud:
    """``start()`` waits until ``/healthz`` answers; ``stop()`` terminates the process."""

    state_dir: Path
    args: tuple[str, ...] = ()
    port: int = 0
    proc: subprocess.Popen | None = field(default=None, repr=False)
    host: str = "127.0.0.1"             # where it listens (a Ray node's IP on a cluster)

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.endpoint}"

    def start(self, timeout_s: float = 30.0) -> LocalCloud:
        self.port = self.port or free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "infra.console_sim", "--host", self.host,
             "--port", str(self.port),
             "--state-dir", str(self.state_dir), *self.args],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **service_process())
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the local cloud exited with status {self.proc.returncode}")
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"the local cloud did not answer /healthz within {timeout_s:g} s")

    def stop(self) -> None:
        stop_process(self.proc)
