"""The pre-checks every train command runs on its resolved arguments."""

from __future__ import annotations

from typing import Any

from ...core.compat import numpy_pair_problem
from ...core.errors import ConfigError
from ...core.launcher import launch_from_env
from ...core.profiles import shard_layout_problem
from .run_folder import check_run_folder
from .values import check_device, check_optimizer, check_seed


def _ranks(args: dict[str, Any]) -> int:
    """The ranks the run will train on: the launcher's (torchrun), or Ultralytics' own DDP over ``device=0,1``."""
    launch = launch_from_env()
    if launch is not None:
        return launch.world_size
    device = str(args.get("device") or "").strip().lower()
    if device in {"", "cpu", "mps"} or "," not in device:
        return 1
    return len([d for d in device.split(",") if d.strip()])


def check_shards(shards: int | None, args: dict[str, Any]) -> None:
    """Refuse, before anything is built, a ``shards: K`` the ranks or ``batch=`` do not fit (one line).

    The rule is :func:`yolo_det.core.profiles.shard_layout_problem`, the one the trainer's layout is held to.
    """
    if shards:
        problem = shard_layout_problem(int(shards), _ranks(args), args.get("batch", 16))
        if problem:
            raise ConfigError(problem)


def check_train_args(
    args: dict[str, Any], *, device: bool = True, task: str | None = None, shards: int | None = None
) -> dict[str, Any]:
    """Run every pre-check on resolved train arguments (see :mod:`yolo_det.tools.prechecks`); return them normalised.

    Args:
        args: The arguments.
        device: Also check ``device=`` (a command with its own rules on devices checks it after them).
        task: The model's task when known (where Ultralytics puts the run folder).
        shards: The profile's ``shards`` (train phase), checked against the ranks and ``batch=``.
    """
    check_shards(shards, args)
    problem = numpy_pair_problem()  # a pair of the declared range that cannot train, refused before it starts
    if problem:
        raise ConfigError(problem)
    if "seed" in args:
        check_seed(args["seed"])
    if device and "device" in args:
        check_device(args["device"])
    if args.get("optimizer") is not None:
        check_optimizer(args["optimizer"])
    check_run_folder(args, task)
    return args
