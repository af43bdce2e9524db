"""Say whether this machine will reproduce a run's weights, before training, and what to set when not.

RECORD is a run folder (holding determinism.json), a determinism.json file, or a file written by
`yolo-det verify --save`. The same command under profile P (default: the run's own) is predicted here:
the threads it would train with, the instruction-set branches of ATen, oneDNN and MKL, torch and its
libraries, the CPU (or on CUDA the GPU model, SM count, driver, CUDA, cuDNN and TF32), and P's training
settings. `yolo-det diff` and `verify --against` name the same causes (one rule, yolo_det.core.machine).

Three answers, each with its exit code:
  0 "will agree"    nothing that decides the bits differs;
  1 "will differ"   a difference known to change the bits (threads, an instruction-set branch, the MKL code
                    path, the GPU model or SM count, TF32), each named with the setting that fixes it;
  3 "not promised"  only versions differ (torch, Ultralytics, oneDNN, MKL, CUDA, cuDNN, the driver) and nobody
                    has measured whether they change the bits: they may agree or not, each named with the reason.
Exit 2 for an unusable file.

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
    """Run ``yolo-det check-machine``: 0 will agree, 1 will differ, 3 not promised."""
    from ..tools.diff import load_record
    from ..tools.machine_check import check_machine

    record, _ = load_record(args.record)
    verdict = check_machine(record, args.profile)
    print(json.dumps(verdict.to_dict(), indent=2, default=str) if args.json else verdict.summary())
    return verdict.exit_code
