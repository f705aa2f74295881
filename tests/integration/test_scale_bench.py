"""``python -m benchmarks.scale`` end to end at a small N: the real orchestrator, lease pool,
Redis stream and staleness control with simulated browsers, policy and cloud (latencies from
a small model written here), one JSON object with the keys it documents."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from benchmarks import scale as bench

LATENCY = {"measured": "test", "reset_s": [0.05, 0.1], "step_s": [0.02, 0.04],
           "generate_s": [0.05, 0.08], "score_s": [0.05], "sdk_call_s": [0.001, 0.002],
           "lookup_s": [0.002], "turns": [2, 3, 4], "lookups": [2, 3], "episode_cpu_s": [0.5]}


@pytest.mark.parametrize("turn_loop", ["worker", "orchestrator"])
def test_the_bench_runs_the_control_plane_and_names_what_saturates(tmp_path, capsys,
                                                                   turn_loop):
    model = tmp_path / "latency.json"
    model.write_text(json.dumps(LATENCY))
    with ThreadPoolExecutor(1) as pool:
        rc = pool.submit(bench.main, ["--json", "--workers", "4", "--warmup", "3",
                                      "--window", "8", "--latency", str(model),
                                      "--train-seconds", "0.2", "--turn-loop",
                                      turn_loop]).result()
    assert rc == 0
    result = json.loads(capsys.readouterr().out)
    for key in ("orchestrator_ms_per_step", "lease_acquire_p99_ms", "throughput_vs_ideal",
                "first_saturated", "episodes_per_s", "steps_per_s", "ideal_episodes_per_s",
                "stream_xadd_per_s", "stream_xreadgroup_per_s", "xadd_max_per_s",
                "actiontrail_qps_total", "actiontrail_qps_per_account_peak",
                "redis_used_memory_mb", "utilization"):
        assert key in result, key
    assert result["workers"] == 4 and result["env_errors"] == 0
    assert result["episodes"] > 0 and result["steps"] >= 2 * result["episodes"] * 0.5
    # Every episode leases an account through Redis and its group goes through the stream.
    assert result["lease_acquires"] > 0 and result["lease_acquire_p99_ms"] > 0
    assert result["lease_probes"] > 0 and result["lease_acquire_in_host_p99_ms"] > 0
    assert result["lease_acquire_shared_cpu_p99_ms"] > 0
    # The process's CPU in the window, by thread: the event loop's share is there.
    assert result["orchestrator_ms_per_step_by_thread"]["event_loop"] > 0
    assert result["trainer_steps"] > 0 and result["stream_xadd_per_s"] > 0
    # Two LookupEvents per episode (the scorer's, the runner's audit read) through the real
    # per-account limiter (2/s, a burst of 1): at most 3 in any one-second bucket.
    assert 0 < result["actiontrail_qps_per_account_peak"] <= 3
    assert 0 < result["throughput_vs_ideal"] <= 1.5
    assert result["first_saturated"] in result["utilization"]
    # Every turn called the simulated policy fleet over Ray, from where the turns ran: the
    # prompts were tokenized there.
    assert result["turn_loop"] == turn_loop
    assert result["policy_calls_per_s"] * result["window_s"] >= 0.8 * result["steps"]
    if turn_loop == "worker":
        assert result["tokenize_ms_per_step"] is None
        assert result["env_workers_ms_per_step"] > 0
    else:
        assert result["tokenize_ms_per_step"] > 0


def test_the_bench_rejects_bad_arguments(tmp_path, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--workers", "0"])
    assert "--workers: each N in 1..5000" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--workers", "ten"])
    assert "integers separated by commas" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--workers", "4", "--latency", str(tmp_path / "none.json")])
    assert "--calibrate measures it" in capsys.readouterr().err
