"""Compare two runs and say why their weights differ (or confirm that they do not).

A and B are run folders (holding determinism.json), determinism.json files, or files written by
`yolo-det verify --save`. Every difference is listed with both values, grouped and ordered by how
likely it changes the bits: data (dataset fingerprint), model (architecture, starting weights), seeds,
profile settings per phase, Ultralytics arguments, versions (torch, CUDA, cuDNN, numpy, Ultralytics,
...), GPU model, CPU, thread counts, environment variables, layer swaps, non-determinism warnings seen.
The line before it says what was compared (settings and topics both records hold, and the weights); the
last line is the verdict. With --png FILE, a picture of both runs' loss and metric curves per epoch (from each
run folder's results.csv) with the first epoch whose logged values differ marked when the weights differ.

Exit 0 when the runs are configured the same and their weights digests are equal, 1 when they differ,
3 (nothing compared) when nothing tells them apart but a record has no final weights digest (an
unfinished run: an equality would prove nothing), 2 on bad input.

examples:
  yolo-det diff runs/detect/train runs/detect/train2
  yolo-det diff machine1/determinism.json machine2/determinism.json --json
  yolo-det diff runs/detect/train runs/detect/train2 --png curves.png
"""

from __future__ import annotations

import argparse
import json
import sys

from ..core.fileio import check_output_path
from ..tools.diff import diff_paths
from . import add_ci_options, check_ci_options, emit_ci


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``diff`` arguments."""
    parser.add_argument("a", metavar="A", help="run folder, determinism.json, or a verify --save file")
    parser.add_argument("b", metavar="B", help="run folder, determinism.json, or a verify --save file")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--png",
        metavar="FILE",
        help="write both runs' loss and metric curves per epoch (results.csv), the first parting epoch marked",
    )
    add_ci_options(parser)


def run(args: argparse.Namespace) -> int:
    """Run ``yolo-det diff``: exit 0 when configured the same with equal weights digests, 3 when there are no
    weights to compare, else 1."""
    from ..tools.ci_report import diff_suite

    check_ci_options(args)
    png = check_output_path(args.png, suffix=".png", what="--png")
    report = diff_paths([args.a, args.b])
    if png is not None:
        from ..tools.curves import diff_curves_png  # matplotlib only when a picture is asked for

        digests = (report.weights.get("a"), report.weights.get("b"))
        for line in diff_curves_png(args.a, args.b, png, parted=None not in digests and digests[0] != digests[1]):
            print(f"yolo-det: {line}", file=sys.stderr)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2, default=str))
    else:
        print(report.summary())
    emit_ci(args, [diff_suite(report)])
    return report.exit_code
