"""Crawl a console into an :class:`~doccheck.model.Inventory`, through an env
worker's own browser (its sign-in, its sandbox: nothing outside the console is reached).

1. **Samples.** A sample of each resource type (Resource META, :data:`SAMPLES`) is provisioned
   in the leased account through the SDK, so list pages have rows and detail pages and their
   forms can be reached.
2. **Pages.** From the console home, breadth first: every console link on a page (side
   navigation, toolbars, rows, sections, forms' cancel links) is followed; a page pattern is
   visited once, or twice when it names a resource (two resources in different states show
   different enabled actions). Each button whose effect the DOM does not say is clicked on a
   fresh copy of the page, to learn whether it opens a dialog (and what that dialog posts to)
   or a menu. Sign-in, sign-out, static files and other hosts are never opened; pages and time
   are capped.
3. **Actions.** Each POST form is filled with generated valid values and sent, and each POST
   control (a direct one, or a dialog's confirmation) is clicked, creating forms first and
   destructive controls last (a destroyed sample is replaced by a fresh set). The API action
   each caused is read from the cloud's audit log (ActionTrail: the console's events carrying
   the crawl's lease mark in their user agent, by time) and stored as ``Service:Action``, with
   the request parameters it carried (``sends``): a value the console adds on its own is kept,
   one that names the resource, the region, or what the crawl typed or chose becomes ``{}``
   (:func:`normalise_sends`).
4. **Clean-up.** Everything of the samples (by tag and name) and everything the crawl's
   submits created (from the audit log) is destroyed, and the account is checked to hold none
   of it; a leftover fails the crawl.

CLI: ``python -m doccheck.crawl --out docs/inventory/local.json [--drift rename]
[--cloud-url http://host:port]``; without ``--cloud-url`` it starts the embedded local cloud
and uses its first default account. Progress goes to stderr.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import re
import secrets
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

from playwright.async_api import Error as PlaywrightError
from playwright.async_api import Page
from prometheus_client import CollectorRegistry, Counter, Gauge

from consolerl.accounts import Account, lease_agent
from consolerl.audit import AuditEvent
from consolerl.config import AtLeast, Checked
from consolerl.errors import CloudAPIError, ConfigError, ConsoleRLError
from consolerl.resources import parse_resources
from consolerl.types import EnvError, EpisodeSpec
from env_workers.worker import EnvWorker, WorkerConfig
from infra.cloud import CloudClient, CloudConfig, Credentials
from infra.provisioning.sdk import Provisioned, ProvisionResult, SdkProvisioner
from reward_service.actiontrail import TrailClient, TrailConfig
from rollout_service.episode import agent_created, exists

from .crawl_forms import fill_and_send
from .crawl_page import (DIALOG_JS, FACTS_JS, Normaliser, entry_from_facts, id_shaped,
                         merge, target_of, with_actions)
from .inventory import save, version_of
from .model import Control, Inventory, PageEntry, Target, TargetKind, WhereKind

log = logging.getLogger("doccheck.crawl")
# What a send taught: the API action (``Service:Action``, "" when none) and its sends.
_Learnt = tuple[str, tuple[tuple[str, str], ...]]
# A value made afresh for each request: a hex token or a UUID (a ClientToken).
_TOKEN = re.compile(r"[0-9a-fA-F]{16,}|[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}")

# One of each resource type the console manages, in states that show every action: a running
# and a stopped instance, a group with an inbound and an outbound rule, a user with a policy.
SAMPLES: list[dict[str, Any]] = [
    {"id": "vpc", "type": "vpc", "properties": {"name": "{episode}-vpc"}},
    {"id": "vsw", "type": "vswitch", "properties": {
        "vpc": "${vpc}", "zone": "{zone}", "cidr_block": "192.168.100.0/24",
        "name": "{episode}-vsw"}},
    {"id": "sg", "type": "security_group", "properties": {"vpc": "${vpc}",
                                                           "name": "{episode}-sg"}},
    {"id": "rule_in", "type": "security_group_rule", "properties": {"security_group": "${sg}"}},
    {"id": "rule_out", "type": "security_group_rule", "properties": {
        "security_group": "${sg}", "direction": "egress", "port_range": "443/443"}},
    {"id": "running", "type": "instance", "properties": {
        "vswitch": "${vsw}", "security_group": "${sg}", "name": "{episode}-run"}},
    {"id": "stopped", "type": "instance", "properties": {
        "vswitch": "${vsw}", "security_group": "${sg}", "name": "{episode}-stop",
        "status": "Stopped"}},
    {"id": "user", "type": "ram_user", "properties": {"name": "{episode}-user",
                                                      "policies": ["ReadOnlyAccess"]}},
    {"id": "bucket", "type": "oss_bucket", "properties": {"name": "{episode}-bucket"}},
]


class CrawlError(ConsoleRLError, RuntimeError):
    """The crawl could not run (sign-in refused, provisioning failed) or left resources."""


@dataclass(frozen=True)
class CrawlConfig(Checked):
    """``max_pages``/``max_seconds``: caps of the page walk; ``examples``: visits of a page
    pattern that names a resource; ``act``: send forms and POST controls to learn their API
    actions (needs the account's AccessKey); ``trail_qps``: LookupEvents rate (the local
    cloud takes many; the real ActionTrail 2 a second); ``settle_s``: how long to wait for an
    action's audit event; ``zone``: where the sample vSwitch goes."""

    max_pages: Annotated[int, AtLeast(1)] = 500
    max_seconds: Annotated[float, AtLeast(0, open=True)] = 900.0
    examples: Annotated[int, AtLeast(1)] = 2
    act: bool = True
    region: str = "cn-hangzhou"
    zone: str = "cn-hangzhou-h"
    trail_qps: Annotated[float, AtLeast(0, open=True)] = 2.0
    settle_s: float = 5.0
    max_rounds: Annotated[int, AtLeast(1)] = 12


class CrawlMetrics:
    def __init__(self, registry: CollectorRegistry):
        self.pages = Counter("consolerl_docs_crawl_pages_total", "Console pages the crawl "
                             "visited, by drift profile.", ["drift"], registry=registry)
        self.seconds = Gauge("consolerl_docs_crawl_seconds", "Duration of the last crawl, by "
                             "drift profile.", ["drift"], registry=registry)
        self.probes = Counter("consolerl_docs_crawl_probes_total", "Buttons clicked to learn "
                              "what they open.", registry=registry)
        self.actions = Counter("consolerl_docs_crawl_actions_total", "Forms and POST controls "
                               "sent, by outcome (found: the audit log named the API action; "
                               "missed: no event; unreachable: the control was not there).",
                               ["outcome"], registry=registry)
        self.leftovers = Gauge("consolerl_docs_crawl_leftovers", "Resources the last crawl's "
                               "clean-up could not remove (0 when clean).", registry=registry)
        for outcome in ("found", "missed", "unreachable"):
            self.actions.labels(outcome)


@dataclass
class _Item:
    """A thing to send: a form, a direct POST control, or a dialog's opener."""

    kind: str                       # form | direct | opener
    pattern: str
    examples: list[str]
    label: str
    where: str = ""
    target: str = ""
    role: str = "button"
    danger: bool = False
    post: str = ""
    fields: tuple[str, ...] = ()    # a form's field names (the values the crawl chose)


def normalise_sends(params: Mapping[str, Any], *, fields: Iterable[str] = (),
                    specific: Callable[[str], bool] = lambda _v: False,
                    context: Iterable[str] = ()) -> tuple[tuple[str, str], ...]:
    """An audit event's ``requestParameters`` as :attr:`Form.sends`: sorted (name, value);
    the value becomes ``{}`` when it is a value of one of the form's ``fields`` (what the crawl
    typed or chose), ``specific`` says it names a resource (an ID, a name the crawl made), or
    it appears in ``context`` (the row or page the control was on, the region). What is left
    is a value the console sends whatever the user does (``PolicyType=System``)."""
    names = set(fields)
    texts = [t for t in context if t]
    out = []
    for name, value in params.items():
        value = "" if value is None else str(value)
        # whole words only: an "1" inside a random ID must not decide
        word = re.compile(rf"(?<![\w.-]){re.escape(value)}(?![\w.-])") if value else None
        if name in names or specific(value) or (
                word is not None and any(word.search(t) for t in texts)):
            value = "{}"
        out.append((str(name), value))
    return tuple(sorted(out))


@dataclass
class _State:
    rounds: list[ProvisionResult] = field(default_factory=list)
    created: list[Provisioned] = field(default_factory=list)
    attributed: set[str] = field(default_factory=set)
    seed_n: int = 0


class Crawler:
    """One crawl of the console ``worker`` signs in to, as ``account``, with ``drift``."""

    def __init__(self, worker: EnvWorker, account: Account, *, drift: str = "",
                 config: CrawlConfig | None = None,
                 client_factory: Callable[[], CloudClient] | None = None,
                 registry: CollectorRegistry | None = None, console_name: str = "local",
                 progress: Callable[[str], None] | None = None, lease_mark: str = ""):
        self.worker = worker
        self.account = account
        self.drift = drift
        self.config = config or CrawlConfig()
        self.metrics = CrawlMetrics(registry if registry is not None else CollectorRegistry())
        self.console_name = console_name
        self.progress = progress or (lambda _m: None)
        self.mark = lease_mark or lease_agent(account.account_id, time.time_ns() // 1000)
        self.base = secrets.token_hex(3)
        if client_factory is None:
            host = urlsplit(worker.config.console_url).netloc
            client_factory = lambda: CloudClient(   # noqa: E731 - one per thread
                CloudConfig(endpoint=host),
                Credentials(account.access_key_id, account.access_key_secret))
        self.provisioner = SdkProvisioner(client_factory, region=self.config.region,
                                          ready_timeout_s=60.0, poll_s=0.05)
        self.provisioner.user_agent = self.mark
        self.trail = TrailClient(client_factory, TrailConfig(
            qps=self.config.trail_qps, burst=max(1.0, self.config.trail_qps / 2),
            clock_skew_s=5.0), account_id=account.account_id)
        self.norm = Normaliser(urlsplit(worker.config.console_url).netloc,
                               known={account.login_name, account.account_id})
        self.state = _State()
        self._deadline = 0.0
        self._started_wall = 0.0
        self._timeout_ms = worker.config.action_timeout_s * 1000

    # ---- the crawl ------------------------------------------------------------------------------
    async def run(self) -> Inventory:
        started = time.monotonic()
        self._deadline = started + self.config.max_seconds
        self._started_wall = time.time()
        crawled_at = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        try:
            await self._new_round()
            page = await self._sign_in()
            pages, examples = await self._walk(page)
            if self.config.act:
                pages = await self._act(page, pages, examples)
        finally:
            await self.worker.close_episode()
            left = await asyncio.to_thread(self._clean_up)
        took = round(time.monotonic() - started, 1)
        self.metrics.seconds.labels(self.drift).set(took)
        if left:
            raise CrawlError(f"the crawl left {len(left)} resource(s) in account "
                             f"{self.account.account_id}: {', '.join(left[:10])}")
        entries = tuple(sorted(pages.values(), key=lambda p: p.pattern))
        products = tuple(sorted({(p.product, p.menu_path[0]) for p in entries
                                 if p.product and p.menu_path}))
        self.progress(f"crawl done: {len(entries)} page patterns in {took:.1f} s")
        return Inventory(console=self.console_name, drift=self.drift, crawled_at=crawled_at,
                         version=version_of(entries), pages=entries, products=products,
                         crawl_s=took)

    async def _sign_in(self) -> Page:
        spec = EpisodeSpec("/console/", drift=self.drift, max_steps=1_000_000,
                           max_seconds=self.config.max_seconds + 600)
        obs = await self.worker.reset(spec, self.account, self.mark)
        if isinstance(obs, EnvError):
            raise CrawlError(f"sign-in for the crawl failed: {obs.kind}: {obs.message}")
        page = self.worker.current_page()
        if page is None:
            raise CrawlError("the env worker has no page after sign-in")
        return page

    def _time_left(self) -> bool:
        return time.monotonic() < self._deadline

    # ---- samples --------------------------------------------------------------------------------
    async def _new_round(self) -> ProvisionResult:
        n = len(self.state.rounds)
        if n >= self.config.max_rounds:
            raise CrawlError(f"more than {self.config.max_rounds} sample sets needed")
        episode = f"crawl{self.base}r{n}"
        specs = parse_resources(SAMPLES, "crawl samples")
        self.progress(f"provisioning sample set {n} ({episode})")
        result = await asyncio.to_thread(self.provisioner.provision, specs, episode,
                                         {"zone": self.config.zone})
        self.state.rounds.append(result)
        self.norm.known |= {r.cloud_id for r in result.resources} | {
            s.properties["name"].replace("{episode}", episode) for s in specs
            if "name" in s.properties}
        return result

    def _remap(self, example: str) -> str:
        """``example`` (a path of sample set 0) on the current sample set."""
        first, last = self.state.rounds[0], self.state.rounds[-1]
        if first is last:
            return example
        path = example
        for spec_id, old in first.values().items():
            new = last.values().get(spec_id, old)
            path = path.replace(old, new)
        return path.replace(first.episode_id, last.episode_id)

    def _hints(self) -> list[str]:
        last = self.state.rounds[-1]
        return [*last.values().values(), last.episode_id]

    def _seed(self) -> str:
        self.state.seed_n += 1
        return f"crawl{self.base}r0-f{self.state.seed_n}"

    # ---- pages ----------------------------------------------------------------------------------
    async def _facts(self, page: Page, url: str) -> dict[str, Any] | None:
        try:
            response = await page.goto(url)
        except PlaywrightError as exc:
            log.info("crawl: %s failed: %s", url, exc.message[:200])
            return None
        if response is None or response.status >= 400 or not self.norm.on_console(page.url):
            return None
        return await page.evaluate(FACTS_JS)

    async def _walk(self, page: Page) -> tuple[dict[str, PageEntry], dict[str, list[str]]]:
        base = self.worker.config.console_url
        queue: deque[str] = deque([base + "/console/"])
        planned: dict[str, int] = {}
        queued: set[str] = {base + "/console/"}
        visits: dict[str, list[PageEntry]] = {}
        while queue and self._time_left():
            url = queue.popleft()
            if len(visits) >= self.config.max_pages:
                break
            facts = await self._facts(page, url)
            if facts is None:
                continue
            self.norm.seen |= set(facts["words"])
            pattern = self.norm.path(facts["url"])
            if len(visits.get(pattern, [])) >= self._limit(pattern):
                continue
            probed, dialog_controls = await self._probe(page, facts)
            entry = entry_from_facts(self.norm, facts, probed, dialog_controls,
                                     facts["url"])
            visits.setdefault(pattern, []).append(entry)
            self.metrics.pages.labels(self.drift).inc()
            self.progress(f"page {len(visits):3d} {pattern}")
            links = [c["url"] for c in facts["controls"] if c["type"] == "link"]
            links += [i["href"] for i in (facts["nav"] or {}).get("items", [])]
            for link in links:
                link = link.split("#")[0]
                if not link or link in queued or not self.norm.on_console(link):
                    continue
                p = self.norm.path(link)
                if planned.get(p, 0) >= self._limit(p):
                    continue
                planned[p] = planned.get(p, 0) + 1
                queued.add(link)
                queue.append(link)
        pages = {}
        examples = {}
        for pattern, entries in visits.items():
            merged = entries[0]
            for other in entries[1:]:
                merged = merge(merged, other)
            pages[pattern] = merged
            examples[pattern] = [e.example for e in entries]
        return pages, examples

    def _limit(self, pattern: str) -> int:
        return self.config.examples if "{}" in pattern else 1

    async def _probe(self, page: Page, facts: dict[str, Any]
                     ) -> tuple[dict[int, str], list[Control]]:
        """Click each button whose effect the DOM does not say (one per label and place)."""
        url = facts["url"]
        probed: dict[int, str] = {}
        dialog_controls: list[Control] = []
        tried: set[tuple[str, str, str]] = set()
        dirty = False
        for c in facts["controls"]:
            key = (c["role"], c["label"], c["where"])
            if target_of(self.norm, c) or c["disabled"] or key in tried or c["type"] == "link" \
                    or c["role"] == "tab" or c["where"] == "form" \
                    or c["where"].startswith("dialog:") or (c["type"] == "submit" and c["url"]):
                continue
            tried.add(key)
            if dirty and await self._facts(page, url) is None:
                break
            dirty = True
            self.metrics.probes.inc()
            try:
                if c["toggle"]:
                    await page.locator(f'[data-crawl="{c["toggle"]}"]').click(
                        timeout=self._timeout_ms)
                await page.locator(f'[data-crawl="{c["n"]}"]').click(timeout=self._timeout_ms)
                await page.wait_for_load_state("domcontentloaded")
            except PlaywrightError as exc:
                log.info("crawl: clicking %r on %s failed: %s", c["label"], url,
                         exc.message[:200])
                continue
            if page.url.split("#")[0] != url.split("#")[0]:
                if self.norm.on_console(page.url):
                    probed[c["n"]] = f"page:{self.norm.path(page.url)}"
                continue
            if await page.evaluate(DIALOG_JS) is not None:
                opened = await page.evaluate(FACTS_JS)
                title = opened["dialogs"][0] if opened["dialogs"] else c["label"]
                extra = [s for s in url.split("/") if s and self.norm.resource(s)]
                where = "dialog:" + self.norm.text(title, extra)
                probed[c["n"]] = where
                for d in opened["controls"]:
                    if d["where"].startswith("dialog:"):
                        dialog_controls.append(Control(
                            d["role"], self.norm.text(d["label"], extra),
                            target_of(self.norm, d), where=where, danger=bool(d["danger"])))
            elif c["expands"] and await page.locator(f'[data-crawl="{c["n"]}"]').get_attribute(
                    "aria-expanded") == "true":
                probed[c["n"]] = "dialog:" + c["label"]
        return probed, dialog_controls

    # ---- actions --------------------------------------------------------------------------------
    def _items(self, pages: Mapping[str, PageEntry], examples: Mapping[str, list[str]]
               ) -> list[_Item]:
        items: list[_Item] = []
        for p in pages.values():
            ex = examples[p.pattern]
            for f in p.forms:
                if f.post:
                    items.append(_Item("form", p.pattern, ex, f.title, post=f.post,
                                       fields=tuple(x.name for x in f.fields)))
            dialogs = {c.where.name for c in p.controls if c.where.kind is WhereKind.DIALOG
                       and c.target.kind is TargetKind.POST}
            for c in p.controls:
                if c.where.kind in (WhereKind.FORM, WhereKind.NAV, WhereKind.DIALOG):
                    continue
                if c.target.kind is TargetKind.POST:
                    items.append(_Item("direct", p.pattern, ex, c.label, c.where, c.target,
                                       c.role, c.danger))
                elif c.target.kind is TargetKind.DIALOG and c.target.name in dialogs:
                    items.append(_Item("opener", p.pattern, ex, c.label, c.where, c.target,
                                       c.role, c.danger))
        # creating forms first, then forms of a resource, then actions, destructive ones last
        return sorted(items, key=lambda i: (i.danger, i.kind != "form", "{}" in i.pattern,
                                            i.pattern, i.label))

    async def _act(self, page: Page, pages: dict[str, PageEntry],
                   examples: dict[str, list[str]]) -> dict[str, PageEntry]:
        by_control: dict[str, dict[tuple[str, str, str], _Learnt]] = {}
        by_post: dict[str, _Learnt] = {}
        pending = self._items(pages, examples)
        for attempt in range(4):
            later: list[_Item] = []
            fresh = False           # a new sample set this pass (for a non-destructive item)
            for item in pending:
                if not self._time_left():
                    break
                found = await self._send(page, item)
                if found is None and ((item.danger and attempt == 0) or
                                      (attempt > 0 and not fresh)):
                    # the samples it needs were used up (deleted, or moved to another state)
                    await self._new_round()
                    fresh = True
                    found = await self._send(page, item)
                if found is None:
                    later.append(item)
                    continue
                learnt, post, dialog_ok = found
                action = learnt[0]
                self.progress(f"action {action or '?':32s} {item.kind} {item.label!r} on "
                              f"{item.pattern}")
                self.metrics.actions.labels("found" if action else "missed").inc()
                if not action:
                    continue
                controls = by_control.setdefault(item.pattern, {})
                if item.kind == "form":
                    by_post[item.post] = learnt
                else:
                    controls[(item.label, item.where, item.target)] = learnt
                if post:
                    by_post.setdefault(post, learnt)
                if dialog_ok:
                    controls[dialog_ok] = learnt
            pending = later
            if not pending:
                break
            await asyncio.sleep(1.0)        # let transitions (Stopping, Starting) finish
        for item in pending:
            self.metrics.actions.labels("unreachable").inc()
            self.progress(f"action unreachable: {item.kind} {item.label!r} on {item.pattern}")
        out = {}
        for pattern, entry in pages.items():
            entry = with_actions(entry, by_control.get(pattern, {}), by_post)
            # a control posting where a known action goes causes that action
            entry = with_actions(entry, {(c.label, c.where, c.target): by_post[c.target.name]
                                         for c in entry.controls if not c.action
                                         and c.target.kind is TargetKind.POST
                                         and c.target.name in by_post}, {})
            out[pattern] = entry
        return out

    async def _send(self, page: Page, item: _Item
                    ) -> tuple[_Learnt, str, tuple[str, str, str] | None] | None:
        """Send ``item`` on one of its pages: ((action, sends), post pattern, the dialog's
        confirming control) or None when it could not be reached (no page, no enabled
        control)."""
        for example in item.examples:
            url = self.worker.config.console_url + self._remap(example)
            facts = await self._facts(page, url)
            if facts is None:
                continue
            since = time.time()
            if item.kind == "form":
                index = next((f["i"] for f in facts["forms"]
                              if f["url"] and self.norm.path(f["url"]) == item.post), None)
                if index is None:
                    continue
                try:
                    sent = await fill_and_send(page, index, self._seed(), self._timeout_ms)
                except PlaywrightError as exc:
                    log.info("crawl: form on %s: %s", url, exc.message[:200])
                    sent = False
                if not sent:
                    continue
                return await self._action_after(since, item.fields, (url,)), item.post, None
            control = self._find(facts, item)
            if control is None:
                continue
            try:
                if control["toggle"]:
                    await page.locator(f'[data-crawl="{control["toggle"]}"]').click(
                        timeout=self._timeout_ms)
                locator = page.locator(f'[data-crawl="{control["n"]}"]')
                if item.kind == "direct":
                    async with page.expect_navigation(timeout=self._timeout_ms * 3):
                        await locator.click(timeout=self._timeout_ms)
                    return await self._action_after(since, (), (url, control["row"])), \
                        Target(item.target).name, None
                await locator.click(timeout=self._timeout_ms)
                dialog = await page.evaluate(DIALOG_JS)
                opened = await page.evaluate(FACTS_JS)
                ok = next((d for d in opened["controls"] if d["where"].startswith("dialog:")
                           and d["method"] == "post"), None)
                if dialog is None or ok is None:
                    continue
                post = self.norm.path(dialog["url"]) if dialog["url"] else ""
                since = time.time()
                async with page.expect_navigation(timeout=self._timeout_ms * 3):
                    await page.locator(f'[data-crawl="{ok["n"]}"]').click(
                        timeout=self._timeout_ms)
            except PlaywrightError as exc:
                log.info("crawl: %r on %s: %s", item.label, url, exc.message[:200])
                continue
            extra = [s for s in urlsplit(url).path.split("/") if s and self.norm.resource(s)]
            key = (self.norm.text(ok["label"], extra), item.target,
                   f"post:{post}" if post else "")
            return await self._action_after(since, (), (url, control["row"])), post, key
        return None

    def _find(self, facts: dict[str, Any], item: _Item) -> dict[str, Any] | None:
        extra = [s for s in urlsplit(facts["url"]).path.split("/")
                 if s and self.norm.resource(s)]
        hints = self._hints()
        matches = [c for c in facts["controls"] if c["role"] == item.role and not c["disabled"]
                   and self.norm.text(c["label"], extra) == item.label
                   and self.norm.text(c["where"], extra) == item.where]
        if item.kind == "direct":
            matches = [c for c in matches if target_of(self.norm, c) == item.target]
        ours = [c for c in matches if any(h in c["row"] for h in hints)]
        return (ours or matches or [None])[0]

    async def _action_after(self, since: float, fields: Iterable[str] = (),
                            context: Iterable[str] = ()) -> _Learnt:
        """The API action of the first console event under the crawl's mark since ``since``
        that no earlier send claimed ("" when none came within ``settle_s``), and the request
        parameters it carried (:func:`normalise_sends` with the form's ``fields`` and the
        ``context`` the control was in)."""
        deadline = time.monotonic() + self.config.settle_s
        while True:
            events = await asyncio.to_thread(self._console_events, since - 2)
            new = [e for e in events if e.event_id not in self.state.attributed]
            if new:
                self.state.attributed |= {e.event_id for e in new}
                self.state.created += agent_created(new)
                first = new[0]
                sends = normalise_sends(
                    first.parameters, fields=fields,
                    specific=self._specific, context=(*context, self.config.region))
                return f"{first.service_name}:{first.event_name}", sends
            if time.monotonic() > deadline:
                return "", ()
            await asyncio.sleep(0.25)

    def _specific(self, value: str) -> bool:
        """Does ``value`` name something of this crawl (an ID, a sample's or a submit's
        name) or is it made afresh for each request (a client token)? Words merely seen in
        tables ("System" in a policy list) are not enough: those may be constants."""
        return value in self.norm.known or id_shaped(value) or self.base in value or any(
            r.episode_id in value for r in self.state.rounds) or bool(_TOKEN.fullmatch(value))

    def _console_events(self, since: float) -> list[AuditEvent]:
        return [e for e in self.trail.events(since, time.time() + 1)
                if e.by_console and self.mark in e.user_agent]

    # ---- clean-up ---------------------------------------------------------------------------------
    def _clean_up(self) -> list[str]:
        """Destroy the sample sets and what the crawl's submits created; return what is left."""
        if not self.state.rounds:
            return []
        try:     # what the submits made that an earlier poll did not see
            events = self._console_events(self._started_wall - 2)
            fresh = [e for e in events if e.event_id not in self.state.attributed]
            self.state.created += agent_created(fresh)
        except CloudAPIError as exc:
            log.warning("crawl clean-up: audit log unreadable: %s", exc)
        extra = list(dict.fromkeys(self.state.created))
        self.progress(f"cleaning up {len(self.state.rounds)} sample set(s) and "
                      f"{len(extra)} created resource(s)")
        left: list[str] = []
        for _ in range(2):
            for i, r in enumerate(self.state.rounds):
                report = self.provisioner.destroy(r.episode_id, extra if i == 0 else ())
                if report.errors:
                    log.warning("crawl clean-up of %s: %s", r.episode_id, report.errors)
            left = [x for r in self.state.rounds for x in self.provisioner.leftovers(
                r.episode_id)] + [f"{x.type} {x.cloud_id}" for x in extra
                                  if exists(self.provisioner.client, x)]
            if not left:
                break
        self.metrics.leftovers.set(len(left))
        return left


async def crawl(console_url: str, account: Account, *, drift: str = "",
                config: CrawlConfig | None = None, worker_config: WorkerConfig | None = None,
                client_factory: Callable[[], CloudClient] | None = None,
                registry: CollectorRegistry | None = None, console_name: str = "local",
                progress: Callable[[str], None] | None = None,
                lease_mark: str = "") -> Inventory:
    """Crawl the console at ``console_url`` (scheme://host:port) signed in as ``account`` with
    the drift profile ``drift``, through a new :class:`EnvWorker`; see the module docstring.
    ``client_factory``: SDK clients of the account (default: the cloud API on the console's
    host and port, as the local cloud serves both). ``lease_mark``: the account lease's
    user-agent token (:func:`consolerl.accounts.lease_agent`); one is made up when the
    account was not leased from a pool. The result's ``crawl_s`` is the crawl's duration."""
    worker = EnvWorker(worker_config or WorkerConfig(console_url=console_url))
    try:
        return await Crawler(worker, account, drift=drift, config=config,
                             client_factory=client_factory, registry=registry,
                             console_name=console_name, progress=progress,
                             lease_mark=lease_mark).run()
    finally:
        await worker.shutdown()


# ---- CLI --------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    from env_workers.accounts import local_cloud_accounts
    from infra.local_cloud import LocalCloud

    ap = argparse.ArgumentParser(prog="python -m doccheck.crawl",
                                 description="Crawl the console into a UI inventory file.")
    ap.add_argument("--out", required=True, help="the inventory file to write")
    ap.add_argument("--drift", default="", help="drift profile to sign in with (e.g. rename)")
    ap.add_argument("--cloud-url", default="", help="scheme://host:port of a running cloud "
                    "(default: start the embedded local cloud)")
    ap.add_argument("--account", default="", help="login name of the account to use (default: "
                    "the first of the local cloud's accounts)")
    ap.add_argument("--console-name", default="local")
    ap.add_argument("--max-pages", type=int, default=500)
    ap.add_argument("--max-seconds", type=float, default=900.0)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    accounts = local_cloud_accounts()
    account = next((a for a in accounts if a.login_name == args.account), None) \
        if args.account else accounts[0]
    if account is None:
        print(f"error: no account {args.account!r} in the local cloud's accounts",
              file=sys.stderr)
        return 2
    cloud = None
    url = args.cloud_url.rstrip("/")
    qps = 2.0
    with tempfile.TemporaryDirectory(prefix="crawl-cloud-") as state:
        if not url:
            print("starting the embedded local cloud", file=sys.stderr)
            cloud = LocalCloud(Path(state), ("--transition", "0.3", "--network-ready", "0.1",
                                             "--lookup-qps", "0")).start()
            url, qps = cloud.url, 50.0
        try:
            inv = asyncio.run(crawl(
                url, account, drift=args.drift, console_name=args.console_name,
                config=CrawlConfig(max_pages=args.max_pages, max_seconds=args.max_seconds,
                                   trail_qps=qps),
                progress=lambda m: print(m, file=sys.stderr, flush=True)))
        except (CrawlError, ConfigError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        finally:
            if cloud is not None:
                cloud.stop()
    save(inv, args.out)
    print(f"wrote {args.out}: {len(inv.pages)} pages, version {inv.version}, "
          f"{inv.crawl_s:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
