"""Where Prometheus finds console-rl's metrics on a Ray cluster of any size.

Every component process serves its own ``prometheus_client`` registries on a free port of its
node (:func:`publish`) and announces the address in Redis — the Redis every component already
reaches (the experience stream, the account leases) — as a key that expires unless it is
renewed. :func:`write_sd_file` (``python -m infra.observability.discovery``) turns the live
announcements into a Prometheus ``file_sd`` file; Prometheus re-reads it on change. No port is
configured per actor and nothing depends on which node an actor landed on.

Each target carries the labels ``component`` (env_worker, policy, rollout, trainer, cloud,
jobs_api, ...), ``name`` (env-worker-0, policy-1, ...), ``run`` (the run or deployment the
component belongs to), ``node`` (the Ray node id, or the host name outside Ray) and
``node_ip``. The key expires ``ttl_s`` after the last renewal: a crashed process stays a
target (shown down: ``up == 0``) for that long, then leaves; a clean stop removes it at once
(:meth:`Announcement.close`, :func:`forget_run`).

Names with a colon (vLLM's ``vllm:*``, passed on by the policy replicas) are served intact in
both exposition formats (:func:`metrics_app`).

Why not ``ray.util.metrics``: its names get a ``ray_`` prefix and lose the histogram buckets and
labels the code and the dashboards already use, and every metric would need rewriting. Ray's
own node metrics are scraped as well, from Ray's ``prom_metrics_service_discovery.json``.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis as redis_lib
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector

log = logging.getLogger("infra.observability.discovery")

KEY_PREFIX = "consolerl:metrics:target:"


@dataclass(frozen=True)
class PublishConfig:
    """Where announcements go: ``redis_url`` (the stream's Redis), ``run`` (the run label),
    ``host`` (the address to serve on and announce; "": the Ray node's IP inside Ray, else
    127.0.0.1), ``ttl_s`` / ``renew_s`` (announcement lifetime and renewal period)."""

    redis_url: str
    run: str
    host: str = ""
    ttl_s: float = 60.0
    renew_s: float = 10.0


class _Union:
    """Several registries served as one (each component keeps its own)."""

    def __init__(self, registries: Iterable[Collector]):
        self.registries = list(registries)

    def collect(self):
        for registry in self.registries:
            yield from registry.collect()


def _node() -> tuple[str, str]:
    """(node id, node IP): Ray's when this process is part of a Ray cluster."""
    try:
        import ray
        if ray.is_initialized():
            return (ray.get_runtime_context().get_node_id(),
                    ray.util.get_node_ip_address())
    except ImportError:
        pass
    return socket.gethostname(), "127.0.0.1"


class Announcement:
    """One announced target: renewed from a daemon thread until :meth:`close`."""

    def __init__(self, config: PublishConfig, address: str, component: str, name: str,
                 labels: Mapping[str, str] | None = None, node: tuple[str, str] | None = None):
        node_id, node_ip = node or _node()
        self.config = config
        self.address = address
        self.labels = {"component": component, "name": name, "run": config.run,
                       "node": node_id, "node_ip": node_ip, **(labels or {})}
        self.key = f"{KEY_PREFIX}{config.run}:{component}:{name}:{address}"
        self.redis = redis_lib.Redis.from_url(config.redis_url, socket_timeout=5,
                                              socket_connect_timeout=5)
        self._value = json.dumps({"targets": [address], "labels": self.labels})
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"metrics-announce-{name}")

    def start(self) -> Announcement:
        self._renew()
        self._thread.start()
        return self

    def _renew(self) -> None:
        try:
            self.redis.set(self.key, self._value, px=int(self.config.ttl_s * 1000))
        except redis_lib.RedisError as exc:      # Redis restarting: the next renewal retries
            log.warning("could not announce %s: %s", self.address, exc)

    def _run(self) -> None:
        while not self._stop.wait(self.config.renew_s):
            self._renew()

    def close(self) -> None:
        self._stop.set()
        try:
            self.redis.delete(self.key)
        except redis_lib.RedisError:
            pass                                 # it expires on its own
        self.redis.close()


def metrics_app(registries: Iterable[Collector]):
    """The WSGI app that serves ``registries`` as one, in the format the scraper asks for.

    prometheus_client (0.26, client_python#1177) answers an OpenMetrics request without an
    ``escaping`` parameter (what Prometheus 2.x sends) with each sample's name spelled in the
    label-name alphabet: ``vllm:kv_cache_usage_perc`` is declared under that name and its
    sample comes out as ``vllm_kv_cache_usage_perc``, which Prometheus stores. Such requests
    are answered with ``escaping=allow-utf-8`` instead, which leaves every name that is valid
    in the classic alphabet (all of console-rl's and vLLM's) exactly as it is."""
    app = make_wsgi_app(_Union(registries))

    def keep_names(environ: dict[str, Any], start_response: Any) -> Any:
        accept = environ.get("HTTP_ACCEPT") or ""
        if "application/openmetrics-text" in accept and "escaping=" not in accept:
            environ = {**environ, "HTTP_ACCEPT": ",".join(
                part + ";escaping=allow-utf-8"
                if part.split(";")[0].strip() == "application/openmetrics-text" else part
                for part in accept.split(","))}
        return app(environ, start_response)
    return keep_names


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        """Scrapes are not logged."""


class MetricsEndpoint:
    """``registries`` served over HTTP on a free port (:func:`metrics_app`), and announced."""

    def __init__(self, config: PublishConfig, registries: Iterable[Collector], component: str,
                 name: str, labels: Mapping[str, str] | None = None):
        node = _node()
        host = config.host or node[1]
        family = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0][0]
        server_class = type("MetricsServer", (ThreadingWSGIServer,), {"address_family": family})
        self.server = make_server(host, 0, metrics_app(registries), server_class,
                                  handler_class=_Quiet)
        threading.Thread(target=self.server.serve_forever, daemon=True,
                         name=f"metrics-http-{name}").start()
        self.address = f"{host}:{self.server.server_port}"
        self.url = f"http://{self.address}/metrics"
        self.announcement = Announcement(config, self.address, component, name, labels,
                                         node).start()

    def close(self) -> None:
        self.announcement.close()
        self.server.shutdown()
        self.server.server_close()


def publish(config: PublishConfig | None, registries: Iterable[Collector], component: str,
            name: str, labels: Mapping[str, str] | None = None) -> MetricsEndpoint | None:
    """Serve and announce ``registries``; None (nothing served) when ``config`` is None.
    A failure to serve is logged, never raised: metrics must not stop the component."""
    if config is None:
        return None
    try:
        return MetricsEndpoint(config, registries, component, name, labels)
    except (OSError, redis_lib.RedisError) as exc:
        log.warning("metrics of %s/%s not published: %s", component, name, exc)
        return None


def announce(config: PublishConfig, address: str, component: str, name: str,
             labels: Mapping[str, str] | None = None) -> Announcement:
    """Announce an endpoint another process serves (the local cloud's, an HTTP service's)."""
    return Announcement(config, address, component, name, labels).start()


def targets(redis: redis_lib.Redis, run: str | None = None) -> list[dict[str, Any]]:
    """The live announcements as Prometheus ``file_sd`` groups, sorted (``run``: only its)."""
    pattern = f"{KEY_PREFIX}{run}:*" if run else f"{KEY_PREFIX}*"
    keys = sorted(redis.scan_iter(match=pattern, count=500))
    groups = []
    for raw in redis.mget(keys) if keys else []:
        if raw is None:                           # expired between SCAN and MGET
            continue
        try:
            group = json.loads(raw)
        except ValueError:
            continue
        if isinstance(group, dict) and isinstance(group.get("targets"), list):
            groups.append(group)
    return sorted(groups, key=lambda g: (g["labels"].get("component", ""),
                                         g["labels"].get("name", ""), g["targets"]))


def forget_run(redis_url: str, run: str) -> int:
    """Remove every announcement of ``run`` (a job that stopped: its actors are gone)."""
    client = redis_lib.Redis.from_url(redis_url, socket_timeout=5)
    try:
        keys = list(client.scan_iter(match=f"{KEY_PREFIX}{run}:*", count=500))
        return client.delete(*keys) if keys else 0
    finally:
        client.close()


def write_sd_file(redis: redis_lib.Redis, path: Path) -> list[dict[str, Any]]:
    """Write the targets to ``path`` atomically (Prometheus never reads half a file); the
    file is only replaced when it changes."""
    groups = targets(redis)
    body = json.dumps(groups, indent=1, sort_keys=True)
    if not path.exists() or path.read_text() != body:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(body)
        os.replace(tmp, path)
    return groups


def refresh_sd_file(redis: redis_lib.Redis, path: Path) -> list[dict[str, Any]] | None:
    """:func:`write_sd_file`, or None when Redis does not answer: the last file stays and
    Prometheus keeps scraping what it lists."""
    try:
        return write_sd_file(redis, path)
    except redis_lib.RedisError:
        return None


def keep_sd_file(redis: redis_lib.Redis, path: Path, interval_s: float,
                 stop: threading.Event) -> None:
    """Refresh ``path`` every ``interval_s`` until ``stop`` is set; says when the number of
    targets changes and when Redis goes away or comes back (not at every try)."""
    seen, reachable = -1, True
    while True:
        groups = refresh_sd_file(redis, path)
        if (groups is not None) != reachable:
            reachable = groups is not None
            log.warning("discovery: Redis %s; %s", "answers again" if reachable else
                        "does not answer, keeping the last file", path)
        if groups is not None and len(groups) != seen:
            seen = len(groups)
            log.info("%d target(s) in %s", seen, path)
        if stop.wait(interval_s):
            return


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m infra.observability.discovery",
        description="Keep a Prometheus file_sd file of the announced console-rl targets.")
    parser.add_argument("--redis", required=True, help="the stream's Redis URL")
    parser.add_argument("--out", required=True, type=Path, help="the file_sd JSON file")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between updates")
    parser.add_argument("--once", action="store_true", help="write once and exit")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    client = redis_lib.Redis.from_url(args.redis, socket_timeout=5)
    if args.once:
        if refresh_sd_file(client, args.out) is None:
            raise SystemExit(f"discovery: no Redis answers at {args.redis}")
        return
    keep_sd_file(client, args.out, args.interval, threading.Event())


if __name__ == "__main__":
    main()
