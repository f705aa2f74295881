"""The scale benchmark's workload and latency model, shared by the benchmark
(:mod:`benchmarks.scale`) and its calibration (:mod:`benchmarks.scale_calibrate`): which tasks
run, the recorded pages the prompts are built from, and the latency samples each simulated call
draws from (``benchmarks/data/scale-latency.json``, written by ``python -m benchmarks.scale
--calibrate``).
"""
from __future__ import annotations

import gzip
import json
import statistics
from dataclasses import dataclass
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
LATENCY_FILE = DATA / "scale-latency.json"
STATES_FILE = DATA / "oracle-states.jsonl.gz"
# Tasks with no prerequisites: provisioning is then nothing, as for most tasks of a warm pool.
TASKS = r"^(ram-create-user|oss-create-bucket)-[0-9]+$"
TRAIL_QPS = 2.0                     # ActionTrail's LookupEvents limit per account
ACTION = "click(12)"                # what the simulated policy always answers


@dataclass
class Latency:
    """Samples (seconds, or turns, or calls) measured on this machine by the calibration; each
    simulated call picks one at random."""

    reset_s: list[float]
    step_s: list[float]
    generate_s: list[float]
    score_s: list[float]
    sdk_call_s: list[float]
    lookup_s: list[float]
    turns: list[int]
    lookups: list[int]
    episode_cpu_s: list[float]
    source: str = ""

    @classmethod
    def load(cls, path: Path) -> Latency:
        data = json.loads(path.read_text())
        return cls(**{k: data[k] for k in ("reset_s", "step_s", "generate_s", "score_s",
                                           "sdk_call_s", "lookup_s", "turns")},
                   lookups=data.get("lookups", [2]), episode_cpu_s=data.get("episode_cpu_s", [0]),
                   source=data.get("measured", ""))

    def mean_episode_s(self, sdk_calls: float, lookups: float) -> float:
        """The model's mean episode, lease to release, with no overhead at all."""
        mean = statistics.fmean
        return (mean(self.reset_s) + mean(self.turns) * (mean(self.generate_s)
                                                         + mean(self.step_s))
                + mean(self.score_s) + sdk_calls * mean(self.sdk_call_s)
                + lookups * mean(self.lookup_s))


def page_texts(limit: int = 200) -> list[str]:
    """Real console pages (the recorded oracle states' observations) for the prompts."""
    out: list[str] = []
    with gzip.open(STATES_FILE, "rt", encoding="utf-8") as f:
        for line in f:
            text = json.loads(line)["messages"][-1]["content"]
            page = text.split("CURRENT PAGE:", 1)[-1].split("\n\nYour next action", 1)[0]
            out.append(page.split("\n", 2)[-1])
            if len(out) >= limit:
                break
    return out

