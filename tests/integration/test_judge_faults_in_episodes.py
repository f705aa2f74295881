"""Faulty judges inside real episodes (the local cloud, Redis, Chromium, the episode runner):
a judge endpoint that is down, slow, answers garbage or 500s, or has fewer slots than there
are episodes. Every episode is scored within the judges' deadline (plus the rule's own
wait), nothing is lost (each has a reward and was cleaned up), the run goes on to the next,
and a healthy judge decides what the rule and the evidence leave open, but never what they
decide."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from functools import partial

import pytest
from prometheus_client import CollectorRegistry

from consolerl.tasks import TASKS_DIR, load_task
from consolerl.types import Observation, StepResult
from env_workers.accounts import PoolConfig
from env_workers.pool import LeasedEnvWorker
from env_workers.worker import WorkerConfig
from reward_service.actiontrail import TrailConfig
from reward_service.judges import JudgeChannel, JudgeConfig, judge_clients
from reward_service.service import RewardService
from rollout_service.episode import EpisodeRunner, StepFn, scripted_policy
from tests.conftest import _server, run_async
from tests.unit.test_judges_faults import Judge, free_port_url

# A wrong document: the agent reports it at once from the user list, without opening the
# user's page. With no console inventory the evidence channel cannot check that (the agent
# did not follow the procedure to the missing step), so the judges are asked.
WRONGDOC = load_task(TASKS_DIR / "ram" / "ram-create-accesskey-wrongdoc.yaml")
DEADLINE_S = 3.0


async def lazy_report(task, values: Mapping[str, str], step: StepFn,
                      observation: Observation) -> StepResult:
    return await step('report_infeasible("The user page has no Create AccessKey button.")')


async def claim_done(task, values: Mapping[str, str], step: StepFn,
                     observation: Observation) -> StepResult:
    return await step('stop("Done.")')


@pytest.fixture(scope="module")
def judged_cloud(tmp_path_factory):
    yield from _server(tmp_path_factory, "judged-cloud", ["--lookup-qps", "0", "--transition",
                                                          "0.3", "--network-ready", "0.1"])


def _channel(url: str, registry: CollectorRegistry, concurrency: int | None = None
             ) -> JudgeChannel:
    factory = partial(judge_clients, url, "judge", [0.0], api_key_env=None, timeout_s=30.0,
                      max_tokens=64)
    return JudgeChannel(config=JudgeConfig(k=3, deadline_s=DEADLINE_S, retries=2,
                                           retry_backoff_s=0.05, concurrency=concurrency),
                        client_factory=factory, registry=registry)


def _run(cloud, accounts, redis_url: str, prefix: str, channel: JudgeChannel, scripts,
         workers: int = 1):
    """Episodes of WRONGDOC, one per script, on ``workers`` browsers; each score timed."""
    registry = CollectorRegistry()
    service = RewardService([WRONGDOC], accounts, cloud.endpoint,
                            TrailConfig(qps=20, settle_s=10, poll_s=0.25, clock_skew_s=5),
                            judges=channel, registry=registry)
    timings: list[float] = []

    def timed(request, task=None):
        started = time.monotonic()
        try:
            return service.score(request, task)
        finally:
            timings.append(time.monotonic() - started)
    runner = EpisodeRunner(accounts, cloud.endpoint, timed)
    pool = PoolConfig(redis_url=redis_url, key_prefix=prefix)
    queue = list(enumerate(scripts))
    outcomes: list = [None] * len(scripts)

    async def work(n: int) -> None:
        env = LeasedEnvWorker(WorkerConfig(console_url=cloud.url), pool, f"judged-{n}")
        try:
            while queue:
                i, script = queue.pop(0)
                outcomes[i] = await runner.run(env, WRONGDOC, scripted_policy(script),
                                               max_steps=5)
        finally:
            await env.drain()

    async def go():
        await asyncio.gather(*(work(n) for n in range(workers)))
    run_async(go())
    return outcomes, timings, registry


def _all_scored_and_clean(outcomes) -> None:
    for o in outcomes:
        assert o is not None and o.env_error is None, o and o.reasons
        assert o.reward is not None and o.leaked == [], o.reasons


@pytest.mark.parametrize("mode", ["down", "slow", "garbage", "500"])
def test_a_broken_judge_leaves_the_episode_undetermined_in_bounded_time(
        judged_cloud, accounts, redis_server, mode):
    server = None if mode == "down" else Judge("ok" if mode == "slow" else mode,
                                               delay_s=30.0 if mode == "slow" else 0.0)
    try:
        ch = _channel(free_port_url() if server is None else server.url, CollectorRegistry())
        outcomes, timings, _ = _run(judged_cloud, accounts, redis_server.url,
                                    f"test:judged:{mode}", ch, [lazy_report, claim_done])
    finally:
        if server is not None:
            server.close()
    _all_scored_and_clean(outcomes)
    lazy, done = outcomes
    # The judges were asked and could not answer: undetermined, not trained on.
    assert (lazy.reward.verdict, lazy.reward.decided_by) == ("undetermined", "none")
    assert lazy.reward.evidence_verdict.kind == "unchecked"
    assert not lazy.reward.trainable
    assert all(v.verdict == "invalid" for v in lazy.reward.judge_verdict.votes)
    # ... and the next episode went on: claiming done on a wrong doc is decided by the evidence.
    assert (done.reward.verdict, done.reward.decided_by) == ("failure", "evidence")
    # The rule waits for the audit log (its settle time) before the judges start.
    assert timings[0] < 10 + DEADLINE_S + 2, timings


def test_more_episodes_than_judge_slots_are_each_scored_in_time(judged_cloud, accounts,
                                                                 redis_server):
    server = Judge("ok", delay_s=1.0)
    try:
        ch = _channel(server.url, CollectorRegistry(), concurrency=1)
        outcomes, timings, registry = _run(judged_cloud, accounts, redis_server.url,
                                           "test:judged:slots", ch, [lazy_report] * 3,
                                           workers=2)
        assert server.max_in_flight <= 1
    finally:
        server.close()
    _all_scored_and_clean(outcomes)
    assert max(timings) < 10 + DEADLINE_S + 2, timings
    for o in outcomes:
        # A slot found in time: the judges' success decides; none: an overloaded vote.
        votes = [v.verdict for v in o.reward.judge_verdict.votes]
        assert set(votes) <= {"success", "invalid"}
        assert o.reward.verdict in ("success", "undetermined")
        if o.reward.verdict == "success":
            assert o.reward.decided_by == "judges"


def test_a_healthy_judge_decides_only_what_the_other_channels_leave_open(
        judged_cloud, accounts, redis_server):
    server = Judge("ok")            # always answers success, however the episode went
    try:
        ch = _channel(server.url, CollectorRegistry())
        outcomes, _, _ = _run(judged_cloud, accounts, redis_server.url, "test:judged:ok", ch,
                              [lazy_report, claim_done])
    finally:
        server.close()
    _all_scored_and_clean(outcomes)
    lazy, done = outcomes
    assert (lazy.reward.verdict, lazy.reward.decided_by) == ("success", "judges")
    # The judge says success here too; the evidence decided failure, and it stands.
    assert (done.reward.verdict, done.reward.decided_by) == ("failure", "evidence")
