"""The pre-checks every train command runs on its resolved arguments."""

from __future__ import annotations

from typing import Any

from .run_folder import check_run_folder
from .values import check_device, check_optimizer, check_seed


def check_train_args(args: dict[str, Any], *, device: bool = True, task: str | None = None) -> dict[str, Any]:
    """Run every pre-check on resolved train arguments (see :mod:`yolo_det.tools.prechecks`); return them normalised.

    Args:
        args: The arguments.
        device: Also check ``device=`` (a command with its own rules on devices checks it after them).
        task: The model's task when known (where Ultralytics puts the run folder).
    """
    if "seed" in args:
        check_seed(args["seed"])
    if device and "device" in args:
        check_device(args["device"])
    if args.get("optimizer") is not None:
        check_optimizer(args["optimizer"])
    check_run_folder(args, task)
    return args
