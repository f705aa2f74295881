"""The sizing arithmetic: what a target episode rate needs of each component, from a latency
model and the scale benchmark's per-step and per-episode costs."""
from __future__ import annotations

import json

import pytest

from benchmarks import sizing
from benchmarks.scale_model import Latency

MODEL = Latency(reset_s=[2.0], step_s=[1.0], generate_s=[1.0], score_s=[4.0],
                sdk_call_s=[0.01], lookup_s=[0.5], turns=[4], lookups=[4],
                episode_cpu_s=[6.0])
SCALE = {"workers": 1000, "orchestrator_ms_per_step": 2.5, "episodes_per_s": 40.0,
         "redis_cpu": 0.2, "redis_commands_per_episode": {"evalsha": 3.0, "xadd": 0.25}}


def test_a_target_rate_becomes_workers_cpus_accounts_and_token_rates():
    row = sizing.size(3600, MODEL, None, generate_s=None, policy_rate=None, trainer_rate=None)
    # 1 episode/s, each 2 + 4 x (1 + 1) + 4 + 4 x 0.5 = 16 s: 16 workers and accounts.
    assert row["episode_s"] == 16.0 and row["env_workers"] == 16 and row["accounts"] == 16
    assert row["browser_cpus"] == 6.0
    assert row["actiontrail_qps_per_account"] == 0.25
    assert row["policy_turns_per_s"] == 4.0
    assert row["policy_prompt_tokens_per_s"] == 4 * sizing.PROMPT_TOKENS
    assert row["policy_gpus"] is None and row["unknown"] == ["policy_gpus", "trainer_gpus"]
    assert row["limits_first"] == "actiontrail_per_account"


def test_gpu_rates_and_the_scale_figures_size_the_rest():
    row = sizing.size(36000, MODEL, SCALE, generate_s=0.5, policy_rate=10_000,
                      trainer_rate=5_000)
    assert row["episode_s"] == 14.0 and row["env_workers"] == 140
    assert row["policy_gpus"] == 3                   # 40 turns/s x 705 tokens / 10,000
    assert row["trainer_gpus"] == 6                  # 40 x 717 / 5,000
    assert row["orchestrator_cores"] == 0.1          # 40 steps/s x 2.5 ms
    assert row["orchestrator_shards"] == 1
    assert row["redis_commands_per_s"] == 33         # 10 episodes/s x 3.25
    assert row["redis_cpu"] == 0.05 and row["unknown"] == []
    assert "env_worker_control_cpus" not in row
    # With the turns on the env workers, their own CPU per step is sized too.
    row = sizing.size(36000, MODEL, {**SCALE, "env_workers_ms_per_step": 5.0},
                      generate_s=0.5, policy_rate=None, trainer_rate=None)
    assert row["env_worker_control_cpus"] == 0.2     # 40 steps/s x 5 ms


def test_the_cli_rejects_bad_targets_and_reads_the_scale_output(tmp_path, capsys):
    with pytest.raises(SystemExit):
        sizing.main(["--episodes-per-hour", "fast"])
    assert "numbers separated by commas" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        sizing.main(["--episodes-per-hour", "0"])
    latency = tmp_path / "lat.json"
    latency.write_text(json.dumps({"measured": "t", **{k: getattr(MODEL, k) for k in (
        "reset_s", "step_s", "generate_s", "score_s", "sdk_call_s", "lookup_s", "turns",
        "lookups", "episode_cpu_s")}}))
    scale = tmp_path / "scale.json"
    scale.write_text(json.dumps({"runs": [{**SCALE, "workers": 10}, SCALE]}))
    assert sizing.main(["--json", "--latency", str(latency), "--scale", str(scale),
                        "--episodes-per-hour", "3600"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["scale_workers"] == 1000 and out["rows"][0]["env_workers"] == 16
