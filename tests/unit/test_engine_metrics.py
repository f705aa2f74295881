"""The engine's metrics merged into the PolicyServer's: each family exposed once, vLLM's labels
kept and ``server`` added, the child's other collectors left out, and a slow, hung or dead
engine never holding a scrape for longer than the collector's timeout.

The end-to-end cases run the real owner (:class:`VllmEngine`) and the real child module
(:mod:`rollout_service.vllm_server`, its socket protocol and its reader thread) with vLLM
replaced by a stand-in registry: no model is loaded."""
from __future__ import annotations

import concurrent.futures
import os
import sys
import textwrap
import time
from collections import Counter
from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rollout_service.engine_metrics import EngineMetrics
from rollout_service.policy import PolicyServer
from rollout_service.vllm_engine import EngineError, VllmEngine
from tests.conftest import run_async, wait_for

VLLM_TEXT = textwrap.dedent('''\
    # HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
    # TYPE vllm:num_preemptions_total counter
    vllm:num_preemptions_total{engine="0",model_name="/m"} 3.0
    # HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
    # TYPE vllm:kv_cache_usage_perc gauge
    vllm:kv_cache_usage_perc{engine="0",model_name="/m"} 0.25
    # HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
    # TYPE vllm:time_to_first_token_seconds histogram
    vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="/m"} 1.0
    vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="/m"} 2.0
    vllm:time_to_first_token_seconds_count{engine="0",model_name="/m"} 2.0
    vllm:time_to_first_token_seconds_sum{engine="0",model_name="/m"} 0.6
    # HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.
    # TYPE process_cpu_seconds_total counter
    process_cpu_seconds_total 12.0
    ''')


class Engine:
    """A model stand-in whose metrics come from ``request``."""

    def __init__(self, request):
        self.version, self.busy_s = 0, 0.0
        self.request_metrics = request


def _done(text: str) -> concurrent.futures.Future:
    future: concurrent.futures.Future = concurrent.futures.Future()
    future.set_result(text)
    return future


def _families(text: str) -> dict[str, list]:
    """Family name -> samples; fails on a family declared twice."""
    types = Counter(line.split()[2] for line in text.splitlines()
                    if line.startswith("# TYPE "))
    assert not [n for n, c in types.items() if c > 1], types
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def test_the_engines_families_are_served_once_with_the_server_label():
    server = PolicyServer(engine=Engine(lambda: _done(VLLM_TEXT)), name="policy-3")
    text = run_async(server.metrics()).decode()
    families = _families(text)
    assert "consolerl_policy_weight_version" in families          # the replica's own
    assert "process_cpu_seconds" not in families                  # the child's process: not
    kv = families["vllm:kv_cache_usage_perc"]
    assert [(s.labels, s.value) for s in kv] == [
        ({"engine": "0", "model_name": "/m", "server": "policy-3"}, 0.25)]
    assert {s.labels["server"] for s in families["vllm:time_to_first_token_seconds"]} == \
        {"policy-3"}
    assert families["vllm:num_preemptions"][0].name == "vllm:num_preemptions_total"
    # The replica's own label spelling: the policy metrics carry ``server`` too.
    assert families["consolerl_policy_weight_version"][0].labels == {"server": "policy-3"}


def test_a_transformers_style_engine_without_metrics_serves_only_the_replicas():
    engine = SimpleNamespace(version=0, busy_s=0.0)
    text = run_async(PolicyServer(engine=engine, name="policy-0").metrics()).decode()
    assert "vllm:" not in text and "consolerl_policy_weight_version" in text


def test_a_slow_engine_serves_its_last_answer_and_one_request_at_a_time():
    pending: list[concurrent.futures.Future] = []
    calls = []

    def request():
        calls.append(1)
        if not calls[1:]:
            return _done(VLLM_TEXT)
        future: concurrent.futures.Future = concurrent.futures.Future()
        pending.append(future)
        return future

    collector = EngineMetrics("policy-1", request, timeout_s=0.2, max_age_s=1.5)
    assert [f.name for f in collector.families()][:1] == ["vllm:num_preemptions"]
    for _ in range(3):                              # the engine stops answering
        t0 = time.perf_counter()
        names = [f.name for f in collector.families()]
        assert time.perf_counter() - t0 < 1.0
        assert "vllm:kv_cache_usage_perc" in names   # the last answer
    assert len(calls) == 2 and len(pending) == 1    # one request in flight, not one a scrape
    time.sleep(1.5)
    assert collector.families() == []               # too old to pass for current
    # The late answer arrives: served (it is the newest there is) while a fresh one is asked.
    pending[0].set_result(VLLM_TEXT.replace("0.25", "0.5"))
    kv = next(f for f in collector.families() if f.name == "vllm:kv_cache_usage_perc")
    assert kv.samples[0].value == 0.5 and len(calls) == 3


def test_a_dead_engine_serves_nothing_and_does_not_raise():
    state = {"dead": False}

    def request():
        if state["dead"]:
            raise EngineError("vLLM engine is not running: closed")
        return _done(VLLM_TEXT)

    server = PolicyServer(engine=Engine(request), name="policy-2")
    assert "vllm:kv_cache_usage_perc" in run_async(server.metrics()).decode()
    state["dead"] = True
    text = run_async(server.metrics()).decode()
    assert "vllm:" not in text and "consolerl_policy_weight_version" in text
    # A request that fails after it was sent (the child died meanwhile): the same.
    failed: concurrent.futures.Future = concurrent.futures.Future()
    failed.set_exception(EngineError("the vLLM process closed its connection"))
    assert EngineMetrics("policy-2", lambda: failed).families() == []


PROMETHEUS_2_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
                       "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1")


@pytest.mark.parametrize("accept", [PROMETHEUS_2_ACCEPT, "text/plain;version=0.0.4", ""])
def test_the_endpoint_keeps_the_colon_in_vllms_names_in_every_format(accept):
    """What Prometheus 2.42 asks for (OpenMetrics, no escaping) gets the names as declared:
    ``vllm:kv_cache_usage_perc``, not ``vllm_kv_cache_usage_perc`` (client_python#1177)."""
    from infra.observability.discovery import metrics_app

    server = PolicyServer(engine=Engine(lambda: _done(VLLM_TEXT)), name="policy-4")
    app = metrics_app([server.registry, server.engine_registry])
    status: list[str] = []
    body = b"".join(app({"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics",
                         "QUERY_STRING": "", "HTTP_ACCEPT": accept},
                        lambda s, headers: status.append(s))).decode()
    assert status == ["200 OK"]
    samples = [line.split("{")[0].split(" ")[0] for line in body.splitlines()
               if line and not line.startswith("#")]
    assert "vllm:kv_cache_usage_perc" in samples and "vllm:num_preemptions_total" in samples
    assert not [n for n in samples if n.startswith("vllm_")], samples
    assert "consolerl_policy_weight_version" in samples
    assert body.rstrip().endswith("# EOF") == accept.startswith("application/openmetrics")


# -- the real owner and child, vLLM replaced -------------------------------------------------------

CHILD = '''
import os, sys, time, types
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector

registry = CollectorRegistry()
labels = ["model_name", "engine"]
Gauge("vllm:kv_cache_usage_perc", "KV-cache usage.", labels,
      registry=registry).labels("/m", "0").set(0.25)
Gauge("vllm:num_requests_running", "Running.", labels,
      registry=registry).labels("/m", "0").set(2)
Counter("vllm:num_preemptions", "Preemptions.", labels,
        registry=registry).labels("/m", "0").inc(1)
Histogram("vllm:time_to_first_token_seconds", "TTFT.", labels,
          registry=registry).labels("/m", "0").observe(0.3)
ProcessCollector(registry=registry)          # what vLLM's process registry also holds


class Slow:
    """Collection blocks while the flag file exists (a child too busy to answer)."""
    def collect(self):
        while os.path.exists(os.environ["FAKE_SLOW_FLAG"]):
            time.sleep(0.05)
        return []


registry.register(Slow())
prometheus = types.ModuleType("vllm.v1.metrics.prometheus")
prometheus.get_prometheus_registry = lambda: registry
vllm = types.ModuleType("vllm")
vllm.__version__ = "stand-in"
for name, module in (("vllm", vllm), ("vllm.v1", types.ModuleType("vllm.v1")),
                     ("vllm.v1.metrics", types.ModuleType("vllm.v1.metrics")),
                     ("vllm.v1.metrics.prometheus", prometheus)):
    sys.modules[name] = module

from rollout_service import vllm_server


async def start(self):
    self.engine = types.SimpleNamespace(shutdown=lambda: None)

vllm_server._Server.start = start
vllm_server.main()
'''


@pytest.fixture
def child_engine(tmp_path, monkeypatch):
    """A VllmEngine whose child is the real server module over a stand-in vLLM."""
    (tmp_path / "child.py").write_text(CHILD)
    python = tmp_path / "python"
    # VllmEngine runs ``python -m rollout_service.vllm_server ARGS``: run the stand-in instead.
    python.write_text(f'#!/bin/sh\nshift 2\nexec {sys.executable} {tmp_path / "child.py"} "$@"\n')
    python.chmod(0o755)
    monkeypatch.setenv("FAKE_SLOW_FLAG", str(tmp_path / "slow"))
    engine = VllmEngine("unused", SimpleNamespace(startup_timeout_s=60), python=str(python))
    try:
        yield engine, tmp_path / "slow"
    finally:
        (tmp_path / "slow").unlink(missing_ok=True)
        engine.close()


def _timed_metrics(server: PolicyServer) -> tuple[dict[str, list], float]:
    t0 = time.perf_counter()
    text = run_async(server.metrics()).decode()
    return _families(text), time.perf_counter() - t0


def test_the_child_answers_over_the_socket_and_a_busy_or_dead_one_never_blocks(child_engine):
    engine, slow = child_engine
    server = PolicyServer(engine=engine, name="policy-5")
    families, _ = _timed_metrics(server)
    assert {"vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_preemptions",
            "vllm:time_to_first_token_seconds", "consolerl_policy_weight_version"} <= \
        set(families)
    assert not [n for n in families if n.startswith(("process_", "python_"))]
    running = families["vllm:num_requests_running"][0]
    assert running.labels == {"engine": "0", "model_name": "/m", "server": "policy-5"}
    assert running.value == 2

    slow.touch()                                    # the child stops answering
    for _ in range(2):
        families, seconds = _timed_metrics(server)
        assert seconds < 2.0, seconds               # the 0.5 s wait, not the child's
        assert "vllm:kv_cache_usage_perc" in families   # the last answer
    assert len(engine._pending) == 1                # one request waits, not one a scrape
    slow.unlink()
    wait_for(lambda: not engine._pending, 10)

    os.killpg(engine._proc.pid, 9)                  # the child dies
    wait_for(lambda: engine._dead, 10)
    families, seconds = _timed_metrics(server)
    assert seconds < 2.0
    assert "consolerl_policy_weight_version" in families
    assert not [n for n in families if n.startswith("vllm:")]
    run_async(server.shutdown())
