"""Turn a profile name and ``key=value`` tokens into a profile and checked Ultralytics train arguments.

Used by the ``train``, ``verify`` and ``bench`` commands and by the benchmark scripts. Without ``data=``
the bundled demo dataset is used with small defaults (:data:`DEMO_DEFAULTS`); it is for detection, so a model
of another task needs ``data=`` (a dataset YAML, or a folder for classification). When resuming
(``resume=True``/``resume=path``) no default is added: the checkpoint's own arguments and the keys given are used.
"""

from __future__ import annotations

from typing import Any

from ..analysis.gate import check_arguments
from ..core.errors import ConfigError
from ..core.profiles import Profile, load_profile
from ..core.resume import is_resume, resume_arguments, resume_save_dir
from ..core.text import short
from .overrides import (
    check_ultralytics_args,
    parse_overrides,
    resolve_data,
    resolve_data_cfg,
    resolve_model,
    resolve_model_task,
)
from .prechecks import check_cfg_file, check_split, check_train_args

__all__ = ["DEMO_DEFAULTS", "RESERVED", "prepare"]

DEMO_DEFAULTS: dict[str, Any] = {
    "model": "yolov8n.yaml",
    "epochs": 3,
    "imgsz": 96,
    "batch": 16,
    "device": "cpu",
    "workers": 0,
}
RESERVED = {
    "deterministic": "the profile decides determinism (choose it with --profile)",
    "mode": "this command always trains",
}


def prepare(profile: str | Profile, tokens: list[str], *, check_device: bool = True) -> tuple[Profile, dict[str, Any]]:
    """Validate the profile and the overrides; return ``(profile, ultralytics_args)`` or raise a one-line error.

    Nothing is written and no model is built. ``check_device=False`` leaves ``device=`` to the caller (verify
    and bench first apply their one-device rule, then :func:`yolo_det.tools.prechecks.check_device`).
    """
    resolved = load_profile(profile)
    args = parse_overrides(tokens)
    given = dict(args)
    if is_resume(args):
        resumed = _prepare_resume(args)
        check_arguments(given)  # the one gate, before Ultralytics reads any file (the checks above read safely)
        return resolved, resumed
    if args.get("cfg") is not None:  # read once, checked with the key=value arguments, which win over it
        file_values = check_cfg_file(args.pop("cfg"))
        # a copy of Ultralytics' default.yaml holds every key: its empty values and the keys yolo-det decides
        # (deterministic, mode) are Ultralytics' defaults, not the user's choice
        args = {**{k: v for k, v in file_values.items() if v is not None and k not in RESERVED}, **args}
    demo = args.get("data") is None
    if demo:
        from .demo import demo_data_yaml

        args.pop("data", None)
        args = {**DEMO_DEFAULTS, **args}
    elif not isinstance(args["data"], str):
        raise ConfigError(f"data= must be a path, got {short(args['data'])}")
    args.setdefault("model", DEMO_DEFAULTS["model"])
    if not isinstance(args["model"], str):
        raise ConfigError(f"model= must be a model YAML or a checkpoint path, got {short(args['model'])}")
    args["model"], model_kind = resolve_model_task(args["model"])
    task = args["task"] if isinstance(args.get("task"), str) and args["task"] else model_kind
    data_cfg = None
    if demo:
        if task not in (None, "detect"):
            what = "a folder with train/ and val/ class folders" if task == "classify" else "a dataset YAML"
            raise ConfigError(
                f"the bundled demo data is for detection and '{args['model']}' is a {task} model; pass data= ({what})"
            )
        args["data"] = str(demo_data_yaml())
    else:
        args["data"], data_cfg = resolve_data_cfg(args["data"], task)
    args = check_ultralytics_args(args, reserved=RESERVED)
    if "split" in args:
        check_split(args["split"], data_cfg)
    args = check_train_args(args, device=check_device, task=task, shards=resolved.train.extra.get("shards"))
    check_arguments(given)  # the one gate, before Ultralytics reads any file (the checks above read safely)
    return resolved, args


def _prepare_resume(args: dict[str, Any]) -> dict[str, Any]:
    """``resume=``: the checkpoint's own arguments, no demo defaults; warn about what resuming ignores."""
    import sys

    if isinstance(args.get("data"), str):
        args["data"] = resolve_data(args["data"])
    args, info, ignored = resume_arguments(args)
    args["model"] = resolve_model(args["model"])  # the checkpoint scan a new run's model= gets
    args = check_ultralytics_args(args, reserved=RESERVED)
    args["save_dir"] = resume_save_dir(info.path)  # the folder holding the checkpoint, never the one stored in it
    if ignored:
        print(
            f"yolo-det: resuming ignores {', '.join(f'{k}={args[k]}' for k in ignored)}: the checkpoint's "
            "values are used (start a new run to change them)",
            file=sys.stderr,
        )
    return args
