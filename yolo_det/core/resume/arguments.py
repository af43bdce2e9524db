"""The arguments of a command-line resume: what the checkpoint decides and what the user may still change."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .checkpoint import CheckpointInfo, read_checkpoint

#: Arguments Ultralytics lets a resumed run change (``BaseTrainer.check_resume``, Ultralytics 8.4); it
#: takes every other argument from the checkpoint, except ``data`` when given.
RESUME_ALLOWED = frozenset(
    {
        "imgsz",
        "batch",
        "device",
        "close_mosaic",
        "augmentations",
        "save_period",
        "workers",
        "cache",
        "patience",
        "time",
        "freeze",
        "val",
        "plots",
        "channels_last",
        "distill_model",
        "save_dir",
    }
)
_RESUME_PASSED = frozenset({"model", "data", "mode", "resume", "pretrained"})


def is_resume(args: Mapping[str, Any]) -> bool:
    """Whether Ultralytics arguments ask to resume (``resume=True`` or ``resume=path``)."""
    value = args.get("resume")
    return value is True or (isinstance(value, str) and value.strip() not in {"", "False", "false"})


def resume_arguments(args: Mapping[str, Any]) -> tuple[dict[str, Any], CheckpointInfo, list[str]]:
    """The Ultralytics arguments of a resumed run, the checkpoint, and the overrides resuming ignores.

    No demo default is added: the checkpoint's own arguments are used, as Ultralytics does, with only the
    keys given by the user passed on. ``resume=path`` resumes ``path``; ``resume=True`` resumes ``model=``.

    Raises:
        ConfigError: No checkpoint named, or it cannot be resumed (a finished, stripped checkpoint).
        ModelError: The checkpoint is missing or not a training checkpoint.
    """
    from ..errors import ConfigError

    out = dict(args)
    resume = out.get("resume")
    if isinstance(resume, str):
        ckpt = resume
    elif isinstance(out.get("model"), str):
        ckpt = out["model"]
    else:
        raise ConfigError(
            "resume=True needs the checkpoint: add model=path/to/weights/last.pt "
            "(or write resume=path/to/weights/last.pt)"
        )
    info = read_checkpoint(Path(ckpt).expanduser())
    if info.epoch >= 0 and info.has_optimizer and info.finished:
        raise ConfigError(
            f"'{ckpt}' finished training (all {info.epoch + 1} epochs are in it), nothing to resume; the run "
            f"ended before Ultralytics stripped the checkpoint: use it as model={ckpt}, or start a new run"
        )
    if not info.resumable:
        raise ConfigError(
            f"'{ckpt}' cannot be resumed: its training finished (epoch {info.epoch}, optimizer "
            f"{'kept' if info.has_optimizer else 'stripped'}); start a new run with "
            f"model={ckpt} and your data="
        )
    out["model"] = str(info.path)
    if isinstance(resume, str):
        out["resume"] = str(info.path)
    ignored = [
        k
        for k, v in args.items()
        if k not in RESUME_ALLOWED and k not in _RESUME_PASSED and v != info.train_args.get(k)
    ]
    return out, info, ignored
