"""Running verify: train several times under a profile, record, compare, report."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from typing import Any, Union

import torch

from ...core import state as _state
from ...core.constants import DEFAULT_KEEP_MIB
from ...core.errors import ConfigError, did_you_mean
from ...core.profiles import Profile, load_profile
from ...core.quiet import quiet_ultralytics
from ..runtime import run_folder
from .compare import compare_runs
from .recorder import _Recorder
from .records import NONDETERMINISTIC_KERNEL, RESERVED, RunRecord
from .report import VerifyReport

__all__ = ["check_args", "check_callbacks", "progress_to_stderr", "record_runs", "verify"]

#: ``{event: fn}`` or ``{event: [fn, ...]}``: Ultralytics callbacks added to every run.
Callbacks = Mapping[str, Union[Callable[[Any], None], Sequence[Callable[[Any], None]]]]


def check_callbacks(callbacks: Callbacks | None) -> dict[str, list[Callable[[Any], None]]]:
    """``{event: fn}`` or ``{event: [fn, ...]}`` as ``{event: [fn, ...]}``; anything else: :class:`ConfigError`."""
    if callbacks is None:
        return {}
    if not isinstance(callbacks, Mapping):
        raise ConfigError(
            f"callbacks must be a dict {{event: fn or [fn, ...]}}, got {type(callbacks).__name__}; "
            "e.g. callbacks={'on_train_epoch_end': fn}"
        )
    from ...core.compat import callbacks as ul_callbacks

    events = list(ul_callbacks.get_default_callbacks())
    out: dict[str, list[Callable[[Any], None]]] = {}
    for event, value in callbacks.items():
        if not isinstance(event, str) or event not in events:
            hint = did_you_mean(str(event), events)
            some = ", ".join(e for e in events if e.startswith("on_train") or e == "on_fit_epoch_end")
            raise ConfigError(
                f"callbacks: {str(event)[:60]!r} is not an Ultralytics callback event.{hint} Events: {some}, ..."
            )
        fns = [value] if callable(value) else list(value) if isinstance(value, (list, tuple)) else None
        if fns is None or not all(callable(f) for f in fns):
            raise ConfigError(
                f"callbacks[{event!r}] must be a function or a list of functions, got {type(value).__name__}; "
                f"e.g. callbacks={{{event!r}: fn}}"
            )
        out[event] = fns
    return out


def check_args(args: Mapping[str, Any], runs: int, steps: int | None, keep_mib: float, *, min_runs: int = 2) -> None:
    """Check verify's arguments before anything runs (one-line :class:`ConfigError` otherwise)."""
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < min_runs:
        raise ConfigError(f"--runs must be an integer >= {min_runs}, got {runs!r}")
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise ConfigError(f"--steps must be a positive integer, got {steps!r}")
    if not (isinstance(keep_mib, (int, float)) and keep_mib >= 0):
        raise ConfigError(f"--keep-mib must be >= 0, got {keep_mib!r}")
    for key, why in RESERVED.items():
        if args.get(key) not in (None, False, 0):
            raise ConfigError(f"'{key}=' cannot be passed to verify: {why}")
    device = args.get("device")
    if isinstance(device, (list, tuple)) or (isinstance(device, str) and "," in device.strip(",")):
        raise ConfigError(f"verify runs on one device; got device={device!r} (pass a single device, e.g. device=0)")


def verify(
    profile: Profile | str,
    args: Mapping[str, Any],
    *,
    runs: int = 2,
    steps: int | None = None,
    keep_mib: float = DEFAULT_KEEP_MIB,
    callbacks: Callbacks | None = None,
    verbose: bool = False,
    progress: Callable[[str], None] | None = None,
    portable: bool = False,
    trace_ops: str | None = None,
    trace_file: str | os.PathLike[str] | None = None,
) -> VerifyReport:
    """Train ``runs`` times with the same arguments under ``profile`` and compare the runs step by step.

    Args:
        profile: A built-in name, a profile file path, or a :class:`~yolo_det.core.profiles.Profile`.
        args: Ultralytics train arguments (``model`` included), as ``yolo-det train`` would pass them (see
            :func:`yolo_det.tools.prepare.prepare`). Without ``project`` the runs go to a temporary folder
            that is removed afterwards.
        runs: How many trainings (>= 2; >= 1 with ``portable``, recording one run to save or compare elsewhere);
            run 1 is the reference.
        steps: Stop every run after this many optimizer steps (None: the epochs decide).
        keep_mib: Memory (MiB) the reference may use to keep gradient values of its first steps, which
            measuring the size of a difference needs.
        callbacks: Extra Ultralytics callbacks ``{event: fn}`` or ``{event: [fn, ...]}`` added to every run
            (after yolo-det's).
        verbose: Show Ultralytics' own log (it goes to stderr either way).
        progress: Called with a line of text as each run ends.
        portable: Also record what a comparison across processes and machines needs (the raw batch, the
            weights after every step, the run's record; see :mod:`yolo_det.tools.verify.crossverify`).
        trace_ops: Trace the ops of these steps of run 1 (``"3-5"``, ``"first:2"``; see
            :mod:`yolo_det.tools.trace`), into ``trace_file`` (None: run 1's folder).
        trace_file: Where run 1's op trace goes.

    Returns:
        The report; ``report.identical`` says whether the runs match bit for bit.
    """
    resolved = load_profile(profile)
    check_args(args, runs, steps, keep_mib, min_runs=1 if portable else 2)
    check_callbacks(callbacks)
    started = time.perf_counter()
    records = record_runs(
        resolved,
        args,
        runs=runs,
        steps=steps,
        keep_mib=keep_mib,
        callbacks=callbacks,
        verbose=verbose,
        progress=progress,
        portable=portable,
        trace_ops=trace_ops,
        trace_file=trace_file,
    )
    divergences = [d for r in records[1:] if (d := compare_runs(records[0], r)) is not None]
    return VerifyReport(
        profile=resolved.name,
        args=dict(args),
        runs=records,
        divergences=divergences,
        steps_requested=steps,
        seconds=time.perf_counter() - started,
        device=_device_name(args.get("device")),
    )


def record_runs(
    profile: Profile | str,
    args: Mapping[str, Any],
    *,
    runs: int,
    steps: int | None = None,
    keep_mib: float = DEFAULT_KEEP_MIB,
    callbacks: Callbacks | None = None,
    verbose: bool = False,
    progress: Callable[[str], None] | None = None,
    record: bool = True,
    portable: bool = False,
    trace_ops: str | None = None,
    trace_file: str | os.PathLike[str] | None = None,
) -> list[RunRecord]:
    """Train ``runs`` times as :func:`verify` does and return what each run recorded (no comparison).

    ``record=False`` trains the same way (same stopping rule) without recording anything: one such run is
    the baseline the cost of verification is measured against (``bench/verify_cost.py``). ``portable=True``
    also records what ``--save``/``--against`` need (see :func:`verify`); ``trace_ops`` traces run 1's ops.
    """
    from ultralytics import YOLO

    from ...integrations.fonts import ensure_local_font
    from ...integrations.ultralytics import attach
    from ..trace import OpTracer, parse_steps

    resolved = load_profile(profile)
    user_callbacks = check_callbacks(callbacks)
    trace_steps = parse_steps(trace_ops) if trace_ops is not None else None
    train_args = dict(args)
    model_src = train_args.pop("model")
    base_name = str(train_args.pop("name", None) or "verify")
    if train_args.get("plots", True):
        ensure_local_font()
    records: list[RunRecord] = []
    before = _state.snapshot()  # ultralytics.YOLO() itself sets CUBLAS_WORKSPACE_CONFIG: put everything back after
    with ExitStack() as stack:
        stack.callback(_state.restore, before)
        project = stack.enter_context(run_folder(train_args.pop("project", None)))
        stack.enter_context(quiet_ultralytics(verbose))
        for index in range(1, runs + 1):
            rec = RunRecord(index=index)
            recorder = _Recorder(
                rec,
                reference=records[0] if records else None,
                steps=steps,
                keep_bytes=int(keep_mib * 2**20),
                enabled=record,
                portable=portable,
            )
            from ...core.untrusted.safeload import guarded_torch_load

            with guarded_torch_load():  # a checkpoint loads through the allow-list
                model = YOLO(model_src)
            attach(model, resolved)
            recorder.add_to(model)
            if trace_steps is not None and index == 1:  # after the recorder: it unwraps the trainer first
                OpTracer(trace_steps, trace_file, meta={"profile": resolved.name}).add_to(model)
            for event, fns in user_callbacks.items():
                for fn in fns:
                    model.add_callback(event, fn)
            t0 = time.perf_counter()
            try:
                # verify's own run folders, replaced when they exist (a given exist_ok= changes nothing)
                model.train(**{**train_args, "project": project, "name": f"{base_name}-run{index}", "exist_ok": True})
            except RuntimeError as e:
                if NONDETERMINISTIC_KERNEL not in str(e):
                    raise
                first = " ".join(str(e).split())[:300]
                raise ConfigError(
                    f"run {index} stopped: {first} -- the profile '{resolved.name}' forbids this kernel; use a profile "
                    "that swaps the layer for a deterministic one, or one with 'backward: disable' (e.g. balanced)"
                ) from None
            rec.seconds = time.perf_counter() - t0
            rec.optimizer_steps = recorder.count
            records.append(rec)
            if progress is not None:
                progress(f"run {index}/{runs}: {recorder.count} optimizer steps in {rec.seconds:.1f} s")
    return records


def _device_name(device: Any) -> str:
    if device in (None, ""):
        return "cuda:0" if torch.cuda.is_available() else "cpu"
    text = str(device)
    return f"cuda:{text}" if text.isdigit() else text


def progress_to_stderr(line: str) -> None:
    """A ``progress`` callback for :func:`verify` that prints to stderr."""
    print(line, file=sys.stderr, flush=True)
