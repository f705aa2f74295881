"""Where the job's services are reached from every Ray node.

On one machine with an embedded Ray cluster, Redis and the local cloud listen on loopback
(``127.0.0.1``), as configured. A job on a Ray cluster (``run.ray_address`` or
``RAY_ADDRESS``, as under ``ray job submit``) has env workers, PolicyServers and trainer workers
on other nodes, where ``127.0.0.1`` is that node itself: the services this job starts (Redis
with ``run.redis``, the local cloud with ``cloud.local``) then listen on an address the other
nodes reach (``run.services_host``, else the Ray node IP of the driver) and every component is
handed that address instead of the configured loopback one (:func:`advertise`); the console
is the cloud endpoint's unless ``env.worker.console_url`` names another. Addresses of
services the job does not start (an external Redis, the real cloud) are never rewritten.
"""
from __future__ import annotations

import ipaddress
import os
import urllib.parse
from dataclasses import replace

from cluster.config import JobConfig, RunSection

LOOPBACK_HOST = "127.0.0.1"


def is_loopback(host: str | None) -> bool:
    """``localhost`` or a loopback IP (``127.0.0.0/8``, ``::1``)."""
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def on_cluster(run: RunSection) -> bool:
    """Whether the job joins an existing Ray cluster (its nodes may be other machines)."""
    return bool(run.ray_address or os.environ.get("RAY_ADDRESS"))


def services_host(run: RunSection, node_ip: str) -> str:
    """The address the services started by this job listen on and are reached at:
    ``run.services_host`` when set; on a cluster the driver's Ray node IP (``node_ip``);
    with an embedded cluster, loopback (a one-machine run stays off the network)."""
    if run.services_host:
        return run.services_host
    if on_cluster(run) and node_ip:
        return node_ip
    return LOOPBACK_HOST


def _host_port(endpoint: str) -> tuple[str, str]:
    host, sep, port = endpoint.rpartition(":")
    return (host, port) if sep else (endpoint, "")


def _moved_netloc(netloc: str, host: str) -> str:
    """``netloc`` (``[user[:password]@]host[:port]``) with its host replaced by ``host``."""
    userinfo, at, hostport = netloc.rpartition("@")
    _, port = _host_port(hostport)
    bracketed = f"[{host}]" if ":" in host else host
    return f"{userinfo}{at}{bracketed}" + (f":{port}" if port else "")


def advertise(config: JobConfig, host: str) -> JobConfig:
    """``config`` with the loopback addresses of the services this job starts moved to
    ``host``: ``stream.url`` when ``run.redis``, ``cloud.endpoint`` when ``cloud.local`` (and
    with it the console, unless ``env.worker.console_url`` names one of its own). Unchanged
    when ``host`` is loopback."""
    if is_loopback(host):
        return config
    stream, cloud = config.stream, config.cloud
    if config.run.redis:
        url = urllib.parse.urlsplit(stream.url)
        if url.scheme in ("redis", "rediss") and is_loopback(url.hostname):
            stream = replace(stream, url=urllib.parse.urlunsplit(
                url._replace(netloc=_moved_netloc(url.netloc, host))))
    if cloud.local and is_loopback(_host_port(cloud.endpoint)[0]):
        cloud = replace(cloud, endpoint=_moved_netloc(cloud.endpoint, host))
    return replace(config, stream=stream, cloud=cloud)


def loopback_left(config: JobConfig) -> list[str]:
    """The settings that still name a loopback address (services this job does not start):
    on a cluster, components on other nodes would look for them on their own node."""
    left = []
    url = urllib.parse.urlsplit(config.stream.url)
    if is_loopback(url.hostname):
        left.append(f"stream.url ({url.hostname}:{url.port})")
    if config.cloud.local and is_loopback(_host_port(config.cloud.endpoint)[0]):
        left.append(f"cloud.endpoint ({config.cloud.endpoint})")
    console = config.env.worker.console_url        # "" = the cloud endpoint's
    if console and is_loopback(urllib.parse.urlsplit(console).hostname):
        left.append(f"env.worker.console_url ({config.env.worker.console_url})")
    return left
