"""A multi-node Ray cluster on one machine for tests: a head (``ray start --head``) and worker
nodes (``ray start --address ...``), each with its own custom resources, on free ports and in
a temp dir of its own, with a token shared by every node and CLI call (Ray >= 2.59 asks for
one). :meth:`RayCluster.stop` ends only the processes this cluster started (found by its temp
dir), never ``ray stop``, which would stop every other cluster on the machine;
:meth:`RayCluster.kill_node` kills one worker node's raylet (a node lost mid-run)."""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from infra.local_cloud import free_port

RAY = str(Path(sys.executable).with_name("ray"))


def host_ip() -> str:
    """This machine's address on its network (what Ray picks as a node IP), else loopback."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 80))          # no packet is sent: it picks the route
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"


@dataclass
class Node:
    """One ``ray start``: its resources, its temp dir and (once up) its Ray node id."""

    name: str
    resources: dict[str, float]
    num_cpus: float
    temp_dir: str
    node_id: str = ""


@dataclass
class RayCluster:
    """``start()`` the head (``head_resources``) then one worker node per entry of
    ``workers`` (name -> custom resources); ``address`` is the GCS address, ``dashboard``
    the job submission URL. Each node's processes live under a temp dir of its own, so one
    node can be killed and the whole cluster stopped without touching any other Ray."""

    workers: dict[str, dict[str, float]]
    head_resources: dict[str, float] = field(default_factory=dict)
    head_cpus: float = 2
    worker_cpus: float = 2
    dashboard: str = ""
    address: str = ""
    ip: str = field(default_factory=host_ip)
    env: dict[str, str] = field(default_factory=dict)
    nodes: dict[str, Node] = field(default_factory=dict)
    _root: str = ""

    def start(self) -> RayCluster:
        # Ray's Unix socket paths must stay short: a temp dir under /tmp, not pytest's.
        self._root = tempfile.mkdtemp(prefix="rc-", dir="/tmp")
        self.env = {**os.environ, "RAY_ADDRESS": "", "RAY_AUTH_MODE": "token",
                    "RAY_AUTH_TOKEN": secrets.token_hex(32), "RAY_USAGE_STATS_ENABLED": "0"}
        port, dashboard = free_port(), free_port()
        try:
            head = self._node("head", self.head_resources, self.head_cpus)
            self._ray_start(head, ["--head", f"--port={port}", "--include-dashboard=true",
                                   "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}"])
            self.address = f"{self.ip}:{port}"
            self.dashboard = f"http://127.0.0.1:{dashboard}"
            for name, resources in self.workers.items():
                self._ray_start(self._node(name, resources, self.worker_cpus),
                                [f"--address={self.address}"])
            self._wait_nodes()
        except BaseException:
            self.stop()
            raise
        return self

    def _node(self, name: str, resources: dict[str, float], cpus: float) -> Node:
        # Each node its own temp dir ("rc-xxxx/head"), short enough for Ray's sockets.
        node = Node(name, dict(resources), cpus, os.path.join(self._root, name[:8]))
        self.nodes[name] = node
        return node

    def _ray_start(self, node: Node, args: list[str]) -> None:
        proc = subprocess.run(
            [RAY, "start", *args, f"--num-cpus={node.num_cpus}",
             f"--resources={json.dumps(node.resources)}", f"--node-ip-address={self.ip}",
             f"--temp-dir={node.temp_dir}", "--disable-usage-stats"],
            capture_output=True, text=True, env={**self.env, "RAY_TMPDIR": node.temp_dir},
            timeout=180)
        if proc.returncode != 0:
            raise RuntimeError(f"ray start of node {node.name} failed: "
                               f"{(proc.stdout + proc.stderr)[-3000:]}")

    def python(self, code: str, timeout_s: float = 120) -> str:
        """Run ``code`` in a driver of this cluster; its last line of output."""
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=timeout_s, env={**self.env, "RAY_ADDRESS": self.address})
        if proc.returncode != 0:
            raise RuntimeError(f"driver failed: {proc.stderr[-3000:]}")
        return proc.stdout.strip().splitlines()[-1]

    def _wait_nodes(self, timeout_s: float = 120) -> None:
        """Until every node is alive; then each :class:`Node` knows its Ray node id."""
        code = ("import json, ray; ray.init(log_to_driver=False); print(json.dumps("
                "[[n['NodeID'], n['RayletSocketName']] for n in ray.nodes() if n['Alive']]))")
        deadline = time.monotonic() + timeout_s
        while True:
            alive = json.loads(self.python(code))
            # A node is known by where its raylet's socket is: under that node's temp dir.
            by_name = {node.name: node_id for node_id, socket_name in alive
                       for node in self.nodes.values()
                       if socket_name.startswith(node.temp_dir + "/")}
            if len(by_name) == len(self.nodes):
                for name, node_id in by_name.items():
                    self.nodes[name].node_id = node_id
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"nodes not up within {timeout_s:g} s: {sorted(by_name)}")
            time.sleep(2)

    def actors(self) -> list[dict]:
        """Every actor the cluster has had (alive, restarting or dead), from Ray's state API:
        ``actor_id``, ``class_name``, ``state``, ``node_id``, ``required_resources``, ``pid``,
        ``num_restarts``."""
        code = ("import json; from ray.util.state import list_actors; print(json.dumps(["
                "{k: getattr(a, k) for k in ('actor_id', 'class_name', 'state', 'node_id', "
                "'required_resources', 'pid', 'num_restarts')} for a in list_actors(address="
                f"{self.dashboard!r}, detail=True, limit=10000)]))")
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=120, env=self.env)
        if proc.returncode != 0:
            raise RuntimeError(f"list_actors failed: {proc.stderr[-3000:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])

    def node_named(self, node_id: str) -> str:
        """The name of the node with Ray node id ``node_id`` ("" if not one of ours)."""
        return next((n.name for n in self.nodes.values() if n.node_id == node_id), "")

    def processes(self, node: str | None = None) -> list[psutil.Process]:
        """The processes of one node (or of every node): those whose command line or
        ``RAY_TMPDIR`` names its temp dir, with their children (agents rename themselves,
        actors' browsers)."""
        roots = [self.nodes[node].temp_dir] if node else [self._root]
        found: dict[int, psutil.Process] = {}
        for p in psutil.process_iter(["cmdline"]):
            try:
                cmd = " ".join(p.info["cmdline"] or [])
                tmp = p.environ().get("RAY_TMPDIR", "")
                if any(r + "/" in cmd or tmp == r or tmp.startswith(r + "/") for r in roots):
                    for q in [p, *p.children(recursive=True)]:
                        found[q.pid] = q
            except psutil.Error:
                continue
        return list(found.values())

    def raylet(self, node: str) -> psutil.Process:
        for p in self.processes(node):
            try:
                if "raylet" in p.name() or any("raylet/raylet" in a for a in p.cmdline()[:1]):
                    return p
            except psutil.Error:
                continue
        raise RuntimeError(f"no raylet found for node {node}")

    def kill_node(self, node: str) -> None:
        """SIGKILL the node's raylet (a machine lost): its workers notice and exit; the GCS
        marks the node dead after its health checks fail."""
        self.raylet(node).kill()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL, every process of this cluster (nothing else)."""
        terminate(self.processes() if self._root else [])
        if self._root:
            shutil.rmtree(self._root, ignore_errors=True)


def terminate(procs: list[psutil.Process], grace_s: float = 15) -> None:
    """SIGTERM ``procs``, then SIGKILL those still alive after ``grace_s``."""
    for p in procs:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
