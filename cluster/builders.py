"""From the root config to what each part of the system is started with: the composition
root hands every component its own section, with the values derived once (the stream's Redis
for the account leases, the cloud endpoint's console, the resolved model, the metrics
announcement) filled in here and nowhere else.

- :func:`env_pool`: the env workers' pool (``config.env`` is the pool's own config);
- :func:`rollout_spec`: everything the rollout side is built from
  (:class:`cluster.rollout.RolloutSide`), for the training job, evaluation and the jobs API
  alike, the reward service's judges (:func:`judge_section`) included;
- :func:`jobs_api_specs`: the jobs API's scheduler and HTTP side (:func:`served_models`: the
  models it serves and their agent settings, checked at start);
- :func:`trainer_algo`: the trainer's algorithm section with the sampling temperature.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from cluster.config import JobConfig, served_agent, untrained_agent
from cluster.jobs_api import HttpSpec, SchedulerSpec, registered_model
from cluster.judges import POLICY_PREFIX, JudgeSection
from cluster.rollout import RolloutSpec
from consolerl.tasks import TASKS_DIR
from env_workers.pool import EnvPoolConfig
from infra.observability.discovery import PublishConfig
from doccheck import labels_by_drift
from jobsapi.schema import SCRIPTED_MODELS
from consolerl.errors import ConfigError
from rollout_service.agent import AgentConfig
from rollout_service.models import (describe_agent, is_base_model, model_agent_settings,
                                    resolve_model)
from rollout_service.policy import PolicyConfig
from trainer.algo import AlgoConfig


def env_pool(config: JobConfig, metrics: PublishConfig | None,
             workers: int | None = None) -> EnvPoolConfig:
    """``config.env`` with its leases in the stream's Redis, the cloud's accounts, the console
    of the cloud endpoint (unless ``env.worker.console_url`` names another) and the metrics
    announcement; ``workers`` replaces the count (the jobs API has its own)."""
    env = config.env
    return replace(
        env, workers=env.workers if workers is None else workers, metrics=metrics,
        pool=replace(env.pool, redis_url=config.stream.url,
                     accounts_file=config.cloud.accounts_path),
        worker=replace(env.worker,
                       console_url=env.worker.console_url or config.cloud.console_url))


def rollout_spec(config: JobConfig, policy: PolicyConfig, metrics: PublishConfig | None, *,
                 workers: int | None = None, suite_dir: str | None = None) -> RolloutSpec:
    """The rollout side's sections. ``policy``: ``config.policy`` with its model resolved
    (the caller resolves it once: the SFT stage may have replaced it)."""
    return RolloutSpec(env_pool=env_pool(config, metrics, workers), policy=policy,
                       agent=config.agent, endpoint=config.cloud.endpoint,
                       accounts_file=config.cloud.accounts_path, trail=config.trail,
                       reward=config.reward, suite_dir=suite_dir or str(TASKS_DIR),
                       metrics=metrics, judges=judge_section(config),
                       console_labels=console_labels(config))


def console_labels(config: JobConfig) -> dict[str, frozenset[str]]:
    """drift profile -> every label of the console's inventory under it, for the evidence
    channel: ``reward.evidence.inventories``, or the committed crawls of the local console
    when the cloud is the local one (none for another cloud unless named)."""
    files = config.reward.evidence.inventories
    if not files:
        return labels_by_drift() if config.cloud.local else {}
    return labels_by_drift({drift: Path(path) for drift, path in files.items()})


def judge_section(config: JobConfig) -> JudgeSection | None:
    """``reward.judges`` when it is on (None: the rule alone), a ``policy:`` endpoint's model
    resolved to its folder here, once (a wrong folder fails before anything starts)."""
    judges = config.reward.judges
    if not judges.active:
        return None
    if judges.policy_model:
        judges = replace(judges, endpoint=POLICY_PREFIX + resolve_model(judges.policy_model))
    return judges


def jobs_api_specs(config: JobConfig, policy: PolicyConfig, metrics: PublishConfig | None,
                   suite_dir: str | None = None, named: frozenset[str] = frozenset()
                   ) -> tuple[SchedulerSpec, HttpSpec]:
    """The jobs API's scheduler (the rollout side with ``api.workers`` env workers, which
    keep every other env setting: placement, restarts) and its HTTP side. The rollout side's
    agent is what a model without ``agent.json`` runs with
    (:func:`cluster.config.untrained_agent`); the scheduler gives a trained model its own settings,
    refusing one that contradicts what the config states (``named``:
    :func:`cluster.config.agent_named`; :func:`served_models` checks them at start)."""
    api = config.api
    tokens = str(Path(api.tokens_file).resolve())
    # Both sides (separate processes, whatever their working folder) share one directory.
    blobs = replace(api.blobs, dir=str(Path(api.blobs.dir).resolve()))
    untrained = replace(config, agent=untrained_agent(config, named))
    rollout = rollout_spec(untrained, policy, metrics, workers=api.workers,
                           suite_dir=suite_dir)
    scheduler = SchedulerSpec(rollout=rollout, scheduler=api.scheduler,
                              redis_url=config.stream.url, prefix=api.prefix,
                              tokens_file=tokens, models=tuple(api.models.items()),
                              blobs=blobs, retention=api.retention,
                              agent_named=tuple(sorted(named)))
    http = HttpSpec(redis_url=config.stream.url, prefix=api.prefix, tokens_file=tokens,
                    models=("live", *SCRIPTED_MODELS, *api.models), sse_max_s=api.sse_max_s,
                    suite_dir=rollout.suite_dir, blobs=blobs, retention=api.retention)
    return scheduler, http


def served_models(config: JobConfig, named: frozenset[str], live: str) -> list[str]:
    """What the jobs API will serve, one line per model (``live``: the served policy's
    folder; then ``api.models`` whose folder is there now): its folder and the agent settings
    it runs with (:func:`cluster.config.served_agent`), the untrained base model's lines
    saying what its verdicts will be. Raises :class:`ConfigError` for a model the config's
    ``agent`` section contradicts, so the jobs API is refused at start."""
    lines = [_served_line("live", live, served_agent(config, named, live))]
    for name, path in config.api.models.items():
        try:
            folder = registered_model(path)
        except ConfigError:
            lines.append(f"{name}: {path} (no model folder yet: checked when a job first "
                         "asks for it)")
            continue
        lines.append(_served_line(name, folder, served_agent(config, named, folder)))
    return lines


def _served_line(name: str, folder: str, agent: AgentConfig) -> str:
    if model_agent_settings(folder) is not None:
        return f"{name}: {folder}, trained with {describe_agent(agent)} (its agent.json)"
    line = f"{name}: {folder}, no agent.json: the config's settings {describe_agent(agent)}"
    if is_base_model(folder):
        line += ("; this is the untrained base model: it completes almost no procedure, so "
                 "verdicts will be mostly `inconclusive` (train one: make demo or make "
                 "learning-check; then make serve serves the newest)")
    return line


def trainer_algo(config: JobConfig) -> AlgoConfig:
    """The trainer's log-probs are computed at the temperature the rollouts sampled at."""
    return replace(config.trainer.algo, temperature=config.agent.temperature)
