"""Say whether this machine will reproduce a run's weights, before training, and what to set when not.

RECORD is a run folder (holding determinism.json), a determinism.json file, or a file written by
`yolo-det verify --save`. The same command under profile P (default: the run's own) is predicted here:
the threads it would train with, the instruction-set branches of ATen, oneDNN and MKL, torch and its
libraries, the CPU (or on CUDA the GPU model, SM count, driver, CUDA, cuDNN and TF32), and P's training
settings. `yolo-det diff` and `verify --against` name the same causes (one rule, yolo_det.core.machine).

Exit 0 "will agree", 1 "will differ" (every cause named with the setting that fixes it), 2 for an
unusable file.

examples:
  yolo-det check-machine runs/detect/train                      # under the run's own profile
  yolo-det check-machine colleague/determinism.json --profile portable
"""

from __future__ import annotations

import argparse
import json


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``check-machine`` arguments."""
    parser.add_argument("record", metavar="RECORD", help="run folder, determinism.json, or a verify --save file")
    parser.add_argument("--profile", default=None, help="the profile the command would run under (default: the run's)")
    parser.add_argument("--json", action="store_true", help="print the prediction as JSON")


def run(args: argparse.Namespace) -> int:
    """Run ``yolo-det check-machine``: 0 will agree, 1 will differ."""
    from ..tools.diff import load_record
    from ..tools.machine_check import check_machine

    record, _ = load_record(args.record)
    verdict = check_machine(record, args.profile)
    print(json.dumps(verdict.to_dict(), indent=2, default=str) if args.json else verdict.summary())
    return verdict.exit_code
