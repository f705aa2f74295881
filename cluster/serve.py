"""The jobs API on one machine, or on the Ray cluster of ``RAY_ADDRESS``:

    python -m cluster.serve [--config configs/serve.yaml] [section.key=value ...]
    python -m cluster.serve token --team docs --scopes jobs:write,jobs:read [--tokens-file F]

starts Redis and the local cloud (when the config says so and nothing answers), Ray, the
scheduler actor (the live policy, ``api.workers`` env workers, the reward service) and the HTTP
side on ``api.host:api.port``, prints a token for ``api.default_team`` the first time, and
serves until Ctrl-C or SIGTERM, then drains: running episodes end, accounts are released.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import ray

from cluster.api import (SCHEDULER_NAME, HttpParts, HttpServerActor, SchedulerActor,
                         SchedulerParts)
from cluster.config import JobConfig, metrics_publish
from cluster.runtime import LocalServices, Observed, on_driver_node, progress, ray_init
from consolerl.config import load_config
from consolerl.errors import ConfigError
from consolerl.tasks import TASKS_DIR
from env_workers.accounts import PoolConfig
from env_workers.pool import EnvPoolConfig
from infra.console_sim.config import DEFAULT_ACCOUNTS_FILE
from rollout_service.jobs.auth import TokenBook
from rollout_service.jobs.schema import SCOPES

TEAM_SCOPES = [s for s in SCOPES if s != "admin"]


def api_parts(config: JobConfig, suite_dir: str | None = None
              ) -> tuple[SchedulerParts, HttpParts]:
    """The scheduler's and the HTTP side's parts, picked out of the root config."""
    api, env = config.api, config.env
    accounts_file = config.cloud.accounts_file or str(DEFAULT_ACCOUNTS_FILE)
    pool = EnvPoolConfig(
        workers=api.workers, worker=env.worker, num_cpus_per_worker=env.num_cpus_per_worker,
        scheduling_strategy=env.scheduling_strategy, metrics=metrics_publish(config),
        pool=PoolConfig(redis_url=config.stream.url, key_prefix=env.lease_prefix,
                        lease_ttl_s=env.lease_ttl_s, accounts_file=accounts_file))
    suite = suite_dir or str(TASKS_DIR)
    tokens = str(Path(api.tokens_file).resolve())
    sched = SchedulerParts(pool, config.policy, config.agent, api.scheduler,
                           config.cloud.endpoint, accounts_file, config.trail, config.reward,
                           config.stream.url, api.prefix, tokens, tuple(api.models.items()),
                           suite, metrics_publish(config))
    http = HttpParts(config.stream.url, api.prefix, tokens, ("live", *api.models),
                     api.sse_max_s, suite)
    return sched, http


def first_token(config: JobConfig) -> str | None:
    """A token for the default team when it has none yet (shown once, stored as a hash)."""
    book = TokenBook(Path(config.api.tokens_file))
    if config.api.default_team in book.teams():
        return None
    return book.create(config.api.default_team, TEAM_SCOPES)


class Stack:
    """The scheduler actor and the HTTP side, started and stopped together."""

    def __init__(self, config: JobConfig, suite_dir: str | None = None):
        self.config = config
        self.sched_parts, self.http_parts = api_parts(config, suite_dir)
        self.scheduler: Any = None
        self.http: Any = None
        self.url = ""

    def start_scheduler(self) -> None:
        if self.config.api.hosting == "serve":
            return                       # a deployment of the Serve application
        self.scheduler = SchedulerActor.options(
            name=SCHEDULER_NAME, num_cpus=0, scheduling_strategy=on_driver_node()).remote(
            self.sched_parts)
        self.run_ref = self.scheduler.run.remote()

    def start_http(self) -> str:
        api = self.config.api
        if api.hosting == "serve":
            from ray import serve  # noqa: PLC0415 - Serve only where it is used

            from cluster.serve_app import build  # noqa: PLC0415
            serve.start(http_options={"host": api.host, "port": api.port})
            serve.run(build(self.config, self.http_parts.suite_dir), name="consolerl-api",
                      route_prefix="/")
            self.url = f"http://{api.host}:{api.port}"
        else:
            self.http = HttpServerActor.options(
                num_cpus=0, scheduling_strategy=on_driver_node()).remote(self.http_parts,
                                                                         api.host, api.port)
            self.url = ray.get(self.http.start.remote(), timeout=60)
        return self.url

    def stop_http(self) -> None:
        if self.http is not None:
            try:
                ray.get(self.http.stop.remote(), timeout=15)
            except Exception:  # noqa: BLE001 - killed below either way
                pass
            ray.kill(self.http)
            self.http = None
        elif self.config.api.hosting == "serve":
            from ray import serve  # noqa: PLC0415
            serve.shutdown()

    def stop(self) -> None:
        self.stop_http()
        if self.scheduler is not None:
            ray.get(self.scheduler.stop.remote(), timeout=30)
            try:
                ray.get(self.run_ref, timeout=600)     # running episodes end and clean up
            finally:
                ray.get(self.scheduler.drain.remote(), timeout=120)
                ray.kill(self.scheduler)
                self.scheduler = None


def serve(config: JobConfig) -> int:
    run_dir = Path(config.run.dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    services = LocalServices(config, run_dir)
    stack: Stack | None = None
    observed = Observed(None)
    try:
        ray_init(config.run)
        config = services.start()      # the addresses every Ray node reaches
        observed = Observed(metrics_publish(config))
        observed.local_cloud(config.cloud)
        token = first_token(config)
        stack = Stack(config)
        progress(f"starting the scheduler: policy {config.policy.model} "
                 f"({config.policy.backend}), {config.api.workers} env workers")
        stack.start_scheduler()
        url = stack.start_http()
        # Its /metrics carry the scheduler's and the reward service's as well.
        observed.announce(url.removeprefix("http://"), "jobs_api", "jobs-api")
        progress(f"the jobs API is on {url} (OpenAPI: {url}/openapi.json, docs: {url}/docs)")
        if token:
            progress(f"a token for team {config.api.default_team!r} (shown once; only its hash "
                     f"is kept in {config.api.tokens_file}):\n\n    {token}\n")
        else:
            progress(f"team {config.api.default_team!r} has tokens in {config.api.tokens_file};"
                     " make another with: python -m cluster.serve token --team "
                     f"{config.api.default_team} --scopes {','.join(TEAM_SCOPES)}")
        progress(f"try: CONSOLE_RL_URL={url} CONSOLE_RL_TOKEN=<token> console-rl jobs submit "
                 "--ids ram-create-user-0 --samples 2 --watch")
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        progress("stopping: running episodes end, accounts are released")
    finally:
        if stack is not None and ray.is_initialized():
            stack.stop()
        observed.close()
        if ray.is_initialized():
            ray.shutdown()
        services.stop()
    return 0


def make_token(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m cluster.serve token",
                                     description="Make a bearer token for a team (printed "
                                                 "once; the file keeps its hash).")
    parser.add_argument("--team", required=True)
    parser.add_argument("--scopes", default=",".join(TEAM_SCOPES),
                        help=f"comma-separated, of {', '.join(SCOPES)}")
    parser.add_argument("--tokens-file", default=JobConfig().api.tokens_file)
    args = parser.parse_args(argv)
    try:
        print(TokenBook(Path(args.tokens_file)).create(args.team, args.scopes.split(",")))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["token"]:
        return make_token(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m cluster.serve", description=__doc__.split(
        "\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=None, help="a YAML file (configs/serve.yaml)")
    parser.add_argument("overrides", nargs="*", help="section.key=value")
    args = parser.parse_args(argv)
    try:
        config = load_config(JobConfig, args.config, args.overrides)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return serve(config)


if __name__ == "__main__":
    sys.exit(main())
