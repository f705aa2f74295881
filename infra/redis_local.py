"""A local ``redis-server`` process on a free loopback port, with AOF (fsync every second)
unless ``persistent=False``: for tests, benchmarks and the embedded single-machine setup.
Never port 6379, which Ray's GCS takes. ``host``: another address to listen on as well (a
Ray node's IP, so that actors on the cluster's other nodes reach it)."""
from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import redis

from consolerl.errors import ConfigError

from .local_cloud import free_port, service_process, stop_process

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


@dataclass
class RedisServer:
    """``start()`` / ``stop()`` a redis-server whose files live in ``data_dir``.
    ``persistent=False``: no AOF and no snapshots, so a restart begins empty (what a Redis
    without persistence does after a crash)."""

    data_dir: Path
    port: int = 0
    persistent: bool = True
    proc: subprocess.Popen | None = None
    host: str = "127.0.0.1"

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(host=self.host, port=self.port, decode_responses=True)

    def _bind_args(self) -> list[str]:
        if self.host == "127.0.0.1":
            return ["--bind", "127.0.0.1"]
        # Protected mode refuses every client but loopback ones when no password is set:
        # reached from the cluster's nodes (a trusted network, as Ray's own ports are).
        return ["--bind", self.host, "127.0.0.1", "--protected-mode", "no"]

    def start(self, timeout_s: float = 10.0) -> RedisServer:
        self.port = self.port or free_port()
        if self.port == 6379:
            raise ConfigError("refusing to start redis-server on 6379 (Ray's GCS port)")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.data_dir / "redis.log", "ab")
        self.proc = subprocess.Popen(
            [REDIS_SERVER, "--port", str(self.port), *self._bind_args(),
             "--save", "", "--appendonly", "yes" if self.persistent else "no",
             "--appendfsync", "everysec",
             "--dir", str(self.data_dir)],
            stdout=log, stderr=subprocess.STDOUT, **service_process())
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited: "
                                   f"{(self.data_dir / 'redis.log').read_text()[-2000:]}")
            try:
                with self.client() as c:
                    if c.ping():
                        return self
            except redis.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError(f"redis-server did not answer within {timeout_s} s")

    def stop(self) -> None:
        stop_process(self.proc)
