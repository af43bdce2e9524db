"""Print the weights digest of checkpoints (the digest determinism.json records).

The digest is the SHA-256 of the model's weights, in a defined order and dtype (see yolo_det.core.record), not
of the file: two checkpoints with equal weights have equal digests even when their metadata (dates, paths, the
optimizer) differ, and `sha256sum FILE` gives another value.

A checkpoint (an Ultralytics or YOLOv5 checkpoint, or a state dict) is read by yolo-det's one reader, which
imports no module the file names, and its pickle may call only what is on yolo-det's allow-list (tensor
rebuilders, containers, plain values): a model made of your own block classes reads too, and one that calls
anything else (builtins.exec, os.system, ...) is refused with its name; --trust-checkpoint digests it anyway
(still without running it: what it would call becomes a placeholder). A truncated file is named so. Every
dtype is digested (float8, complex32, bits, float4: their raw bytes).

example:
  yolo-det digest runs/detect/train/weights/last.pt runs/detect/train2/weights/last.pt
"""

from __future__ import annotations

import argparse

from ..core.untrusted.container import TRUST_FLAG, trusted_checkpoints


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``digest`` arguments."""
    parser.add_argument("checkpoints", nargs="+", metavar="CHECKPOINT", help="checkpoint files (.pt)")
    parser.add_argument(
        TRUST_FLAG,
        action="store_true",
        help="digest a checkpoint even when its pickle calls what is not on the allow-list (still runs nothing)",
    )


def run(args: argparse.Namespace) -> int:
    """Run ``yolo-det digest``; exit 0 when all digests are equal, 1 when they differ."""
    from ..core.record import checkpoint_digest

    with trusted_checkpoints(args.trust_checkpoint):
        digests = [(checkpoint_digest(path), path) for path in args.checkpoints]
    for digest, path in digests:
        print(f"{digest}  {path}")
    return 0 if len({d for d, _ in digests}) <= 1 else 1
