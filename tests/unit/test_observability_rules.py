"""The Prometheus rules in infra/observability/rules: promtool accepts both rule files and
their unit tests (tests.yml) pass; every alert carries a severity, a summary and a
description; the set of alert names is the agreed one (so none is dropped silently); the
rules name only metrics listed in metrics.md or recorded in recording.yml."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from infra.observability.inventory import MARKDOWN, Metric, documented

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "infra" / "observability" / "rules"
RECORDING = RULES / "recording.yml"
ALERTS = RULES / "alerts.yml"
TESTS = RULES / "tests.yml"

ALERT_NAMES = {
    "ConsoleRLEnvPoolSaturated",
    "ConsoleRLLeaseHeldTooLong",
    "ConsoleRLBrowserRestartStorm",
    "ConsoleRLPolicyLagging",
    "ConsoleRLStreamBacklogGrowing",
    "ConsoleRLTrainerStalled",
    "ConsoleRLRewardUndeterminedHigh",
    "ConsoleRLTargetDown",
    "ConsoleRLComponentMissing",
    "ConsoleRLRedisExporterDown",
    "ConsoleRLRedisNearMaxmemory",
}
RECORDED_NAMES = {
    "consolerl:env_utilisation:ratio",
    "consolerl:episodes:rate5m",
    "consolerl:policy_version_lag",
    "consolerl:reward_undetermined:ratio_rate15m",
    "consolerl:trainer_step_seconds:p90_15m",
}
SEVERITIES = {"warning", "critical"}


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool not installed: make setup installs the Debian prometheus package")
    return path


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_promtool(), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def _rules(path: Path) -> list[dict]:
    data = yaml.safe_load(path.read_text())
    return [rule for group in data["groups"] for rule in group["rules"]]


@pytest.mark.parametrize("path", [RECORDING, ALERTS], ids=lambda p: p.name)
def test_promtool_check_rules(path: Path) -> None:
    result = _run("check", "rules", str(path.relative_to(ROOT)))
    assert result.returncode == 0, f"promtool check rules {path.name}:\n" \
                                   f"{result.stdout}{result.stderr}"


def test_promtool_rule_unit_tests() -> None:
    result = _run("test", "rules", str(TESTS.relative_to(ROOT)))
    assert result.returncode == 0, f"promtool test rules tests.yml:\n" \
                                   f"{result.stdout}{result.stderr}"


def test_recording_rule_names() -> None:
    groups = yaml.safe_load(RECORDING.read_text())["groups"]
    assert [g["name"] for g in groups] == ["consolerl-recording"]
    assert {r["record"] for r in _rules(RECORDING)} == RECORDED_NAMES


def test_alerts_are_complete() -> None:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    assert [g["name"] for g in groups] == ["consolerl-alerts"]
    rules = _rules(ALERTS)
    assert all("alert" in r for r in rules), "alerts.yml holds only alerting rules"
    assert {r["alert"] for r in rules} == ALERT_NAMES
    for rule in rules:
        name = rule["alert"]
        assert rule.get("labels", {}).get("severity") in SEVERITIES, \
            f"{name}: labels.severity must be one of {sorted(SEVERITIES)}"
        annotations = rule.get("annotations", {})
        for key in ("summary", "description"):
            assert str(annotations.get(key, "")).strip(), f"{name}: annotations.{key} missing"


def test_every_alert_is_unit_tested() -> None:
    cases = yaml.safe_load(TESTS.read_text())["tests"]
    fires, quiet = set(), set()
    for case in cases:
        for check in case.get("alert_rule_test", []):
            (fires if check.get("exp_alerts") else quiet).add(check["alertname"])
    assert fires == ALERT_NAMES, f"no firing case for {sorted(ALERT_NAMES - fires)}"
    assert quiet == ALERT_NAMES, f"no quiet case for {sorted(ALERT_NAMES - quiet)}"
    tested = {check["expr"] for case in cases for check in case.get("promql_expr_test", [])}
    assert RECORDED_NAMES <= tested, f"recording rules untested: {RECORDED_NAMES - tested}"


_METRIC = re.compile(r"\b(?:consolerl|redis)[_:][a-zA-Z0-9_:]*|\bup\b")


def test_rules_use_only_listed_metrics() -> None:
    listed = {series for name, kind in documented(MARKDOWN).items()
              for series in Metric(name, kind, (), "", "").series()}
    assert listed, f"no metrics read from {MARKDOWN}"
    known = listed | RECORDED_NAMES
    for path in (RECORDING, ALERTS):
        for rule in _rules(path):
            unknown = set(_METRIC.findall(rule["expr"])) - known
            assert not unknown, f"{path.name} {rule.get('alert') or rule.get('record')}: " \
                                f"{sorted(unknown)} not in metrics.md"
