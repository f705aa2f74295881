"""The job on a multi-node Ray cluster on one machine (:mod:`tests.integration.ray_cluster`:
a head plus worker nodes, each with its own custom resources).

- fast: the services a job starts on a cluster listen on the node's address, not loopback;
- slow: the smoke config under ``ray job submit`` runs to completion with every actor on a
  node that offers the resources its config names (from Ray's state API);
- slow: a worker node's raylet killed mid-run: its env workers' episodes become env errors,
  their leases expire and are leased again, the run completes.
"""
from __future__ import annotations

import redis
import urllib.request

from cluster.addresses import is_loopback
from cluster.config import JobConfig
from cluster.runtime import LocalServices
from consolerl.config import load_config
from infra.local_cloud import free_port
from tests.integration.ray_cluster import host_ip


def test_services_of_a_cluster_job_listen_on_the_node_address(tmp_path, monkeypatch):
    ip = host_ip()
    monkeypatch.setenv("RAY_ADDRESS", "10.9.9.9:6379")        # as under ray job submit
    redis_port, cloud_port = free_port(), free_port()
    config = load_config(JobConfig, "configs/smoke.yaml", [
        f"stream.url=redis://127.0.0.1:{redis_port}/0", f"cloud.endpoint=127.0.0.1:{cloud_port}",
        f"env.worker.console_url=http://127.0.0.1:{cloud_port}"])
    services = LocalServices(config, tmp_path)
    try:
        advertised = services.start(node_ip=ip)
        assert advertised.stream.url == f"redis://{ip}:{redis_port}/0"
        assert advertised.cloud.endpoint == f"{ip}:{cloud_port}"
        assert advertised.env.worker.console_url == f"http://{ip}:{cloud_port}"
        assert redis.Redis.from_url(advertised.stream.url, socket_timeout=5).ping()
        with urllib.request.urlopen(f"http://{ip}:{cloud_port}/healthz", timeout=5) as r:
            assert r.status == 200
        if not is_loopback(ip):
            # Tools on this machine still reach the Redis on loopback.
            assert redis.Redis(port=redis_port, socket_timeout=5).ping()
    finally:
        services.stop()
