"""The local services a benchmark runs against: a local cloud and a Redis (for the account
leases and the experience stream) in a temporary folder, stopped and removed on exit."""
from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx

from infra.local_cloud import LocalCloud
from infra.redis_local import RedisServer


@contextmanager
def cloud_and_redis(prefix: str, cloud_args: Sequence[str]
                    ) -> Iterator[tuple[LocalCloud, RedisServer]]:
    """``cloud_args``: the local cloud's flags (``--lookup-qps 0``, ``--transition 1``, ...)."""
    state = Path(tempfile.mkdtemp(prefix=prefix))
    cloud = LocalCloud(state / "cloud", tuple(cloud_args))
    redis = RedisServer(state / "redis")
    try:
        cloud.start()
        redis.start()
        yield cloud, redis
    finally:
        redis.stop()
        cloud.stop()
        shutil.rmtree(state, ignore_errors=True)


def wait_http(url: str, limit_s: float, what: str = "the API", poll_s: float = 0.5) -> None:
    """Poll ``url`` (a health or readiness route) until it answers 200; RuntimeError naming
    ``what`` after ``limit_s``."""
    deadline = time.monotonic() + limit_s
    while True:
        try:
            if httpx.get(url, timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not answer 200 at {url} within {limit_s:.0f} s")
        time.sleep(poll_s)
