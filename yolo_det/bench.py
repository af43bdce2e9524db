"""What each determinism profile costs on the user's model and device: step time, throughput, peak memory.

:func:`bench` sets up one Ultralytics training (the user's model, data, batch size, device, AMP) and, once
the trainer has built its model, optimizer, scaler and loaders, runs its own timed loop in the same process:
every *configuration* (a profile's ``train`` phase, or one setting toggled from a base) gets ``warmup``
untimed steps, then blocks of ``block`` measured steps in round-robin order, the order rotating every round,
until each has ``steps`` measurements. A step is the trainer's own step: ``preprocess_batch``, forward
under the trainer's autocast, ``scaler.scale(loss).backward()``, ``trainer.optimizer_step()``. Every block
starts from the same weights, optimizer, EMA and scaler state, and cycles over the same few input batches
(loaded once), so configurations differ only by their settings; data loading is not timed. On a CPU
device the process CPU time of each step is recorded next to its wall time (steadier on a busy machine). A
configuration whose step raises (strict determinism meeting a kernel without a deterministic version) is
reported with its error and the others are still measured.

A configuration is applied with :func:`yolo_det.state.apply` (restored after each block), the backward
toggle with :class:`~yolo_det.backward.ToggleScaler`, and anything that changes the model itself through
scopes registered with :func:`register_scope`. The built-in scope applies the layer swaps
(:mod:`yolo_det.swaps`; the audit that chooses them runs once per model and policy, outside the timed
steps) and functional interception (:mod:`yolo_det.intercept`).

Peak memory: on CUDA ``torch.cuda.max_memory_allocated`` over each timed block (reset before it). On Linux
CPUs the process's peak resident set size (``VmHWM``) over one extra, untimed step per configuration, after
returning freed heap memory to the OS (``malloc_trim``) and resetting the high-water mark
(``/proc/self/clear_refs``); it includes everything resident (libraries, the model), so compare the rows'
differences. Elsewhere memory is not measured.

The bench's own cost per measured step (clock reads, bookkeeping, the loop) is measured with an empty step
and reported, in absolute terms and as a share of the median step.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from . import state as _state
from .backward import ToggleScaler
from .bench_stats import iqr, ratio_interval, verdict
from .errors import ConfigError
from .profiles import PhaseSettings, Profile, load_profile
from .runtime import new_figure, quiet_ultralytics, run_folder, save_figure, unwrap_model

__all__ = [
    "BASES",
    "DEFAULT_PROFILES",
    "ISOLATIONS",
    "BenchReport",
    "Isolation",
    "bench",
    "check_args",
    "parse_profiles",
    "plot_bench",
    "register_scope",
    "unregister_scope",
]

SCHEMA = "yolo-det/bench/1"
POOL_BATCHES = 4  # input batches loaded once and cycled through by every configuration
DEFAULT_PROFILES: tuple[str, ...] = ("repro", "balanced", "fast")
RESERVED = {
    "resume": "the bench trains from the model as given",
    "time": "the bench decides how many steps to run (use --steps)",
}

_OFF = PhaseSettings(deterministic_algorithms="off", cudnn_benchmark=False, cudnn_deterministic=False,
                     allow_tf32=False, fill_uninitialized_memory=False, backward="keep", swaps="none", intercept=False)
#: The bases settings are toggled from: everything off, and deterministic algorithms (strict) alone.
BASES: dict[str, PhaseSettings] = {"off": _OFF, "strict": _OFF.replace(deterministic_algorithms="strict")}


@dataclass(frozen=True)
class Isolation:
    """One setting measured on its own: ``base`` against ``base`` with ``changes``.

    Attributes:
        setting: The :class:`~yolo_det.profiles.PhaseSettings` field.
        base: A key of :data:`BASES`.
        changes: The fields changed from the base.
        devices: Device types where the setting can change anything (None: all).
        needs_scope: A setting applied by a registered scope (``swaps``, ``intercept``); measured only when a
            scope handles it.
    """

    setting: str
    base: str
    changes: Mapping[str, Any]
    devices: tuple[str, ...] | None = None
    needs_scope: str | None = None

    @property
    def label(self) -> str:
        return ", ".join(f"{k}={_fmt_value(v)}" for k, v in self.changes.items())


def _fmt_value(v: Any) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


ISOLATIONS: tuple[Isolation, ...] = (
    Isolation("deterministic_algorithms", "off", {"deterministic_algorithms": "strict"}),
    Isolation("cudnn_deterministic", "off", {"cudnn_deterministic": True}, devices=("cuda",)),
    Isolation("cudnn_benchmark", "off", {"cudnn_benchmark": True}, devices=("cuda",)),
    # TF32 is a CUDA tensor-core format: on a CPU the toggle has nothing to change, and a "cost" there is noise
    Isolation("allow_tf32", "off", {"allow_tf32": True}, devices=("cuda",)),
    Isolation("fill_uninitialized_memory", "strict", {"fill_uninitialized_memory": True}),
    Isolation("backward", "strict", {"backward": "disable"}),
    Isolation("swaps", "strict", {"swaps": "auto"}, needs_scope="swaps"),
    Isolation("intercept", "strict", {"intercept": True}, needs_scope="intercept"),
)

# ---------------------------------------------------------------------------------------------------------
# the extension point for settings that change the model (swaps, interception)

ScopeFactory = Callable[[torch.nn.Module, PhaseSettings], "AbstractContextManager[Any] | None"]
_SCOPES: list[tuple[ScopeFactory, frozenset[str]]] = []


def register_scope(factory: ScopeFactory, *, handles: Iterable[str]) -> None:
    """Register ``factory(model, settings) -> context manager | None``, entered around every measured block.

    This is how layer swaps and functional interception take part in the bench: the context manager
    applies what ``settings`` asks for to ``model`` (the trainer's model, in training mode) and undoes it on
    exit. It must keep the parameter objects (the optimizer holds them). ``handles`` names the settings it
    implements (``"swaps"``, ``"intercept"``); their rows are measured only once some scope handles them.
    Registering the same factory again replaces its entry.
    """
    unregister_scope(factory)
    _SCOPES.append((factory, frozenset(handles)))


def unregister_scope(factory: ScopeFactory) -> None:
    """Remove a factory added with :func:`register_scope` (no-op if absent)."""
    _SCOPES[:] = [(f, h) for f, h in _SCOPES if f is not factory]


_SWAP_PLANS: dict[tuple[int, str], list[Any]] = {}


def _model_scope(model: torch.nn.Module, settings: PhaseSettings) -> AbstractContextManager[Any] | None:
    """The built-in scope: ``settings.swaps`` on ``model`` and ``settings.intercept``, undone on exit."""
    if settings.swaps == "none" and not settings.intercept:
        return None
    from .intercept import interception
    from .swaps import SWAPS, swap_modules, unswap_modules

    stack = ExitStack()
    if settings.swaps != "none":
        key = (id(model), settings.swaps)
        if key not in _SWAP_PLANS:
            _SWAP_PLANS[key] = swap_modules(model, settings.swaps)
        else:
            modules = dict(model.named_modules())
            targets = {t.__name__: t for t in SWAPS.values()}
            for record in _SWAP_PLANS[key]:
                modules[record.path].__class__ = targets[record.target]
        stack.callback(unswap_modules, model)
    if settings.intercept:
        stack.enter_context(interception())
    return stack


def _handled() -> frozenset[str]:
    out: set[str] = set()
    for _, handles in _SCOPES:
        out |= handles
    return frozenset(out)


# ---------------------------------------------------------------------------------------------------------
# memory


class _Memory:
    """Peak memory of a block: CUDA allocator peak, or the process's peak RSS on Linux."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._libc: Any = None
        if device.type == "cuda":
            self.method = "torch.cuda.max_memory_allocated during the measured steps (reset before each block)"
            self.available = True
        elif sys.platform.startswith("linux") and os.path.exists("/proc/self/clear_refs"):
            name = ctypes.util.find_library("c")
            try:
                self._libc = ctypes.CDLL(name) if name else None
            except OSError:
                self._libc = None
            self.method = ("process peak resident set size (VmHWM) over one untimed step per configuration, after "
                           "malloc_trim(0) and a reset of the high-water mark (/proc/self/clear_refs); includes "
                           "libraries and the model, so compare differences between rows")
            self.available = self._reset_hwm()
        else:
            self.method = "not measured on this platform"
            self.available = False
        self.start = 0

    def _reset_hwm(self) -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return True
        except OSError:
            return False

    @staticmethod
    def _status(key: str) -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
        return 0

    def begin(self) -> None:
        if not self.available:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.start = torch.cuda.memory_allocated(self.device)
        else:
            if self._libc is not None and hasattr(self._libc, "malloc_trim"):
                self._libc.malloc_trim(0)
            self._reset_hwm()
            self.start = self._status("VmRSS")

    def end(self) -> tuple[int, int] | None:
        """``(peak, peak - level at begin)`` in bytes, or None when not measured."""
        if not self.available:
            return None
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
        else:
            peak = self._status("VmHWM")
        return peak, max(peak - self.start, 0)


# ---------------------------------------------------------------------------------------------------------
# the report


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
            lines.append(f"{r['profile']:<12}{r['step_ms']:>10.1f}{iqr:>16}{cpu:>9}{r['images_per_s']:>11.1f}{mem:>11}"
                         f"{step_mem:>10}{r['time_ratio']:>7.2f}x{ci:>14}  {word:<13}{mratio:>8}")
        lines.append("IQR: interquartile range of the step times; CPU ms: process CPU time per step (CPU devices; "
                     "robust to a busy machine); step mem: peak above the level at the start of a block; time, memory: "
                     "ratio to the fastest profile and to the smallest peak; 95% CI: bootstrap interval of the time "
                     "ratio; 'within noise': the interval contains 1 or the difference is under 1%")
        for r in self.rows:
            for note in r["notes"]:
                lines.append(f"  {r['profile']}: {note}")
        if self.settings:
            lines += ["", "what each setting costs on its own (one setting toggled from a base; + is slower):",
                      f"{'setting':<34}{'base':>8}{'base ms':>10}{'toggled ms':>12}{'cost':>9}{'95% CI':>18}  "
                      f"{'verdict':<13}{'CPU cost':>10}{'mem delta':>11}"]
            for s in self.settings:
                if s["status"] != "measured":
                    lines.append(f"{s['label']:<34}{s['base']:>8}  {s['status']}")
                    continue
                mem = _fmt_bytes(s["memory_delta_bytes"], signed=True)
                cpu_cost = f"{s['cpu_cost_pct']:+.1f}%" if s.get("cpu_cost_pct") is not None else "-"
                ci = "-" if s.get("cost_pct_low") is None else f"{s['cost_pct_low']:+.1f}..{s['cost_pct_high']:+.1f}%"
                lines.append(f"{s['label']:<34}{s['base']:>8}{s['base_ms']:>10.1f}{s['toggled_ms']:>12.1f}"
                             f"{s['cost_pct']:>+8.1f}%{ci:>18}  {s.get('verdict') or '-':<13}{cpu_cost:>10}{mem:>11}")
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
    panels = [("median step time (ms), bar: IQR", step, (low, high)),
              ("throughput (images/s)", [r["images_per_s"] for r in rows], None),
              ("peak memory (MiB)", [None if r["peak_memory_bytes"] is None else r["peak_memory_bytes"] / 2**20
                                     for r in rows], None)]
    for k, (title, values, err) in enumerate(panels):
        ax = fig.add_subplot(n_rows, 3, k + 1)
        vals = [v if v is not None else 0.0 for v in values]
        bars = ax.bar(names, vals, color=[colors[j % len(colors)] for j in range(len(names))],
                      yerr=None if err is None else [err[0], err[1]], capsize=4 if err else 0)
        for j, (bar, v) in enumerate(zip(bars, values)):
            text = "n/a" if v is None else (f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}")
            if k == 0:
                word = rows[j].get("time_ratio_verdict")
                text += {"reference": "\nfastest", "within noise": "\nwithin noise", "slower": "\nslower",
                         "faster": "\nfaster"}.get(word or "", "")
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
            bar_colors.append("#bbbbbb" if not m or word == "within noise" else
                              "#c44e52" if s["cost_pct"] > 0 else "#55a868")
        xerr_low = [c - s["cost_pct_low"] if m and s.get("cost_pct_low") is not None else 0.0
                    for s, m, c in zip(shown, measured, costs)]
        xerr_high = [s["cost_pct_high"] - c if m and s.get("cost_pct_high") is not None else 0.0
                     for s, m, c in zip(shown, measured, costs)]
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
            ax.annotate(text, (max(c, 0.0) + hi + span * 0.03, y), va="center", fontsize=8,
                        color="#555555" if not m or s.get("verdict") == "within noise" else "black")
        ax.set_xlabel("step time change when toggled on its own (%), bar: 95% bootstrap interval; "
                      "grey: within noise or not applicable")
        ax.grid(True, axis="x", alpha=0.3)
    i = report.info
    fig.suptitle(f"yolo-det bench: {i['model']} on {i['device']}, batch {i['batch']}, imgsz {i['imgsz']}, "
                 f"{i['steps']} steps per configuration", fontsize=11)
    fig.tight_layout()
    return save_figure(fig, path)


# ---------------------------------------------------------------------------------------------------------
# running


class _Done(Exception):
    """Ends the Ultralytics training once the bench has run inside its setup callback."""


def parse_profiles(profiles: str | Sequence[str | Profile]) -> list[Profile]:
    items = [p.strip() for p in profiles.split(",")] if isinstance(profiles, str) else list(profiles)
    if not items or any(isinstance(p, str) and not p for p in items):
        raise ConfigError("--profiles needs a comma-separated list of profiles, e.g. --profiles repro,balanced,fast")
    loaded = [load_profile(p) for p in items]
    names = [p.name for p in loaded]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"--profiles names {', '.join(dupes)} more than once")
    return loaded


def check_args(args: Mapping[str, Any], steps: int, warmup: int, block: int) -> None:
    """Check the bench's own arguments (one-line :class:`~yolo_det.errors.ConfigError` on bad input)."""
    for name, value, low in (("--steps", steps, 1), ("--warmup", warmup, 0), ("--block", block, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(f"{name} must be an integer >= {low}, got {value!r}")
    for key, why in RESERVED.items():
        if args.get(key) not in (None, False, 0):
            raise ConfigError(f"'{key}=' cannot be passed to bench: {why}")
    device = args.get("device")
    if isinstance(device, (list, tuple)) or (isinstance(device, str) and "," in device.strip(",")):
        raise ConfigError(f"bench runs on one device; got device={device!r} (pass a single device, e.g. device=0)")


def bench(
    profiles: str | Sequence[str | Profile],
    args: Mapping[str, Any],
    *,
    steps: int = 20,
    warmup: int = 3,
    block: int = 5,
    isolate: bool = True,
    verbose: bool = False,
    progress: Callable[[str], None] | None = None,
    kernel_steps: int = 0,
) -> BenchReport:
    """Measure each profile's training step on the model and device of ``args`` in one process.

    Args:
        profiles: Profile names or files (a comma-separated string or a sequence), or Profiles.
        args: Ultralytics train arguments, ``model`` included (see :func:`yolo_det.commands.train.prepare`).
            ``plots`` and ``val`` default to False here. Without ``project`` the run folder is temporary.
        steps: Measured steps per configuration.
        warmup: Untimed steps per configuration before its first measurement.
        block: Consecutive steps a configuration runs before the next one takes over.
        isolate: Also measure each setting toggled on its own (see :data:`ISOLATIONS`).
        verbose: Show Ultralytics' own log (on stderr).
        progress: Called with a line of text as the bench advances.
        kernel_steps: On CUDA, after the measurement, run this many extra steps of each profile under
            ``torch.profiler`` and report its GPU kernels (``rows[i]["kernels"]``: name, calls and self
            device time per step, largest first); 0 (default) or a CPU device: not profiled.

    Returns:
        The report (``rows`` has one entry per profile, in the order given).
    """
    from ultralytics import YOLO

    loaded = parse_profiles(profiles)
    check_args(args, steps, warmup, block)
    train_args = {"plots": False, "val": False, **dict(args)}
    model_src = train_args.pop("model")
    train_args.pop("name", None)
    result: dict[str, Any] = {}

    def run_bench(trainer: Any) -> None:
        try:
            result["report"] = _Runner(trainer, loaded, steps=steps, warmup=warmup, block=block, isolate=isolate,
                                       progress=progress, model_name=str(model_src), kernel_steps=kernel_steps).run()
        finally:
            for loader in (getattr(trainer, "train_loader", None), getattr(trainer, "test_loader", None)):
                if hasattr(loader, "close"):
                    loader.close()
        raise _Done

    before = _state.snapshot()
    try:
        with run_folder(train_args.pop("project", None)) as project, quiet_ultralytics(verbose):
            model = YOLO(model_src)
            model.add_callback("on_pretrain_routine_end", run_bench)
            try:
                model.train(**train_args, project=project, name="bench", exist_ok=True)
            except _Done:
                pass
    finally:
        _state.restore(before)
    if "report" not in result:  # pragma: no cover - a trainer that never reaches on_pretrain_routine_end
        raise ConfigError("the trainer ended before its setup finished; nothing was measured")
    return result["report"]


def _interval_fields(prefix: str, cfg: _Config, ref: _Config | None) -> dict[str, Any]:
    """``<prefix>_low``, ``<prefix>_high`` (95% bootstrap interval of the ratio of medians ``cfg / ref``) and
    ``<prefix>_verdict`` (``slower``, ``faster`` or ``within noise``); None where it cannot be computed."""
    empty = {f"{prefix}_low": None, f"{prefix}_high": None, f"{prefix}_verdict": None}
    if ref is None or not cfg.times or not ref.times:
        return empty
    if ref is cfg:
        return {f"{prefix}_low": 1.0, f"{prefix}_high": 1.0, f"{prefix}_verdict": "reference"}
    ratio, low, high = ratio_interval(cfg.times, ref.times)
    return {f"{prefix}_low": low, f"{prefix}_high": high, f"{prefix}_verdict": verdict(ratio, low, high)}


class _Runner:
    """The timed loop inside a set-up trainer."""

    def __init__(self, trainer: Any, profiles: list[Profile], *, steps: int, warmup: int, block: int, isolate: bool,
                 progress: Callable[[str], None] | None, model_name: str, kernel_steps: int = 0) -> None:
        self.trainer = trainer
        self.kernel_steps = kernel_steps
        self.profiles = profiles
        self.steps, self.warmup, self.block = steps, warmup, block
        self.isolate = isolate
        self.progress = progress or (lambda line: None)
        self.model_name = model_name
        self.device: torch.device = trainer.device
        self.memory = _Memory(self.device)
        self.sync: Callable[[], None] | None = (lambda: torch.cuda.synchronize(self.device)) \
            if self.device.type == "cuda" else None

    # -- configurations -----------------------------------------------------------------------------
    def _configs(self) -> tuple[dict[str, _Config], list[tuple[Profile, str]], list[tuple[Isolation, str, str | None, str]]]:
        by_settings: dict[PhaseSettings, _Config] = {}

        def config(key: str, settings: PhaseSettings) -> str:
            if settings not in by_settings:
                by_settings[settings] = _Config(key=key, settings=settings)
            return by_settings[settings].key

        profile_keys = [(p, config(f"profile:{p.name}", p.train)) for p in self.profiles]
        isolations: list[tuple[Isolation, str, str | None, str]] = []
        handled = _handled()
        if self.isolate:
            for iso in ISOLATIONS:
                if iso.devices is not None and self.device.type not in iso.devices:
                    isolations.append((iso, "", None, f"not applicable on {self.device.type}"))
                elif iso.needs_scope is not None and iso.needs_scope not in handled:
                    isolations.append((iso, "", None, "not measured: no implementation registered "
                                                      "(yolo_det.bench.register_scope)"))
                else:
                    base = config(f"base:{iso.base}", BASES[iso.base])
                    toggled = config(f"toggle:{iso.setting}", BASES[iso.base].replace(**iso.changes))
                    isolations.append((iso, base, toggled, "measured"))
        configs = {c.key: c for c in by_settings.values()}
        for p, key in profile_keys:
            for name in ("swaps", "intercept"):
                value = getattr(p.train, name)
                if value not in ("none", False) and name not in handled:
                    configs[key].notes.append(f"{name}={_fmt_value(value)} not applied (no implementation registered)")
        return configs, profile_keys, isolations

    # -- training state -------------------------------------------------------------------------------
    def _save_state(self) -> dict[str, Any]:
        t = self.trainer

        def cpu(obj: Any) -> Any:
            if isinstance(obj, torch.Tensor):
                return obj.detach().to("cpu", copy=True)
            if isinstance(obj, dict):
                return {k: cpu(v) for k, v in obj.items()}
            if isinstance(obj, list):
                return [cpu(v) for v in obj]
            return obj

        saved = {"model": cpu(unwrap_model(t.model).state_dict()), "optimizer": cpu(t.optimizer.state_dict()),
                 "scaler": cpu(ToggleScaler.unwrap(t.scaler).state_dict())}
        ema = getattr(t, "ema", None)
        if ema is not None:
            saved["ema"] = cpu(ema.ema.state_dict())
            saved["ema_updates"] = ema.updates
        return saved

    def _load_state(self, saved: dict[str, Any]) -> None:
        t = self.trainer
        unwrap_model(t.model).load_state_dict(saved["model"])
        t.optimizer.load_state_dict(saved["optimizer"])
        t.optimizer.zero_grad(set_to_none=True)
        ToggleScaler.unwrap(t.scaler).load_state_dict(saved["scaler"])
        if "ema" in saved:
            t.ema.ema.load_state_dict(saved["ema"])
            t.ema.updates = saved["ema_updates"]

    # -- steps ----------------------------------------------------------------------------------------
    def _step_fn(self) -> Callable[[dict[str, Any]], None]:
        from ultralytics.utils.torch_utils import autocast

        t = self.trainer
        amp = torch.bfloat16 if getattr(t.args, "amp", None) == "bf16" else bool(t.amp)
        device_type = self.device.type

        def step(batch: dict[str, Any]) -> None:
            with autocast(amp, device=device_type):
                b = t.preprocess_batch(dict(batch))
                loss, _ = t.model(b)
                loss = loss.sum()
            t.scaler.scale(loss).backward()
            t.optimizer_step()

        return step

    def _block(self, step: Callable[[dict[str, Any]], None], pool: list[dict[str, Any]], n: int,
               times: list[float] | None, cpu_times: list[float] | None = None) -> None:
        """Run ``n`` steps; append each one's wall seconds to ``times`` and, on a CPU device, its process CPU
        seconds to ``cpu_times`` (None: untimed)."""
        clock = time.perf_counter
        cpu_clock = time.process_time if cpu_times is not None else None
        sync = self.sync
        size = len(pool)
        c0 = 0.0
        for j in range(n):
            batch = pool[j % size]
            if cpu_clock is not None:
                c0 = cpu_clock()
            t0 = clock()
            step(batch)
            if sync is not None:
                sync()
            if times is not None:
                times.append(clock() - t0)
            if cpu_clock is not None and cpu_times is not None:
                cpu_times.append(cpu_clock() - c0)

    def _overhead(self, pool: list[dict[str, Any]], median_step: float) -> dict[str, Any]:
        """The cost of :meth:`_block`'s bookkeeping per step, measured with an empty step."""

        def empty(batch: dict[str, Any]) -> None:
            return None

        n = 2000
        samples = []
        for _ in range(5):
            times: list[float] = []
            t0 = time.perf_counter()
            self._block(empty, pool, n, times, [] if self.device.type == "cpu" else None)
            samples.append((time.perf_counter() - t0) / n)
        per_step = statistics.median(samples)
        return {"per_step_us": per_step * 1e6,
                "percent_of_median_step": 100.0 * per_step / median_step if median_step > 0 else math.nan,
                "method": "the measurement loop run with an empty step (clock reads, sync, bookkeeping), "
                          f"{n} steps x 5, median"}

    def _apply(self, stack: ExitStack, settings: PhaseSettings) -> None:
        t = self.trainer
        before = _state.apply(settings)
        stack.callback(_state.restore, before)
        if settings.backward == "disable":
            original = t.scaler
            t.scaler = ToggleScaler(original)
            stack.callback(setattr, t, "scaler", original)
        model = unwrap_model(t.model)
        for factory, _ in list(_SCOPES):
            cm = factory(model, settings)
            if cm is not None:
                stack.enter_context(cm)

    def _measured_block(self, cfg: _Config, step: Callable[[dict[str, Any]], None], pool: list[dict[str, Any]],
                        n: int) -> None:
        """Time ``n`` steps of ``cfg``; measure its peak memory (see :class:`_Memory`).

        On CUDA the peak is read around every timed block (resetting the peak counter costs nothing). On a
        CPU, measuring means returning freed memory to the OS first, which the next step pays for in page
        faults; so there the peak is taken once per configuration, on one extra untimed step after its first
        timed block.
        """
        if self.device.type == "cuda":
            self.memory.begin()
            self._block(step, pool, n, cfg.times)
            self._record_memory(cfg)
            return
        self._block(step, pool, n, cfg.times, cfg.cpu_times)
        if cfg.peak is None and self.memory.available:
            self.memory.begin()
            self._block(step, pool, 1, None)
            self._record_memory(cfg)

    def _profile_kernels(self, cfg: _Config, step: Callable[[dict[str, Any]], None], pool: list[dict[str, Any]],
                         top: int = 60) -> None:
        """Run ``kernel_steps`` steps of ``cfg`` under ``torch.profiler``; keep its largest GPU kernels."""
        from torch.profiler import ProfilerActivity, profile

        n = self.kernel_steps
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            self._block(step, pool, n, None)
        kernels = []
        for e in prof.key_averages():
            if str(getattr(e, "device_type", "")).split(".")[-1] != "CUDA":
                continue
            self_us = getattr(e, "self_device_time_total", None)
            if self_us is None:  # older torch
                self_us = getattr(e, "self_cuda_time_total", 0.0)
            kernels.append({"name": e.key, "calls_per_step": e.count / n, "self_us_per_step": float(self_us) / n})
        kernels.sort(key=lambda k: -k["self_us_per_step"])
        cfg.kernels = kernels[:top]

    def _record_memory(self, cfg: _Config) -> None:
        mem = self.memory.end()
        if mem is not None:
            cfg.peak = max(cfg.peak or 0, mem[0])
            cfg.peak_delta = max(cfg.peak_delta or 0, mem[1])

    def _guarded(self, cfg: _Config, body: Callable[[_Config], None], saved: dict[str, Any]) -> None:
        """Run ``body`` under ``cfg`` from the saved state; a RuntimeError marks the configuration failed."""
        if cfg.error is not None:
            return
        try:
            with ExitStack() as stack:
                self._load_state(saved)
                self._apply(stack, cfg.settings)
                body(cfg)
        except RuntimeError as e:  # e.g. strict determinism meeting a kernel without a deterministic version
            cfg.error = " ".join(str(e).split())[:300]
            cfg.times.clear()
            cfg.cpu_times.clear()
            self.trainer.optimizer.zero_grad(set_to_none=True)
            self.progress(f"bench: {cfg.key} failed: {cfg.error}")

    def run(self) -> BenchReport:
        t = self.trainer
        configs, profile_keys, isolations = self._configs()
        it = iter(t.train_loader)
        pool = [next(it) for _ in range(max(1, min(len(t.train_loader), POOL_BATCHES)))]
        del it
        batch_size = int(pool[0]["img"].shape[0])
        (getattr(t, "_model_train", None) or t.model.train)()
        step = self._step_fn()
        saved = self._save_state()
        order = list(configs)
        self.progress(f"bench: {len(order)} configurations x ({self.warmup} warm-up + {self.steps} measured steps) "
                      f"on {self.device}")
        try:
            for key in order:  # warm-up, untimed
                self._guarded(configs[key], lambda cfg: self._block(step, pool, self.warmup, None), saved)
            rounds = math.ceil(self.steps / self.block)
            for r in range(rounds):
                shift = r % len(order)
                for key in order[shift:] + order[:shift]:
                    cfg = configs[key]
                    n = min(self.block, self.steps - len(cfg.times))
                    if n > 0 and cfg.error is None:
                        self._guarded(cfg, lambda cfg, n=n: self._measured_block(cfg, step, pool, n), saved)
                self.progress(f"bench: round {r + 1}/{rounds} done")
            if self.kernel_steps > 0 and self.device.type == "cuda":
                for _, key in profile_keys:
                    self._guarded(configs[key], lambda cfg: self._profile_kernels(cfg, step, pool), saved)
        finally:
            self._load_state(saved)
        timed = [configs[k].median() for _, k in profile_keys if configs[k].error is None and configs[k].times]
        fastest = min(timed) if timed else math.nan
        fastest_cfg = next((configs[k] for _, k in profile_keys if configs[k].error is None and configs[k].times
                            and configs[k].median() == fastest), None)
        peaks = [configs[k].peak for _, k in profile_keys if configs[k].peak is not None]
        smallest = min(peaks) if peaks else None
        rows = []
        for p, key in profile_keys:
            c = configs[key]
            ok = c.error is None and bool(c.times)
            med = c.median()
            q1, q3 = c.quartiles()
            rows.append({
                "profile": p.name,
                "source": p.source,
                "steps": len(c.times) if ok else 0,
                "step_ms": med * 1e3 if ok else None,
                "step_ms_q1": q1 * 1e3 if ok else None,
                "step_ms_q3": q3 * 1e3 if ok else None,
                "step_cpu_ms": c.cpu_median() * 1e3 if ok and c.cpu_median() is not None else None,
                "step_times_ms": [t * 1e3 for t in c.times] if ok else [],
                "images_per_s": batch_size / med if ok and med > 0 else None,
                "peak_memory_bytes": c.peak if ok else None,
                "peak_memory_over_start_bytes": c.peak_delta if ok else None,
                "time_ratio": med / fastest if ok and fastest > 0 else None,
                **_interval_fields("time_ratio", c, fastest_cfg if ok else None),
                "throughput_ratio": fastest / med if ok and med > 0 else None,
                "memory_ratio": (c.peak / smallest) if ok and c.peak is not None and smallest else None,
                "error": c.error,
                "settings": {k: v for k, v in c.settings.to_dict().items() if k not in {"seed"}},
                "notes": list(c.notes),
                "kernels": c.kernels,
            })
        setting_rows = []
        for iso, base_key, toggled_key, status in isolations:
            row: dict[str, Any] = {"setting": iso.setting, "label": iso.label, "base": iso.base,
                                   "changes": dict(iso.changes), "status": status, "base_ms": None, "toggled_ms": None,
                                   "cost_ratio": None, "cost_pct": None, "memory_delta_bytes": None,
                                   "base_cpu_ms": None, "toggled_cpu_ms": None, "cpu_cost_pct": None,
                                   "cost_pct_low": None, "cost_pct_high": None, "verdict": None}
            if toggled_key is not None:
                b, tg = configs[base_key], configs[toggled_key]
                failed = b.error or tg.error
                if failed:
                    row["status"] = f"error: {failed}"
                else:
                    bm, tm = b.median(), tg.median()
                    bc, tc = b.cpu_median(), tg.cpu_median()
                    if bc and tc:
                        row.update(base_cpu_ms=bc * 1e3, toggled_cpu_ms=tc * 1e3, cpu_cost_pct=100.0 * (tc / bc - 1.0))
                    interval = _interval_fields("cost", tg, b)
                    row.update(base_ms=bm * 1e3, toggled_ms=tm * 1e3, cost_ratio=tm / bm,
                               cost_pct=100.0 * (tm / bm - 1.0), verdict=interval["cost_verdict"],
                               cost_pct_low=None if interval["cost_low"] is None else 100.0 * (interval["cost_low"] - 1),
                               cost_pct_high=None if interval["cost_high"] is None else 100.0 * (interval["cost_high"] - 1),
                               memory_delta_bytes=(tg.peak - b.peak) if tg.peak is not None and b.peak is not None
                               else None)
            setting_rows.append(row)
        all_timed = [c.median() for c in configs.values() if c.error is None and c.times]
        overhead = self._overhead(pool, statistics.median(all_timed) if all_timed else math.nan)
        info = {
            "model": self.model_name,
            "device": str(self.device),
            "device_name": torch.cuda.get_device_name(self.device) if self.device.type == "cuda"
            else (platform.processor() or platform.machine()),
            "imgsz": int(pool[0]["img"].shape[-1]),
            "batch": batch_size,
            "amp": bool(t.amp),
            "steps": self.steps,
            "warmup": self.warmup,
            "block": self.block,
            "configurations": len(order),
            "memory_method": self.memory.method,
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count(),
        }
        return BenchReport(rows=rows, settings=setting_rows, overhead=overhead, info=info)


register_scope(_model_scope, handles={"swaps", "intercept"})
