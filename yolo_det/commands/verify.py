"""Train the same configuration several times and check that the runs are bitwise identical.

usage: yolo-det verify [--profile NAME|FILE] [--runs N] [--steps K] [--resume-at K [--drop-resume-state]]
                      [--json] [--plot PATH] [key=value ...]

Each run trains a fresh model exactly as `yolo-det train` does (same key=value arguments, same demo
defaults without data=). Per optimizer step the input batch, the loss components and every gradient are
fingerprinted; at the end the weights. The runs are compared step by step: either "bitwise identical"
(exit 0) or the first divergence (exit 1): the step, what differed first (data order or content, loss,
gradients, weights), the parameter with the largest difference and its size. Bad input exits 2.

With --resume-at K, run 2 is stopped cleanly after epoch K (checkpoint written, as an interrupted job
leaves it) and resumed from its last.pt as `yolo-det train resume=...` does; the report compares it with
the straight run 1 in the same way. --drop-resume-state deletes yolo-det's resume state before
resuming, which shows what a plain Ultralytics resume gives.

Without --steps the runs last the epochs given (demo: 3; other data: epochs=1 unless you pass epochs=).
Without project= the runs go to a temporary folder that is removed afterwards.

examples:
  yolo-det verify --profile repro                          # the demo, twice: bitwise identical
  yolo-det verify --profile fast --steps 5 --plot loss.png
  yolo-det verify --profile repro --runs 3 --steps 20 model=my-model.yaml data=my.yaml imgsz=320 device=0
  yolo-det verify --profile balanced --json > verify.json
  yolo-det verify --profile repro --resume-at 2 epochs=4          # interrupted after epoch 2 and resumed
"""

from __future__ import annotations

import argparse
import json

from ..analysis.models import model_names
from ..core.errors import ConfigError
from ..core.fileio import check_output_path
from ..tools.overrides import parse_overrides
from ..tools.prepare import prepare
from ..tools.verify import check_args, plot_losses, progress_to_stderr, verify
from ..tools.verify.records import DEFAULT_KEEP_MIB, RESERVED
from ..tools.verify.resume import check_resume_at, verify_resume

USER_DATA_EPOCHS = 1


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``verify`` arguments."""
    parser.add_argument("--profile", default="repro", metavar="NAME|FILE",
                        help="built-in profile (repro, balanced, fast) or a profile YAML file (default: repro)")
    parser.add_argument("--runs", type=int, default=2, metavar="N", help="number of trainings to compare (default: 2)")
    parser.add_argument("--steps", type=int, default=None, metavar="K",
                        help="stop each run after K optimizer steps (default: the epochs decide)")
    parser.add_argument("--keep-mib", type=float, default=DEFAULT_KEEP_MIB, metavar="MIB",
                        help="memory for the gradient values of run 1's first steps, used to measure a difference "
                             f"(default: {DEFAULT_KEEP_MIB})")
    parser.add_argument("--resume-at", type=int, default=None, metavar="K",
                        help="run 2 is interrupted after epoch K and resumed; compare it with a straight run")
    parser.add_argument("--drop-resume-state", action="store_true",
                        help="with --resume-at: delete yolo-det's resume state before resuming (a plain resume)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--plot", default=None, metavar="PATH", help="write the runs' loss curves to this PNG")
    parser.add_argument("--verbose", action="store_true", help="show Ultralytics' training log (on stderr)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="Ultralytics train arguments")


def run(args: argparse.Namespace) -> int:
    """Run ``yolo-det verify``: exit 0 when the runs are bitwise identical, 1 when not."""
    tokens = list(args.overrides)
    user = parse_overrides(tokens)
    if user.get("resume") not in (None, False):
        raise ConfigError(f"'resume=' cannot be passed to verify: {RESERVED['resume']} (to check a resume, use "
                          "--resume-at K)")
    profile, ul_args = prepare(args.profile, tokens)
    if user.get("data") is not None and "epochs" not in user:
        ul_args["epochs"] = USER_DATA_EPOCHS
    plot_path = check_output_path(args.plot, suffix=".png", what="--plot")
    check_args(ul_args, args.runs, args.steps, args.keep_mib)
    if args.resume_at is None:
        if args.drop_resume_state:
            raise ConfigError("--drop-resume-state goes with --resume-at K")
        with model_names():
            report = verify(profile, ul_args, runs=args.runs, steps=args.steps, keep_mib=args.keep_mib,
                            verbose=args.verbose, progress=progress_to_stderr)
    else:
        if args.runs != 2 or args.steps is not None:
            raise ConfigError("--resume-at compares two runs over whole epochs; drop --runs and --steps")
        check_resume_at(ul_args, args.resume_at)
        with model_names():
            report = verify_resume(profile, ul_args, resume_at=args.resume_at, drop_state=args.drop_resume_state,
                                   keep_mib=args.keep_mib, verbose=args.verbose, progress=progress_to_stderr)
    if plot_path is not None:
        report.plot = str(plot_losses(report, plot_path))
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(report.summary())
        if report.plot:
            print(f"loss curves: {report.plot}")
    return 0 if report.identical else 1
