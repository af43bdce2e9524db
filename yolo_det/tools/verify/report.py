"""The verify result: plain data, a table, a loss plot."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..runtime import new_figure, save_figure
from .records import NOTHING, SCHEMA, Divergence, RunRecord, _json_float, nothing_trained

__all__ = ["VerifyReport", "loss_figure", "plot_losses"]


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
    def evidence(self) -> dict[str, Any]:
        """What the verdict rests on: runs, optimizer steps (per run), steps that changed the weights (when
        recorded), whether the weights moved from the initial ones, tensors and elements compared."""
        ref = self.runs[0] if self.runs else RunRecord(index=1)
        return {
            "runs": len(self.runs),
            "optimizer_steps": [len(r.steps) for r in self.runs],
            "steps_changing_weights": ref.steps_changing_weights,
            "weights_changed": None if not ref.initial_params else not ref.weights_unchanged,
            "tensors": len(ref.param_names),
            "elements": ref.param_elements,
        }

    @property
    def nothing_compared(self) -> list[str]:
        """Why "identical" would rest on nothing (the weights never changed), with what to do; empty otherwise."""
        why = nothing_trained(self.runs[0]) if self.runs else None
        return [why] if why else []

    @property
    def verdict(self) -> str:
        """ "bitwise identical", "diverged", or "nothing compared" instead of an identity over untrained weights."""
        if not self.identical:
            return "diverged"
        return NOTHING if self.nothing_compared else "bitwise identical"

    @property
    def exit_code(self) -> int:
        """0 when bitwise identical, 1 when the runs diverged, 3 when nothing was compared."""
        verdict = self.verdict
        return 1 if verdict == "diverged" else 3 if verdict == NOTHING else 0

    @property
    def steps_note(self) -> str | None:
        """Why the runs made fewer optimizer steps than ``--steps`` asked for, or None when they made them all."""
        if self.steps_requested is None or not self.runs:
            return None
        made = min(len(r.steps) for r in self.runs)
        if made >= self.steps_requested:
            return None
        epochs = self.args.get("epochs")
        if isinstance(epochs, int) and not isinstance(epochs, bool) and epochs > 0 and made > 0:
            per_epoch = made / epochs
            need = math.ceil(self.steps_requested / per_epoch)
            hint = (
                f"pass epochs={need} (about {per_epoch:.3g} optimizer steps per epoch) to reach {self.steps_requested}"
            )
            return (
                f"asked for {self.steps_requested} optimizer steps, the runs made {made}: training ended "
                f"when its epochs ran out (epochs={epochs}); {hint}, or lower --steps"
            )
        return (
            f"asked for {self.steps_requested} optimizer steps, the runs made {made}: training ended first "
            "(the epochs ran out or the trainer stopped); raise epochs= or lower --steps"
        )

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
            "verdict": self.verdict,
            "evidence": self.evidence,
            "nothing_compared": self.nothing_compared,
            "profile": self.profile,
            "device": self.device,
            "runs": len(self.runs),
            "steps_requested": self.steps_requested,
            "steps": [len(r.steps) for r in self.runs],
            "steps_note": self.steps_note,
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
                    "final_weights": (
                        {
                            "parameter": r.final_diff[0][0],
                            "max_abs_diff": _json_float(r.final_diff[0][1]),
                            "parameters_differing": len(r.final_diff),
                        }
                        if r.final_diff
                        else None
                    ),
                }
                for r in self.runs[1:]
            ],
            "plot": self.plot,
            "note": self.note,
        }

    def summary(self) -> str:
        """A few lines for the terminal."""
        n_steps = sorted({len(r.steps) for r in self.runs})
        lines = [
            f"yolo-det verify: profile {self.profile}, {len(self.runs)} runs, "
            f"{'/'.join(map(str, n_steps))} optimizer steps each, device {self.device}"
        ]
        if self.note:
            lines.append(f"  ({self.note})")
        for r in self.runs:
            lines.append(
                f"  run {r.index}: {len(r.steps)} steps in {r.seconds:.1f} s, "
                f"weights digest {r.weights.get('sha256', '?')}"
            )
        if self.steps_note:
            lines.append(f"note: {self.steps_note}")
        e = self.evidence
        changed = "" if e["steps_changing_weights"] is None else f" ({e['steps_changing_weights']} changed the weights)"
        moved = {None: "", True: ", weights moved from the initial ones", False: ", weights equal the initial ones"}
        lines.append(
            f"  compared: {min(e['optimizer_steps'], default=0)} optimizer steps{changed}, {e['tensors']} parameter "
            f"tensors ({e['elements']} elements){moved[e['weights_changed']]}"
        )
        if self.identical and self.nothing_compared:
            lines.extend(f"  nothing compared: {why}" for why in self.nothing_compared)
            lines.append(f"verdict: {NOTHING}")
            return "\n".join(lines)
        if self.identical:
            lines.append(
                f"bitwise identical: input batches, losses and gradients at every step and the final "
                f"weights of all {len(self.runs)} runs match"
            )
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
            count = (
                f"; {d.parameters_differing} of {d.parameters_total} parameters differ" if d.parameters_total else ""
            )
            lines.append(f"  largest {what} difference: {d.parameter}: {size}{scale}{count}")
        if d.note:
            lines.append(f"  note: {d.note}")
        for r in self.runs[1:]:
            if r.final_diff:
                k, v = r.final_diff[0]
                lines.append(
                    f"  final weights of run {r.index}: {len(r.final_diff)} tensors differ, largest {k} by {v:.3g}"
                )
        return "\n".join(lines)


def _short_files(files: Sequence[str], n: int = 4) -> str:
    names = [Path(f).name for f in files[:n]]
    return ", ".join(names) + (f", ... ({len(files)} images)" if len(files) > n else "")


def plot_losses(report: VerifyReport, path: str | Path) -> Path:
    """Write a PNG of the runs' loss curves (see :func:`loss_figure`)."""
    return save_figure(loss_figure(report), path)


def loss_figure(report: VerifyReport) -> Any:
    """The verify chart as a matplotlib figure: the runs' loss curves on top, their difference below.

    Identical runs: the lower panel says so in words (the difference is exactly 0 at every step; no
    curve, no log axis). Diverging runs: the lower panel draws each run's *relative* loss difference to run
    1, ``|loss - loss_1| / |loss_1|``, on a log axis with a few decade ticks; steps where the losses are
    still bit-identical are drawn as markers on the bottom edge, and the first divergence (which may be in
    the data or the gradients before the loss moves) is a red line with its step, kind and parameter, with
    everything after it shaded in both panels.
    """
    from matplotlib.ticker import LogLocator, MaxNLocator, NullFormatter

    fig = new_figure(8.0, 6.0)
    top = fig.add_subplot(2, 1, 1)
    bottom = fig.add_subplot(2, 1, 2, sharex=top)
    styles = ["-", "--", ":", "-."]
    ref = report.runs[0].losses() if report.runs else []
    relative: list[tuple[int, list[tuple[int, float]], list[int]]] = []
    for k, run in enumerate(report.runs):
        losses = run.losses()
        pts = [(s.step, v) for s, v in zip(run.steps, losses) if v is not None]
        marker = "o" if len(pts) <= 30 else None
        top.plot(
            [x for x, _ in pts],
            [y for _, y in pts],
            styles[k % len(styles)],
            color=f"C{k}",
            marker=marker,
            markersize=3,
            linewidth=1.5,
            label=f"run {run.index}",
        )
        if k:
            moved, same = [], []
            for s, v, r in zip(run.steps, losses, ref):
                if v is None or r is None:
                    continue
                if v != r:
                    moved.append((s.step, abs(v - r) / max(abs(r), 1e-300)))
                else:
                    same.append(s.step)
            relative.append((k, moved, same))
    first = report.first
    steps = max((len(r.steps) for r in report.runs), default=0)
    if first is None:
        title = f"{report.profile}: {len(report.runs)} runs bitwise identical"
        if report.nothing_compared:
            title = f"{report.profile}: {NOTHING} (the weights never changed from the initial ones)"
        bottom.axhline(0.0, color="C2", linewidth=2)
        bottom.set_ylim(-1, 1)
        bottom.set_yticks([0.0])
        bottom.set_yticklabels(["0"])
        bottom.text(
            0.5,
            0.62,
            f"bitwise identical: {len(report.runs)} runs x {steps} steps",
            transform=bottom.transAxes,
            ha="center",
            va="center",
            fontsize=13,
            color="C2",
            weight="bold",
        )
        bottom.text(
            0.5,
            0.3,
            "input batches, losses, every gradient and the final weights match exactly;\n"
            "the loss difference to run 1 is 0 at every step",
            transform=bottom.transAxes,
            ha="center",
            va="center",
            fontsize=9,
        )
        bottom.set_ylabel("loss - loss of run 1")
    else:
        title = f"{report.profile}: runs diverge at step {first.step} ({first.kind})"
        values = [v for _, moved, _ in relative for _, v in moved if v > 0 and math.isfinite(v)]
        low = min(values) if values else 1e-16
        high = max(values) if values else 1.0
        bottom.set_yscale("log")
        bottom.set_ylim(low / 10, max(high * 10, low * 100))
        bottom.yaxis.set_major_locator(LogLocator(base=10.0, numticks=6))
        bottom.yaxis.set_minor_formatter(NullFormatter())
        for k, moved, same in relative:
            marker = "o" if steps <= 30 else None
            bottom.plot(
                [x for x, _ in moved],
                [max(y, low / 10) for _, y in moved],
                styles[k % len(styles)],
                color=f"C{k}",
                marker=marker,
                markersize=3,
                linewidth=1.2,
                label=f"run {report.runs[k].index} vs run 1",
            )
            if same:
                bottom.plot(
                    same,
                    [0.02] * len(same),
                    "|",
                    color=f"C{k}",
                    markersize=8,
                    transform=bottom.get_xaxis_transform(),
                    label=f"run {report.runs[k].index}: loss identical",
                )
        right = max(steps, first.step) + 0.5
        for ax in (top, bottom):
            ax.axvline(first.step, color="red", linewidth=1.5)
            ax.axvspan(first.step, right, color="red", alpha=0.07)
        label = f"first divergence: step {first.step} ({first.kind})"
        if first.parameter:
            label += f"\n{first.parameter}"
        top.annotate(
            label,
            xy=(first.step, 0.95),
            xycoords=("data", "axes fraction"),
            va="top",
            ha="left",
            fontsize=8,
            color="red",
            xytext=(4, 0),
            textcoords="offset points",
        )
        bottom.set_ylabel("|loss - loss of run 1| / |loss of run 1|")
    top.set_title(title)
    top.set_ylabel("training loss (sum of components)")
    bottom.set_xlabel("optimizer step")
    bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper left" if ax is bottom else "upper right", fontsize=8)
    fig.tight_layout()
    return fig
