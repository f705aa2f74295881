"""EnvWorker against the local cloud in real Chromium: episodes through the action space only,
deterministic observations, agent mistakes as data, the sandbox, limits, crashes."""
from __future__ import annotations

import asyncio
import dataclasses
import random
import re
from collections.abc import Iterator

import psutil
import pytest

from consolerl.types import EnvError, EpisodeSpec, Observation
from env_workers.driver import ScriptedDriver, expect_observation
from env_workers.worker import EnvWorker, WorkerConfig
from tests.conftest import CloudServer, _server
from tests.conftest import run_async as run


@pytest.fixture(scope="module")
def env_cloud(tmp_path_factory) -> Iterator[CloudServer]:
    yield from _server(tmp_path_factory, "env-cloud", ["--transition", "0.3",
                                                      "--network-ready", "0.1",
                                                      "--lookup-qps", "0"])


def worker_for(cloud: CloudServer, **kw) -> EnvWorker:
    return EnvWorker(WorkerConfig(console_url=cloud.url, **kw))


def test_a_create_flow_through_the_action_space(env_cloud, accounts, make_client):
    async def flow():
        worker = worker_for(env_cloud)
        try:
            obs = expect_observation(await worker.reset(EpisodeSpec("/console/ram/users"),
                                                        accounts[0]))
            assert obs.url.endswith("/console/ram/users") and "# Users" in obs.text
            d = ScriptedDriver(worker.step, obs)
            await d.click("link", "Create User")
            await d.fill("Logon Name", "agent-made")
            await d.fill("Display Name", "Made by the action space")
            await d.click("button", "Create")
            assert d.observation.url.endswith("/console/ram/users/agent-made")
            await d.click("link", "Add Permissions")
            await d.click("radio", "ReadOnlyAccess")
            await d.click("button", "OK")
            assert "ReadOnlyAccess" in d.observation.text
            result = await d.act('stop("user agent-made created with ReadOnlyAccess")')
            assert result.done and result.answer.startswith("user agent-made")
            assert all(not r.observation.last_action_error for r in d.results)
            assert [r.observation.step for r in d.results] == list(range(1, 9))
        finally:
            await worker.shutdown()
    run(flow())
    client = make_client(0, server=env_cloud)
    assert client.rpc("Ram", "GetUser", {"UserName": "agent-made"})["User"]["DisplayName"] == \
        "Made by the action space"
    policies = client.rpc("Ram", "ListPoliciesForUser", {"UserName": "agent-made"})
    assert [p["PolicyName"] for p in policies["Policies"]["Policy"]] == ["ReadOnlyAccess"]


def test_select_and_rows_through_the_action_space(env_cloud, accounts, make_client):
    client = make_client(1, server=env_cloud)
    client.rpc("Ecs", "CreateSecurityGroup", {"RegionId": "cn-beijing",
                                              "SecurityGroupName": "row-target"})

    async def flow():
        worker = worker_for(env_cloud)
        try:
            d = ScriptedDriver(worker.step, expect_observation(
                await worker.reset(EpisodeSpec("/console/ecs/security-groups"), accounts[1])))
            await d.select("Region", "China (Beijing)")
            assert "row-target" in d.observation.text
            await d.click_in_row("row-target", "Manage Rules")
            await d.click("link", "Add Rule")
            await d.select("Protocol", "Custom UDP")
            await d.fill("Port Range", "53/53")
            await d.fill("Authorization Object", "10.0.0.0/8")
            await d.click("button", "Save")
            assert "Rule added." in d.observation.text
        finally:
            await worker.shutdown()
    run(flow())
    sg = client.rpc("Ecs", "DescribeSecurityGroups", {"RegionId": "cn-beijing"})[
        "SecurityGroups"]["SecurityGroup"][0]
    rules = client.rpc("Ecs", "DescribeSecurityGroupAttribute", {
        "RegionId": "cn-beijing", "SecurityGroupId": sg["SecurityGroupId"]})
    assert [(r["IpProtocol"], r["PortRange"]) for r in rules["Permissions"]["Permission"]] == [
        ("UDP", "53/53")]


def test_the_observation_of_a_fixed_page_is_identical_across_runs(env_cloud, accounts):
    async def observe_twice() -> list[Observation]:
        worker = worker_for(env_cloud)
        try:
            seen = []
            for path in ("/console/ecs/instances/create", "/console/ecs/instances/create"):
                seen.append(expect_observation(await worker.reset(EpisodeSpec(path),
                                                                  accounts[2])))
            return seen
        finally:
            await worker.shutdown()
    first, second = run(observe_twice())
    other_run = run(observe_twice())[0]
    assert first.text == second.text == other_run.text
    assert first.title == other_run.title and first.url == other_run.url
    assert re.search(r'\[\d+\] combobox "Zone"', first.text)


BAD_ACTIONS = [
    "", "   ", "click()", "click(9999)", "click(a b)", 'fill(1, "unterminated)',
    "__import__('os').system('true')", "click(1); import os", "exec('x')", "eval(1)",
    "press(\"Meta+Alt+Control+Shift+Delete+F13\")", 'press("rm -rf")', 'scroll("left")',
    'goto("file:///etc/passwd")', 'goto("javascript:alert(1)")', 'goto("http://evil.example/")',
    'select(1, "no such option")', 'fill(99999, "x")', "click(" + "9" * 200 + ")",
    "\x00\x01\x02", "ｃｌｉｃｋ(１)", "click(1)" * 500, 'fill(1, "' + "x" * 3000 + '")',
    "x" * 200_000,
]


def test_bad_actions_are_errors_and_the_worker_keeps_working(env_cloud, accounts):
    rng = random.Random(7)
    garbage = ["".join(rng.choice("()[]\"',;\\ abcfilk0123\n\t") for _ in range(rng.randint(1, 60)))
               for _ in range(25)]

    async def flow():
        worker = worker_for(env_cloud)
        try:
            obs = expect_observation(await worker.reset(
                EpisodeSpec("/console/ram/users/create", max_steps=200), accounts[3]))
            steps = 0
            for text in BAD_ACTIONS + garbage:
                result = await worker.step(text)
                steps += 1
                assert result.env_error is None and not result.done, text[:80]
                assert result.observation.step == steps
                if text.strip():
                    assert result.observation.last_action_error, text[:80]
            # Still works: a real action right after.
            d = ScriptedDriver(worker.step, obs)
            d.observation = result.observation
            await d.fill("Logon Name", "after-the-fuzz")
            assert not d.results[-1].observation.last_action_error
            return result
        finally:
            await worker.shutdown()
    last = run(flow())
    assert "bid" in last.observation.last_action_error or last.observation.last_action_error


def test_the_sandbox_blocks_and_reports(env_cloud, accounts):
    async def flow():
        worker = worker_for(env_cloud)
        try:
            expect_observation(await worker.reset(EpisodeSpec("/console/ram/users"),
                                                  accounts[4]))
            page = worker._episode.page   # the test plays a hostile page script
            outcomes = await page.evaluate("""async () => {
                const tries = ['http://example.invalid/x', '/?Action=LookupEvents&Version=2020-07-06',
                               '/metrics', 'http://127.0.0.1:1/'];
                const out = [];
                for (const url of tries) {
                    try { await fetch(url); out.push('reached ' + url); }
                    catch (e) { out.push('blocked'); }
                }
                window.open('http://other.example/', '_blank');
                return out; }""")
            assert outcomes == ["blocked"] * 4
            result = await worker.step('goto("' + env_cloud.url + '/?Action=LookupEvents")')
            assert "goto refused" in result.observation.last_action_error
            await asyncio.sleep(0.3)
            result = await worker.step('scroll("down")')
            blocked = worker.blocked()
            assert result.observation.blocked_requests == len(blocked) >= 6
            text = "\n".join(blocked)
            assert "example.invalid" in text and "Action=LookupEvents" in text
            assert "popup" in text and "/metrics" in text
            assert len(worker_pages(worker)) == 1        # the popup was closed
        finally:
            await worker.shutdown()
    run(flow())


def worker_pages(worker: EnvWorker) -> list:
    return worker._episode.context.pages


def test_step_limit_and_sign_in_failure(env_cloud, accounts):
    async def flow():
        worker = worker_for(env_cloud)
        try:
            expect_observation(await worker.reset(EpisodeSpec("/console/", max_steps=2),
                                                  accounts[5]))
            first = await worker.step('scroll("down")')
            second = await worker.step('scroll("up")')
            assert not first.done and second.done and second.truncated == "max_steps"
            after = await worker.step('scroll("up")')
            assert after.env_error is not None and after.done
            wrong = dataclasses.replace(accounts[5], password="not-the-password")
            error = await worker.reset(EpisodeSpec("/console/"), wrong)
            assert isinstance(error, EnvError) and error.kind == "signin_failed"
            assert "not-the-password" not in error.message
        finally:
            await worker.shutdown()
    run(flow())


def test_a_crashed_browser_is_an_env_error_and_is_relaunched(env_cloud, accounts):
    async def flow():
        worker = worker_for(env_cloud, screenshot=True)
        try:
            obs = expect_observation(await worker.reset(EpisodeSpec("/console/"), accounts[6]))
            assert obs.screenshot and obs.screenshot[:3] == b"\xff\xd8\xff"   # JPEG
            assert len(obs.screenshot) <= worker.config.screenshot_max_bytes
            for child in psutil.Process().children(recursive=True):
                if "chrom" in child.name().lower():
                    child.kill()
            await asyncio.sleep(0.5)
            result = await worker.step('scroll("down")')
            assert result.done and result.env_error is not None
            assert result.env_error.kind == "browser_crashed"
            again = expect_observation(await worker.reset(EpisodeSpec("/console/ram/users"),
                                                          accounts[6]))
            assert "# Users" in again.text
            restarts = {reason: worker.metrics.browser_restarts.labels(reason)._value.get()
                        for reason in ("disconnected", "context_failed", "memory")}
            assert sum(restarts.values()) == 1 and restarts["memory"] == 0, restarts
        finally:
            await worker.shutdown()
    run(flow())


def test_wall_clock_limit_and_browser_restart_past_the_memory_limit(env_cloud, accounts):
    async def flow():
        worker = worker_for(env_cloud, max_browser_rss_mb=1)   # every browser is "too big"
        try:
            expect_observation(await worker.reset(EpisodeSpec("/console/", max_seconds=0.2),
                                                  accounts[7]))
            await asyncio.sleep(0.3)
            result = await worker.step('scroll("down")')
            assert result.done and result.truncated == "max_seconds"
            launches = worker.metrics.browser_launches._value.get()
            expect_observation(await worker.reset(EpisodeSpec("/console/"), accounts[7]))
            assert worker.metrics.browser_launches._value.get() == launches + 1
            assert worker.metrics.browser_restarts.labels("memory")._value.get() == 1
        finally:
            await worker.shutdown()
    run(flow())
