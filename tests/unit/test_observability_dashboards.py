"""The dashboards, the metrics inventory and the Prometheus configuration, checked like a
linter would: generated files are current, every panel follows the conventions, every metric a
dashboard or rule names is in the inventory, and promtool accepts the configuration."""
from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from infra.observability import dashboards, inventory
from infra.observability.observe import ObserveConfig, render_config

HERE = Path(dashboards.__file__).resolve().parent
RULE_FILES = [HERE / "rules" / "recording.yml", HERE / "rules" / "alerts.yml"]


def _committed() -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted(dashboards.OUT.glob("*.json"))}


def _lint(dashboard: dict, known: set[str]) -> list[str]:
    """What is wrong with a dashboard's JSON (empty: nothing)."""
    problems = []
    title = dashboard.get("title", "?")
    variables = {v["name"]: v for v in dashboard.get("templating", {}).get("list", [])}
    ds = variables.get("datasource")
    if not ds or ds.get("type") != "datasource" or ds.get("query") != "prometheus":
        problems.append(f"{title}: no templated Prometheus datasource variable")
    if "run" not in variables:
        problems.append(f"{title}: no run variable")
    for panel in dashboard.get("panels", []):
        if panel["type"] == "row":
            continue
        where = f"{title} / {panel.get('title')}"
        if panel.get("datasource", {}).get("uid") != "${datasource}":
            problems.append(f"{where}: datasource is not $datasource")
        if not panel.get("fieldConfig", {}).get("defaults", {}).get("unit"):
            problems.append(f"{where}: no unit")
        if len(panel.get("description", "")) < 40:
            problems.append(f"{where}: no description of what a bad value looks like")
        if not panel.get("targets"):
            problems.append(f"{where}: no query")
        for target in panel.get("targets", []):
            expr = target["expr"]
            if target.get("datasource", {}).get("uid") != "${datasource}":
                problems.append(f"{where}: a query's datasource is not $datasource")
            for fn, window in re.findall(
                    r"\b(rate|irate|increase|deriv|delta)\([^\[]*\[([^\]]*)\]", expr):
                if window != "$__rate_interval":
                    problems.append(f"{where}: {fn}(...[{window}]) instead of $__rate_interval")
            for args in re.findall(r"histogram_quantile\(([^,]+),\s*sum by \(([^)]*)\)", expr):
                if "le" not in [a.strip() for a in args[1].split(",")]:
                    problems.append(f"{where}: histogram_quantile not summed by le")
            if "histogram_quantile" in expr and "_bucket" not in expr:
                problems.append(f"{where}: histogram_quantile without _bucket")
            for name, matchers in re.findall(r"\b(consolerl_\w+)(\{[^}]*\})?", expr):
                if 'run=~"$run"' not in matchers:
                    problems.append(f"{where}: {name} not filtered by $run")
            unknown = inventory.metric_names(expr) - known
            if unknown:
                problems.append(f"{where}: metrics not in the inventory: {sorted(unknown)}")
    return problems


def _known() -> set[str]:
    return set(inventory.documented()) | inventory.series_names(inventory.inventory())


def test_generated_dashboards_are_current():
    rendered = dashboards.rendered()
    on_disk = {p.name: p.read_text() for p in dashboards.OUT.glob("*.json")}
    assert set(on_disk) == set(rendered), "python -m infra.observability.dashboards"
    stale = [name for name in rendered if on_disk[name] != rendered[name]]
    assert not stale, f"regenerate (python -m infra.observability.dashboards): {stale}"
    assert len(rendered) == 9


def test_inventory_matches_the_code():
    text = inventory.render(inventory.inventory())
    assert inventory.MARKDOWN.read_text() == text, "python -m infra.observability.inventory"
    documented = inventory.documented()
    # Spot checks that the scan reads names, types and labels from the code.
    assert documented["consolerl_env_worker_steps_total"] == "counter"
    assert documented["consolerl_trainer_phase_seconds"] == "histogram"
    assert documented["consolerl_env_worker_in_episode"] == "gauge"
    scanned = {m.name: m for m in inventory.scan()}
    assert scanned["consolerl_reward_scores_total"].labels == ("verdict", "decided_by")
    assert scanned["consolerl_trainer_last_step_timestamp_seconds"].unit == "unix time"
    assert all(m.help for m in scanned.values()), "every metric needs a help text"


def test_dashboards_follow_the_conventions():
    known = _known()
    problems = [p for d in _committed().values() for p in _lint(d, known)]
    assert not problems, "\n".join(problems)
    titles = {d["title"] for d in _committed().values()}
    assert titles == {"console-rl / Overview", "console-rl / Env pool",
                      "console-rl / Policy serving", "console-rl / Freshness",
                      "console-rl / Experience stream", "console-rl / Reward",
                      "console-rl / Trainer", "console-rl / Local cloud",
                      "console-rl / Jobs API"}


def test_the_linter_catches_what_it_claims_to():
    good = json.loads((dashboards.OUT / "consolerl-overview.json").read_text())
    known = _known()
    assert _lint(good, known) == []
    bad = copy.deepcopy(good)
    panel = next(p for p in bad["panels"] if p["type"] != "row")
    panel["fieldConfig"]["defaults"]["unit"] = ""
    panel["description"] = ""
    panel["datasource"] = {"type": "prometheus", "uid": "prom-1"}
    panel["targets"][0]["expr"] = ('histogram_quantile(0.9, sum by (x) '
                                   '(rate(consolerl_made_up_seconds_bucket[5m])))')
    bad["templating"]["list"] = [v for v in bad["templating"]["list"]
                                 if v["name"] != "datasource"]
    found = "\n".join(_lint(bad, known))
    for expected in ("no templated Prometheus datasource", "no unit", "no description",
                     "datasource is not $datasource", "instead of $__rate_interval",
                     "not summed by le", "not filtered by $run",
                     "not in the inventory: ['consolerl_made_up_seconds_bucket']"):
        assert expected in found, found


def test_rules_name_only_inventory_metrics():
    known = _known()
    records = set()
    exprs = []
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                records.add(rule.get("record", ""))
                exprs.append((rule.get("record") or rule.get("alert"), rule["expr"]))
    unknown = {name: sorted(inventory.metric_names(expr) - known - records)
               for name, expr in exprs}
    assert not {k: v for k, v in unknown.items() if v}, unknown


@pytest.mark.skipif(shutil.which("promtool") is None,
                    reason="promtool not installed: make setup installs the Debian "
                           "prometheus package")
def test_promtool_accepts_the_prometheus_config(tmp_path):
    committed = subprocess.run(["promtool", "check", "config", str(HERE / "prometheus.yml")],
                               capture_output=True, text=True)
    assert committed.returncode == 0, committed.stdout + committed.stderr
    # What make observe runs: absolute paths, its ports and intervals.
    rendered = tmp_path / "prometheus.yml"
    rendered.write_text(yaml.safe_dump(render_config(ObserveConfig(
        "redis://127.0.0.1:6390/0", tmp_path, 19090, 19121, "1s")), sort_keys=False))
    result = subprocess.run(["promtool", "check", "config", str(rendered)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 2 rule files found" in result.stdout + result.stderr
    # Its rule groups are evaluated at its own interval (a local run is minutes long).
    for f in (tmp_path / "rules").glob("*.yml"):
        assert {g["interval"] for g in yaml.safe_load(f.read_text())["groups"]} == {"15s"}


def test_grafana_provisioning_points_at_the_dashboards():
    prov = HERE / "grafana" / "provisioning"
    ds = yaml.safe_load((prov / "datasources" / "prometheus.yaml").read_text())
    assert ds["datasources"][0]["type"] == "prometheus"
    provider = yaml.safe_load((prov / "dashboards" / "consolerl.yaml").read_text())
    assert provider["providers"][0]["type"] == "file"
    assert provider["providers"][0]["options"]["path"].endswith("console-rl")
    # The Kubernetes manifest (Grafana Operator) loads every generated dashboard.
    manifest = list(yaml.safe_load_all((HERE.parents[1] / "cluster" / "deploy" /
                                        "grafana.yaml").read_text()))
    keys = {d["spec"]["configMapRef"]["key"] for d in manifest
            if d["kind"] == "GrafanaDashboard"}
    assert keys == set(dashboards.rendered())
