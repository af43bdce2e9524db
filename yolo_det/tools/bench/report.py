"""The bench's result: rows per profile and per setting, as plain data, a table and a plot."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...core.profiles import PhaseSettings
from ..runtime import new_figure, save_figure
from .isolations import SCHEMA
from .stats import iqr

__all__ = ["BenchReport", "plot_bench"]


@dataclass
class _Config:
    key: str
    settings: PhaseSettings
    times: list[float] = field(default_factory=list)
    cpu_times: list[float] = field(default_factory=list)
    peak: int | None = None
    peak_delta: int | None = None
    notes: list[str] = field(default_factory=list)
    error: str | None = None
    kernels: list[dict[str, Any]] | None = None

    def median(self) -> float:
        return statistics.median(self.times) if self.times else math.nan

    def cpu_median(self) -> float | None:
        return statistics.median(self.cpu_times) if self.cpu_times else None

    def quartiles(self) -> tuple[float, float]:
        if not self.times:
            return math.nan, math.nan
        return iqr(self.times)


@dataclass
class BenchReport:
    """The outcome of :func:`bench`; ``to_dict()`` is the ``--json`` output (schema ``yolo-det/bench/1``)."""

    rows: list[dict[str, Any]]
    settings: list[dict[str, Any]]
    overhead: dict[str, Any]
    info: dict[str, Any]
    plot: str | None = None

    @property
    def fastest(self) -> str | None:
        """The profile with the lowest median step time."""
        timed = [r for r in self.rows if r.get("step_ms") is not None]
        return min(timed, key=lambda r: r["step_ms"])["profile"] if timed else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data."""
        return {
            "schema": SCHEMA,
            **self.info,
            "fastest": self.fastest,
            "rows": self.rows,
            "settings": self.settings,
            "overhead": self.overhead,
            "plot": self.plot,
        }

    def table(self) -> str:
        """The terminal table."""
        i = self.info
        lines = [
            f"yolo-det bench: {i['model']} on {i['device']} ({i['device_name']}), imgsz {i['imgsz']}, "
            f"batch {i['batch']}, amp {i['amp']}",
            f"{i['steps']} measured steps per configuration after {i['warmup']} warm-up steps, interleaved in blocks "
            f"of {i['block']}; data loading not timed",
            "",
            f"{'profile':<12}{'step ms':>10}{'IQR ms':>16}{'CPU ms':>9}{'images/s':>11}{'peak mem':>11}{'step mem':>10}"
            f"{'time':>8}{'95% CI':>14}  {'vs fastest':<13}{'memory':>8}",
        ]
        for r in self.rows:
            if r.get("error"):
                lines.append(f"{r['profile']:<12}  raised: {r['error']}")
                continue
            iqr = f"{r['step_ms_q1']:.1f}-{r['step_ms_q3']:.1f}"
            mem = _fmt_bytes(r["peak_memory_bytes"])
            mratio = f"{r['memory_ratio']:.2f}x" if r["memory_ratio"] is not None else "-"
            step_mem = _fmt_bytes(r["peak_memory_over_start_bytes"])
            cpu = f"{r['step_cpu_ms']:.1f}" if r.get("step_cpu_ms") is not None else "-"
            ci = "-" if r.get("time_ratio_low") is None else f"{r['time_ratio_low']:.2f}-{r['time_ratio_high']:.2f}"
            word = {"reference": "fastest", None: "-"}.get(r.get("time_ratio_verdict"), r.get("time_ratio_verdict"))
            lines.append(
                f"{r['profile']:<12}{r['step_ms']:>10.1f}{iqr:>16}{cpu:>9}{r['images_per_s']:>11.1f}{mem:>11}"
                f"{step_mem:>10}{r['time_ratio']:>7.2f}x{ci:>14}  {word:<13}{mratio:>8}"
            )
        lines.append(
            "IQR: interquartile range of the step times; CPU ms: process CPU time per step (CPU devices; "
            "robust to a busy machine); step mem: peak above the level at the start of a block; time, memory: "
            "ratio to the fastest profile and to the smallest peak; 95% CI: bootstrap interval of the time "
            "ratio; 'within noise': the interval contains 1 or the difference is under 1%"
        )
        for r in self.rows:
            for note in r["notes"]:
                lines.append(f"  {r['profile']}: {note}")
        if self.settings:
            lines += [
                "",
                "what each setting costs on its own (one setting toggled from a base; + is slower):",
                f"{'setting':<34}{'base':>8}{'base ms':>10}{'toggled ms':>12}{'cost':>9}{'95% CI':>18}  "
                f"{'verdict':<13}{'CPU cost':>10}{'mem delta':>11}",
            ]
            for s in self.settings:
                if s["status"] != "measured":
                    lines.append(f"{s['label']:<34}{s['base']:>8}  {s['status']}")
                    continue
                mem = _fmt_bytes(s["memory_delta_bytes"], signed=True)
                cpu_cost = f"{s['cpu_cost_pct']:+.1f}%" if s.get("cpu_cost_pct") is not None else "-"
                ci = "-" if s.get("cost_pct_low") is None else f"{s['cost_pct_low']:+.1f}..{s['cost_pct_high']:+.1f}%"
                lines.append(
                    f"{s['label']:<34}{s['base']:>8}{s['base_ms']:>10.1f}{s['toggled_ms']:>12.1f}"
                    f"{s['cost_pct']:>+8.1f}%{ci:>18}  {s.get('verdict') or '-':<13}{cpu_cost:>10}{mem:>11}"
                )
        o = self.overhead
        lines += [
            "",
            f"peak memory: {i['memory_method']}",
            f"bench overhead: {o['per_step_us']:.2f} us per measured step "
            f"({o['percent_of_median_step']:.4f}% of the median step)",
        ]
        return "\n".join(lines)


def _fmt_bytes(n: int | None, *, signed: bool = False) -> str:
    if n is None:
        return "-"
    sign = ("+" if n >= 0 else "-") if signed else ""
    return f"{sign}{abs(n) / 2**20:.0f} MiB"


def plot_bench(report: BenchReport, path: str | Path) -> Path:
    """Write a PNG chart: step time (with its interquartile range), throughput and peak memory per profile,
    and each setting's cost with its 95% interval; differences inside the noise are drawn grey and labelled
    "within noise", settings that do not apply on the device are listed as such."""
    rows = [r for r in report.rows if r.get("step_ms") is not None]
    names = [r["profile"] for r in rows]
    colors = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860"]
    shown = [s for s in report.settings if s["status"] == "measured" or s["status"].startswith("not applicable")]
    fig = new_figure(11, 8.0 if shown else 4.2)
    n_rows = 2 if shown else 1
    step = [r["step_ms"] for r in rows]
    low = [r["step_ms"] - r["step_ms_q1"] for r in rows]
    high = [r["step_ms_q3"] - r["step_ms"] for r in rows]
    panels = [
        ("median step time (ms), bar: IQR", step, (low, high)),
        ("throughput (images/s)", [r["images_per_s"] for r in rows], None),
        (
            "peak memory (MiB)",
            [None if r["peak_memory_bytes"] is None else r["peak_memory_bytes"] / 2**20 for r in rows],
            None,
        ),
    ]
    for k, (title, values, err) in enumerate(panels):
        ax = fig.add_subplot(n_rows, 3, k + 1)
        vals = [v if v is not None else 0.0 for v in values]
        bars = ax.bar(
            names,
            vals,
            color=[colors[j % len(colors)] for j in range(len(names))],
            yerr=None if err is None else [err[0], err[1]],
            capsize=4 if err else 0,
        )
        for j, (bar, v) in enumerate(zip(bars, values)):
            text = "n/a" if v is None else (f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}")
            if k == 0:
                word = rows[j].get("time_ratio_verdict")
                text += {
                    "reference": "\nfastest",
                    "within noise": "\nwithin noise",
                    "slower": "\nslower",
                    "faster": "\nfaster",
                }.get(word or "", "")
            top = bar.get_height() + (err[1][j] if err else 0.0)
            ax.annotate(text, (bar.get_x() + bar.get_width() / 2, top), ha="center", va="bottom", fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.margins(y=0.25)
        ax.grid(True, axis="y", alpha=0.3)
    if shown:
        ax = fig.add_subplot(2, 1, 2)
        labels = [s["label"] for s in shown]
        ypos = list(range(len(shown)))
        measured = [s["status"] == "measured" for s in shown]
        costs = [s["cost_pct"] if m else 0.0 for s, m in zip(shown, measured)]
        bar_colors = []
        for s, m in zip(shown, measured):
            word = s.get("verdict")
            bar_colors.append(
                "#bbbbbb" if not m or word == "within noise" else "#c44e52" if s["cost_pct"] > 0 else "#55a868"
            )
        xerr_low = [
            c - s["cost_pct_low"] if m and s.get("cost_pct_low") is not None else 0.0
            for s, m, c in zip(shown, measured, costs)
        ]
        xerr_high = [
            s["cost_pct_high"] - c if m and s.get("cost_pct_high") is not None else 0.0
            for s, m, c in zip(shown, measured, costs)
        ]
        ax.barh(ypos, costs, color=bar_colors, xerr=[xerr_low, xerr_high], capsize=3)
        ax.set_yticks(ypos)
        ax.set_yticklabels(labels)
        ax.invert_yaxis()
        ax.axvline(0, color="black", linewidth=0.8)
        span = max([abs(c) + max(lo, hi) for c, lo, hi in zip(costs, xerr_low, xerr_high)] + [1.0])
        ax.set_xlim(-span * 1.6, span * 1.6)
        for y, s, m, c, hi in zip(ypos, shown, measured, costs, xerr_high):
            if not m:
                text = s["status"]
            else:
                text = f"{c:+.1f}% ({s.get('verdict') or '-'})"
            ax.annotate(
                text,
                (max(c, 0.0) + hi + span * 0.03, y),
                va="center",
                fontsize=8,
                color="#555555" if not m or s.get("verdict") == "within noise" else "black",
            )
        ax.set_xlabel(
            "step time change when toggled on its own (%), bar: 95% bootstrap interval; "
            "grey: within noise or not applicable"
        )
        ax.grid(True, axis="x", alpha=0.3)
    i = report.info
    fig.suptitle(
        f"yolo-det bench: {i['model']} on {i['device']}, batch {i['batch']}, imgsz {i['imgsz']}, "
        f"{i['steps']} steps per configuration",
        fontsize=11,
    )
    fig.tight_layout()
    return save_figure(fig, path)
