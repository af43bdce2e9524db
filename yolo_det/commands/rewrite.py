"""Swap a model YAML's non-deterministic layers for yolo-det's deterministic ones (or back).

Only the module name of each layer that needs it changes (nn.AdaptiveMaxPool2d -> DetAdaptiveMaxPool2d,
nn.Upsample with a bicubic mode -> DetUpsample, ...); comments, key order and every other line stay as
they are, and --reverse turns the names back (rewrite then --reverse gives the original text). The
rewritten YAML builds the same layers with the same parameters (checked before anything is written).
yolo-det's example blocks become their deterministic variants (CBAMMax -> DetCBAMMax). Layers whose
non-determinism is inside your own block (a CBAM's max pool) are listed, never renamed: the profile's
module swaps handle them at training time. Every yolo-det command resolves the yolo-det names; in
Python, build the model inside `with yolo_det.custom_modules():`. --import MODULE (repeatable): the
YAML may name the classes MODULE defines.

exit codes: 0 written (or nothing to do), 1 with --check when a rewrite is needed, 2 bad input.

examples:
  yolo-det rewrite models/my-cbam.yaml -o models/my-cbam-det.yaml
  yolo-det rewrite models/my-cbam-det.yaml -o models/my-cbam-export.yaml --reverse
  yolo-det rewrite models/my-cbam.yaml --check
"""

from __future__ import annotations

import argparse
import json

from ..core.text import printable
from . import add_import_option


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``rewrite`` arguments."""
    parser.add_argument("model", metavar="IN.yaml", help="the model YAML to rewrite (never changed without --in-place)")
    out = parser.add_mutually_exclusive_group()
    out.add_argument("-o", "--output", metavar="OUT.yaml", help="where to write the result (must not exist)")
    out.add_argument("--in-place", action="store_true", help="rewrite IN.yaml itself")
    out.add_argument("--check", action="store_true", help="write nothing; exit 1 when a rewrite is needed")
    parser.add_argument("--reverse", action="store_true", help="turn yolo-det layer names back into PyTorch's")
    parser.add_argument(
        "--policy",
        choices=["auto", "all"],
        default="auto",
        help="auto: layers that are non-deterministic on this torch; all: every layer with an "
        "equivalent (default: auto)",
    )
    parser.add_argument("--force", action="store_true", help="replace OUT.yaml if it exists")
    parser.add_argument("--imgsz", type=int, default=64, help="input size of the trace that decides 'auto'")
    add_import_option(parser)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    """Run ``yolo-det rewrite``."""
    from ..fixes.yaml_rewrite import rewrite_yaml

    result = rewrite_yaml(
        args.model,
        args.output,
        in_place=args.in_place,
        check=args.check,
        force=args.force,
        reverse=args.reverse,
        policy=args.policy,
        imgsz=args.imgsz,
        modules=args.imports,
    )
    if args.json:
        print(
            json.dumps(
                {
                    "input": args.model,
                    "output": None if args.check else (args.output or args.model),
                    **result.to_dict(),
                },
                indent=2,
            )
        )
    else:
        print(printable(result.format(args.model)))
        if not args.check and (result.changed or args.output):
            print(printable(f"wrote {args.output or args.model}"))
    return 1 if args.check and result.changed else 0
