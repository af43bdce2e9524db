"""Two runs' curves in one picture: loss and metric values per epoch, the first epoch they part marked.

:func:`read_curves` reads a run's ``results.csv`` (Ultralytics writes one row per epoch into the run folder): a
file from others, read as data only, within limits (:data:`MAX_BYTES`, :data:`MAX_ROWS`, :data:`MAX_COLUMNS`),
every value a number, a column name shown only as printable text cut short. :func:`first_parting_epoch` is the
first epoch at which two runs' logged values differ. :func:`write_curves_png` draws one panel per loss or metric
column, run A solid and run B dashed, with a vertical line at the parting epoch, on a figure of its own (an Agg
canvas: no pyplot, no backend or ``rcParams`` changed) and writes the PNG atomically. ``yolo-det diff --png``
calls it; so can any command that compares two runs and knows where they parted.
"""

from __future__ import annotations

import csv
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import ConfigError
from ..core.untrusted.textfile import TextTooLarge, read_text
from .runtime import new_figure, save_figure

__all__ = [
    "MAX_BYTES",
    "MAX_COLUMNS",
    "MAX_ROWS",
    "RESULTS_NAME",
    "Curves",
    "curve_names",
    "curves_figure",
    "diff_curves_png",
    "first_parting_epoch",
    "read_curves",
    "results_path",
    "write_curves_png",
]

#: The file of a run folder that holds its values per epoch.
RESULTS_NAME = "results.csv"
#: Largest ``results.csv`` read (Ultralytics writes about 200 bytes an epoch).
MAX_BYTES = 8 * 2**20
#: Most epochs (rows) and columns read.
MAX_ROWS, MAX_COLUMNS = 100_000, 100
#: Most panels drawn.
MAX_PANELS = 16
_NAME = re.compile(r"[^A-Za-z0-9_/().:\- ]")


@dataclass(frozen=True)
class Curves:
    """A run's values per epoch, as read from its ``results.csv``.

    Attributes:
        source: The file they were read from.
        epochs: The ``epoch`` column (1 for the first epoch, as Ultralytics writes it).
        series: ``column -> value per epoch`` of every other column, in the file's order.
    """

    source: str
    epochs: tuple[int, ...]
    series: dict[str, tuple[float, ...]]


def results_path(run: str | os.PathLike[str]) -> Path:
    """The ``results.csv`` of ``run``: a run folder, or a file in one (its ``determinism.json``, the CSV itself)."""
    path = Path(run).expanduser()
    if path.is_dir():
        return path / RESULTS_NAME
    return path if path.name == RESULTS_NAME else path.parent / RESULTS_NAME


def _number(text: str, where: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"{where} is not a number; pass a {RESULTS_NAME} Ultralytics wrote") from None


def read_curves(run: str | os.PathLike[str]) -> Curves:
    """Read the values per epoch of ``run`` (see :func:`results_path`).

    Raises:
        ConfigError: The file is missing, too large, not a CSV with an ``epoch`` column and numbers, or has more
            rows or columns than the limits (one line naming it).
    """
    path = results_path(run)
    shown = _printable(str(path), 200)
    if not path.is_file():
        raise ConfigError(f"no {RESULTS_NAME} at '{shown}': the run's curves cannot be drawn")
    try:
        text = read_text(path, limit=MAX_BYTES, what=RESULTS_NAME)
    except (TextTooLarge, OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read '{shown}': {_printable(str(e), 200)}") from None
    rows = csv.reader(text.splitlines())
    header = [h.strip() for h in next(rows, [])]
    if "epoch" not in header or len(header) > MAX_COLUMNS:
        raise ConfigError(f"'{shown}' is not a {RESULTS_NAME} of at most {MAX_COLUMNS} columns with an epoch column")
    epochs: list[int] = []
    values: list[list[float]] = [[] for _ in header]
    for i, row in enumerate(rows, start=2):
        if not row:
            continue
        if len(epochs) >= MAX_ROWS:
            raise ConfigError(f"'{shown}' has more than {MAX_ROWS} epochs")
        if len(row) != len(header):
            raise ConfigError(f"line {i} of '{shown}' has {len(row)} values for {len(header)} columns")
        numbers = [_number(v.strip(), f"line {i} of '{shown}'") for v in row]
        for column, v in zip(values, numbers):
            column.append(v)
        epoch = numbers[header.index("epoch")]
        if not (math.isfinite(epoch) and epoch == int(epoch)):
            raise ConfigError(f"line {i} of '{shown}': the epoch is not a whole number")
        epochs.append(int(epoch))
    series = {name: tuple(v) for name, v in zip(header, values) if name != "epoch"}
    return Curves(source=str(path), epochs=tuple(epochs), series=series)


def curve_names(*runs: Curves) -> list[str]:
    """The loss and metric columns of ``runs`` (first run's order first), at most :data:`MAX_PANELS`."""
    names: list[str] = []
    for curves in runs:
        names += [n for n in curves.series if ("loss" in n or n.startswith("metrics/")) and n not in names]
    return names[:MAX_PANELS]


def first_parting_epoch(a: Curves, b: Curves) -> int | None:
    """The first epoch both runs logged at which a loss or metric column both hold differs (None: none does)."""
    names = [n for n in curve_names(a, b) if n in a.series and n in b.series]
    at_b = {e: i for i, e in enumerate(b.epochs)}
    for i, epoch in enumerate(a.epochs):
        j = at_b.get(epoch)
        if j is not None and any(a.series[n][i] != b.series[n][j] for n in names):
            return epoch
    return None


def _printable(text: str, limit: int = 40) -> str:
    """``text`` with only plain characters (matplotlib reads ``$`` as mathematics), cut to ``limit``."""
    text = _NAME.sub("?", text)
    return text if len(text) <= limit else "..." + text[-(limit - 3) :]


def curves_figure(runs: list[tuple[str, Curves]], parted_epoch: int | None = None) -> Any:
    """A matplotlib figure (Agg canvas) of ``runs`` (``(label, curves)``, ``A`` solid, ``B`` dashed): one panel
    per loss or metric column, a red dotted line at ``parted_epoch``."""
    from matplotlib.ticker import MaxNLocator

    names = curve_names(*(c for _, c in runs))
    cols = max(1, min(4, len(names)))
    rows = max(1, -(-len(names) // cols))
    fig = new_figure(3.6 * cols, 2.8 * rows + 0.6)
    axes = list(fig.subplots(rows, cols, squeeze=False).flat)
    styles = {"A": {"linestyle": "-", "marker": "o"}, "B": {"linestyle": "--", "marker": "x"}}
    for ax, name in zip(axes, names):
        for label, curves in runs:
            if name in curves.series:
                style = styles.get(label, {})
                ax.plot(curves.epochs, curves.series[name], markersize=3, label=f"run {label}", **style)
        if parted_epoch is not None:
            ax.axvline(parted_epoch, color="red", linestyle=":", label=f"parted at epoch {parted_epoch}")
        ax.set_title(_printable(name), fontsize=9)
        ax.set_xlabel("epoch", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in axes[len(names) :]:
        ax.set_visible(False)
    axes[0].legend(fontsize=7)
    title = "   ".join(f"{label}: {_printable(str(Path(c.source).parent), 60)}" for label, c in runs)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def write_curves_png(
    run_a: str | os.PathLike[str],
    run_b: str | os.PathLike[str],
    out: str | os.PathLike[str],
    parted_epoch: int | None = None,
) -> list[str]:
    """Draw both runs' loss and metric curves per epoch, with ``parted_epoch`` marked, into the PNG ``out``.

    Args:
        run_a, run_b: Run folders (or files in them, see :func:`results_path`).
        out: The PNG to write (atomically).
        parted_epoch: The first epoch at which the runs parted (None: no mark).

    Returns:
        One line per run whose curves are left out (its ``results.csv`` missing or unreadable).

    Raises:
        ConfigError: Neither run has curves to draw.
    """
    found: list[tuple[str, Curves]] = []
    notes: list[str] = []
    for label, run in (("A", run_a), ("B", run_b)):
        try:
            found.append((label, read_curves(run)))
        except ConfigError as e:
            notes.append(f"run {label}: {e}; only the other run's curves are drawn")
    if not any(curve_names(c) for _, c in found):
        raise ConfigError("neither run has loss or metric curves to draw: " + " / ".join(notes or ["no columns"]))
    fig = curves_figure(found, parted_epoch)
    save_figure(fig, out)
    return notes


def diff_curves_png(
    run_a: str | os.PathLike[str], run_b: str | os.PathLike[str], out: str | os.PathLike[str], *, parted: bool
) -> list[str]:
    """``yolo-det diff --png``: :func:`write_curves_png`, marking, when the runs' weights differ (``parted``), the
    first epoch whose logged values differ (:func:`first_parting_epoch`). Returns the lines to show."""
    epoch = None
    if parted:
        try:
            epoch = first_parting_epoch(read_curves(run_a), read_curves(run_b))
        except ConfigError:
            epoch = None  # a run without curves: write_curves_png says so
    notes = write_curves_png(run_a, run_b, out, parted_epoch=epoch)
    if parted and epoch is None and not notes:
        notes.append("the weights differ, but the logged values agree at every epoch both runs logged: no epoch marked")
    elif epoch is not None:
        notes.append(f"the logged values first differ at epoch {epoch} (marked)")
    return [*notes, f"curves written to {out}"]
