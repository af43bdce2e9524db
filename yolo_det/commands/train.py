"""Train an Ultralytics model under a determinism profile.

usage: yolo-det train [--profile NAME|FILE] [key=value ...]

Every key=value is an Ultralytics train argument (model=, data=, epochs=, imgsz=, batch=, device=,
seed=, project=, name=, ...), parsed with YAML rules (never eval). Without data= the bundled demo
dataset is used with small defaults (model=yolov8n.yaml epochs=3 imgsz=96 batch=16 device=cpu), so
`yolo-det train --profile repro` trains in well under a minute on a CPU.

The run directory gets determinism.json (profile, seeds, versions, flags, warnings, weights digest);
its path and the weights digest are printed at the end.

To continue an interrupted run, pass its checkpoint: `resume=True model=RUN/weights/last.pt` (or
`resume=RUN/weights/last.pt`). The checkpoint's own arguments are used (no demo defaults); overrides
that Ultralytics ignores on resume are listed. Under a deterministic profile the continuation is bit for
bit the uninterrupted run (see the README's "Resume" section).

examples:
  yolo-det train --profile repro
  yolo-det train --profile repro resume=runs/detect/train/weights/last.pt
  yolo-det train --profile repro seed=1 project=runs/repro name=a
  yolo-det train --profile balanced model=yolo11n.yaml data=coco8.yaml epochs=100 device=0
  yolo-det train --profile my-profile.yaml model=custom-cbam.yaml data=data.yaml
"""

from __future__ import annotations

import argparse
from typing import Any

from ..errors import ConfigError
from ..overrides import check_ultralytics_args, parse_overrides, resolve_data, resolve_model
from ..profiles import load_profile
from ..resume import is_resume, resume_arguments

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


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``train`` arguments."""
    parser.add_argument("--profile", default="repro", metavar="NAME|FILE",
                        help="built-in profile (repro, balanced, fast) or a profile YAML file (default: repro)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="Ultralytics train arguments")


def prepare(profile: str, tokens: list[str]) -> tuple[Any, dict[str, Any]]:
    """Validate the profile and the overrides; return ``(profile, ultralytics_args)`` or raise a one-line error.

    Nothing is written and no model is built.
    """
    resolved = load_profile(profile)
    args = parse_overrides(tokens)
    if is_resume(args):
        return resolved, _prepare_resume(args)
    if args.get("data") is None:
        from ..demo import demo_data_yaml

        args.pop("data", None)
        args = {**DEMO_DEFAULTS, **args, "data": str(demo_data_yaml())}
    else:
        if not isinstance(args["data"], str):
            raise ConfigError(f"data= must be a path, got {args['data']!r}")
        args["data"] = resolve_data(args["data"])
    args.setdefault("model", DEMO_DEFAULTS["model"])
    if not isinstance(args["model"], str):
        raise ConfigError(f"model= must be a model YAML or a checkpoint path, got {args['model']!r}")
    args["model"] = resolve_model(args["model"])
    args = check_ultralytics_args(args, reserved=RESERVED)
    return resolved, args


def _prepare_resume(args: dict[str, Any]) -> dict[str, Any]:
    """``resume=``: the checkpoint's own arguments, no demo defaults; warn about what resuming ignores."""
    import sys

    if isinstance(args.get("data"), str):
        args["data"] = resolve_data(args["data"])
    args, _, ignored = resume_arguments(args)
    args = check_ultralytics_args(args, reserved=RESERVED)
    if ignored:
        print(f"yolo-det: resuming ignores {', '.join(f'{k}={args[k]}' for k in ignored)}: the checkpoint's "
              "values are used (start a new run to change them)", file=sys.stderr)
    return args


def train(profile: Any, args: dict[str, Any]) -> Any:
    """Train with Ultralytics under ``profile``; return the plugin (``record_path``, ``weights_digest``)."""
    from ultralytics import YOLO

    from ..demo import ensure_local_font
    from ..integrations.ultralytics import attach
    from ..models import model_names

    ensure_local_font()
    train_args = dict(args)
    with model_names():  # rewritten YAMLs and the example blocks of data/models/*.yaml build
        model = YOLO(train_args.pop("model"))
        plugin = attach(model, profile)
        model.train(**train_args)
    return plugin


def run(args: argparse.Namespace) -> int:
    """Run ``yolo-det train``."""
    profile, ul_args = prepare(args.profile, list(args.overrides))
    plugin = train(profile, ul_args)
    if plugin.record_path is not None:
        print(f"determinism record: {plugin.record_path}")
    if plugin.weights_digest is not None:
        print(f"weights sha256: {plugin.weights_digest}")
    return 0
