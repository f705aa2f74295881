"""Helpers for console tests in real Chromium: sign in, follow forms and dialogs the way a user
does (by label and role), and read the audit log through the official ActionTrail SDK."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import httpx
from alibabacloud_actiontrail20200706 import models as at
from playwright.sync_api import Locator, Page, expect

from infra.cloud import CloudClient
from consolerl.accounts import Account


@dataclass
class Console:
    page: Page
    base: str
    account: Account

    def goto(self, path: str) -> None:
        self.page.goto(self.base + path)

    def sign_in(self, drift: str = "") -> None:
        self.goto("/console/signin" + (f"?drift={drift}" if drift else ""))
        self.page.get_by_label("Account name").fill(self.account.login_name)
        self.page.get_by_label("Password").fill(self.account.password)
        with self.page.expect_navigation():
            self.page.get_by_role("button", name="Sign In").click()
        expect(self.page.get_by_role("heading", level=1)).to_contain_text("Welcome")

    def click_and_wait(self, target: Locator) -> None:
        """Click something that submits a form; wait for the page it leads to."""
        with self.page.expect_navigation():
            target.click()

    def button(self, name: str, exact: bool = True) -> Locator:
        return self.page.get_by_role("button", name=name, exact=exact)

    def link(self, name: str, exact: bool = True) -> Locator:
        return self.page.get_by_role("link", name=name, exact=exact)

    def field(self, label: str) -> Locator:
        return self.page.get_by_label(label, exact=True)

    def pick(self, label: str, text: str) -> None:
        """Choose the option of a select whose text contains ``text``."""
        select = self.field(label)
        value = select.locator("option", has_text=text).first.get_attribute("value")
        assert value, f"no option with {text!r} in {label}"
        select.select_option(value)

    def switch_region(self, region_id: str) -> None:
        """The top bar's region selector (it submits itself on change)."""
        with self.page.expect_navigation():
            self.page.get_by_label("Region", exact=True).select_option(region_id)

    def row(self, text: str) -> Locator:
        return self.page.get_by_role("row").filter(has_text=text)

    def confirm(self, ok_name: str = "OK", typed: str | None = None) -> None:
        """Finish an open confirmation dialog (typing ``typed`` when it asks for it)."""
        dialog = self.page.get_by_role("dialog")
        expect(dialog).to_be_visible()
        if typed is not None:
            dialog.get_by_label(re.compile("To confirm, type")).fill(typed)
        self.click_and_wait(dialog.get_by_role("button", name=ok_name, exact=True))

    def toast(self) -> str:
        return " ".join(self.page.get_by_role("status").all_inner_texts() +
                        self.page.locator(".toast-error").all_inner_texts())

    def alert(self) -> str:
        return " ".join(self.page.get_by_role("alert").all_inner_texts())


def signin_token(web: httpx.Client) -> str:
    """Open the sign-in form as a browser does: ``web`` keeps its CSRF cookie; returns the
    form's hidden ``_csrf`` token."""
    page = web.get("/console/signin")
    assert page.status_code == 200, page.status_code
    return re.search(r'name="_csrf" value="([^"]+)"', page.text)[1]


def sign_in_http(web: httpx.Client, account: Account, password: str | None = None,
                 **fields: str) -> httpx.Response:
    """Fill in and submit the sign-in form with ``web`` (an httpx client on the cloud's base
    URL): the answer is a 303 to ``next`` with the session cookie set, or the form again."""
    return web.post("/console/signin", data={
        "_csrf": signin_token(web), "login_name": account.login_name,
        "password": account.password if password is None else password, **fields})


def audit_events(client: CloudClient) -> list[dict[str, Any]]:
    """Every audit event of the client's account, oldest first (all pages)."""
    events: list[dict[str, Any]] = []
    token = None
    while True:
        req = at.LookupEventsRequest(max_results="50", next_token=token)
        resp = client.call(client.actiontrail.lookup_events_with_options, req)
        events.extend(resp.events or [])
        token = resp.next_token
        if not token:
            return events[::-1]   # LookupEvents answers newest first


def console_writes(client: CloudClient, account: Account) -> list[tuple[str, str]]:
    """(eventName, errorCode) of the account's console operations, in order; asserts each is
    a write made from the console, audited the way the real console is."""
    found = []
    for e in audit_events(client):
        if e["eventType"] != "ConsoleOperation":
            continue
        assert e["eventRW"] == "Write", f"a console read was audited: {e['eventName']}"
        host = e["userAgent"].split()[0]       # then the browser's user agent, if any
        assert host.endswith(".console.aliyun.com"), e["userAgent"]
        assert e["eventSource"] == host
        assert e["sourceIpAddress"] == "127.0.0.1"
        assert e["userIdentity"]["accountId"] == account.account_id
        found.append((e["eventName"], e["errorCode"]))
    return found
