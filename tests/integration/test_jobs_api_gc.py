"""The HTTP side's garbage collector (cluster.jobs_api.HttpServer, in this process): start-up
freezes what exists and sets thresholds under which the oldest generation would almost never
be collected, so cyclic garbage that reached it stayed for hours (the soak's slow RSS growth).
A full collection on a timer collects it, and its pause is exported."""
from __future__ import annotations

import gc
import re
import threading

import httpx

from cluster.jobs_api import HttpServer, HttpSpec
from infra.local_cloud import free_port


class _Cycle:
    def __init__(self, collected: threading.Event):
        self.me = self
        self.collected = collected

    def __del__(self):
        self.collected.set()


def test_garbage_in_the_oldest_generation_is_collected_on_the_timer(redis_server, tmp_path):
    thresholds = gc.get_threshold()
    spec = HttpSpec(redis_url=redis_server.url, prefix="gc:api",
                    tokens_file=str(tmp_path / "tokens.json"))
    server = HttpServer(spec, "127.0.0.1", free_port(), gc_every_s=0.5)
    try:
        url = server.start()
        assert gc.get_threshold() == (100_000, 50, 1000)
        collected = threading.Event()
        cycle = _Cycle(collected)
        gc.collect(1)             # promoted to the oldest generation while still referenced,
        del cycle                 # then garbage there: only a full collection finds it
        assert collected.wait(10), "the cycle in the oldest generation was never collected"
        body = httpx.get(f"{url}/metrics", timeout=10).text
        count = re.search(r"^consolerl_api_gc_pause_seconds_count (\S+)$", body, re.M)
        assert count is not None and float(count[1]) >= 1, body[-2000:]
    finally:
        server.stop()
        gc.unfreeze()
        gc.set_threshold(*thresholds)
