"""A real ``redis-server`` subprocess on a free loopback port, with AOF, for integration tests.

Never port 6379 (Ray's GCS listens there). RDB snapshots are off (``--save ""``); the AOF is
fsynced every second, as in production.
"""
from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import redis

from tests.conftest import free_port

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


@dataclass
class RedisServer:
    """``start()`` / ``stop()`` a redis-server whose files live in ``data_dir``."""

    data_dir: Path
    port: int = 0
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, decode_responses=True)

    def start(self, timeout_s: float = 10.0) -> None:
        self.port = self.port or free_port()
        if self.port == 6379:
            raise RuntimeError("refusing to start redis-server on 6379 (Ray's GCS port)")
        log = open(self.data_dir / "redis.log", "ab")
        self.proc = subprocess.Popen(
            [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "yes", "--appendfsync", "everysec",
             "--dir", str(self.data_dir)],
            stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited: {(self.data_dir / 'redis.log').read_text()}")
            try:
                with self.client() as c:
                    if c.ping():
                        return
            except redis.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError(f"redis-server did not answer within {timeout_s} s")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
