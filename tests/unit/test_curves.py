"""The run's curves: a metrics.jsonl of SFT and GRPO lines becomes a PNG whose step axes carry
whole steps only, with the per-step values and their trailing mean weighted by episodes."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from trainer.curves import WINDOW, build_figure, plot_curves, read_metrics, trailing_mean


def _metrics(path: Path, sft_steps: int = 6, grpo_steps: int = 7) -> Path:
    lines = [{"stage": "sft", "step": s, "loss": 2.0 / s, "tokens": 3000}
             for s in range(1, sft_steps + 1)]
    lines += [{"stage": "grpo", "step": s, "samples": 4, "groups": 1,
               "success_rate": (s % 3) / 4, "reward_mean": (s % 3) / 4 * 0.9, "loss": 0.1}
              for s in range(1, grpo_steps + 1)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def _visible_ticks(ax) -> list[float]:
    lo, hi = ax.get_xlim()
    return [t for t in ax.get_xticks() if lo <= t <= hi]


def test_trailing_mean_weights_each_step_by_its_episodes() -> None:
    # window 2: (1*2)/2, (1*2 + 0*6)/8, (0*6 + 0.5*4)/10
    assert trailing_mean([1.0, 0.0, 0.5], [2, 6, 4], window=2) == pytest.approx(
        [1.0, 0.25, 0.2])
    assert trailing_mean([0.25, 0.75], [4, 4], window=WINDOW) == pytest.approx([0.25, 0.5])
    assert math.isnan(trailing_mean([1.0], [0])[0])


def test_plot_curves_writes_a_png_with_whole_step_ticks(tmp_path: Path) -> None:
    import matplotlib.pyplot as plt

    metrics = _metrics(tmp_path / "metrics.jsonl")
    png = plot_curves(metrics, tmp_path / "curves.png")
    assert png == tmp_path / "curves.png" and png.stat().st_size > 1000
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    fig = build_figure(read_metrics(metrics))
    try:
        sft_ax, grpo_ax = fig.axes
        fig.canvas.draw()
        for ax in (sft_ax, grpo_ax):
            ticks = _visible_ticks(ax)
            assert ticks and all(float(t).is_integer() for t in ticks), ticks
        assert "n = 4 episodes per step" in grpo_ax.get_title()
        labels = [line.get_label() for line in grpo_ax.get_lines()]
        assert labels == ["success rate, per step",
                          f"success rate, mean of the last {WINDOW} steps",
                          "mean reward, per step", f"mean reward, mean of the last {WINDOW} steps"]
        bold = grpo_ax.get_lines()[1]
        success = [(s % 3) / 4 for s in range(1, 8)]
        assert list(bold.get_ydata()) == pytest.approx(trailing_mean(success, [4] * 7))
    finally:
        plt.close(fig)


def test_grpo_only_and_equal_reward_draw_one_series_on_few_steps(tmp_path: Path) -> None:
    import matplotlib.pyplot as plt

    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"stage": "grpo", "step": s, "samples": n,
                                        "reward_mean": r, "success_rate": r}) + "\n"
                            for s, n, r in ((1, 4, 0.25), (2, 2, 0.5), (3, 4, 0.25))))
    fig = build_figure(read_metrics(path))
    try:
        (ax,) = fig.axes
        fig.canvas.draw()
        ticks = _visible_ticks(ax)
        assert ticks and all(float(t).is_integer() for t in ticks), ticks
        assert "n = 2-4 episodes per step" in ax.get_title()
        assert [line.get_label() for line in ax.get_lines()] == [
            "success rate (= mean reward), per step",
            f"success rate (= mean reward), mean of the last {WINDOW} steps"]
    finally:
        plt.close(fig)
    assert plot_curves(path, tmp_path / "c.png").stat().st_size > 1000
