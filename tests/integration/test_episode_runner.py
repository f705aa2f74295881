"""The one episode runner end to end on a real local cloud, Redis and Chromium: an episode's
typed outcome (lease, provision, act, score, destroy, release), and a lease lost during the
episode marked as an env error with everything still destroyed and released."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping

import pytest
import redis

from consolerl.accounts import lease_agent, parse_lease_agent
from consolerl.page import parse
from consolerl.tasks import TASKS_DIR, Task, load_task
from consolerl.types import Observation, StepResult
from env_workers.accounts import PoolConfig
from env_workers.leases import AccountPool
from env_workers.observation import bid_number
from env_workers.pool import LeasedEnvWorker
from env_workers.worker import WorkerConfig
from infra.provisioning.sdk import EPISODE_TAG
from reward_service.actiontrail import TrailClient
from reward_service.service import RewardService
from rollout_service import episode as episode_module
from rollout_service.episode import EpisodeRunner, StepFn, episode_id_seed, scripted_policy
from datagen.oracle import run_oracle
from tests.conftest import _server, run_async

TASK = load_task(TASKS_DIR / "ecs" / "ecs-add-rule-0.yaml")     # has prerequisites


@pytest.fixture(scope="module")
def runner_cloud(tmp_path_factory):
    yield from _server(tmp_path_factory, "runner-cloud", ["--lookup-qps", "0", "--transition",
                                                          "0.3", "--network-ready", "0.1"])


def run(cloud, accounts, redis_url: str, prefix: str, script, id_seed: int | None = None):
    runner = EpisodeRunner(accounts, cloud.endpoint,
                           RewardService([TASK], accounts, cloud.endpoint).score)
    pool = PoolConfig(redis_url=redis_url, key_prefix=prefix)

    async def go():
        env = LeasedEnvWorker(WorkerConfig(console_url=cloud.url), pool, "runner-test")
        try:
            return await runner.run(env, TASK, scripted_policy(script), max_steps=40,
                                    trajectory_id="t-1", seed=3, id_seed=id_seed)
        finally:
            await env.drain()
    return runner, run_async(go())


@pytest.mark.parametrize("random_ids", [False, True], ids=["document-order", "random-ids"])
def test_the_oracle_episode_is_solved_scored_and_cleaned_up(runner_cloud, accounts,
                                                             redis_server, random_ids):
    """Also with the page's ids drawn for the episode (``AgentConfig.random_ids``): every
    page of the episode numbered from its seed, and the oracle, which finds elements by their
    labels, solves it all the same."""
    pages: list[str] = []

    async def oracle(task: Task, values: Mapping[str, str], step: StepFn,
                     observation: Observation) -> StepResult:
        async def seen(text: str) -> StepResult:
            result = await step(text)
            pages.append(result.observation.text)
            return result
        pages.append(observation.text)
        return await run_oracle(task, values, seen, observation)

    id_seed = episode_id_seed(random_ids, "t-1", 3)
    runner, outcome = run(runner_cloud, accounts, redis_server.url, "test:runner:ok",
                          oracle, id_seed)
    bids = [[n.bid for n in parse(text).controls()] for text in pages]
    assert len(bids) >= 3 and all(bids)
    assert bids == [[str(bid_number(k, id_seed)) for k in range(1, len(b) + 1)] for b in bids]
    assert any(b[:3] != ["1", "2", "3"] for b in bids) == random_ids
    assert outcome.env_error is None and outcome.status == "solved", outcome.reasons
    assert outcome.trajectory.trajectory_id == "t-1" and outcome.trajectory.end_reason == "stop"
    assert len(outcome.trajectory.turns) >= 2
    assert all(t.action_text and not t.prompt_ids for t in outcome.trajectory.turns)
    assert outcome.reward.reward == 1.0 and outcome.reward.rule_verdict.verdict == "success"
    assert outcome.provision_s > 0 and outcome.fencing >= 1 and outcome.worker == "runner-test"
    assert outcome.episode_s > outcome.provision_s      # provisioning is a part of it
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


class _Breaks:
    """An env worker whose ``step`` raises (its process died under Ray: the call raises
    instead of answering an EnvError)."""

    def __init__(self, env: LeasedEnvWorker):
        self.env = env

    def __getattr__(self, name):
        return getattr(self.env, name)

    async def step(self, text: str):
        raise RuntimeError("The actor died unexpectedly before finishing this task.")


def run_wrapped(cloud, accounts, redis_url: str, prefix: str, wrapper):
    """An oracle episode on a real env worker seen through ``wrapper`` (a broken worker);
    returns the runner, the outcome and the episode's seconds."""
    runner = EpisodeRunner(accounts, cloud.endpoint,
                           RewardService([TASK], accounts, cloud.endpoint).score)
    pool = PoolConfig(redis_url=redis_url, key_prefix=prefix)

    async def go():
        env = LeasedEnvWorker(WorkerConfig(console_url=cloud.url), pool, "runner-test")
        try:
            t0 = time.monotonic()
            out = await runner.run(wrapper(env), TASK, scripted_policy(run_oracle),
                                   max_steps=40, trajectory_id="t-2", seed=3)
            return out, time.monotonic() - t0
        finally:
            await env.drain()
    return (runner, *run_async(go()))


def test_an_env_worker_that_breaks_mid_episode_is_an_env_error(runner_cloud, accounts,
                                                              redis_server):
    runner, outcome, _ = run_wrapped(runner_cloud, accounts, redis_server.url,
                                     "test:runner:broken", _Breaks)
    assert outcome.env_error is not None and outcome.env_error.kind == "worker_failed"
    assert "actor died" in outcome.env_error.message and outcome.status == "env_error"
    assert outcome.leaked == []                 # destroyed all the same
    leased = runner.accounts[outcome.account_id]
    assert runner.provisioner(leased).leftovers(outcome.episode_id) == []
    assert not list(redis_server.client().scan_iter("test:runner:broken:lease:*"))


class _Hangs(_Breaks):
    """An env worker whose ``step`` never answers (a browser that died mid-call)."""

    async def step(self, text: str):
        await asyncio.sleep(3600)


def test_an_env_worker_that_hangs_mid_episode_is_an_env_error(runner_cloud, accounts,
                                                             redis_server, monkeypatch):
    monkeypatch.setitem(episode_module.CALL_TIMEOUT_S, "step", 2.0)
    runner, outcome, seconds = run_wrapped(runner_cloud, accounts, redis_server.url,
                                           "test:runner:hangs", _Hangs)
    assert outcome.env_error is not None and outcome.env_error.kind == "worker_failed"
    assert "step did not answer within 2 s" in outcome.env_error.message
    assert seconds < 120
    assert outcome.leaked == []                 # destroyed all the same
    leased = runner.accounts[outcome.account_id]
    assert runner.provisioner(leased).leftovers(outcome.episode_id) == []
    assert not list(redis_server.client().scan_iter("test:runner:hangs:lease:*"))


def test_a_policy_that_fails_mid_episode_is_an_env_error(runner_cloud, accounts, redis_server):
    async def replica_gone(task, values, step, observation):
        await step('click("nothing")')
        raise ConnectionError("policy replica restarting")

    runner, outcome = run(runner_cloud, accounts, redis_server.url, "test:runner:policy",
                          replica_gone)
    assert outcome.env_error is not None and outcome.env_error.kind == "policy_failed"
    assert "restarting" in outcome.env_error.message
    assert outcome.leaked == []
    assert not list(redis_server.client().scan_iter("test:runner:policy:lease:*"))


def test_every_call_under_a_lease_carries_its_mark_in_the_audit_log(runner_cloud, accounts,
                                                                    redis_server):
    """Provisioning (SDK), the console (browser) and clean-up all say which lease they ran
    under: the audit log alone shows who used the account when."""
    runner, outcome = run(runner_cloud, accounts, redis_server.url, "test:runner:mark",
                          run_oracle)
    assert outcome.env_error is None
    leased = runner.accounts[outcome.account_id]
    trail = TrailClient(runner.provisioner(leased).client, account_id=leased.account_id)
    events = trail.events(time.time() - 120, time.time() + 1)
    mark = lease_agent(leased.account_id, outcome.fencing)
    marked = [e for e in events if mark in e.user_agent]
    assert any(e.by_console for e in marked), "no console event carries the lease mark"
    assert any(not e.by_console and e.event_name.startswith("Create") for e in marked)
    assert any(e.event_name.startswith(("Delete", "Revoke")) for e in marked)
    assert parse_lease_agent(marked[0].user_agent) == (leased.account_id, outcome.fencing)


def test_what_a_dead_holder_left_is_destroyed_by_the_next_one(runner_cloud, accounts,
                                                              redis_server):
    """A job killed mid-episode leaves its resources and its write-ahead record; the account
    is leased before the others, and that episode destroys them before provisioning."""
    prefix = "test:runner:orphans"
    pool = AccountPool.from_config(PoolConfig(redis_url=redis_server.url, key_prefix=prefix))
    runner = EpisodeRunner(accounts, runner_cloud.endpoint,
                           RewardService([TASK], accounts, runner_cloud.endpoint).score)
    victim = accounts[3]
    vpc = runner.provisioner(victim).client.rpc("Vpc", "CreateVpc", {
        "RegionId": "cn-hangzhou", "CidrBlock": "10.9.0.0/16",
        "Tag.1.Key": EPISODE_TAG, "Tag.1.Value": "orphan01"})["VpcId"]
    pool.episode_begun(victim.account_id, "orphan01")
    try:
        _, outcome = run(runner_cloud, accounts, redis_server.url, prefix, run_oracle)
        assert outcome.env_error is None
        assert outcome.account_id == victim.account_id          # leased first
        assert runner.provisioner(victim).leftovers("orphan01") == [], vpc
        assert pool.unfinished_episodes(victim.account_id) == []
    finally:
        runner.provisioner(victim).destroy("orphan01")
        pool.episode_cleaned(victim.account_id, "orphan01")
        pool.close()


def test_a_sweep_clears_what_dead_holders_left_without_running_an_episode(
        runner_cloud, accounts, redis_server):
    """The job's last step (and a resumed job with nothing left to train): leases the
    accounts a dead holder left resources in and destroys them."""
    prefix = "test:runner:sweep"
    pool = AccountPool.from_config(PoolConfig(redis_url=redis_server.url, key_prefix=prefix))
    runner = EpisodeRunner(accounts, runner_cloud.endpoint,
                           RewardService([TASK], accounts, runner_cloud.endpoint).score)
    victim = accounts[4]
    runner.provisioner(victim).client.rpc("Vpc", "CreateVpc", {
        "RegionId": "cn-hangzhou", "CidrBlock": "10.8.0.0/16",
        "Tag.1.Key": EPISODE_TAG, "Tag.1.Value": "orphan02"})
    pool.episode_begun(victim.account_id, "orphan02")

    async def go():
        env = LeasedEnvWorker(WorkerConfig(console_url=runner_cloud.url),
                            PoolConfig(redis_url=redis_server.url, key_prefix=prefix), "sweeper")
        try:
            return await runner.sweep_orphans(env), await runner.clear_orphans(env)
        finally:
            await env.drain()
    try:
        first, second = run_async(go())
        assert (first.account_id, first.episodes, first.resources) == (
            victim.account_id, ("orphan02",), 1)
        assert second == 0
        assert runner.provisioner(victim).leftovers("orphan02") == []
        assert pool.unfinished_episodes(victim.account_id) == []
        assert not list(redis_server.client().scan_iter(f"{prefix}:lease:*"))
    finally:
        runner.provisioner(victim).destroy("orphan02")
        pool.episode_cleaned(victim.account_id, "orphan02")
        pool.close()


def test_the_lease_is_told_before_anything_is_provisioned(runner_cloud, accounts,
                                                          redis_server):
    """``on_lease`` hears the episode's lease (what a scheduler records to sweep the episode
    if it dies) while the account has nothing of the episode yet; when it fails, nothing is
    provisioned and the account is released."""
    prefix = "test:runner:onlease"
    runner = EpisodeRunner(accounts, runner_cloud.endpoint,
                           RewardService([TASK], accounts, runner_cloud.endpoint).score)
    pool = PoolConfig(redis_url=redis_server.url, key_prefix=prefix)
    heard = []

    async def on_lease(lease):
        account = runner.accounts[lease.account_id]
        heard.append((lease, runner.provisioner(account).leftovers(lease.episode_id)))

    async def refuse(lease):
        heard.append((lease, None))
        raise ConnectionError("the store is away")

    async def go(hook):
        env = LeasedEnvWorker(WorkerConfig(console_url=runner_cloud.url), pool, "leased")
        try:
            return await runner.run(env, TASK, scripted_policy(run_oracle), max_steps=40,
                                    on_lease=hook)
        finally:
            await env.drain()
    outcome = run_async(go(on_lease))
    assert outcome.env_error is None and outcome.status == "solved"
    (lease, before), = heard
    assert before == [] and lease.episode_id == outcome.episode_id
    assert (lease.account_id, lease.fencing, lease.worker) == (outcome.account_id,
                                                               outcome.fencing, "leased")
    heard.clear()
    refused = run_async(go(refuse))
    assert refused.env_error.kind == "internal" and "could not be recorded" in \
        refused.env_error.message
    (lease, _), = heard
    account = runner.accounts[lease.account_id]
    assert runner.provisioner(account).leftovers(lease.episode_id) == []
    assert refused.trajectory is None and refused.provision_s == refused.episode_s == 0
    assert not list(redis_server.client().scan_iter(f"{prefix}:lease:*"))
