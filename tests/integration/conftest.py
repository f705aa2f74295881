"""Fixtures of the integration tests: a local cloud of their own, real headless Chromium (the
system's, through Playwright), a signed-in :class:`Console` per test, and a real redis-server
per test module."""
from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, sync_playwright

from consolerl.chromium import chromium_path
from infra.redis_local import RedisServer
from infra.cloud import CloudClient, CloudConfig, Credentials
from tests.conftest import CloudServer, _server
from tests.integration.console_kit import Console


@pytest.fixture(scope="session")
def console_cloud(tmp_path_factory) -> Iterator[CloudServer]:
    """A server only console tests use, so audit-log checks see only their own events."""
    yield from _server(tmp_path_factory, "console-cloud", [
        "--transition", "0.6", "--network-ready", "0.2", "--lookup-qps", "0"])


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_path())
        yield browser
        browser.close()


@pytest.fixture
def console(browser: Browser, console_cloud: CloudServer, accounts):
    """``console(index, drift="")``: a fresh browser context signed in as that account."""
    contexts = []

    def open_console(index: int, drift: str = "", sign_in: bool = True) -> Console:
        context = browser.new_context(viewport={"width": 1366, "height": 860})
        context.set_default_timeout(15_000)
        contexts.append(context)
        c = Console(context.new_page(), console_cloud.url, accounts[index])
        if sign_in:
            c.sign_in(drift)
        return c
    yield open_console
    for context in contexts:
        context.close()


@pytest.fixture
def api(console_cloud: CloudServer, accounts):
    """``api(index)``: the official SDKs for that account, against the console tests' server."""
    def make(index: int) -> CloudClient:
        account = accounts[index]
        return CloudClient(CloudConfig(endpoint=console_cloud.endpoint),
                           Credentials(account.access_key_id, account.access_key_secret))
    return make


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory) -> Iterator[RedisServer]:
    """A redis-server of the test module's own (AOF on, loopback, a free port)."""
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()
