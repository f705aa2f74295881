"""``python -m benchmarks.reward`` end to end with small numbers: a local cloud, seeded
events, console episodes (every second one fails), scores in process, at once and over HTTP,
one JSON object."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from benchmarks import reward as bench


def test_the_bench_prints_its_figures_and_checks_every_verdict(capsys):
    # In a thread of its own: the console tests' sync Playwright keeps an event loop running
    # on the main thread, where the bench's asyncio.run would fail.
    with ThreadPoolExecutor(1) as pool:
        rc = pool.submit(bench.main, ["--json", "--events", "2000", "--episodes", "4",
                                      "--rounds", "2", "--failure-every", "2", "--seeders",
                                      "2", "--clock-skew", "3"]).result()
    assert rc == 0
    result = json.loads(capsys.readouterr().out)
    for key in ("score_p50_ms", "score_p95_ms", "scores_per_s", "http_scores_per_s",
                "http_score_p50_ms", "events_stored", "episodes", "accounts", "lookup_qps",
                "wall_s"):
        assert key in result, key
    assert result["verdicts_ok"] is True
    assert result["verdicts"] == {"success": 2, "failure": 2}
    assert (result["events_stored"], result["episodes"], result["accounts"]) == (2000, 4, 5)
    assert result["lookup_qps"] == 2.0 and result["delivery_delay_s"] == 0.0
    assert result["scores"] == 4 * 2 + 4 * 2 + 4
    assert 0 < result["score_p50_ms"] <= result["score_p95_ms"]
    assert result["scores_per_s"] > 0 and result["http_scores_per_s"] > 0
    assert result["trail_throttled_retries"] == 0


def test_the_bench_rejects_bad_arguments(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--episodes", "0"])
    assert "--episodes must be at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--events", "5", "--episodes", "4"])
    assert "--events must be at least 2 per account" in capsys.readouterr().err
