"""``python -m benchmarks.soak --minutes 10``: teams submitting oracle jobs at a steady rate
beside a training stand-in, Redis capped, retention cycling: nothing fails, nothing leaks,
and memory and latency stay flat (slow: about 15 minutes)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(1800)          # the suite's default is 300 s; this run takes ~15 minutes
def test_ten_minutes_of_teams_and_training_stay_bounded():
    proc = subprocess.run([sys.executable, "-m", "benchmarks.soak", "--json", "--minutes", "10",
                           "--results-ttl-s", "120", "--screenshots-ttl-s", "60"],
                          cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert result["errors"] == 0, result["error_samples"]
    assert result["leases_leaked"] == 0
    assert result["api_gc"]["collections"] >= 10, result["api_gc"]     # one every 30 s
    assert result["resources_leaked"] == 0, result["resources_leaked_samples"]
    assert result["jobs"] >= 20 and result["jobs_completed"] == result["jobs"]
    assert result["episodes"] == result["jobs"]
    redis_mb = result["redis_used_mb"]
    # Retention cycles within the run: Redis ends near where it started, far from its cap.
    assert redis_mb["peak"] < 0.5 * result["redis_maxmemory_mb"]
    assert redis_mb["last"] <= redis_mb["first"] + 8, redis_mb
    for side in ("scheduler", "http"):
        rss = result["rss_mb"][side]
        assert rss["last"] <= rss["first"] * 1.25 + 50, (side, rss)
    p99 = result["api_p99_ms"]
    assert p99["last"] <= 3 * p99["first"] + 100, p99
