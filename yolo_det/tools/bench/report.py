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

    def median(self) -> float:
        return statistics.median(self.times) if self.times else math.nan

    def cpu_median(self) -> float | None:
        return statistics.median(self.cpu_times) if self.cpu_times else None

    def quartiles(self) -> tuple[float, float]:
        if len(self.times) < 2:
            m = self.median()
            return m, m
        q = statistics.quantiles(self.times, n=4, method="inclusive")
        return q[0], q[2]


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
        return {"schema": SCHEMA, **self.info, "fastest": self.fastest, "rows": self.rows, "settings": self.settings,
                "overhead": self.overhead, "plot": self.plot}

    def table(self) -> str:
        """The terminal table."""
        i = self.info
        lines = [
            f"yolo-det bench: {i['model']} on {i['device']} ({i['device_name']}), imgsz {i['imgsz']}, batch {i['batch']}, "
            f"amp {i['amp']}",
            f"{i['steps']} measured steps per configuration after {i['warmup']} warm-up steps, interleaved in blocks "
            f"of {i['block']}; data loading not timed",
            "",
            f"{'profile':<12}{'step ms':>10}{'IQR ms':>16}{'CPU ms':>9}{'images/s':>11}{'peak mem':>11}{'step mem':>10}"
            f"{'time':>8}{'memory':>8}",
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
            lines.append(f"{r['profile']:<12}{r['step_ms']:>10.1f}{iqr:>16}{cpu:>9}{r['images_per_s']:>11.1f}{mem:>11}"
                         f"{step_mem:>10}{r['time_ratio']:>7.2f}x{mratio:>8}")
        lines.append("CPU ms: process CPU time per step (CPU devices; robust to a busy machine); step mem: peak above "
                     "the level at the start of a block; time, memory: ratio to the fastest profile and to the smallest "
                     "peak")
        for r in self.rows:
            for note in r["notes"]:
                lines.append(f"  {r['profile']}: {note}")
        if self.settings:
            lines += ["", "what each setting costs on its own (one setting toggled from a base; + is slower):",
                      f"{'setting':<34}{'base':>8}{'base ms':>10}{'toggled ms':>12}{'cost':>9}{'CPU cost':>10}"
                      f"{'mem delta':>11}"]
            for s in self.settings:
                if s["status"] != "measured":
                    lines.append(f"{s['label']:<34}{s['base']:>8}  {s['status']}")
                    continue
                mem = _fmt_bytes(s["memory_delta_bytes"], signed=True)
                cpu_cost = f"{s['cpu_cost_pct']:+.1f}%" if s.get("cpu_cost_pct") is not None else "-"
                lines.append(f"{s['label']:<34}{s['base']:>8}{s['base_ms']:>10.1f}{s['toggled_ms']:>12.1f}"
                             f"{s['cost_pct']:>+8.1f}%{cpu_cost:>10}{mem:>11}")
        o = self.overhead
        lines += ["", f"peak memory: {i['memory_method']}",
                  f"bench overhead: {o['per_step_us']:.2f} us per measured step "
                  f"({o['percent_of_median_step']:.4f}% of the median step)"]
        return "\n".join(lines)


def _fmt_bytes(n: int | None, *, signed: bool = False) -> str:
    if n is None:
        return "-"
    sign = ("+" if n >= 0 else "-") if signed else ""
    return f"{sign}{abs(n) / 2**20:.0f} MiB"


def plot_bench(report: BenchReport, path: str | Path) -> Path:
    """Write a PNG bar chart: step time, throughput and peak memory per profile, and each setting's cost."""
    rows = report.rows
    names = [r["profile"] for r in rows]
    colors = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860"]
    measured = [s for s in report.settings if s["status"] == "measured"]
    fig = new_figure(11, 7.5 if measured else 4.0)
    n_rows = 2 if measured else 1
    panels = [("median step time (ms)", [r["step_ms"] for r in rows]),
              ("throughput (images/s)", [r["images_per_s"] for r in rows]),
              ("peak memory (MiB)", [None if r["peak_memory_bytes"] is None else r["peak_memory_bytes"] / 2**20
                                     for r in rows])]
    for k, (title, values) in enumerate(panels):
        ax = fig.add_subplot(n_rows, 3, k + 1)
        vals = [v if v is not None else 0.0 for v in values]
        bars = ax.bar(names, vals, color=[colors[j % len(colors)] for j in range(len(names))])
        for bar, v in zip(bars, values):
            ax.annotate("n/a" if v is None else f"{v:.3g}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.grid(True, axis="y", alpha=0.3)
    if measured:
        ax = fig.add_subplot(2, 1, 2)
        labels = [s["label"] for s in measured]
        costs = [s["cost_pct"] for s in measured]
        ax.barh(labels, costs, color=["#c44e52" if c > 0 else "#55a868" for c in costs])
        ax.axvline(0, color="black", linewidth=0.8)
        ax.set_xlabel("step time change when toggled on its own (%)")
        ax.grid(True, axis="x", alpha=0.3)
    i = report.info
    fig.suptitle(f"yolo-det bench: {i['model']} on {i['device']}, batch {i['batch']}, imgsz {i['imgsz']}", fontsize=11)
    fig.tight_layout()
    return save_figure(fig, path)
