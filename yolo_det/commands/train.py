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

from ..tools.prepare import prepare


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``train`` arguments."""
    parser.add_argument("--profile", default="repro", metavar="NAME|FILE",
                        help="built-in profile (repro, balanced, fast) or a profile YAML file (default: repro)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="Ultralytics train arguments")


def train(profile: Any, args: dict[str, Any]) -> Any:
    """Train with Ultralytics under ``profile``; return the plugin (``record_path``, ``weights_digest``)."""
    from ultralytics import YOLO

    from ..analysis.models import model_names
    from ..integrations.fonts import ensure_local_font
    from ..integrations.ultralytics import attach

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
