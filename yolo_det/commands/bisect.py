"""Find the first op where two runs part: the step, then the module, from their op traces.

A and B are op traces (.jsonl) or run folders trained with `--trace-ops STEPS` (their
ops-trace-rank{R}.jsonl), or `verify --save FILE --trace-ops STEPS` files (FILE.ops.jsonl beside FILE):
two runs, two machines, two ranks (--rank-b), a resumed run and its uninterrupted twin, a run and a
baseline. Steps are aligned by iteration. In the first step where the traces part, the first op whose
output differs is named, in the order the data flows: the state the step starts from, the batch, the
forward of each module (in the order the calls end), the backward (in autograd's order), then the
optimizer update; with its type, shapes and dtype, whether its inputs are equal on both sides, and the
settings of both runs that can change it (threads and instruction set on a CPU, cuDNN and TF32 on CUDA,
the layer class in force).

--replay CHECKPOINT re-runs here, with tracing on, only the first step after that checkpoint (a last.pt or
epochN.pt with its yolo-det resume state, as `yolo-det train resume=` takes it) and compares that step
with A's trace of it: a run that was not traced can still be compared with one that was. The checkpoint,
its resume state and its record are copied to a temporary folder first and the step runs there, so nothing
beside the checkpoint changes; --replay-trace FILE keeps the replayed step's trace.

The runs' records (beside their traces; for --replay, the record of the checkpoint's run) name the settings
the runs differ in. When every traced step agrees but the records' final weights differ, the answer is that
the traced window agrees and the runs part later, with those settings (close_mosaic=, say), never "equal".

Exit codes: 0 the traces are equal (and the final weights, where both records hold them), 1 they part (the op
named, or after the traced steps), 2 unusable input (one line). Traces are
read as data only: the schema, version and every field are checked; nothing in them is executed.

examples:
  yolo-det train --profile repro --trace-ops first:3 project=runs name=a
  yolo-det train --profile repro --trace-ops first:3 project=runs name=b
  yolo-det bisect runs/a runs/b
  yolo-det bisect runs/a runs/a --rank 0 --rank-b 1 --json       # two ranks of one DDP run
  yolo-det bisect runs/a --replay runs/b/weights/epoch2.pt        # run b was not traced
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from . import add_ci_options, add_import_option, check_ci_options, emit_ci


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``bisect`` arguments."""
    parser.add_argument("a", metavar="A", help="an op trace (.jsonl), a run folder, or a verify --save file")
    parser.add_argument("b", metavar="B", nargs="?", default=None, help="the other one (not with --replay)")
    parser.add_argument("--rank", type=int, default=0, metavar="R", help="the rank whose trace to read (default: 0)")
    parser.add_argument("--rank-b", type=int, default=None, metavar="R", help="B's rank, when it differs from A's")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument(
        "--replay",
        default=None,
        metavar="CHECKPOINT",
        help="re-run the first step after this checkpoint here, traced, and compare it with A",
    )
    parser.add_argument(
        "--replay-trace", default=None, metavar="FILE.jsonl", help="with --replay: keep the replayed step's trace here"
    )
    add_import_option(parser)
    add_ci_options(parser)


def run(args: argparse.Namespace) -> int:
    """Run ``yolo-det bisect``: 0 equal, 1 parted."""
    from ..core.errors import ConfigError
    from ..tools.trace.bisect import bisect_paths
    from ..tools.trace.report import bisect_suite

    if args.rank < 0 or (args.rank_b is not None and args.rank_b < 0):
        raise ConfigError("--rank and --rank-b are ranks: integers >= 0")
    if (args.b is None) == (args.replay is None):
        raise ConfigError("pass two traces (A B), or one trace and --replay CHECKPOINT")
    if args.replay_trace is not None and args.replay is None:
        raise ConfigError("--replay-trace goes with --replay CHECKPOINT")
    check_ci_options(args)
    from ..core.fileio import check_output_path, copy_file
    from ..tools.trace.bisect import resolve_trace
    from ..tools.trace.tracefile import read_trace

    keep = check_output_path(args.replay_trace, suffix=".jsonl", what="--replay-trace")
    started = time.perf_counter()
    if args.replay is None:
        report = bisect_paths(args.a, args.b, rank=args.rank, rank_b=args.rank_b)
    else:
        read_trace(resolve_trace(args.a, args.rank))  # a bad A fails before any training
        with tempfile.TemporaryDirectory(prefix="yolo-det-replay-") as tmp:
            replayed = _replay(args.replay, Path(tmp), args)
            if keep is not None:
                copy_file(replayed, keep)  # replaces a link there, never writes through it
            made_by = Path(args.replay).expanduser().parent.parent  # the run the checkpoint came from
            report = bisect_paths(args.a, replayed, rank=args.rank, record_b=made_by)
            if keep is not None:
                report.b = str(keep)
    print(report.to_json() if args.json else report.summary())
    emit_ci(args, [bisect_suite(report, seconds=time.perf_counter() - started)])
    return 0 if report.equal else 1


def _replay(checkpoint: str, folder: Path, args: argparse.Namespace) -> Path:
    """Resume a copy of ``checkpoint`` in ``folder`` for one optimizer step, traced; return the trace."""
    from ..analysis.gate import allow_downloads
    from ..analysis.models import model_names
    from ..core.errors import ConfigError
    from ..core.fileio import copy_file
    from ..core.quiet import quiet_ultralytics
    from ..core.record import RECORD_NAME
    from ..core.resume import state_path
    from ..core.untrusted.safeload import trusted_checkpoints
    from ..tools.prepare import prepare
    from ..tools.trace import OpTracer
    from .train import _resumed_profile, train

    src = Path(checkpoint).expanduser()
    if not src.is_file():
        raise ConfigError(f"--replay: '{src}' does not exist; pass a checkpoint (last.pt, epochN.pt) of the run")
    run = folder / "replay"
    (run / "weights").mkdir(parents=True)
    copy = run / "weights" / src.name
    copy_file(src, copy)
    if state_path(src).is_file():
        copy_file(state_path(src), state_path(copy))
    record = src.parent.parent / RECORD_NAME
    if record.is_file():
        copy_file(record, run / RECORD_NAME)
    trace = folder / "replay.jsonl"
    with (
        model_names(args.imports),
        trusted_checkpoints(False),
        allow_downloads(False),
        quiet_ultralytics(drop_stdout=True),  # stdout is the report's (--json)
    ):
        profile, ul_args = prepare("repro", [f"resume={copy}", "val=False", "plots=False"])
        profile = _resumed_profile(ul_args) or profile
        tracer: Any = OpTracer("first:1", trace, meta={"replay": src.name}, stop=True)
        train(profile, ul_args, tracer=tracer)
    if tracer.written is None:
        raise ConfigError(f"--replay: the run resumed from '{src}' made no step (its training had finished)")
    return trace
