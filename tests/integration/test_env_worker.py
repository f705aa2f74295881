"""EnvWorker against the local cloud in real Chromium: episodes through the action space only,
deterministic observations, agent mistakes as data, the sandbox, limits, crashes."""
from __future__ import annotations

import asyncio
import dataclasses
import random
import re
from urllib.parse import urlsplit
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


REDIRECTS_OUT = {"metrics": "/metrics", "openapi": "/?Action=LookupEvents&Version=2020-07-06",
                 "other": "http://example.invalid/x", "dots": "/console/../metrics"}


def _outside(url: str) -> bool:
    parts = urlsplit(url)   # (a blocked page shows chrome-error://chromewebdata/)
    return parts.scheme.startswith("http") and (parts.path in ("/metrics", "/")
                                                or parts.hostname == "example.invalid")


def test_redirect_hops_are_filtered_like_first_requests(env_cloud, accounts):
    """A console page that redirects out (the test plays a buggy console: a route of the
    browser context answers 302) takes neither the page, nor a script's fetch, nor a popup
    out of the sandbox: each hop is refused and counted as a first request is. Redirects
    that stay in the console (the real 307 from /console) still work."""
    async def flow():
        worker = worker_for(env_cloud)
        try:
            expect_observation(await worker.reset(EpisodeSpec("/console/ram/users"),
                                                  accounts[4]))
            page = worker._episode.page
            responses: list[str] = []
            page.context.on("response", lambda response: responses.append(response.url))

            async def buggy_console(route) -> None:
                name = route.request.url.rsplit("/hop-", 1)[1]
                await route.fulfill(status=302, headers={"location": REDIRECTS_OUT[name]})
            await page.context.route("**/console/hop-*", buggy_console)
            for name in REDIRECTS_OUT:
                result = await worker.step(f'goto("{env_cloud.url}/console/hop-{name}")')
                assert "ERR_BLOCKED_BY_CLIENT" in result.observation.last_action_error, name
                assert not _outside(result.observation.url), result.observation.url
            home = await worker.step(f'goto("{env_cloud.url}/console")')
            assert not home.observation.last_action_error
            assert home.observation.url == env_cloud.url + "/console/"
            outcomes = await page.evaluate("""async (names) => {
                const out = [];
                for (const name of names) {
                    try { const r = await fetch('/console/hop-' + name);
                          out.push('reached ' + r.url); }
                    catch (e) { out.push('blocked'); }
                }
                window.open('/console/hop-metrics', '_blank');
                return out; }""", list(REDIRECTS_OUT))
            assert outcomes == ["blocked"] * len(REDIRECTS_OUT)
            await asyncio.sleep(0.5)
            result = await worker.step('scroll("down")')
            assert not [url for url in responses if _outside(url)], responses
            blocked = "\n".join(worker.blocked())
            assert blocked.count("/metrics") >= 4 and "Action=LookupEvents" in blocked
            assert "example.invalid" in blocked and "popup" in blocked
            assert result.observation.blocked_requests == len(worker.blocked())
        finally:
            await worker.shutdown()
    run(flow())


@pytest.mark.parametrize("url,ok", [
    ("/console/", True), ("/console", True), ("/console/ram/users?q=a.b", True),
    ("/console/ecs/../ram/users", True), ("/favicon.ico", True),
    ("/console/../metrics", False), ("/console/%2e%2e/metrics", False),
    ("/console/%2E./metrics", False), ("/console/..%2fmetrics", False),
    ("/console/..%2F..%2F?Action=LookupEvents", False), ("/console\\..\\metrics", False),
    ("/console/%5c..%5cmetrics", False), ("/console/%252e%252e/metrics", False),
    ("/console//../metrics", False), ("/console/ram//users", True),
    ("/console/..", False), ("/metrics", False), ("/", False), ("/consolex", False),
    ("/console/%25252525252e%25252525252e/metrics", False),   # still encoded after 4 rounds
])
def test_the_sandbox_judges_paths_as_a_server_reads_them(url: str, ok: bool):
    worker = EnvWorker(WorkerConfig(console_url="http://127.0.0.1:18080"))
    assert worker._allowed("http://127.0.0.1:18080" + url) is ok
    assert not worker._allowed("http://127.0.0.1:18081" + url)


@pytest.mark.parametrize("start_path", ["/console/../metrics", "/console/%2e%2e/metrics",
                                        "/console/..%2f?Action=LookupEvents", "/metrics"])
def test_a_start_path_outside_the_console_is_an_env_error(env_cloud, accounts, start_path):
    async def flow():
        worker = worker_for(env_cloud)
        try:
            return await worker.reset(EpisodeSpec(start_path), accounts[4])
        finally:
            await worker.shutdown()
    error = run(flow())
    assert isinstance(error, EnvError) and error.kind == "navigation_failed", error
    assert "not a console page" in error.message


def test_a_sign_in_that_redirects_out_is_an_env_error(env_cloud, accounts):
    """The test plays a console whose sign-in sends the browser to /metrics: the hop is
    refused, and the episode does not start on whatever page the browser was left on."""
    async def flow():
        worker = worker_for(env_cloud)
        try:
            browser = await worker._ensure_browser()
            new_context = browser.new_context

            async def buggy_console(route) -> None:
                if route.request.method == "POST":
                    await route.fulfill(status=303, headers={"location": "/metrics"})
                else:
                    await route.continue_()

            async def hostile_context(**kwargs):
                context = await new_context(**kwargs)
                new_page = context.new_page

                async def hostile_page():
                    # A page route: it runs before any route of the context.
                    page = await new_page()
                    await page.route("**/console/signin*", buggy_console)
                    return page
                context.new_page = hostile_page
                return context
            browser.new_context = hostile_context
            blocked_before = worker.metrics.blocked.labels("request")._value.get()
            error = await worker.reset(EpisodeSpec("/console/"), accounts[4])
            return error, worker.metrics.blocked.labels("request")._value.get() - blocked_before
        finally:
            await worker.shutdown()
    error, blocked = run(flow())
    assert isinstance(error, EnvError) and error.kind == "navigation_failed", error
    assert blocked == 1 and "ERR_BLOCKED_BY_CLIENT" in error.message, error.message


def test_gotos_refused_for_their_scheme_or_path_are_counted_as_blocked(env_cloud, accounts):
    async def flow():
        worker = worker_for(env_cloud)
        try:
            expect_observation(await worker.reset(EpisodeSpec("/console/"), accounts[4]))
            gotos = worker.metrics.blocked.labels("goto")
            before = gotos._value.get()
            refused = ["javascript:alert(1)", "file:///etc/passwd", "data:text/html,hi",
                       "http://user@127.0.0.1/", env_cloud.url + "/console/../metrics",
                       env_cloud.url + "/console/..%2fmetrics"]
            for count, url in enumerate(refused, 1):
                result = await worker.step(f'goto("{url}")')
                assert result.observation.last_action_error and not result.done, url
                assert worker.blocked()[-1] == f"goto: {url}"
                assert result.observation.blocked_requests == count
            assert gotos._value.get() == before + len(refused)
            ok = await worker.step(f'goto("{env_cloud.url}/console/ram/users")')
            assert not ok.observation.last_action_error
            assert ok.observation.blocked_requests == len(refused)
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


def test_a_locked_account_is_signin_locked_not_signin_failed(tmp_path_factory, accounts):
    """Wrong passwords (an agent that signed out and guessed) lock the account for a while;
    the worker says so, and the pool does not quarantine the account for it."""
    import httpx

    from tests.integration.console_kit import sign_in_http
    gen = _server(tmp_path_factory, "env-lock", [])
    server = next(gen)
    try:
        with httpx.Client(base_url=server.url) as web:
            codes = [sign_in_http(web, accounts[4], "wrong").status_code for _ in range(5)]
        assert codes[-1] == 429

        async def flow():
            worker = worker_for(server)
            try:
                return await worker.reset(EpisodeSpec("/console/"), accounts[4])
            finally:
                await worker.shutdown()
        error = run(flow())
        assert isinstance(error, EnvError) and error.kind == "signin_locked", error
    finally:
        next(gen, None)


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


def test_current_page_is_the_running_episodes_page(env_cloud, accounts):
    async def flow():
        worker = worker_for(env_cloud)
        try:
            assert worker.current_page() is None
            expect_observation(await worker.reset(EpisodeSpec("/console/ram/users"),
                                                  accounts[2]))
            page = worker.current_page()
            assert page is not None and page.url.endswith("/console/ram/users")
            assert await page.locator("h1").inner_text() == "Users"
            await worker.close_episode()
            assert worker.current_page() is None
        finally:
            await worker.shutdown()
    run(flow())
