"""The ``check-deploy`` chart: per image and scenario, how far the detections moved from the image alone."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from ..runtime import new_figure, save_figure

__all__ = ["deploy_figure", "save_deploy_plot"]

_COLORS = {"bitwise": "#2e7d32", "within tolerance": "#f9a825", "differs": "#c62828"}


def deploy_figure(report: Any) -> Any:
    """A figure of a :class:`~yolo_det.tools.deploy.check.DeployReport`: one row per image, one column per
    scenario; the colour is the verdict, the number the largest box difference in pixels (``=`` bitwise).
    With ``val`` results, a second panel shows each metric's difference from the first ``batch=``."""
    data = report.to_dict() if hasattr(report, "to_dict") else report
    images = [im["image"] for im in data["images"]]
    scenarios = list(dict.fromkeys(c["scenario"] for c in data["comparisons"]))
    has_val = bool(data.get("val"))
    height = max(3.0, 0.32 * len(images) + 1.8) + (2.2 if has_val else 0)
    fig = new_figure(max(6.0, 1.3 * len(scenarios) + 3.5), height)
    ax = fig.add_subplot(2, 1, 1) if has_val else fig.add_subplot(1, 1, 1)
    cells = {(c["image"], c["scenario"]): c for c in data["comparisons"]}
    for y, name in enumerate(images):
        for x, scenario in enumerate(scenarios):
            c = cells.get((name, scenario))
            if c is None:
                ax.add_patch(_rect(x, y, "#eeeeee"))
                continue
            ax.add_patch(_rect(x, y, _COLORS[c["verdict"]]))
            text = "=" if c["verdict"] == "bitwise" else f"{c['max_box_diff']:.3g}"
            if c["count"][0] != c["count"][1]:
                text += f"\n{c['count'][0]}→{c['count'][1]}"
            ax.text(x, y, text, ha="center", va="center", fontsize=7, color="white")
    ax.set_xlim(-0.5, len(scenarios) - 0.5)
    ax.set_ylim(len(images) - 0.5, -0.5)
    ax.set_xticks(range(len(scenarios)), scenarios, fontsize=8)
    ax.set_yticks(range(len(images)), images, fontsize=7)
    ax.set_title(
        f"{Path(str(data['weights'])).name}: detections vs the image alone "
        f"(profile {data['profile']}) — verdict: {data['verdict']}",
        fontsize=9,
    )
    if has_val:
        val = data["val"]
        vx = fig.add_subplot(2, 1, 2)
        metrics = val["metrics"]
        first = metrics[str(val["batches"][0])]
        keys = list(first)
        others = val["batches"][1:]
        width = 0.8 / max(1, len(others))
        for k, b in enumerate(others):
            diffs = [abs(metrics[str(b)][key] - first[key]) for key in keys]
            vx.bar(
                [i + width * k for i in range(len(keys))],
                [d if math.isfinite(d) else 0.0 for d in diffs],
                width=width,
                label=f"batch={b}",
            )
        vx.set_xticks(range(len(keys)), [k.replace("metrics/", "") for k in keys], fontsize=7, rotation=20)
        vx.set_ylabel(f"|metric - batch={val['batches'][0]}|", fontsize=8)
        vx.set_title(f"val metrics at several batch= values: {val['verdict']}", fontsize=9)
        vx.legend(fontsize=7)
    fig.tight_layout()
    return fig


def _rect(x: int, y: int, color: str) -> Any:
    from matplotlib.patches import Rectangle

    return Rectangle((x - 0.48, y - 0.45), 0.96, 0.9, color=color)


def save_deploy_plot(report: Any, path: str | os.PathLike[str]) -> Path:
    """Write :func:`deploy_figure` of ``report`` as PNG to ``path`` (atomically)."""
    return save_figure(deploy_figure(report), path)
