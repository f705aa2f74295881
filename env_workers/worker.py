"""``EnvWorker``: one Chromium (the system's, via Playwright) running console episodes.

Episode: a new isolated browser context → sign in with the leased account → the task's start
page → steps (one action text each) → close the context. The browser outlives episodes and is
relaunched when it crashed or grew past ``max_browser_rss_mb``.

The agent's mistakes (unparsable action, unknown bid, a click that times out) come back as
``last_action_error`` in the next observation; infrastructure failures (sign-in refused, the
browser died) come back as an :class:`~consolerl.types.EnvError` value. Nothing the model writes
is executed as code: actions are parsed by :mod:`env_workers.actions` into dataclasses.

Sandbox: the page may only reach the console's own pages (``/console/...`` on the console host
and port). Everything else — other hosts, the OpenAPI and OSS on the same port, ActionTrail —
is aborted and counted; popups are closed, downloads refused, native dialogs dismissed,
permission prompts denied (no permissions are granted), file pickers left empty.

The request filter sits on the browser's own DevTools session (``Fetch`` on the browser
target), not on Playwright's ``route``: Chromium pauses there every request of every page,
frame and worker, and every hop of a redirect, whereas Playwright's route handler sees only
the first request of a redirect chain and lets the browser follow ``Location`` unchecked.
Paths are judged as the most lenient server may read them (:func:`consolerl.paths.server_path`: decoded,
backslashes as slashes, dot segments resolved), so ``/console/%2e%2e/metrics`` is ``/metrics``.
A ``goto`` refused for where it points (another host, a path outside the console, a scheme
such as ``javascript:`` that the action parser refuses) is counted as a blocked ``goto``.

DevTools interception sees HTTP requests only; every other way out (a WebSocket, WebRTC's
UDP, WebTransport's QUIC, a preconnect, DNS) is closed at the network level: Chromium runs
with :class:`~env_workers.egress.EgressGuard` as its fixed proxy for everything but the
console's origin, non-proxied UDP off and hostname resolution limited to the console's host
(see :mod:`env_workers.egress`); what reaches the guard is refused and counted by kind.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit

import psutil
from playwright.async_api import (Browser, BrowserContext, CDPSession, Page, Playwright,
                                  async_playwright)
from playwright.async_api import Error as PlaywrightError
from prometheus_client import CollectorRegistry, Counter, Histogram

from consolerl.chromium import chromium_path
from consolerl.errors import ConfigError
from consolerl.paths import is_console_path
from consolerl.types import EnvError, EpisodeSpec, Observation, StepResult
from consolerl.accounts import Account

from .egress import KINDS as EGRESS_KINDS, EgressGuard
from .actions import (Action, ActionError, Click, Fill, GoBack, Goto, Press, ReportInfeasible,
                      Scroll, Select, Stop, host_allowed, parse_action)
from .observation import render_snapshot

log = logging.getLogger("env_workers.worker")
CHROMIUM_ARGS = ("--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-dev-shm-usage",
                 # Fewer of the browser's own calls home (the egress proxy refuses them; it
                 # counts the rest as kind "browser", outside the episode). No
                 # --disable-features here: a second one would replace Playwright's.
                 "--disable-client-side-phishing-detection", "--disable-domain-reliability",
                 "--no-pings", "--password-store=basic")


@dataclass(frozen=True)
class WorkerConfig:
    """``console_url``: scheme://host:port of the console; "" only inside a root config, whose
    composition root fills in the cloud endpoint's (the local cloud serves its console)."""

    console_url: str = ""
    chromium: str = ""                       # "" = consolerl.chromium.chromium_path()
    action_timeout_s: float = 5.0
    navigation_timeout_s: float = 15.0
    screenshot: bool = False
    screenshot_type: str = "jpeg"            # or "png"
    screenshot_max_bytes: int = 400_000
    viewport: tuple[int, int] = (1280, 800)
    max_browser_rss_mb: float = 1500.0
    scroll_px: int = 600
    settle_s: float = 0.3          # how long a select or key press may take to start navigating
    # The longest an episode (lease to release) should take; operators are alerted when a
    # lease is held past twice it (a stuck worker keeps an account from everyone else).
    episode_limit_s: float = 600.0

    @property
    def console_host(self) -> str:
        return urlsplit(self.console_url).netloc


@dataclass
class _Episode:
    spec: EpisodeSpec
    context: BrowserContext
    page: Page
    started: float
    step: int = 0
    bids: dict[str, str] = field(default_factory=dict)
    blocked: list[str] = field(default_factory=list)
    done: bool = False


class WorkerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.steps = Counter("consolerl_env_worker_steps_total", "Steps taken, by outcome "
                             "(ok, action_error, env_error).", ["outcome"], registry=registry)
        self.step_latency = Histogram(
            "consolerl_env_worker_step_duration_seconds", "Action plus observation time.",
            registry=registry, buckets=(0.025, 0.05, 0.1, 0.15, 0.25, 0.5, 1, 2.5, 5, 10))
        self.blocked = Counter("consolerl_env_worker_blocked_requests_total", "Requests the "
                               "sandbox refused, by kind.", ["kind"], registry=registry)
        self.episodes = Counter("consolerl_env_worker_episodes_total", "Episodes started, by "
                                "outcome of the reset.", ["outcome"], registry=registry)
        self.browser_launches = Counter("consolerl_env_worker_browser_launches_total",
                                        "Chromium launches (first and restarts).",
                                        registry=registry)
        self.browser_restarts = Counter(
            "consolerl_env_worker_browser_restarts_total", "Chromium restarts, by reason: "
            "disconnected (the browser died or crashed), context_failed (a new context could "
            "not be opened), memory (resident size over worker.max_browser_rss_mb).",
            ["reason"], registry=registry)
        for reason in ("disconnected", "context_failed", "memory"):
            self.browser_restarts.labels(reason)
        for kind in ("request", "popup", "file_chooser", "goto", *EGRESS_KINDS):
            self.blocked.labels(kind)


class EnvWorker:
    """Async; also the body of the Ray actor (see :mod:`env_workers.pool`)."""

    def __init__(self, config: WorkerConfig, registry: CollectorRegistry | None = None):
        if not config.console_url:
            raise ConfigError("env worker: field 'console_url' is required (scheme://host:port "
                              "of the console)")
        self.config = config
        self.metrics = WorkerMetrics(registry or CollectorRegistry())
        self._pw: Playwright | None = None
        self._browser: Browser | None = None
        self._episode: _Episode | None = None
        self._restart_reason = ""        # why the next launch is a restart ("" = first launch)
        # The filter's pending answers: the loop holds only weak references to tasks, and a
        # task collected before it answers leaves its request paused for good.
        self._answers: set[asyncio.Task] = set()
        self._egress = EgressGuard(lambda kind, target: self._count(
            self._episode if kind != "browser" else None, kind, target))

    # ---- browser ------------------------------------------------------------------------------
    async def _ensure_browser(self) -> Browser:
        if self._browser is not None and self._browser.is_connected():
            return self._browser
        if self._browser is not None:
            self._restart_reason = "disconnected"
        if self._pw is None:
            self._pw = await async_playwright().start()
        await self._egress.start()
        browser = await self._pw.chromium.launch(
            executable_path=self.config.chromium or chromium_path(),
            args=[*CHROMIUM_ARGS, *self._egress.chromium_args(self.config.console_url)])
        try:
            await self._start_filter(browser)
        except PlaywrightError:
            await browser.close()   # never a browser without the sandbox
            raise
        self._browser = browser
        self.metrics.browser_launches.inc()
        if self._restart_reason:
            self.metrics.browser_restarts.labels(self._restart_reason).inc()
        self._restart_reason = ""
        return self._browser

    def browser_rss_mb(self) -> float:
        """Proportional set size (PSS) of this process's Chromium processes."""
        total = 0
        for child in psutil.Process().children(recursive=True):
            try:
                if "chrom" in child.name().lower():
                    # PSS: shared pages split among the processes that map them.
                    total += child.memory_full_info().pss
            except psutil.Error:
                continue
        return total / 2 ** 20

    async def shutdown(self) -> None:
        await self.close_episode()
        if self._browser is not None:
            await self._browser.close()
            self._browser = None
        if self._pw is not None:
            await self._pw.stop()
            self._pw = None
        await self._egress.close()

    # ---- episodes -------------------------------------------------------------------------------
    async def reset(self, spec: EpisodeSpec, account: Account, lease_mark: str = ""
                    ) -> Observation | EnvError:
        """Start an episode signed in as ``account`` on ``spec.start_path``. ``lease_mark``
        (:func:`consolerl.accounts.lease_agent`) goes into the browser's user agent, which
        the cloud's audit log records for every console call."""
        await self.close_episode()
        if not self._allowed(self.config.console_url + spec.start_path):
            # A task whose start page is outside the sandbox (``/console/../metrics``): the
            # console would quietly send the browser home instead; say so.
            self.metrics.episodes.labels("navigation_failed").inc()
            return EnvError("navigation_failed", f"start path {spec.start_path[:200]!r} is "
                            "not a console page (it must stay under /console/)")
        try:
            browser = await self._ensure_browser()
            agent = f"Mozilla/5.0 (X11; Linux x86_64) HeadlessChrome/{browser.version} " \
                    f"console-rl{' ' + lease_mark if lease_mark else ''}"
            context = await browser.new_context(
                user_agent=agent,
                accept_downloads=False, permissions=[], service_workers="block",
                viewport={"width": self.config.viewport[0], "height": self.config.viewport[1]})
        except PlaywrightError as exc:
            self._browser = None
            self._restart_reason = "context_failed"
            self.metrics.episodes.labels("browser_failed").inc()
            return EnvError("browser_crashed", f"could not open a browser context: {exc}")
        context.set_default_timeout(self.config.action_timeout_s * 1000)
        context.set_default_navigation_timeout(self.config.navigation_timeout_s * 1000)
        page = await context.new_page()
        episode = _Episode(spec, context, page, time.monotonic())
        self._episode = episode
        context.on("page", lambda popup: asyncio.ensure_future(self._popup(episode, popup)))
        page.on("dialog", lambda dialog: asyncio.ensure_future(dialog.dismiss()))
        page.on("filechooser", lambda _chooser: self._count(episode, "file_chooser", "file"))
        try:
            error = await self._sign_in(page, account, spec)
        except PlaywrightError as exc:
            error = EnvError("navigation_failed", f"sign-in page failed: {exc.message[:300]}")
        if error is not None:
            self.metrics.episodes.labels(error.kind).inc()
            await self.close_episode()
            return error
        self.metrics.episodes.labels("ok").inc()
        return await self._observe(episode, "")

    async def _sign_in(self, page: Page, account: Account, spec: EpisodeSpec) -> EnvError | None:
        base = self.config.console_url
        url = f"{base}/console/signin?next={quote(spec.start_path, safe='')}"
        if spec.drift:
            url += f"&drift={quote(spec.drift)}"
        response = await page.goto(url)
        if response is None or response.status != 200:
            return EnvError("navigation_failed", f"sign-in page answered "
                            f"{response.status if response else 'nothing'}")
        await page.get_by_label("Account name").fill(account.login_name)
        await page.get_by_label("Password").fill(account.password)
        async with page.expect_navigation() as navigation:
            await page.get_by_role("button", name="Sign In").click()
        answer = await navigation.value
        if "/console/signin" in page.url:
            if answer is not None and answer.status == 429:
                # Locked by wrong passwords (an agent that signed out and guessed, say). The
                # lock ends by itself: no reason to quarantine the account, as signin_failed is.
                return EnvError("signin_locked", f"the console has locked sign-in for account "
                                f"{account.account_id} ({account.login_name}) for a while")
            return EnvError("signin_failed", f"the console refused sign-in for account "
                            f"{account.account_id} ({account.login_name})")
        return None

    async def close_episode(self) -> None:
        episode, self._episode = self._episode, None
        if episode is not None:
            try:
                await episode.context.close()
            except PlaywrightError:
                pass
            pss_mb = self.browser_rss_mb()
            if pss_mb > self.config.max_browser_rss_mb and self._browser:
                log.info("restarting Chromium: %.0f MB resident", pss_mb)
                await self._browser.close()
                self._browser = None
                self._restart_reason = "memory"

    # ---- sandbox --------------------------------------------------------------------------------
    def _allowed(self, url: str) -> bool:
        """True for the console's pages on its host and port (the path judged as a server may
        read it, see :func:`consolerl.paths.server_path`) and for data:, blob: and about: URLs."""
        try:
            parts = urlsplit(url)
        except ValueError:
            return False
        if parts.scheme in ("data", "blob", "about"):
            return True
        if parts.scheme not in ("http", "https") or parts.netloc != self.config.console_host:
            return False
        return is_console_path(parts.path)

    async def _start_filter(self, browser: Browser) -> None:
        """Pause every request of ``browser`` (all its contexts, pages, frames and workers,
        each hop of a redirect) until :meth:`_answer` lets it through or fails it."""
        session = await browser.new_browser_cdp_session()

        def paused(event: dict[str, Any]) -> None:
            task = asyncio.ensure_future(self._answer(session, event))
            self._answers.add(task)
            task.add_done_callback(self._answers.discard)
        session.on("Fetch.requestPaused", paused)
        await session.send("Fetch.enable", {"patterns": [{"urlPattern": "*"}]})

    async def _answer(self, session: CDPSession, event: dict[str, Any]) -> None:
        url = str(event.get("request", {}).get("url", ""))
        try:
            if self._allowed(url):
                await session.send("Fetch.continueRequest", {"requestId": event["requestId"]})
                return
            hop = " (a redirect hop)" if event.get("redirectedRequestId") else ""
            self._count(self._episode, "request", url[:200] + hop)
            await session.send("Fetch.failRequest", {"requestId": event["requestId"],
                                                     "errorReason": "BlockedByClient"})
        except PlaywrightError:
            pass   # the request went away with its page, its context or the browser

    def _count(self, episode: _Episode | None, kind: str, what: str) -> None:
        """Record a refusal; ``episode`` None: between episodes (the metric only)."""
        if episode is not None:
            episode.blocked.append(f"{kind}: {what[:240]}")
        self.metrics.blocked.labels(kind).inc()

    async def _popup(self, episode: _Episode, popup: Page) -> None:
        if popup is episode.page:
            return
        self._count(episode, "popup", popup.url)
        await popup.close()

    # ---- steps ----------------------------------------------------------------------------------
    async def step(self, action_text: str) -> StepResult:
        started = time.perf_counter()
        episode = self._episode
        if episode is None or episode.done:
            return StepResult(Observation("", "", "", last_action_error="no episode is running"),
                              done=True, env_error=EnvError("internal", "step() without reset()"))
        episode.step += 1
        action = parse_action(action_text)
        error, result = "", None
        if isinstance(action, ActionError):
            error = action.message
            if action.refused_url:   # a goto refused for where it points, as in _run
                self._count(episode, "goto", action.refused_url)
        elif isinstance(action, (Stop, ReportInfeasible)):
            episode.done = True
            result = action
        else:
            try:
                error = await self._execute(episode, action)
            except PlaywrightError as exc:
                if episode.page.is_closed() or not (self._browser and self._browser.is_connected()):
                    episode.done = True
                    self.metrics.steps.labels("env_error").inc()
                    return StepResult(Observation(episode.page.url if not episode.page.is_closed()
                                                  else "", "", "", step=episode.step), done=True,
                                      env_error=EnvError("browser_crashed", exc.message[:300]))
                error = _describe(action, exc)
        elapsed = time.monotonic() - episode.started
        truncated = ""
        if not episode.done and episode.step >= episode.spec.max_steps:
            truncated = "max_steps"
        elif not episode.done and elapsed >= episode.spec.max_seconds:
            truncated = "max_seconds"
        try:
            observation = await self._observe(episode, error)
        except PlaywrightError as exc:
            episode.done = True
            self.metrics.steps.labels("env_error").inc()
            return StepResult(Observation("", "", "", step=episode.step), done=True,
                              env_error=EnvError("browser_crashed", exc.message[:300]))
        done = episode.done or bool(truncated)
        episode.done = done
        self.metrics.steps.labels("action_error" if error else "ok").inc()
        took = time.perf_counter() - started
        self.metrics.step_latency.observe(took)
        return StepResult(
            observation, done=done,
            answer=result.answer if isinstance(result, Stop) else None,
            infeasible=result.reason if isinstance(result, ReportInfeasible) else None,
            truncated=truncated,
            action_text=action.to_text() if not isinstance(action, ActionError) else "",
            elapsed_ms=took * 1000)

    async def _execute(self, episode: _Episode, action: Action) -> str:
        """Run one browser action; returns an error message for the agent, or ""."""
        page = episode.page
        timeout = self.config.action_timeout_s * 1000
        # Playwright waits for navigations a click starts; a select or key press can start one
        # from a script a moment later (a select that submits its form), so watch for it.
        navigating = asyncio.Event()

        def on_request(request) -> None:
            if request.is_navigation_request() and request.frame == page.main_frame:
                navigating.set()
        page.on("request", on_request)
        try:
            error = await self._run(episode, action, timeout)
            if not error and isinstance(action, (Select, Press)):
                try:
                    await asyncio.wait_for(navigating.wait(), self.config.settle_s)
                except TimeoutError:
                    pass
        finally:
            page.remove_listener("request", on_request)
        if not error:
            await self._settle(page)
        return error

    async def _run(self, episode: _Episode, action: Action, timeout: float) -> str:
        page = episode.page
        if isinstance(action, (Click, Fill, Select)):
            ref = episode.bids.get(action.bid)
            if ref is None:
                return (f"no element with bid {action.bid} on this page; use a bid shown in "
                        "the current observation")
            target = page.locator(f"aria-ref={ref}")
            if isinstance(action, Click):
                # Playwright's full actionability wait (two stable animation frames, ~35 ms a
                # click) buys nothing here: bids come from the accessibility tree, which holds
                # no hidden or inert (modal-covered) element. Visibility and enabledness are
                # still checked, cheaply.
                if not await target.is_visible():
                    return (f"{action.to_text()}: element {action.bid} is not visible any more; "
                            "look at the current observation")
                if not await target.is_enabled(timeout=timeout):
                    return f"{action.to_text()}: element {action.bid} is disabled"
                await target.click(force=True, timeout=timeout)
            elif isinstance(action, Fill):
                await target.fill(action.text, timeout=timeout)
            else:
                try:
                    await target.select_option(label=action.option, timeout=timeout)
                except PlaywrightError:
                    await target.select_option(value=action.option, timeout=timeout)
        elif isinstance(action, Press):
            await page.keyboard.press(action.key)
        elif isinstance(action, Scroll):
            await page.mouse.wheel(0, self.config.scroll_px * (1 if action.direction == "down"
                                                              else -1))
        elif isinstance(action, Goto):
            if not host_allowed(action.url, [self.config.console_host]) or \
                    not self._allowed(action.url):
                self._count(episode, "goto", action.url)
                return (f"goto refused: only pages of the console at "
                        f"{self.config.console_url}/console/ may be opened")
            await page.goto(action.url)
        elif isinstance(action, GoBack):
            await page.go_back()
        return ""

    async def _settle(self, page: Page) -> None:
        """Let a navigation the action started finish (a form submit, a link)."""
        try:
            # DOMContentLoaded: the document and its deferred script have run; the console
            # loads nothing later that the accessibility tree depends on.
            await page.wait_for_load_state("domcontentloaded",
                                           timeout=self.config.navigation_timeout_s * 1000)
        except PlaywrightError:
            pass   # the next observation shows whatever state the page reached

    async def _observe(self, episode: _Episode, error: str) -> Observation:
        page = episode.page
        snapshot = await page.aria_snapshot(mode="ai", timeout=self.config.navigation_timeout_s
                                            * 1000)
        rendered = render_snapshot(snapshot, episode.spec.id_seed)
        episode.bids = rendered.bids
        shot, mime = None, ""
        if self.config.screenshot:
            shot, mime = await self._screenshot(page)
        return Observation(url=page.url, title=await page.title(), text=rendered.text,
                           focused=rendered.focused, last_action_error=error, step=episode.step,
                           screenshot=shot, screenshot_mime=mime,
                           blocked_requests=len(episode.blocked))

    async def _screenshot(self, page: Page) -> tuple[bytes | None, str]:
        if self.config.screenshot_type == "png":
            data = await page.screenshot(type="png")
            return (data, "image/png") if len(data) <= self.config.screenshot_max_bytes \
                else (None, "")
        for quality in (70, 45, 25):
            data = await page.screenshot(type="jpeg", quality=quality)
            if len(data) <= self.config.screenshot_max_bytes:
                return data, "image/jpeg"
        return None, ""

    def current_page(self) -> Page | None:
        """The browser page of the running episode (None between episodes), for tools that
        read the console through the worker's own browser and sandbox (the documentation
        crawler): what they do there is not an agent step and is not counted as one."""
        episode = self._episode
        if episode is None or episode.page.is_closed():
            return None
        return episode.page

    def blocked(self) -> list[str]:
        """What the sandbox refused in the current episode."""
        return list(self._episode.blocked) if self._episode else []


def _describe(action: Action, exc: PlaywrightError) -> str:
    first = exc.message.strip().splitlines()[0] if exc.message else type(exc).__name__
    if "Timeout" in first or "timeout" in first:
        return (f"{action.to_text()} timed out: the element was not visible, enabled or "
                "stable in time")
    return f"{action.to_text()} failed: {first[:200]}"
