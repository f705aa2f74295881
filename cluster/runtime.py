"""The runtime every entry point shares (:class:`Session`): Ray bootstrap (embedded, or the
cluster of ``RAY_ADDRESS``), the local services launcher (Redis, the local cloud, on an address
every Ray node reaches), the run's metrics announcements, signal handling; and pinning actors
to the driver's node, peak-memory sampling, stopping actors."""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import ray
import redis as redis_lib
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from cluster.addresses import advertise, is_loopback, loopback_left, on_cluster, services_host
from cluster.config import CloudSection, JobConfig, RunSection, metrics_publish
from consolerl.errors import ConfigError
from infra.local_cloud import LocalCloud
from infra.observability.discovery import PublishConfig, announce, forget_run, publish
from infra.redis_local import RedisServer


def progress(msg: str) -> None:
    print(f"[console-rl] {msg}", file=sys.stderr, flush=True)


class LocalServices:
    """Redis (on the stream URL's port) and the local cloud (on ``cloud.endpoint``), started
    here when nothing answers at the configured addresses and they are this job's to start
    (``run.redis``, ``cloud.local``) on a loopback address, or on the services host.

    :meth:`start` is called once Ray is up (:func:`ray_init`): on a cluster the services
    listen on an address every node reaches and the config it returns names that address
    (:mod:`cluster.addresses`)."""

    def __init__(self, config: JobConfig, run_dir: Path):
        self.config, self.run_dir = config, run_dir
        self.redis: Any = None
        self.cloud: Any = None

    def start(self, node_ip: str | None = None) -> JobConfig:
        """Start what is missing; returns the config with the addresses as advertised to the
        components. ``node_ip``: the driver's Ray node IP (asked of Ray when None)."""
        if node_ip is None:
            node_ip = ray.util.get_node_ip_address() if ray.is_initialized() else ""
        host = services_host(self.config.run, node_ip)
        config = advertise(self.config, host)
        ours = ("127.0.0.1", "localhost", host)
        url = urllib.parse.urlparse(config.stream.url)
        try:
            redis_lib.Redis.from_url(config.stream.url, socket_timeout=2).ping()
        except redis_lib.ConnectionError:
            if not config.run.redis or url.hostname not in ours:
                raise ConfigError(f"stream.url: no Redis answers at {url.hostname}:{url.port} "
                                  "(run.redis=true starts one on a loopback URL)") from None
            self.redis = RedisServer(self.run_dir / "redis", port=url.port or 6390,
                                     host=url.hostname).start()
            progress(f"started Redis on {url.hostname}:{self.redis.port}")
        if config.cloud.local:
            cloud_host, _, port = config.cloud.endpoint.rpartition(":")
            if not answers(f"http://{config.cloud.endpoint}/healthz"):
                if cloud_host not in ours:
                    raise ConfigError(f"cloud.endpoint: {config.cloud.endpoint} does not "
                                      "answer and is not a loopback address (nor "
                                      f"run.services_host {host})")
                self.cloud = LocalCloud(self.run_dir / "cloud", port=int(port),
                                        host=cloud_host).start()
                progress(f"started the local cloud on {self.cloud.endpoint}")
        if on_cluster(config.run) and not is_loopback(host):
            left = loopback_left(config)
            if left:
                progress("warning: on a Ray cluster these still name loopback, which is each "
                         f"node itself: {', '.join(left)}")
        return config

    def stop(self) -> None:
        if self.cloud is not None:
            self.cloud.stop()
        if self.redis is not None:
            self.redis.stop()


class Announcements:
    """The announcements the composition root makes for a run (the local cloud's, the
    trainer's, the jobs API's), ended together by :meth:`close`, which also forgets the
    entries of the run's actors (they are killed, not stopped). A no-op when ``config`` is
    None (``observe.enabled`` off)."""

    def __init__(self, config: PublishConfig | None):
        self.config = config
        self.items: list[Any] = []

    def local_cloud(self, cloud: CloudSection) -> None:
        """The embedded local cloud serves its own /metrics: announced on its behalf."""
        if self.config is not None and cloud.local:
            self.items.append(announce(self.config, cloud.endpoint, "cloud", "local-cloud"))

    def announce(self, address: str, component: str, name: str) -> None:
        if self.config is not None:
            self.items.append(announce(self.config, address, component, name))

    def publish(self, registries: list[Any], component: str, name: str) -> str:
        """Serve and announce ``registries`` from this process; returns the URL ("" if not)."""
        endpoint = publish(self.config, registries, component, name)
        if endpoint is None:
            return ""
        self.items.append(endpoint)
        return endpoint.url

    def close(self) -> None:
        for item in self.items:
            item.close()
        self.items = []
        if self.config is not None:
            try:
                forget_run(self.config.redis_url, self.config.run)
            except redis_lib.RedisError as exc:     # Redis already gone: the entries expire
                progress(f"could not remove the run's metrics targets: {exc}")


class Session:
    """One run's runtime, entered by each entry point (``cluster.job``, ``cluster.serve``,
    ``cluster.evaluate``): Ray (embedded, or the cluster of ``RAY_ADDRESS``), the local
    services the run starts, and the run's metrics announcements. :attr:`config` is the config
    with the addresses every Ray node reaches; :attr:`metrics` where components announce their
    metrics (None: ``observe.enabled`` off).

    Leaving it stops them in reverse: the announcements, Ray (every actor left), and the local
    services last, since components still talk to Redis and the cloud while they stop. The
    embedded Ray cluster's processes and the services are started in process groups of their
    own, so a signal to the run's group (Ctrl-C in a terminal, ``kill -TERM -PGID``, make's
    group) reaches only the driver, which then stops everything in that order
    (:func:`handle_stop_signals`)."""

    def __init__(self, config: JobConfig, run_dir: Path):
        self.config = config
        self.services = LocalServices(config, run_dir)
        self.metrics: PublishConfig | None = None
        self.announcements = Announcements(None)

    def __enter__(self) -> Session:
        try:
            ray_init(self.config.run)
            self.config = self.services.start()
            self.metrics = metrics_publish(self.config)
            self.announcements = Announcements(self.metrics)
            self.announcements.local_cloud(self.config.cloud)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        stopping()
        self.announcements.close()
        if ray.is_initialized():
            ray.shutdown()       # stops an embedded cluster; disconnects from an external one
        self.services.stop()


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def ray_init(run: RunSection) -> None:
    """Join the configured or ``RAY_ADDRESS`` cluster, else start an embedded one (which
    ``ray.shutdown()`` stops again; an external one it only disconnects from) whose processes
    run in process groups of their own (:func:`own_process_groups`). ``ray.init`` replaces the
    SIGTERM handler (its core worker then aborts on the signal, skipping every ``finally``):
    ours goes back (:func:`handle_stop_signals`)."""
    address = run.ray_address or os.environ.get("RAY_ADDRESS", "")
    kwargs: dict[str, Any] = {"log_to_driver": False}
    if address:
        ray.init(address=address, **kwargs)
    else:
        kwargs["include_dashboard"] = False
        if run.ray_num_cpus:
            kwargs["num_cpus"] = run.ray_num_cpus
        with own_process_groups():
            ray.init(**kwargs)
    handle_stop_signals()


@contextlib.contextmanager
def own_process_groups() -> Iterator[None]:
    """Ray processes started inside (an embedded cluster's GCS, raylet and agents; through the
    raylet every worker, and the browsers and vLLM engines the workers start) each get a
    process group of their own instead of the driver's. Ray starts them all through
    ``ray._private.services.ConsolePopen`` (Ray 2.60; tests/integration/test_process_groups.py
    fails if that moves); they still die with the driver (Ray's kernel fate-sharing,
    PR_SET_PDEATHSIG)."""
    from ray._private import services  # noqa: PLC0415 - Ray's process launcher

    launcher = services.ConsolePopen

    class OwnGroupPopen(launcher):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("process_group", 0)
            super().__init__(*args, **kwargs)

    services.ConsolePopen = OwnGroupPopen
    try:
        yield
    finally:
        services.ConsolePopen = launcher


# The signal that began the stop (0: none yet), and whether the run is stopping (by a signal
# or on its own). Signals while stopping are noted, not raised: an interrupt inside the
# clean-up would leave accounts leased and processes running.
_STOP_SIGNAL = [0]
_STOPPING = [False]


def stopping() -> None:
    """The run is stopping on its own (the work is done or failed): from here on a signal
    no longer interrupts, so the clean-up finishes."""
    _STOPPING[0] = True


def handle_stop_signals() -> None:
    """SIGTERM and SIGINT raise :class:`KeyboardInterrupt` in the main thread once; a repeat
    while the run stops is reported and otherwise ignored. A no-op off the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _on_stop_signal)


def _on_stop_signal(signum: int, frame: Any) -> None:
    if _STOPPING[0]:                 # set by the first signal too
        progress(f"stopping already (signal {signum} ignored): the run's processes and "
                 "leases are being released")
        return
    _STOP_SIGNAL[0] = signum
    _STOPPING[0] = True
    raise KeyboardInterrupt(f"signal {signum}")


def stop_exit_code() -> int:
    """The conventional exit code of a run stopped by a signal: 128 + its number (130 for
    SIGINT when none was recorded, as Python's own Ctrl-C)."""
    return 128 + (_STOP_SIGNAL[0] or signal.SIGINT)


class PeakMemory:
    """Peak memory of this process and everything it started (an embedded Ray cluster's
    actors, vLLM, Chromium, Redis, the local cloud), sampled every 2 s as the sum of
    proportional set sizes (PSS: shared pages such as the object store counted once).
    :attr:`breakdown` is the sample at the peak, summed by kind of process (see
    :func:`process_kind`)."""

    def __init__(self, interval_s: float = 2.0,
                 last: dict[int, tuple[str, int]] | None = None) -> None:
        self.peak = 0
        # The latest sample by pid, (kind, PSS): kept in place in ``last`` when given.
        self.last: dict[int, tuple[str, int]] = last if last is not None else {}
        self.breakdown: dict[str, int] = {}
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="peak-memory")
        self._thread.start()

    def _run(self) -> None:
        me = psutil.Process()
        while not self._stop.wait(self.interval_s):
            total, kinds = 0, {}
            for p in [me, *me.children(recursive=True)]:
                try:
                    pss = p.memory_full_info().pss
                    kind = process_kind(p.cmdline(), p is me)
                except (psutil.Error, AttributeError):
                    continue
                total += pss
                kinds[kind] = kinds.get(kind, 0) + pss
                self.last[p.pid] = (kind, pss)
            if total > self.peak:
                self.peak, self.breakdown = total, kinds

    def stop(self) -> float:
        self._stop.set()
        return round(self.peak / 2**30, 2)

    def breakdown_gib(self) -> dict[str, float]:
        """The peak's processes by kind, GiB, largest first."""
        return {k: round(v / 2**30, 2) for k, v in sorted(self.breakdown.items(),
                                                          key=lambda kv: -kv[1])}


def process_kind(cmdline: list[str], is_driver: bool = False) -> str:
    """What a process of the job is: ``ray::<Actor>`` for Ray actors (``ray::IDLE`` workers
    count as ``ray workers``), ``chromium``, ``vllm``, ``redis``, ``local cloud``, ``ray``
    (the GCS, raylet, dashboard and agents), ``driver``, else the program's name."""
    if is_driver:
        return "driver"
    text = " ".join(cmdline)
    first = cmdline[0] if cmdline else ""
    if first.startswith("ray::"):
        name = first.split()[0].removeprefix("ray::").split(".")[0]
        return "ray workers" if name in ("IDLE", "") else f"ray::{name}"
    for needle, kind in (("chrom", "chromium"), ("vllm", "vllm"), ("redis-server", "redis"),
                         ("console_sim", "local cloud"), ("gcs_server", "ray"),
                         ("raylet", "ray"), ("dashboard", "ray"), ("ray/_private", "ray"),
                         ("runtime_env", "ray"), ("log_monitor", "ray"), ("monitor.py", "ray")):
        if needle in text:
            return kind
    return os.path.basename(first) or "other"


def on_driver_node() -> NodeAffinitySchedulingStrategy:
    """Placement for the control plane (the rollout actor, the jobs API's scheduler and HTTP
    server): the driver's own node, hard. Left to Ray, an actor asking ``num_cpus=0`` may
    land on any node, and losing a worker node would then stop the whole job."""
    return NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)


def stop_actors(actors: list[Any], timeout_s: float = 60) -> None:
    """Ask every actor to ``shutdown()`` (its child processes, process groups) at once, wait up
    to ``timeout_s`` in all, then kill each."""
    refs = []
    for actor in actors:
        try:
            refs.append(actor.shutdown.remote())
        except Exception:  # noqa: BLE001 - killed below either way
            pass
    if refs:
        ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    for actor in actors:
        ray.kill(actor)
