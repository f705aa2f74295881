"""From the root config to what each part of the system is started with: the composition
root's builders hand every component its own sections, never the root config.

- :func:`rollout_parts`: the rollout side's component configs (env pool, policy, agent,
  orchestrator, stream, reward service), for :class:`cluster.rollout.RolloutActor`;
- the policy: :func:`cluster.rollout.start_policy` with ``config.policy``;
- the trainer's workers: :func:`trainer.engine.start_workers` with ``config.trainer``'s
  ``engine`` and ``algo`` sections.
"""
from __future__ import annotations

from cluster.config import JobConfig, metrics_publish
from cluster.rollout import RolloutParts
from consolerl.tasks import TASKS_DIR
from env_workers.accounts import PoolConfig
from env_workers.pool import EnvPoolConfig
from infra.console_sim.config import DEFAULT_ACCOUNTS_FILE


def rollout_parts(config: JobConfig, suite_dir: str | None = None) -> RolloutParts:
    """Pick the rollout side's sections out of the root config."""
    accounts_file = config.cloud.accounts_file or str(DEFAULT_ACCOUNTS_FILE)
    env = config.env
    pool = EnvPoolConfig(
        workers=env.workers, worker=env.worker, num_cpus_per_worker=env.num_cpus_per_worker,
        scheduling_strategy=env.scheduling_strategy, resources=env.resources,
        max_restarts=env.max_restarts, metrics=metrics_publish(config),
        pool=PoolConfig(redis_url=config.stream.url, key_prefix=env.lease_prefix,
                        lease_ttl_s=env.lease_ttl_s, accounts_file=accounts_file))
    return RolloutParts(pool, config.policy, config.agent, config.orchestrator, config.stream,
                        config.cloud.endpoint, accounts_file, config.trail, config.reward,
                        suite_dir or str(TASKS_DIR), metrics_publish(config))
