"""The verify result: plain data, a table, a loss plot."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..runtime import new_figure, save_figure
from .records import SCHEMA, Divergence, RunRecord, _json_float

__all__ = ["VerifyReport", "plot_losses"]

@dataclass
class VerifyReport:
    """The outcome of :func:`verify`.

    Attributes:
        profile: The profile's name.
        args: The Ultralytics arguments every run used.
        runs: What each run recorded.
        divergences: One entry per run after the first that differs from run 1.
        steps_requested: ``--steps`` (None: the epochs decide).
        seconds: Wall time of the whole verification.
        plot: Path of the loss-curve PNG, when one was written.
        note: How the runs differ by design (``--resume-at``: run 2 was interrupted and resumed).
    """

    profile: str
    args: dict[str, Any]
    runs: list[RunRecord]
    divergences: list[Divergence]
    steps_requested: int | None
    seconds: float
    device: str = "cpu"
    plot: str | None = None
    note: str | None = None

    @property
    def identical(self) -> bool:
        """True when every run matches run 1 bit for bit (data, losses, gradients, final weights)."""
        return not self.divergences

    @property
    def first(self) -> Divergence | None:
        """The earliest divergence over all runs (lowest step, then lowest run)."""
        return min(self.divergences, key=lambda d: (d.step, d.run)) if self.divergences else None

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data (schema ``yolo-det/verify/1``)."""
        first = self.first
        return {
            "schema": SCHEMA,
            "identical": self.identical,
            "verdict": "bitwise identical" if self.identical else "diverged",
            "profile": self.profile,
            "device": self.device,
            "runs": len(self.runs),
            "steps_requested": self.steps_requested,
            "steps": [len(r.steps) for r in self.runs],
            "seconds": round(self.seconds, 3),
            "run_seconds": [round(r.seconds, 3) for r in self.runs],
            "args": {k: v for k, v in self.args.items() if k not in {"project", "name"}},
            "weights": [dict(r.weights) for r in self.runs],
            "loss_names": self.runs[0].loss_names if self.runs else [],
            "loss": [[_json_float(x) for x in r.losses()] for r in self.runs],
            "first_divergence": first.to_dict() if first else None,
            "comparisons": [
                {
                    "run": r.index,
                    "against": 1,
                    "identical": all(d.run != r.index for d in self.divergences),
                    "first_divergence": next((d.to_dict() for d in self.divergences if d.run == r.index), None),
                    "final_weights": ({"parameter": r.final_diff[0][0], "max_abs_diff": _json_float(r.final_diff[0][1]),
                                       "parameters_differing": len(r.final_diff)} if r.final_diff else None),
                }
                for r in self.runs[1:]
            ],
            "plot": self.plot,
            "note": self.note,
        }

    def summary(self) -> str:
        """A few lines for the terminal."""
        n_steps = sorted({len(r.steps) for r in self.runs})
        lines = [f"yolo-det verify: profile {self.profile}, {len(self.runs)} runs, "
                 f"{'/'.join(map(str, n_steps))} optimizer steps each, device {self.device}"]
        if self.note:
            lines.append(f"  ({self.note})")
        for r in self.runs:
            lines.append(f"  run {r.index}: {len(r.steps)} steps in {r.seconds:.1f} s, "
                         f"weights {r.weights.get('model', '?')[:16]}")
        if self.identical:
            lines.append(f"bitwise identical: input batches, losses and gradients at every step and the final "
                         f"weights of all {len(self.runs)} runs match")
            return "\n".join(lines)
        d = self.first
        if d is None:  # pragma: no cover - not identical implies a divergence
            return "\n".join(lines)
        where = f"step {d.step}" + (f" (epoch {d.epoch + 1})" if d.epoch is not None else "")
        lines.append(f"NOT reproducible: run {d.run} first differs from run 1 at {where}: {d.kind}")
        lines.append(f"  {d.detail}")
        if d.files:
            lines.append(f"  run 1 images: {_short_files(d.files[0])}")
            lines.append(f"  run {d.run} images: {_short_files(d.files[1])}")
        for name, (a, b) in list(d.loss_components.items())[:4]:
            lines.append(f"  {name}: {a!r} vs {b!r}")
        if d.parameter is not None:
            what = "weight" if d.kind == "weights" else "gradient"
            size = f"max |difference| {d.max_abs_diff:.3g}" if d.max_abs_diff is not None else "difference not measured"
            scale = f" (largest |value| {d.reference_abs_max:.3g})" if d.reference_abs_max is not None else ""
            count = f"; {d.parameters_differing} of {d.parameters_total} parameters differ" if d.parameters_total else ""
            lines.append(f"  largest {what} difference: {d.parameter}: {size}{scale}{count}")
        if d.note:
            lines.append(f"  note: {d.note}")
        for r in self.runs[1:]:
            if r.final_diff:
                k, v = r.final_diff[0]
                lines.append(f"  final weights of run {r.index}: {len(r.final_diff)} tensors differ, largest {k} by {v:.3g}")
        return "\n".join(lines)


def _short_files(files: Sequence[str], n: int = 4) -> str:
    names = [Path(f).name for f in files[:n]]
    return ", ".join(names) + (f", ... ({len(files)} images)" if len(files) > n else "")


def plot_losses(report: VerifyReport, path: str | Path) -> Path:
    """Write a PNG that overlays the runs' loss curves and marks the first divergence.

    The lower panel shows each run's absolute loss difference to run 1 (zero is drawn at the bottom), which
    makes a divergence visible long before the curves themselves separate.
    """
    from matplotlib.ticker import MaxNLocator

    fig = new_figure(8.0, 6.0)
    top = fig.add_subplot(2, 1, 1)
    bottom = fig.add_subplot(2, 1, 2, sharex=top)
    styles = ["-", "--", ":", "-."]
    ref = report.runs[0].losses() if report.runs else []
    diffs: list[float] = []
    for k, run in enumerate(report.runs):
        losses = run.losses()
        pts = [(s.step, v) for s, v in zip(run.steps, losses) if v is not None]
        marker = "o" if len(pts) <= 30 else None
        top.plot([x for x, _ in pts], [y for _, y in pts], styles[k % len(styles)], color=f"C{k}", marker=marker,
                 markersize=3, linewidth=1.5, label=f"run {run.index}")
        if k:
            d = [(s.step, abs(v - r)) for s, v, r in zip(run.steps, losses, ref) if v is not None and r is not None]
            diffs += [y for _, y in d]
            bottom.plot([x for x, _ in d], [y for _, y in d], styles[k % len(styles)], color=f"C{k}", marker=marker,
                        markersize=3, linewidth=1.2, label=f"run {run.index} vs run 1")
    nonzero = [y for y in diffs if y > 0]
    bottom.set_yscale("symlog", linthresh=min(nonzero) if nonzero else 1e-12)
    first = report.first
    if first is not None:
        for ax in (top, bottom):
            ax.axvline(first.step, color="red", linewidth=1, alpha=0.8)
        label = f"first divergence: step {first.step}, {first.kind}" + (f"\n{first.parameter}" if first.parameter else "")
        top.annotate(label, xy=(first.step, 0.95), xycoords=("data", "axes fraction"), va="top", ha="left",
                     fontsize=8, color="red", xytext=(4, 0), textcoords="offset points")
        title = f"{report.profile}: runs diverge at step {first.step} ({first.kind})"
    else:
        title = f"{report.profile}: {len(report.runs)} runs bitwise identical"
    top.set_title(title)
    top.set_ylabel("training loss (sum of components)")
    bottom.set_ylabel("|loss - loss of run 1|")
    bottom.set_xlabel("optimizer step")
    bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)
