"""``yolo-det verify --resume-at K``: prove that an interrupted and resumed training ends as the uninterrupted one.

Run 1 trains straight through. Run 2 trains the same configuration, is stopped cleanly right after the
checkpoint (and resume state) of epoch ``K`` is written (as a crash or a cancelled job would leave it,
``last.pt`` unstripped), and is then resumed from that ``last.pt`` exactly as ``yolo-det train
resume=...`` does. Both parts of run 2 are recorded as one run (the micro-batches accumulated before the
interruption carry over into the first resumed optimizer step) and compared step by step with run 1, in
the report format of :func:`yolo_det.tools.verify.verify`.

``drop_state=True`` deletes the resume state before resuming: the demonstration of what plain
Ultralytics resume gives (the report then names the first divergence, at the first resumed step).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from ...core import state as _state
from ...core.constants import DEFAULT_KEEP_MIB
from ...core.errors import ConfigError
from ...core.profiles import Profile, load_profile
from ...core.quiet import quiet_ultralytics
from ...core.resume import state_path
from ...integrations.trainer_state import state_of
from ..runtime import run_folder
from .compare import compare_runs
from .recorder import _Recorder
from .records import RunRecord
from .report import VerifyReport
from .run import _device_name, check_args

__all__ = ["check_resume_at", "verify_resume"]


class _Interrupted(Exception):
    """Raised from a callback right after epoch K's checkpoint and resume state are written."""


def check_resume_at(args: Mapping[str, Any], resume_at: int) -> None:
    """Check ``--resume-at`` against the run's epochs.

    Raises:
        ConfigError: ``resume_at`` is not an epoch after which the run continues.
    """
    epochs = args.get("epochs")
    if isinstance(resume_at, bool) or not isinstance(resume_at, int) or resume_at < 1:
        raise ConfigError(f"--resume-at must be an epoch number >= 1, got {resume_at!r}")
    if isinstance(epochs, int) and resume_at >= epochs:
        raise ConfigError(
            f"--resume-at {resume_at} leaves nothing to resume with epochs={epochs}; give an epoch below {epochs}"
        )
    if args.get("save") is False:
        raise ConfigError("--resume-at needs checkpoints; remove save=False")


def _train(
    model_src: str,
    profile: Profile,
    train_args: Mapping[str, Any],
    recorder: _Recorder,
    extra: Mapping[str, Callable[[Any], None]] | None = None,
) -> bool:
    """Train once; return False when the run was interrupted by ``_Interrupted``."""
    from ultralytics import YOLO

    from ...core.untrusted.safeload import guarded_torch_load
    from ...integrations.ultralytics import attach

    with guarded_torch_load():  # a checkpoint loads through the allow-list
        model = YOLO(model_src)
    attach(model, profile)
    recorder.add_to(model)
    for event, fn in (extra or {}).items():
        model.add_callback(event, fn)
    try:
        model.train(**train_args)
    except _Interrupted:
        return False
    return True


def verify_resume(
    profile: Profile | str,
    args: Mapping[str, Any],
    *,
    resume_at: int,
    drop_state: bool = False,
    keep_mib: float = DEFAULT_KEEP_MIB,
    verbose: bool = False,
    progress: Callable[[str], None] | None = None,
) -> VerifyReport:
    """Train straight, then interrupted after epoch ``resume_at`` and resumed; compare the two step by step.

    Args:
        profile: A built-in name, a profile file path, or a :class:`~yolo_det.profiles.Profile`.
        args: Ultralytics train arguments (``model`` included), as :func:`yolo_det.tools.prepare.prepare`
            returns them. Without ``project`` the runs go to a temporary folder removed afterwards.
        resume_at: The epoch (1-based) after which run 2 is interrupted.
        drop_state: Delete run 2's resume state before resuming (what resuming without yolo-det gives).
        keep_mib: See :func:`yolo_det.tools.verify.verify`.
        verbose: Show Ultralytics' own log (on stderr).
        progress: Called with a line of text as each part ends.

    Returns:
        The report (run 2 is the interrupted and resumed run); ``report.identical`` says whether they match.
    """
    from ...integrations.fonts import ensure_local_font

    resolved = load_profile(profile)
    check_args(args, 2, None, keep_mib)
    check_resume_at(args, resume_at)
    started = time.perf_counter()
    train_args = dict(args)
    model_src = str(train_args.pop("model"))
    base = str(train_args.pop("name", None) or "verify")
    if train_args.get("plots", True):
        ensure_local_font()
    keep = int(keep_mib * 2**20)
    before = _state.snapshot()
    with ExitStack() as stack:
        stack.callback(_state.restore, before)
        project = stack.enter_context(run_folder(train_args.pop("project", None)))
        stack.enter_context(quiet_ultralytics(verbose))
        reference = RunRecord(index=1)
        rec1 = _Recorder(reference, reference=None, steps=None, keep_bytes=keep)
        t0 = time.perf_counter()
        _train(
            model_src, resolved, {**train_args, "project": project, "name": f"{base}-straight", "exist_ok": True}, rec1
        )
        reference.seconds = time.perf_counter() - t0
        reference.optimizer_steps = rec1.count
        if progress is not None:
            progress(f"run 1 (straight): {rec1.count} optimizer steps in {reference.seconds:.1f} s")

        resumed = RunRecord(index=2)
        part1 = _Recorder(resumed, reference=reference, steps=None, keep_bytes=keep)

        def interrupt(trainer: Any) -> None:
            if int(trainer.epoch) + 1 == resume_at:
                part1._drain()  # the digests of the last steps are kept (a failing run drops them)
                state_of(trainer).stopped_on_purpose = True
                raise _Interrupted(f"stopped after epoch {resume_at}")

        t0 = time.perf_counter()
        name = f"{base}-resumed"
        if _train(
            model_src,
            resolved,
            {**train_args, "project": project, "name": name, "exist_ok": True},
            part1,
            {"on_fit_epoch_end": interrupt},
        ):
            raise ConfigError(
                f"run 2 finished before epoch {resume_at} ended (early stopping?); pick an earlier --resume-at"
            )
        last = Path(project) / name / "weights" / "last.pt"
        if drop_state:
            for f in last.parent.glob(state_path(last, 0).stem + "*"):
                f.unlink()
        part2 = _Recorder(resumed, reference=reference, steps=None, keep_bytes=keep)
        part2.count, part2.iteration = part1.count, part1.iteration
        part2._pending, part2._captured = part1._pending, part1._captured
        resume_args = {k: v for k, v in train_args.items() if k in {"device", "workers", "batch", "imgsz"}}
        _train(str(last), resolved, {**resume_args, "resume": True}, part2)
        resumed.seconds = time.perf_counter() - t0
        resumed.optimizer_steps = part2.count
        if progress is not None:
            progress(
                f"run 2 (interrupted after epoch {resume_at}, resumed"
                f"{' without its resume state' if drop_state else ''}): {part2.count} optimizer steps in "
                f"{resumed.seconds:.1f} s"
            )
    divergence = compare_runs(reference, resumed)
    report = VerifyReport(
        profile=resolved.name,
        args={**dict(args), "resume_at": resume_at, "drop_resume_state": drop_state},
        runs=[reference, resumed],
        divergences=[divergence] if divergence else [],
        steps_requested=None,
        seconds=time.perf_counter() - started,
        device=_device_name(args.get("device")),
    )
    report.note = (
        f"run 2 was interrupted after epoch {resume_at} and resumed from its last.pt"
        f"{' with its resume state deleted' if drop_state else ''}"
    )
    return report
