"""Metrics discovery against a real Redis: a published endpoint serves every registry it was
given and is announced with its labels; a clean stop removes the announcement at once, a
crashed process's expires after its TTL; the file_sd file is written atomically and only when
it changes; a Redis that is down when a component starts does not stop it, and the
announcement appears once Redis is back."""
from __future__ import annotations

import json
import time

import httpx
import pytest
import redis as redis_lib
from prometheus_client import CollectorRegistry, Counter, Gauge

from infra.local_cloud import free_port
from infra.observability.discovery import (KEY_PREFIX, PublishConfig, announce, forget_run,
                                           publish, targets, write_sd_file)
from tests.conftest import wait_for
from tests.integration.redis_server import RedisServer


@pytest.fixture
def redis_server(tmp_path):
    server = RedisServer(tmp_path / "redis", port=free_port()).start()
    yield server
    server.stop()


def test_publish_serves_announces_and_forgets(redis_server, tmp_path):
    client = redis_lib.Redis.from_url(redis_server.url)
    one, two = CollectorRegistry(), CollectorRegistry()
    Counter("consolerl_test_things_total", "Things.", registry=one).inc(3)
    Gauge("consolerl_test_level", "Level.", registry=two).set(7)
    config = PublishConfig(redis_server.url, run="r1", host="127.0.0.1", ttl_s=30, renew_s=0.2)
    endpoint = publish(config, [one, two], "trainer", "trainer")
    other = announce(PublishConfig(redis_server.url, run="r2"), "127.0.0.1:1", "cloud", "c")
    try:
        body = httpx.get(endpoint.url, timeout=5).text
        assert "consolerl_test_things_total 3.0" in body and "consolerl_test_level 7.0" in body
        groups = targets(client, "r1")
        assert groups == [{"targets": [endpoint.address], "labels": {
            "component": "trainer", "name": "trainer", "run": "r1",
            "node": groups[0]["labels"]["node"], "node_ip": "127.0.0.1"}}]
        assert len(targets(client)) == 2                       # every run

        sd = tmp_path / "sd" / "consolerl.json"
        write_sd_file(client, sd)
        assert {g["labels"]["run"] for g in json.loads(sd.read_text())} == {"r1", "r2"}
        mtime = sd.stat().st_mtime_ns
        time.sleep(0.05)
        write_sd_file(client, sd)
        assert sd.stat().st_mtime_ns == mtime                  # unchanged: not rewritten
        assert not list(sd.parent.glob("*.tmp"))

        # Garbage under the prefix is skipped, not fatal.
        client.set(KEY_PREFIX + "r1:x:y:z", b"not json")
        assert len(targets(client, "r1")) == 1
        assert forget_run(redis_server.url, "r1") == 2
        assert targets(client, "r1") == [] and len(targets(client, "r2")) == 1
        # The renewal thread puts a live endpoint back (forget_run is for stopped runs).
        wait_for(lambda: len(targets(client, "r1")) == 1, timeout=5)
    finally:
        endpoint.close()
        other.close()
    assert targets(client) == []                               # a clean stop: gone at once
    with pytest.raises(httpx.HTTPError):
        httpx.get(endpoint.url, timeout=2)
    assert publish(None, [one], "trainer", "t") is None        # observing turned off


def test_a_dead_process_expires_after_its_ttl(redis_server):
    client = redis_lib.Redis.from_url(redis_server.url)
    a = announce(PublishConfig(redis_server.url, run="r", ttl_s=1.0, renew_s=0.2),
                 "127.0.0.1:9", "env_worker", "env-worker-0")
    time.sleep(1.5)
    assert len(targets(client, "r")) == 1                      # renewed past its TTL
    a._stop.set()                                              # the process dies: no renewal
    wait_for(lambda: targets(client, "r") == [], timeout=5)


def test_redis_down_at_start_does_not_stop_the_component(tmp_path):
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    registry = CollectorRegistry()
    Gauge("consolerl_test_up", "Up.", registry=registry).set(1)
    endpoint = publish(PublishConfig(url, run="late", host="127.0.0.1", renew_s=0.2),
                       [registry], "policy", "policy-0")
    try:
        assert "consolerl_test_up 1.0" in httpx.get(endpoint.url, timeout=5).text
        server = RedisServer(tmp_path / "redis", port=port).start()
        try:
            client = redis_lib.Redis.from_url(url)
            wait_for(lambda: len(targets(client, "late")) == 1, timeout=5)
        finally:
            server.stop()
    finally:
        endpoint.close()


def test_the_sd_file_keeper_waits_out_a_missing_redis(tmp_path):
    """The loop make observe and the discovery command run: no Redis yet (a job starts its own)
    leaves the file as it is; once Redis answers, the file lists the announcements."""
    import threading

    from infra.observability.discovery import keep_sd_file, refresh_sd_file
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    client = redis_lib.Redis.from_url(url, socket_timeout=2)
    sd = tmp_path / "sd.json"
    assert refresh_sd_file(client, sd) is None and not sd.exists()
    stop = threading.Event()
    keeper = threading.Thread(target=keep_sd_file, args=(client, sd, 0.2, stop), daemon=True)
    keeper.start()
    server = RedisServer(tmp_path / "redis", port=port).start()
    try:
        a = announce(PublishConfig(url, run="k"), "127.0.0.1:7", "trainer", "trainer")
        wait_for(lambda: sd.exists() and len(json.loads(sd.read_text())) == 1, timeout=10)
        a.close()
        wait_for(lambda: json.loads(sd.read_text()) == [], timeout=10)
    finally:
        stop.set()
        keeper.join(5)
        server.stop()
    assert not keeper.is_alive()
