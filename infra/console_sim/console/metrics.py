"""Prometheus metrics of the console web UI (``consolerl_console_sim_*``), in the server's
registry so one ``/metrics`` shows the API and the console."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)


class ConsoleMetrics:
    def __init__(self, registry: CollectorRegistry, sessions) -> None:
        self.pages = Counter(
            "consolerl_console_sim_pages_total", "Console requests answered, by page handler and "
            "HTTP status.", ["page", "status"], registry=registry)
        self.page_latency = Histogram(
            "consolerl_console_sim_page_duration_seconds", "Time to answer a console request.",
            ["page"], registry=registry, buckets=_BUCKETS)
        self.operations = Counter(
            "consolerl_console_sim_operations_total", "Changes made from the console, by product, "
            "action and result code.", ["product", "action", "code"], registry=registry)
        self.operation_latency = Histogram(
            "consolerl_console_sim_operation_duration_seconds", "Time of one console change "
            "through the service layer.", ["product"], registry=registry, buckets=_BUCKETS)
        self.signins = Counter(
            "consolerl_console_sim_signins_total", "Sign-in attempts, by outcome (success, "
            "failed, missing, locked, bad_token).", ["outcome"], registry=registry)
        self.csrf_refusals = Counter(
            "consolerl_console_sim_csrf_refusals_total", "State-changing console requests "
            "refused as possible cross-site forgeries, by the check that refused them: origin "
            "(another Origin), fetch_site (Sec-Fetch-Site not same-origin), signin_token, "
            "session_token.", ["check"], registry=registry)
        self.signin_lockouts = Counter(
            "consolerl_console_sim_signin_lockouts_total", "Sign-in locks started by repeated "
            "wrong passwords, by scope (account or address).", ["scope"], registry=registry)
        self.sessions = Gauge(
            "consolerl_console_sim_sessions", "Console sessions not yet expired.",
            registry=registry)
        self.sessions.set_function(sessions.count_active)
