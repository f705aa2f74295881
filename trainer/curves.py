"""The curves of a training run: ``metrics.jsonl`` -> ``curves.png``.

``metrics.jsonl`` holds one JSON object a line: ``"stage": "sft"`` lines (``step``, ``loss`` on
the action tokens, ...) written by the job's SFT stage, and ``"stage": "grpo"`` lines (``step``,
``samples``: the episodes the step trained on, ``reward_mean``, ``success_rate``, ...) written by
:class:`trainer.grpo.GRPOTrainer`. Other lines are ignored.

What a reader should see: on the left, the SFT loss falling (the policy learns to imitate the
oracle); on the right, the GRPO success rate and mean reward over steps. One GRPO step's value
is the mean over its few episodes, so single steps jump between a handful of values (0, 0.25,
0.5, ... with four episodes); they are drawn faintly, and the trend to read is the bold line,
the mean over the last :data:`WINDOW` steps weighted by each step's episodes. The panel's title
gives the episodes per step. Both x axes count whole optimizer steps.
"""
from __future__ import annotations

import json
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

WINDOW = 5          # GRPO steps in the trailing mean


def read_metrics(path: Path) -> list[dict[str, Any]]:
    rows = []
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if line:
            rows.append(json.loads(line))
    return rows


def trailing_mean(values_S: Sequence[float], weights_S: Sequence[float],
                  window: int = WINDOW) -> list[float]:
    """Per step, the mean of the values of the last ``window`` steps (this one included), each
    weighted by its ``weights_S`` entry (the episodes it trained on)."""
    out = []
    for i in range(len(values_S)):
        lo = max(0, i - window + 1)
        w = sum(weights_S[lo:i + 1])
        out.append(sum(v * n for v, n in zip(values_S[lo:i + 1], weights_S[lo:i + 1])) / w
                   if w > 0 else float("nan"))
    return out


def _episodes_note(samples: Sequence[int] | None) -> str:
    if not samples:
        return "episodes per step not recorded"
    lo, hi = min(samples), max(samples)
    return f"n = {lo} episodes per step" if lo == hi else f"n = {lo}-{hi} episodes per step"


def build_figure(rows: Sequence[dict[str, Any]]):
    """The figure of ``rows`` (as :func:`read_metrics` returns them): an SFT loss panel when
    there are SFT steps, and the GRPO panel."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    sft = [r for r in rows if r.get("stage") == "sft"]
    grpo = [r for r in rows if r.get("stage") == "grpo"]
    fig, axes = plt.subplots(1, 2 if sft else 1, figsize=(12 if sft else 6.5, 4.6),
                             squeeze=False)
    panels = list(axes[0])
    if sft:
        ax = panels.pop(0)
        ax.plot([r["step"] for r in sft], [r["loss"] for r in sft], color="tab:red",
                marker="o" if len(sft) <= 30 else None, markersize=3)
        ax.set_xlabel("SFT step")
        ax.set_ylabel("loss on the action tokens")
        ax.set_title("SFT: the loss should fall")
    ax = panels[0]
    if grpo:
        steps = [r["step"] for r in grpo]
        recorded = all("samples" in r for r in grpo)
        samples = [int(r["samples"]) for r in grpo] if recorded else None
        weights = samples if samples is not None else [1] * len(grpo)
        success = [float(r["success_rate"]) for r in grpo]
        reward = [float(r["reward_mean"]) for r in grpo]
        series = [("success rate", success, "tab:blue")]
        if any(abs(a - b) > 1e-9 for a, b in zip(success, reward)):
            series.append(("mean reward", reward, "tab:orange"))
        else:                       # reward 1 on success, else 0: one line, not two on top
            series[0] = ("success rate (= mean reward)", success, "tab:blue")
        for label, values, color in series:
            ax.plot(steps, values, color=color, alpha=0.3, linewidth=1, marker="o",
                    markersize=3, label=f"{label}, per step")
            ax.plot(steps, trailing_mean(values, weights), color=color, linewidth=2.2,
                    label=f"{label}, mean of the last {WINDOW} steps")
        lows = [0.0, *success, *reward]
        ax.set_ylim(min(lows) - 0.05, 1.05)
        ax.set_title(f"GRPO: success and reward should trend up ({_episodes_note(samples)})",
                     fontsize=10)
        ax.legend(loc="best", fontsize=8)
    else:
        ax.set_title("GRPO: no steps recorded", fontsize=10)
        ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("share of episodes / reward")
    for a in axes[0]:
        a.xaxis.set_major_locator(MaxNLocator(integer=True))
        a.grid(alpha=0.3)
    caption = ("Read the trend, not single steps: each GRPO step is the mean of a few "
               "episodes, so it jumps; the bold line averages the last steps.")
    fig.text(0.5, 0.01, textwrap.fill(caption, 95 if sft else 70), ha="center", va="bottom",
             fontsize=8, color="0.35")
    fig.tight_layout(rect=(0, 0.07 if sft else 0.09, 1, 1))
    return fig


def plot_curves(metrics_path: Path, out: Path) -> Path:
    """Write the run's curves (:func:`build_figure` of ``metrics_path``) to ``out`` as PNG."""
    fig = build_figure(read_metrics(metrics_path))     # chooses the Agg backend first
    import matplotlib.pyplot as plt

    out = Path(out)
    try:
        fig.savefig(out, dpi=100)
    finally:
        plt.close(fig)
    return out
