"""Find the first op where two runs part: the step, then the module, from their op traces.

usage: yolo-det bisect A B [--rank R] [--rank-b R] [--json] [--junit FILE.xml] [--annotations github]

A and B are op traces (.jsonl) or run folders trained with `--trace-ops STEPS` (their
ops-trace-rank{R}.jsonl), or `verify --save FILE --trace-ops STEPS` files (FILE.ops.jsonl beside FILE):
two runs, two machines, two ranks (--rank-b), a resumed run and its uninterrupted twin, a run and a
baseline. Steps are aligned by iteration. In the first step where the traces part, the first op whose
output differs is named, in the order the data flows: the state the step starts from, the batch, the
forward of each module (in the order the calls end), the backward (in autograd's order), then the
optimizer update; with its type, shapes and dtype, whether its inputs are equal on both sides, and the
settings of both runs that can change it (threads and instruction set on a CPU, cuDNN and TF32 on CUDA,
the layer class in force).

Exit codes: 0 the traces are equal, 1 they part (the op named), 2 unusable input (one line). Traces are
read as data only: the schema, version and every field are checked; nothing in them is executed.

examples:
  yolo-det train --profile repro --trace-ops first:3 project=runs name=a
  yolo-det train --profile repro --trace-ops first:3 project=runs name=b
  yolo-det bisect runs/a runs/b
  yolo-det bisect runs/a runs/a --rank 0 --rank-b 1 --json       # two ranks of one DDP run
"""

from __future__ import annotations

import argparse
import time

from . import add_ci_options, check_ci_options, emit_ci


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``bisect`` arguments."""
    parser.add_argument("a", metavar="A", help="an op trace (.jsonl), a run folder, or a verify --save file")
    parser.add_argument("b", metavar="B", help="the other one")
    parser.add_argument("--rank", type=int, default=0, metavar="R", help="the rank whose trace to read (default: 0)")
    parser.add_argument("--rank-b", type=int, default=None, metavar="R", help="B's rank, when it differs from A's")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    add_ci_options(parser)


def run(args: argparse.Namespace) -> int:
    """Run ``yolo-det bisect``: 0 equal, 1 parted."""
    from ..core.errors import ConfigError
    from ..tools.trace.bisect import bisect_paths
    from ..tools.trace.report import bisect_suite

    if args.rank < 0 or (args.rank_b is not None and args.rank_b < 0):
        raise ConfigError("--rank and --rank-b are ranks: integers >= 0")
    check_ci_options(args)
    started = time.perf_counter()
    report = bisect_paths(args.a, args.b, rank=args.rank, rank_b=args.rank_b)
    print(report.to_json() if args.json else report.summary())
    emit_ci(args, [bisect_suite(report, seconds=time.perf_counter() - started)])
    return 0 if report.equal else 1
