"""``make observe`` / ``python -m infra.observability.observe``: Prometheus on loopback scraping
a running console-rl job (``make demo``, a training job under ``ray job submit``, the jobs
API), with the Redis exporter and the discovery process. Installs what is missing from Debian
(``prometheus``, ``prometheus-redis-exporter``) when it can.

:class:`Observatory` is the same thing as a library (the tests start it around a real run).
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import redis as redis_lib
import yaml

from consolerl.errors import ConsoleRLError

from .discovery import keep_sd_file, refresh_sd_file

HERE = Path(__file__).resolve().parent
TEMPLATE = HERE / "prometheus.yml"
RULES = HERE / "rules"
DASHBOARDS = HERE / "grafana" / "dashboards"
PACKAGES = {"prometheus": "prometheus", "promtool": "prometheus",
            "prometheus-redis-exporter": "prometheus-redis-exporter"}


class ObserveError(ConsoleRLError, RuntimeError):
    """Prometheus or the exporter could not be installed or started."""


def ensure_binaries(install: bool = True) -> None:
    """The Debian packages Prometheus comes from; installed when missing and we may."""
    missing = sorted({pkg for binary, pkg in PACKAGES.items() if shutil.which(binary) is None})
    if not missing:
        return
    if not install:
        raise ObserveError(f"missing: {', '.join(missing)} (apt-get install {' '.join(missing)})")
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    if sudo and shutil.which("sudo") is None:
        raise ObserveError(f"missing Debian packages {' '.join(missing)}: run "
                           f"`apt-get install {' '.join(missing)}` as root")
    print(f"installing {' '.join(missing)} (Debian)", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run([*sudo, "apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run([*sudo, "apt-get", "install", "-y", "-qq", "--no-install-recommends",
                    *missing], check=True, env=env)


@dataclass(frozen=True)
class ObserveConfig:
    redis_url: str                          # the stream's Redis (announcements, streams)
    dir: Path = Path("var/observe")
    port: int = 19090
    exporter_port: int = 19121
    scrape_interval: str = "5s"
    evaluation_interval: str = "15s"
    streams: str = "consolerl:*"            # key patterns the exporter reports as streams
    ray_sd_file: str = "/tmp/ray/prom_metrics_service_discovery.json"
    sd_interval_s: float = 1.0


def render_config(config: ObserveConfig) -> dict[str, Any]:
    """The committed prometheus.yml with this machine's paths, ports and intervals."""
    doc = yaml.safe_load(TEMPLATE.read_text())
    doc["global"]["scrape_interval"] = config.scrape_interval
    doc["global"]["scrape_timeout"] = config.scrape_interval
    doc["global"]["evaluation_interval"] = config.evaluation_interval
    # The rules as committed, but each group evaluated at this Prometheus's interval: the
    # committed groups' own intervals (30 s) are for a cluster's long runs; a local run of a
    # minute would get one evaluation or none.
    rules_dir = config.dir.resolve() / "rules"
    rules_dir.mkdir(parents=True, exist_ok=True)
    files = []
    for f in doc["rule_files"]:
        rules = yaml.safe_load((RULES / Path(f).name).read_text())
        for group in rules.get("groups", []):
            group["interval"] = config.evaluation_interval
        (rules_dir / Path(f).name).write_text(yaml.safe_dump(rules, sort_keys=False))
        files.append(str(rules_dir / Path(f).name))
    doc["rule_files"] = files
    for job in doc["scrape_configs"]:
        name = job["job_name"]
        if name == "consolerl":
            job["file_sd_configs"][0]["files"] = [str(config.dir.resolve() / "sd" /
                                                      "consolerl.json")]
        elif name == "redis":
            job["static_configs"][0]["targets"] = [f"127.0.0.1:{config.exporter_port}"]
        elif name == "ray":
            job["file_sd_configs"][0]["files"] = [config.ray_sd_file]
        elif name == "prometheus":
            job["static_configs"][0]["targets"] = [f"127.0.0.1:{config.port}"]
    return doc


class Observatory:
    """Discovery, the Redis exporter and Prometheus, started and stopped together."""

    def __init__(self, config: ObserveConfig):
        self.config = config
        self.dir = config.dir.resolve()
        self.url = f"http://127.0.0.1:{config.port}"
        self.procs: list[subprocess.Popen] = []
        self.logs: list[Any] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, timeout_s: float = 60.0) -> Observatory:
        ensure_binaries()
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "sd").mkdir(exist_ok=True)
        config_file = self.dir / "prometheus.yml"
        config_file.write_text(yaml.safe_dump(render_config(self.config), sort_keys=False))
        self.redis = redis_lib.Redis.from_url(self.config.redis_url, socket_timeout=5)
        sd_file = self.dir / "sd" / "consolerl.json"
        refresh_sd_file(self.redis, sd_file)     # None without Redis yet: a job starts its own
        self._thread = threading.Thread(
            target=keep_sd_file, args=(self.redis, sd_file, self.config.sd_interval_s,
                                       self._stop), daemon=True, name="observe-discovery")
        self._thread.start()
        log = open(self.dir / "redis-exporter.log", "ab")  # noqa: SIM115 - closed in stop()
        self.logs.append(log)
        self.procs.append(subprocess.Popen(
            ["prometheus-redis-exporter", "-redis.addr", self.config.redis_url,
             "-check-streams", self.config.streams,
             "-web.listen-address", f"127.0.0.1:{self.config.exporter_port}"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        log = open(self.dir / "prometheus.log", "ab")  # noqa: SIM115 - closed in stop()
        self.logs.append(log)
        self.procs.append(subprocess.Popen(
            ["prometheus", f"--config.file={config_file}",
             f"--storage.tsdb.path={self.dir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.config.port}",
             "--web.enable-lifecycle", "--log.level=warn"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        deadline = time.monotonic() + timeout_s
        while True:
            for proc in self.procs:
                if proc.poll() is not None:
                    self.stop()
                    raise ObserveError(f"{proc.args[0]} exited with {proc.returncode}; see "
                                       f"{self.dir}/*.log")
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise ObserveError(f"Prometheus not ready within {timeout_s:g} s; see "
                                   f"{self.dir / 'prometheus.log'}")
            time.sleep(0.25)

    def targets(self) -> list[dict[str, Any]]:
        """Prometheus's active targets (its /api/v1/targets)."""
        body = httpx.get(f"{self.url}/api/v1/targets", timeout=10).json()
        return body["data"]["activeTargets"]

    def query(self, expr: str, **params: Any) -> list[dict[str, Any]]:
        """An instant query (``time=...``) or, with ``start``/``end``/``step``, a range query."""
        path = "query_range" if "start" in params else "query"
        response = httpx.get(f"{self.url}/api/v1/{path}", params={"query": expr, **params},
                             timeout=30)
        body = response.json()
        if body.get("status") != "success":
            raise ObserveError(f"{expr}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]["result"]

    def stop(self) -> None:
        self._stop.set()
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.procs = []
        for log in self.logs:
            log.close()
        self.logs = []


def _redis_url(args: argparse.Namespace) -> tuple[str, str]:
    if args.redis:
        return args.redis, "consolerl:*"
    doc = yaml.safe_load(Path(args.config).read_text()) or {}
    stream = doc.get("stream", {}) or {}
    url = stream.get("url", "redis://127.0.0.1:6390/0")
    return url, f"{stream.get('stream', 'consolerl:experience')}*"


def _interrupt(_signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt       # SIGTERM stops everything the way Ctrl-C does


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.observability.observe",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/demo.yaml",
                        help="the job's config: its stream.url is where targets are announced")
    parser.add_argument("--redis", default="", help="a Redis URL instead of --config's")
    parser.add_argument("--port", type=int, default=19090)
    parser.add_argument("--exporter-port", type=int, default=19121)
    parser.add_argument("--scrape-interval", default="5s")
    parser.add_argument("--dir", type=Path, default=Path("var/observe"))
    args = parser.parse_args(argv)
    url, streams = _redis_url(args)
    config = ObserveConfig(url, args.dir, args.port, args.exporter_port, args.scrape_interval,
                           streams=streams)
    try:
        obs = Observatory(config).start()
    except (ObserveError, subprocess.CalledProcessError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    signal.signal(signal.SIGTERM, _interrupt)
    print(f"""Prometheus is scraping console-rl (targets announced in {url}):
  targets:    {obs.url}/targets
  alerts:     {obs.url}/alerts
  graph:      {obs.url}/graph?g0.expr=consolerl%3Aepisodes%3Arate5m
  dashboards: {DASHBOARDS} (Grafana: see infra/observability/README.md)
  data:       {obs.dir}
Start a job now if none runs (make demo, or ray job submit ... python -m cluster.job ...).
Ctrl-C stops Prometheus and the exporter.""", flush=True)
    seen: tuple[int, int] = (-1, -1)
    try:
        while True:
            time.sleep(5)
            try:
                targets = obs.targets()
            except (httpx.HTTPError, KeyError, ValueError):
                continue
            up = sum(t["health"] == "up" for t in targets)
            if (up, len(targets)) != seen:
                seen = (up, len(targets))
                print(f"{time.strftime('%H:%M:%S')} targets up: {up}/{len(targets)}",
                      flush=True)
    except KeyboardInterrupt:
        pass
    finally:
        obs.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
