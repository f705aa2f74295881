"""The operators' view against a real run: Prometheus (the real binary), the Redis exporter and
discovery around ``python -m cluster.job --config configs/smoke.yaml`` (2 env workers, a
policy replica, the rollout actor, the trainer, the local cloud). After the run, every panel
query of every dashboard and every recording rule parses and returns at least one series over
the run's time range; every component was discovered and scraped.

The smoke run serves its policy with transformers; the panels of vLLM's own metrics are checked
against a vLLM replica of their own (the default model, ``.venv-vllm``) published to a second
Prometheus: its ``vllm:*`` series are scraped through the replica's endpoint and those panels
return data, grouped by the replica's ``server`` label.

Writes the scrape target list and a PNG of one panel's data to test-artifacts/observability/.
"""
from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from infra.local_cloud import free_port
from infra.observability.dashboards import DASHBOARDS, policy_serving, render
from infra.observability.discovery import PublishConfig
from infra.observability.observe import ObserveConfig, Observatory
from tests.conftest import require_vllm, run_async

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "observability"
RUN = "observe-smoke"
SCRAPE_S = 1
RATE_WINDOW = "10s"              # what Grafana's $__rate_interval would be at this scrape rate
VLLM_RUN = "observe-vllm"
ENGINE_ROW = "Engine (vLLM)"     # the Policy serving row of vLLM's own metrics
ENGINE_PANELS = {(policy_serving().title, p.title) for row in policy_serving().rows
                 if row.title == ENGINE_ROW for p in row.panels}

# Panels that legitimately have no data in a smoke run, with the reason. Keep this short.
NO_DATA_IN_SMOKE: dict[tuple[str, str], str] = {
    ("console-rl / Local cloud", "Auth failures"):
        "nothing is refused in a healthy run; a series appears with the first refusal's code",
    ("console-rl / Reward", "Judge calls"):
        "the smoke run configures no judges (reward.judges is off); the series exist from the "
        "first episode of a run that has them",
    ("console-rl / Jobs API", "Storage per team"):
        "the smoke run is a training job: no jobs API runs, so nothing is kept for a team",
    ("console-rl / Local cloud", "Console operations"):
        "the smoke run's tiny random policy never completes a change in the console; a series "
        "appears with the first one (product, action and code are not known before)",
    **{key: "the smoke run's policy backend is transformers (no vLLM engine); "
            "test_engine_panels_return_data_for_a_vllm_replica checks them" for key in
       ENGINE_PANELS},
}

pytestmark = pytest.mark.skipif(
    any(subprocess.run(["which", b], capture_output=True).returncode for b in
        ("prometheus", "prometheus-redis-exporter")),
    reason="prometheus / prometheus-redis-exporter not installed: make setup installs them")


@pytest.fixture(scope="module")
def observed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("observe")
    config = ObserveConfig("redis://127.0.0.1:6391/0", tmp / "observe", free_port(),
                           free_port(), f"{SCRAPE_S}s", "2s",
                           streams="consolerl:smoke:experience*", sd_interval_s=0.5)
    obs = Observatory(config).start()
    try:
        run_dir = tmp / "run"
        started = time.time()
        proc = subprocess.run(
            [sys.executable, "-m", "cluster.job", "--config", "configs/smoke.yaml",
             "--run-dir", str(run_dir), f"observe.run={RUN}"],
            cwd=ROOT, capture_output=True, text=True, timeout=900)
        ended = time.time()
        assert proc.returncode == 0, proc.stderr[-4000:]
        time.sleep(3 * SCRAPE_S + 2)               # the recording rules' last evaluations
        yield obs, started, ended, proc.stderr
    finally:
        obs.stop()


def _range(obs: Observatory, expr: str, started: float, ended: float) -> list[dict]:
    return obs.query(expr, start=started, end=ended + 10, step="2s")


def _concrete(expr: str, run: str = RUN) -> str:
    return (expr.replace("$__rate_interval", RATE_WINDOW).replace("$run", run)
            .replace("$stream", ".*"))


def test_every_component_is_discovered_and_scraped(observed):
    obs, started, ended, stderr = observed
    assert f"run={RUN}" in stderr                          # the job says where metrics go
    # Each target's up series over the run (targets leave discovery when the run ends).
    ups = _range(obs, f'up{{job="consolerl", run="{RUN}"}}', started, ended)
    seen = {(s["metric"]["component"], s["metric"]["name"]) for s in ups
            if any(v == "1" for _, v in s["values"])}
    assert seen == {("env_worker", "env-worker-0"), ("env_worker", "env-worker-1"),
                    ("policy", "policy-0"), ("rollout", "rollout"), ("trainer", "trainer"),
                    ("cloud", "local-cloud")}, seen
    assert all(s["metric"]["node"] and s["metric"]["node_ip"] for s in ups)
    redis_up = _range(obs, "redis_up", started, ended)
    assert any(v == "1" for s in redis_up for _, v in s["values"])
    # The run stopped cleanly: its announcements are gone, so Prometheus drops the targets.
    deadline = time.time() + 30
    while any(t["labels"].get("run") == RUN for t in obs.targets()):
        assert time.time() < deadline, obs.targets()
        time.sleep(1)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    rows = sorted({(s["metric"]["component"], s["metric"]["name"], s["metric"]["instance"],
                    s["metric"]["node"][:12], s["metric"]["node_ip"]) for s in ups})
    (ARTIFACTS / "targets.txt").write_text(
        "component    name           instance               node          node_ip\n" +
        "".join(f"{c:<12} {n:<14} {i:<22} {nd:<13} {ip}\n" for c, n, i, nd, ip in rows) +
        "".join(f"{'redis':<12} {'exporter':<14} {s['metric']['instance']}\n"
                for s in redis_up))


def test_every_panel_query_returns_data(observed):
    obs, started, ended, _ = observed
    empty, checked = [], 0
    for make in DASHBOARDS:
        dashboard = render(make())
        for panel in dashboard["panels"]:
            for target in panel.get("targets", []):
                expr = _concrete(target["expr"])
                series = _range(obs, expr, started, ended)     # raises if it does not parse
                checked += 1
                key = (dashboard["title"], panel["title"])
                if not series and key not in NO_DATA_IN_SMOKE:
                    empty.append(f"{key}: {expr}")
    assert checked > 80
    assert not empty, "panels without data:\n" + "\n".join(empty)


def test_every_recording_rule_returns_data(observed):
    obs, started, ended, _ = observed
    rules = yaml.safe_load((ROOT / "infra/observability/rules/recording.yml").read_text())
    names = [r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r]
    assert names
    empty = [n for n in names if not _range(obs, f'{n}{{run="{RUN}"}}', started, ended)]
    assert not empty, f"recording rules without data: {empty}"
    # The alert rules load and evaluate (none is expected to fire in a healthy smoke run).
    rules = obs.query("ALERTS")
    assert all(a["metric"]["alertstate"] in ("pending", "firing") for a in rules)
    loaded = json.loads(json.dumps(
        __import__("httpx").get(f"{obs.url}/api/v1/rules", timeout=10).json()))
    groups = {g["name"]: g for g in loaded["data"]["groups"]}
    assert {"consolerl-recording", "consolerl-alerts"} <= set(groups)
    assert all(r["health"] == "ok" for g in groups.values() for r in g["rules"]), groups


def test_panel_png(observed):
    """One panel's data drawn from the query API, as an operator would see it."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    obs, started, ended, _ = observed
    panel = next(p for p in render(DASHBOARDS[1]())["panels"] if p["title"] == "Utilisation")
    fig, ax = plt.subplots(figsize=(8, 3.2))
    drawn = 0
    for target in panel["targets"]:
        for s in _range(obs, _concrete(target["expr"]), started, ended):
            label = re.sub(r"\{\{(\w+)\}\}", lambda m: s["metric"].get(m.group(1), ""),
                           target["legendFormat"])
            xs = [float(t) - started for t, _ in s["values"]]
            ax.plot(xs, [float(v) for _, v in s["values"]], label=label)
            drawn += 1
    assert drawn >= 3                                      # the pool and both workers
    ax.set(title=f"Env pool / {panel['title']} (run {RUN})", xlabel="seconds into the run",
           ylabel="share in an episode")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    fig.savefig(ARTIFACTS / "env-utilisation.png", dpi=110)
    assert (ARTIFACTS / "env-utilisation.png").stat().st_size > 5000


@pytest.fixture(scope="module")
def vllm_observed(redis_server, tmp_path_factory):
    """A vLLM PolicyServer (in this process) publishing to a Prometheus of its own, asked for
    two rounds of concurrent generations between scrapes."""
    from rollout_service.agent import SamplingParams
    from rollout_service.models import default_model
    from rollout_service.policy import PolicyConfig, PolicyServer
    require_vllm()
    tmp = tmp_path_factory.mktemp("observe-vllm")
    obs = Observatory(ObserveConfig(redis_server.url, tmp / "observe", free_port(),
                                    free_port(), f"{SCRAPE_S}s", "2s", streams="none",
                                    sd_interval_s=0.5)).start()
    server = None
    try:
        started = time.time()
        config = PolicyConfig(model=str(default_model()), backend="vllm", max_model_len=1024,
                              kv_cache_gib=0.5, enforce_eager=True)
        server = PolicyServer(config, name="policy-vllm", metrics=PublishConfig(
            redis_server.url, run=VLLM_RUN, host="127.0.0.1", renew_s=1.0))

        async def burst(seeds):
            return await asyncio.gather(*(server.generate(list(range(1, 60)),
                                                          SamplingParams(8, 1.0, seed=s))
                                          for s in seeds))
        for seeds in (range(4), range(4, 10)):
            assert all(g.token_ids for g in run_async(burst(seeds)))
            time.sleep(5 * SCRAPE_S)
        yield obs, started, time.time()
    finally:
        if server is not None:
            run_async(server.shutdown())
        obs.stop()


def test_engine_panels_return_data_for_a_vllm_replica(vllm_observed):
    obs, started, ended = vllm_observed
    # Up to the end of the generations (not the shutdown after them, which a scrape may
    # catch): every scrape of the replica was parsed (no family declared twice). A scrape may
    # time out while the engine holds this process's CPU on a loaded 2-core machine; one that
    # failed for any other reason (a parse error fails at once) fails the test.
    selector = f'{{job="consolerl", run="{VLLM_RUN}"}}'
    ups = obs.query(f"up{selector}", start=started, end=ended, step="1s")
    assert [(s["metric"]["component"], s["metric"]["name"]) for s in ups] == \
        [("policy", "policy-vllm")]
    durations = dict(obs.query(f"scrape_duration_seconds{selector}", start=started,
                               end=ended, step="1s")[0]["values"])
    failed = [(t, float(durations.get(t, "nan"))) for t, v in ups[0]["values"] if v != "1"]
    assert ups[0]["values"] and len(failed) <= len(ups[0]["values"]) // 2, ups
    assert all(d >= 0.9 * SCRAPE_S for _, d in failed), failed   # timed out, nothing else
    # Every vllm: series the engine registers came through the replica's endpoint, with the
    # replica's server label beside vLLM's own labels and the target's.
    scraped = _range(obs, f'{{__name__=~"vllm:.+", run="{VLLM_RUN}"}}', started, ended)
    names = {s["metric"]["__name__"] for s in scraped}
    assert {"vllm:kv_cache_usage_perc", "vllm:num_requests_running",
            "vllm:num_requests_waiting", "vllm:num_preemptions_total",
            "vllm:time_to_first_token_seconds_bucket"} <= names, sorted(names)
    assert len(names) > 20, sorted(names)
    assert all(s["metric"]["server"] == "policy-vllm" and "engine" in s["metric"] and
               s["metric"]["component"] == "policy" for s in scraped)
    ttft = _range(obs, f'max(vllm:time_to_first_token_seconds_count{{run="{VLLM_RUN}"}})',
                  started, ended)
    assert float(ttft[0]["values"][-1][1]) == 10                 # both bursts' requests

    dashboard = render(policy_serving())
    checked = 0
    for panel in dashboard["panels"]:
        if (dashboard["title"], panel["title"]) not in ENGINE_PANELS:
            continue
        for target in panel["targets"]:
            expr = _concrete(target["expr"], VLLM_RUN)
            series = _range(obs, expr, started, ended)
            assert series, f"{panel['title']}: no data: {expr}"
            assert {s["metric"].get("server") for s in series} == {"policy-vllm"}, series
            values = [float(v) for s in series for _, v in s["values"]]
            assert any(v == v for v in values), f"{panel['title']}: only NaN: {expr}"
            checked += 1
    assert checked == 6 and len(ENGINE_PANELS) == 4          # 4 panels, 6 queries
