"""The one episode runner end to end on a real local cloud, Redis and Chromium: an episode's
typed outcome (lease, provision, act, score, destroy, release), and a lease lost during the
episode marked as an env error with everything still destroyed and released."""
from __future__ import annotations

from collections.abc import Mapping

import pytest
import redis

from consolerl.tasks import TASKS_DIR, Task, load_task
from consolerl.types import Observation, StepResult
from env_workers.accounts import PoolConfig
from env_workers.pool import EnvWorkerBody
from env_workers.worker import WorkerConfig
from reward_service.service import RewardService
from rollout_service.episode import EpisodeRunner, StepFn, scripted_policy
from rollout_service.oracle import run_oracle
from tests.conftest import _server, run_async

TASK = load_task(TASKS_DIR / "ecs" / "ecs-add-rule-0.yaml")     # has prerequisites


@pytest.fixture(scope="module")
def runner_cloud(tmp_path_factory):
    yield from _server(tmp_path_factory, "runner-cloud", ["--lookup-qps", "0", "--transition",
                                                          "0.3", "--network-ready", "0.1"])


def run(cloud, accounts, redis_url: str, prefix: str, script):
    runner = EpisodeRunner(accounts, cloud.endpoint,
                           RewardService([TASK], accounts, cloud.endpoint).score)
    pool = PoolConfig(redis_url=redis_url, key_prefix=prefix)

    async def go():
        env = EnvWorkerBody(WorkerConfig(console_url=cloud.url), pool, "runner-test")
        try:
            return await runner.run(env, TASK, scripted_policy(script), max_steps=40,
                                    trajectory_id="t-1", seed=3)
        finally:
            await env.drain()
    return runner, run_async(go())


def test_the_oracle_episode_is_solved_scored_and_cleaned_up(runner_cloud, accounts,
                                                             redis_server):
    runner, outcome = run(runner_cloud, accounts, redis_server.url, "test:runner:ok",
                          run_oracle)
    assert outcome.env_error is None and outcome.status == "solved", outcome.reasons
    assert outcome.trajectory.trajectory_id == "t-1" and outcome.trajectory.end_reason == "stop"
    assert len(outcome.trajectory.turns) >= 2
    assert all(t.action_text and not t.prompt_ids for t in outcome.trajectory.turns)
    assert outcome.reward.reward == 1.0 and outcome.reward.rule_verdict.verdict == "success"
    assert outcome.provision_s > 0 and outcome.fencing >= 1 and outcome.worker == "runner-test"
    assert outcome.leaked == [] and outcome.broken_prerequisites == []
    leased = runner.accounts[outcome.account_id]
    assert runner.provisioner(leased).leftovers(outcome.episode_id) == []
    assert not list(redis_server.client().scan_iter("test:runner:ok:lease:*"))


def test_a_lease_lost_during_the_episode_is_an_env_error(runner_cloud, accounts, redis_server):
    async def lose_the_lease(task: Task, values: Mapping[str, str], step: StepFn,
                             observation: Observation) -> StepResult:
        # The lease lapses (a stalled heartbeat, a Redis failover): someone else may act on
        # the account from now on.
        client = redis.Redis.from_url(redis_server.url)
        for key in client.scan_iter("test:runner:lost:lease:*"):
            client.delete(key)
        client.close()
        return await step('stop("done")')

    runner, outcome = run(runner_cloud, accounts, redis_server.url, "test:runner:lost",
                          lose_the_lease)
    assert outcome.env_error is not None and outcome.env_error.kind == "lease_lost"
    assert outcome.status == "env_error"
    assert outcome.leaked == []                 # destroyed all the same
    leased = runner.accounts[outcome.account_id]
    assert runner.provisioner(leased).leftovers(outcome.episode_id) == []
