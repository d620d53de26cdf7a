"""Logged metrics as curves, for the verdicts and panels of the methods that log more than a loss (preference tuning:
finetune/train/preference/curves.py; reward models: finetune/train/reward/curves.py).

    metric_series(history, "accuracy")    (step, value) of every logged value, non-finite ones left out
    series(history, "accuracy")           the training series, else the eval_ one; with the key it came from
    ends(points)                          (first, last) levels: means over a fifth of the points at each end,
                                          at least min(3, half of them), as the loss's levels are taken
    levels(history, names)                {key: {"first", "last"}} of every name logged (train and eval_)
    plot_panels(axes, history, panels)    a panel per metric group, train solid and eval_ dashed
"""

from __future__ import annotations

import math


def metric_series(log_history: list[dict], key: str) -> list[tuple[int, float]]:
    """(step, value) of every logged `key`, non-finite values left out."""
    points = [(int(e["step"]), float(e[key])) for e in log_history if key in e and "step" in e]
    return [p for p in points if math.isfinite(p[1])]


def series(log_history: list[dict], name: str) -> tuple[list[tuple[int, float]], str]:
    """The training series of `name`, else the eval one; with the key it came from."""
    train = metric_series(log_history, name)
    return (train, name) if train else (metric_series(log_history, f"eval_{name}"), f"eval_{name}")


def ends(points: list[tuple[int, float]]) -> tuple[float, float]:
    n = len(points)
    k = max(min(3, n // 2), n // 5, 1)
    return sum(v for _, v in points[:k]) / k, sum(v for _, v in points[-k:]) / k


def levels(log_history: list[dict], names) -> dict:
    """{metric: {"first", "last"}} levels of every name logged (train and eval_): diagnosis.json."""
    out = {}
    for name in names:
        for key in (name, f"eval_{name}"):
            points = metric_series(log_history, key)
            if points:
                first, last = ends(points)
                out[key] = {"first": round(first, 4), "last": round(last, 4)}
    return out


def plot_panels(axes, log_history: list[dict], panels, colors: dict) -> None:
    """One panel per (names, ylabel, reference line, its label) on matplotlib axes: each name's training series solid,
    its eval_ series dashed; a panel holding an accuracy shows the whole 0..1 scale (chance and a tie at a glance)."""
    for ax, (names, ylabel, line, line_label) in zip(axes, panels):
        for name in names:
            for key, style in ((name, "-"), (f"eval_{name}", "--")):
                points = metric_series(log_history, key)
                if points:
                    ax.plot(*zip(*points), style, label=key, color=colors[name], marker="o" if style == "--" else None,
                            markersize=3)
        if line is not None:
            ax.axhline(line, color="gray", linestyle=":", linewidth=1, label=line_label)
        ax.set(xlabel="optimizer step", ylabel=ylabel)
        if any("accurac" in name for name in names):
            ax.set_ylim(-0.03, 1.03)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
