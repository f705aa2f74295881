"""Shared fixtures: a real local-cloud server process on a free port."""
from __future__ import annotations

import asyncio
import concurrent.futures
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from infra.cloud import CloudClient, CloudConfig, Credentials
from consolerl.accounts import Account, load_accounts
from infra.local_cloud import free_port, stop_process
from infra.console_sim.config import DEFAULT_ACCOUNTS_FILE

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class CloudServer:
    """A ``python -m infra.console_sim`` process; ``restart()`` keeps the state dir."""

    state_dir: Path
    extra_args: list[str] = field(default_factory=list)
    port: int = 0
    proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.endpoint}"

    def start(self) -> None:
        self.port = self.port or free_port()
        log = open(self.state_dir / "server.log", "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "infra.console_sim", "--port", str(self.port),
             "--state-dir", str(self.state_dir), *self.extra_args],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ})
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"local cloud exited: {(self.state_dir / 'server.log').read_text()}")
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError("local cloud did not start within 30 s")

    def stop(self) -> None:
        stop_process(self.proc)

    def restart(self) -> None:
        self.stop()
        self.start()


@pytest.fixture(scope="session")
def accounts() -> list[Account]:
    return load_accounts(DEFAULT_ACCOUNTS_FILE)


def _server(tmp_path_factory, name: str, args: list[str]) -> Iterator[CloudServer]:
    server = CloudServer(tmp_path_factory.mktemp(name), args)
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def cloud(tmp_path_factory) -> Iterator[CloudServer]:
    """The shared server: fast transitions, no LookupEvents limit (tests query a lot)."""
    yield from _server(tmp_path_factory, "cloud", ["--transition", "0.3", "--network-ready",
                                                   "0.1", "--lookup-qps", "0"])


@pytest.fixture
def make_client(cloud: CloudServer, accounts: list[Account]):
    def make(index: int = 0, signature: str = "v3", server: CloudServer | None = None,
             secret: str | None = None, key: str | None = None) -> CloudClient:
        account = accounts[index]
        creds = Credentials(key or account.access_key_id, secret or account.access_key_secret)
        return CloudClient(CloudConfig(endpoint=(server or cloud).endpoint,
                                       signature=signature), creds)
    return make


def run_async(coro):
    """Run a coroutine on a fresh event loop in its own thread: the session's sync Playwright
    (console tests) keeps an event loop running on the main thread, where asyncio.run fails."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def in_thread(fn, *args, **kwargs):
    """Call ``fn`` in a thread of its own: code that calls ``asyncio.run`` (a training job's
    stages) cannot run on the main thread, where the session's sync Playwright keeps an event
    loop running."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(fn, *args, **kwargs).result()


def require_vllm() -> None:
    """Skip the calling test where vLLM (``.venv-vllm``, or ``policy.vllm_python``) is not
    installed, except under CI, where its absence is a failure: ``make setup`` installs it."""
    from consolerl.errors import ConfigError                 # noqa: PLC0415
    from rollout_service.vllm_engine import vllm_python      # noqa: PLC0415
    try:
        vllm_python()
    except ConfigError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"vLLM not installed: {exc}")


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(interval)


# -- process exit ------------------------------------------------------------------------------
# Several test modules start and stop a Ray session in this one process (ray.init ... shutdown).
# Ray does not support that well: threads of an earlier session can outlive its core worker,
# and the interpreter's own finalisation then occasionally crashes with SIGSEGV after every
# test has passed and the summary is printed (ray-project/ray#31145; seen once here in a full
# CI run: make test failed on SIGSEGV after a green suite). The product never restarts Ray in one process. So once
# pytest has finished reporting, a process that imported Ray leaves with pytest's exit status
# directly, skipping the finaliser that can crash. Faults during the tests are unaffected (and
# `make test` runs with faulthandler on, so they print a traceback).
_exit_status: list[int] = []


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _exit_status.append(int(exitstatus))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    if _exit_status and "ray" in sys.modules:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_exit_status[-1])
