"""Reward hacking in a real browser: agents that try to get the reward without doing the task,
through the whole episode path (provision, Chromium on the local cloud's console, the rule
channel, fusion with judges that trust the page, destroy). None gets a reward.

(Events of another account and events from before the episode: test_rule_verifier.py.)"""
from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import quote, urlsplit

import pytest

from consolerl.rewards import JudgeVerdict, JudgeVote
from consolerl.tasks import TASKS_DIR, Task, load_task
from consolerl.types import Observation, StepResult
from env_workers.accounts import PoolConfig
from env_workers.driver import ScriptedDriver, StepFn, find_bid
from env_workers.pool import LeasedEnvWorker
from env_workers.worker import WorkerConfig
from reward_service.fusion import fuse
from reward_service.service import RewardService
from rollout_service.episode import EpisodeRunner, scripted_policy
from tests.conftest import _server, run_async

TASK = load_task(TASKS_DIR / "ram" / "ram-create-user-0.yaml")
# Judges fooled by the page: they would say success to every one of these.
FOOLED = JudgeVerdict("success", (JudgeVote("judge-0", "success", "page says created"),),
                      "unanimous")


def origin(obs: Observation) -> str:
    u = urlsplit(obs.url)
    return f"{u.scheme}://{u.netloc}"


async def fake_success_message(task: Task, values: Mapping[str, str], step: StepFn,
                               obs: Observation) -> StepResult:
    """Type the success message into the page's search box so the page shows it."""
    d = ScriptedDriver(step, obs)
    message = f"User {values['user_name']} created."
    box = find_bid(d.observation.text, "searchbox", "Search") or \
        find_bid(d.observation.text, "textbox", "Search")
    if box is not None:
        await d.act(f'fill({box}, "{message}")')
    await d.act(f'goto("{origin(obs)}/console/ram/users?q={quote(message)}")')
    assert message in d.observation.text or "created" in d.observation.text.lower()
    return await d.act(f'stop("{message}")')


async def call_the_api_from_the_browser(task: Task, values: Mapping[str, str], step: StepFn,
                                        obs: Observation) -> StepResult:
    """Unsigned OpenAPI calls (create the user, read the audit log) from the signed-in
    browser: refused, they create nothing."""
    d = ScriptedDriver(step, obs)
    base = origin(obs)
    await d.act(f'goto("{base}/?Action=CreateUser&UserName={values["user_name"]}'
                f'&Version=2015-05-01")')
    await d.act(f'goto("{base}/?Action=LookupEvents&Version=2020-07-06")')
    assert "eventName" not in d.observation.text
    return await d.act('stop("created the user")')


@pytest.fixture(scope="module")
def hack_cloud(tmp_path_factory):
    yield from _server(tmp_path_factory, "hack-cloud", ["--lookup-qps", "0"])


@pytest.mark.parametrize("policy", [fake_success_message, call_the_api_from_the_browser])
def test_hacks_earn_nothing(hack_cloud, make_client, accounts, redis_server, policy):
    runner = EpisodeRunner(accounts, hack_cloud.endpoint,
                           RewardService([TASK], accounts, hack_cloud.endpoint).score)

    async def go():
        env = LeasedEnvWorker(WorkerConfig(console_url=hack_cloud.url), PoolConfig(
            redis_url=redis_server.url, key_prefix="test:hack"), "hacker")
        try:
            return await runner.run(env, TASK, scripted_policy(policy), max_steps=40)
        finally:
            await env.drain()
    outcome = run_async(go())
    assert outcome.env_error is None, outcome.env_error
    assert outcome.trajectory.answer is not None                 # it claimed success
    rule = outcome.reward.rule_verdict
    assert rule is not None and rule.verdict == "failure", rule
    assert outcome.reward.reward == 0.0 and outcome.status == "failed"
    result = fuse(TASK.expected, rule, FOOLED, None)
    assert result.reward == 0.0 and result.decided_by == "rule"
    assert outcome.leaked == []
    client = make_client([a.account_id for a in accounts].index(outcome.account_id),
                         server=hack_cloud)
    names = [u["UserName"] for u in client.rpc("Ram", "ListUsers", {})["Users"]["User"]]
    assert not any(n.startswith("user0-") for n in names)
