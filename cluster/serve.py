"""The jobs API on one machine, or on the Ray cluster of ``RAY_ADDRESS``:

    python -m cluster.serve [--config configs/serve.yaml] [--model newest|FOLDER]
                            [section.key=value ...]
    python -m cluster.serve token --team docs --scopes jobs:write,jobs:read [--tokens-file F]

starts Redis and the local cloud (when the config says so and nothing answers), Ray, the
scheduler actor (the live policy, ``api.workers`` env workers, the reward service) and the HTTP
side on ``api.host:api.port``, prints a token for ``api.default_team`` the first time, and
serves until Ctrl-C or SIGTERM, then drains: running episodes end, accounts are released.

The live policy is ``policy.model``, or ``--model``: a folder, or ``newest``, the newest
model a training stage wrote under ``--runs`` (:func:`newest_trained_model`; the base model
when there is none; what ``make serve`` asks for). Before anything starts it prints each
served model and the agent settings it runs with: a trained model's own (its
``agent.json``), which the config's ``agent`` section may not contradict
(:func:`cluster.builders.served_models`).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import ray

from cluster.builders import jobs_api_specs, served_models
from cluster.config import JobConfig, agent_named
from cluster.jobs_api import SCHEDULER_NAME, HttpServerActor, JobsSchedulerActor
from cluster.runtime import (Session, handle_stop_signals, on_driver_node, progress,
                             stop_exit_code, stopping)
from consolerl.config import load_config
from consolerl.errors import ConfigError
from infra.observability.discovery import PublishConfig
from jobsapi.auth import TokenBook
from jobsapi.schema import SCOPES
from rollout_service.models import AGENT_FILE, resolve_model

TEAM_SCOPES = [s for s in SCOPES if s != "admin"]


def first_token(config: JobConfig) -> str | None:
    """A token for the default team when it has none yet (shown once, stored as a hash)."""
    book = TokenBook(Path(config.api.tokens_file))
    if config.api.default_team in book.teams():
        return None
    return book.create(config.api.default_team, TEAM_SCOPES)


class Stack:
    """The scheduler actor and the HTTP side, started and stopped together. ``metrics``:
    where the policy replicas and env workers announce their metrics (None: not served);
    ``named``: the model settings the config's ``agent`` section states
    (:func:`cluster.config.agent_named`)."""

    def __init__(self, config: JobConfig, metrics: PublishConfig | None = None,
                 suite_dir: str | None = None, named: frozenset[str] = frozenset()):
        self.config = config
        self.named = named
        policy = replace(config.policy, model=resolve_model(config.policy.model))
        self.scheduler_spec, self.http_spec = jobs_api_specs(config, policy, metrics, suite_dir,
                                                             named)
        self.scheduler: Any = None
        self.http: Any = None
        self.url = ""

    def start_scheduler(self) -> None:
        if self.config.api.hosting == "serve":
            return                       # a deployment of the Serve application
        self.scheduler = JobsSchedulerActor.options(
            name=SCHEDULER_NAME, num_cpus=0, scheduling_strategy=on_driver_node()).remote(
            self.scheduler_spec)
        self.run_ref = self.scheduler.run.remote()

    def start_http(self) -> str:
        api = self.config.api
        if api.hosting == "serve":
            from ray import serve  # noqa: PLC0415 - Serve only where it is used

            from cluster.serve_app import build  # noqa: PLC0415
            serve.start(http_options={"host": api.host, "port": api.port})
            serve.run(build(self.config, self.http_spec.suite_dir, self.named),
                      name="consolerl-api", route_prefix="/")
            self.url = f"http://{api.host}:{api.port}"
        else:
            self.http = HttpServerActor.options(
                num_cpus=0, scheduling_strategy=on_driver_node()).remote(self.http_spec,
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

    def stop(self, interrupted: bool = False) -> None:
        """The HTTP side first (no new jobs), then the scheduler: running episodes stop at
        their next step and go back to the queue, accounts are released. ``interrupted``
        (a signal): the episodes get seconds, not minutes."""
        stopping()
        self.stop_http()
        if self.scheduler is not None:
            ray.get(self.scheduler.stop.remote(), timeout=30)
            try:
                ray.get(self.run_ref, timeout=20 if interrupted else 600)
            finally:
                ray.get(self.scheduler.drain.remote(), timeout=120)
                ray.kill(self.scheduler)
                self.scheduler = None


def serve(config: JobConfig, named: frozenset[str] = frozenset()) -> int:
    """Serve until a signal; the exit code is 0, or 128 + the signal's number. ``named``:
    as :class:`Stack` takes it."""
    run_dir = Path(config.run.dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    handle_stop_signals()
    stack: Stack | None = None
    interrupted = False
    try:
        with Session(config, run_dir) as session:
            config = session.config
            try:
                token = first_token(config)
                stack = Stack(config, session.metrics, named=named)
                progress(f"starting the scheduler: policy {config.policy.model} "
                         f"({config.policy.backend}), {config.api.workers} env workers")
                stack.start_scheduler()
                url = stack.start_http()
                # Its /metrics carry the scheduler's and the reward service's as well.
                session.announcements.announce(url.removeprefix("http://"), "jobs_api",
                                               "jobs-api")
                _say_ready(config, url, token)
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                interrupted = True
                progress("stopping: running episodes end, accounts are released")
            finally:
                if stack is not None:
                    stack.stop(interrupted)
    except KeyboardInterrupt:       # a signal while starting: everything is stopped
        interrupted = True
    return stop_exit_code() if interrupted else 0


def _say_ready(config: JobConfig, url: str, token: str | None) -> None:
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


def newest_trained_model(root: Path, depth: int = 3) -> Path | None:
    """The newest model folder a training stage wrote under ``root`` (at most ``depth``
    levels down): a folder with ``agent.json``, ``config.json`` and ``*.safetensors``
    weights, newest by the folder's modification time; hidden folders (a stage's temporary
    ones) and ``*.tmp`` are skipped. ``None``: there is none."""
    found: list[tuple[float, str]] = []
    if not root.is_dir():
        return None
    top = len(root.parts)
    for folder, dirs, files in os.walk(root):
        here = Path(folder)
        dirs[:] = [d for d in dirs if not d.startswith(".") and not d.endswith(".tmp")
                   and len(here.parts) - top < depth]
        if (AGENT_FILE in files and "config.json" in files
                and any(f.endswith(".safetensors") for f in files)):
            found.append((here.stat().st_mtime, folder))
    return Path(max(found)[1]) if found else None


def pick_model(choice: str, runs: Path, configured: str) -> tuple[str, str]:
    """The live policy's model for ``--model choice`` and why: ``""`` the config's
    (``configured``), ``newest`` :func:`newest_trained_model` under ``runs`` (the base model,
    ``default``, when there is none), else the folder named."""
    if not choice:
        return configured, "policy.model"
    if choice != "newest":
        return choice, "named"
    newest = newest_trained_model(runs)
    if newest is None:
        return "default", (f"no trained model under {runs}/ (a folder with agent.json and "
                           "weights): the base model")
    return str(newest), f"the newest trained model under {runs}/"


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
    parser.add_argument("--model", default="",
                        help="the live policy's model: a folder, or 'newest' (the newest "
                             "trained model under --runs); default: policy.model")
    parser.add_argument("--runs", default="runs", help="where --model newest looks")
    parser.add_argument("overrides", nargs="*", help="section.key=value")
    args = parser.parse_args(argv)
    try:
        config = load_config(JobConfig, args.config, args.overrides)
        named = agent_named(args.config, args.overrides)
        model, why = pick_model(args.model, Path(args.runs), config.policy.model)
        config = replace(config, policy=replace(config.policy, model=model))
        progress(f"serving {model} ({why})")
        for line in served_models(config, named, resolve_model(model)):
            progress(line)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return serve(config, named)


if __name__ == "__main__":
    sys.exit(main())
