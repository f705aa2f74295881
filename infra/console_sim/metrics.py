"""Prometheus metrics of the local cloud (``consolerl_cloud_sim_*``)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class SimMetrics:
    """One registry per server so several servers can live in one test process."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "consolerl_cloud_sim_requests_total", "OpenAPI requests answered, by product, action "
            "and result code (Success or the error code).", ["product", "action", "code"],
            registry=self.registry)
        self.latency = Histogram(
            "consolerl_cloud_sim_request_duration_seconds", "Time to answer an OpenAPI request.",
            ["product"], registry=self.registry,
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0))
        self.auth_failures = Counter(
            "consolerl_cloud_sim_auth_failures_total", "Requests refused before reaching an "
            "action, by error code.", ["code"], registry=self.registry)
        self.events = Counter(
            "consolerl_cloud_sim_audit_events_total", "Audit events appended, by service and "
            "event type.", ["service", "event_type"], registry=self.registry)
        self.delivery = Histogram(
            "consolerl_cloud_sim_audit_delivery_seconds", "From an audit event's time to the "
            "first LookupEvents answer that returned it (the delivery delay plus how soon "
            "someone asked).", registry=self.registry,
            buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 600, 1800))
        self.resources = Gauge(
            "consolerl_cloud_sim_resources", "Resources stored, by type (updated on scrape).",
            ["type"], registry=self.registry)
