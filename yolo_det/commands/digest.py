"""Print the weights digest of checkpoints (the digest determinism.json records).

usage: yolo-det digest CHECKPOINT [CHECKPOINT ...]

The digest covers the model's state dict in a defined order and dtype (see yolo_det.core.record), so two
checkpoints with equal weights have equal digests even when their metadata (dates, paths) differ.

example:
  yolo-det digest runs/detect/train/weights/last.pt runs/detect/train2/weights/last.pt
"""

from __future__ import annotations

import argparse

from ..core.record import checkpoint_digest


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``digest`` arguments."""
    parser.add_argument("checkpoints", nargs="+", metavar="CHECKPOINT", help="checkpoint files (.pt)")


def run(args: argparse.Namespace) -> int:
    """Run ``yolo-det digest``; exit 0 when all digests are equal, 1 when they differ."""
    digests = [(checkpoint_digest(path), path) for path in args.checkpoints]
    for digest, path in digests:
        print(f"{digest}  {path}")
    return 0 if len({d for d, _ in digests}) <= 1 else 1
