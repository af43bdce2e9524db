"""Print the weights digest of checkpoints (the digest determinism.json records).

usage: yolo-det digest CHECKPOINT [CHECKPOINT ...] [--trust-checkpoint]

The digest covers the model's state dict in a defined order and dtype (see yolo_det.core.record), so two
checkpoints with equal weights have equal digests even when their metadata (dates, paths) differ.

A checkpoint is read without importing or calling anything it names (a model made of your own block
classes reads too). One whose pickle names what no checkpoint needs (builtins.exec, os.system, ...) is
refused; --trust-checkpoint digests it anyway (still without running it).

example:
  yolo-det digest runs/detect/train/weights/last.pt runs/detect/train2/weights/last.pt
"""

from __future__ import annotations

import argparse

from ..core.pickle_scan import TRUST_FLAG, check_checkpoint
from ..core.record import checkpoint_digest


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``digest`` arguments."""
    parser.add_argument("checkpoints", nargs="+", metavar="CHECKPOINT", help="checkpoint files (.pt)")
    parser.add_argument(TRUST_FLAG, action="store_true",
                        help="digest a checkpoint even when its pickle names functions no checkpoint needs")


def run(args: argparse.Namespace) -> int:
    """Run ``yolo-det digest``; exit 0 when all digests are equal, 1 when they differ."""
    if not args.trust_checkpoint:
        for path in args.checkpoints:
            check_checkpoint(path)
    digests = [(checkpoint_digest(path), path) for path in args.checkpoints]
    for digest, path in digests:
        print(f"{digest}  {path}")
    return 0 if len({d for d, _ in digests}) <= 1 else 1
