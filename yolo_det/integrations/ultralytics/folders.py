"""Run folders of Ultralytics trainings: where a resumed run writes, and the lock against other live runs.

A resumed run writes into the folder that holds its checkpoint (:func:`yolo_det.core.resume.resume_save_dir`):
:func:`resume_into_its_folder` (``model.train(**kwargs)``) and :func:`resume_overrides` (a trainer's
``overrides``) pass that folder to Ultralytics, and :func:`check_resume_folder` refuses a resumed trainer built
another way. A run folder whose name is fixed is locked (:mod:`yolo_det.core.runlock`) before Ultralytics
writes into it (:func:`lock_fixed_folder`, :func:`lock_planned_folder`); a fresh one when training starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...core import runlock
from .runs import process_rank

__all__ = [
    "check_resume_folder",
    "lock_fixed_folder",
    "lock_planned_folder",
    "resume_checkpoint",
    "resume_into_its_folder",
    "resume_overrides",
]


def resume_checkpoint(args: dict[str, Any], model: Any = None) -> str | None:
    """The checkpoint a training with ``args`` resumes from (None when it does not resume)."""
    resume = args.get("resume")
    if isinstance(resume, (str, Path)) and str(resume).strip() not in {"", "False", "false", "True", "true"}:
        return str(resume)
    if resume is True or str(resume).strip() in {"True", "true"}:
        if model is not None:
            return str(model.ckpt_path) if model.ckpt_path else None
        if isinstance(args.get("model"), (str, Path)) and str(args["model"]).endswith(".pt"):
            return str(args["model"])
        try:
            from ...core.compat import get_latest_run

            return get_latest_run() or None
        except Exception:
            return None
    return None


def resume_into_its_folder(model: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` of ``model.train(**kwargs)`` with ``save_dir`` set to the folder holding the resumed checkpoint
    (:func:`yolo_det.core.resume.resume_save_dir`); unchanged when the training does not resume."""
    from ...core.resume import resume_save_dir

    args = {**model.overrides, **kwargs}
    ckpt = resume_checkpoint(args, model)
    if ckpt is None:
        return kwargs
    return {**kwargs, "save_dir": resume_save_dir(ckpt, args.get("save_dir"))}


def check_resume_folder(trainer: Any) -> None:
    """Refuse a resumed trainer whose run folder is not the folder holding its checkpoint (a trainer built
    without yolo-det's routes, e.g. a plugin registered on it later)."""
    if not trainer.resume:
        return
    from ...core.resume import resume_folder

    ckpt, save_dir = str(trainer.args.resume or trainer.args.model), trainer.save_dir
    folder = resume_folder(ckpt, requested=None)
    if Path(save_dir).resolve() != folder.resolve():
        from ...core.errors import ConfigError

        raise ConfigError(
            f"cannot resume '{ckpt}' into '{save_dir}': a resumed run writes into the folder that holds "
            f"its checkpoint ('{folder}'); train with yolo_det.attach(model) or "
            "trainer=yolo_det.trainer_class(...), which pass that folder to Ultralytics"
        )


def lock_fixed_folder(model: Any, kwargs: dict[str, Any]) -> runlock.RunLock | None:
    """Lock the run folder of ``model.train(**kwargs)`` before Ultralytics writes into it (see
    :func:`lock_planned_folder`)."""
    if kwargs.get("cfg"):
        return None
    args = {**model.overrides, **kwargs, "task": model.task, "mode": "train"}
    return lock_planned_folder(None, args)


def lock_planned_folder(cfg: Any, overrides: dict[str, Any] | None) -> runlock.RunLock | None:
    """Lock the run folder a trainer built from ``cfg``/``overrides`` will use, before it writes anything,
    when the folder's name is fixed (``exist_ok=True`` or ``save_dir=``); a fresh folder (Ultralytics
    numbers it) is locked when training starts. Resumed runs are locked when training starts too."""
    if process_rank() != -1:
        return None
    try:
        from ...core.compat import DEFAULT_CFG, DEFAULT_CFG_DICT, get_cfg, run_folder

        overrides = {k: v for k, v in (overrides or {}).items() if k in DEFAULT_CFG_DICT}
        args = get_cfg(DEFAULT_CFG if cfg is None else cfg, overrides)
        if getattr(args, "resume", None) or not (getattr(args, "exist_ok", False) or getattr(args, "save_dir", None)):
            return None
        folder = run_folder(args)
    except Exception:  # Ultralytics reports bad arguments its own way; the later lock still holds
        return None
    return runlock.acquire(folder)


def resume_overrides(overrides: dict[str, Any] | None) -> dict[str, Any] | None:
    """A trainer's ``overrides`` with ``save_dir`` set to the folder holding the resumed checkpoint."""
    from ...core.resume import resume_save_dir

    ckpt = resume_checkpoint(overrides or {})
    if ckpt is None or overrides is None:
        return overrides
    return {**overrides, "save_dir": resume_save_dir(ckpt, overrides.get("save_dir"))}
