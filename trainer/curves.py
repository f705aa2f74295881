"""Reward / success and loss curves of a run (``metrics.jsonl`` -> ``curves.png``)."""
from __future__ import annotations

import json
from pathlib import Path


def read_metrics(path: Path) -> list[dict]:
    rows = []
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if line:
            rows.append(json.loads(line))
    return rows


def plot_curves(metrics_path: Path, out: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(metrics_path)
    sft = [r for r in rows if r.get("stage") == "sft"]
    grpo = [r for r in rows if r.get("stage") == "grpo"]
    fig, axes = plt.subplots(1, 2 if sft else 1, figsize=(11 if sft else 6, 4), squeeze=False)
    ax = axes[0][0]
    if grpo:
        steps = [r["step"] for r in grpo]
        ax.plot(steps, [r["reward_mean"] for r in grpo], marker="o", label="reward (mean)")
        ax.plot(steps, [r["success_rate"] for r in grpo], marker="s", label="success rate")
    ax.set_xlabel("GRPO step")
    ax.set_ylim(-0.05, 1.05)
    ax.set_title("GRPO: rollout reward and success")
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    if sft:
        ax2 = axes[0][1]
        ax2.plot([r["step"] for r in sft], [r["loss"] for r in sft], color="tab:red")
        ax2.set_xlabel("SFT step")
        ax2.set_ylabel("loss (action tokens)")
        ax2.set_title("SFT")
        ax2.grid(alpha=0.3)
    fig.tight_layout()
    out = Path(out)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
