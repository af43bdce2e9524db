"""Train the same configuration several times and check that the runs are bitwise identical.

Each run trains a fresh model exactly as `yolo-det train` does (same key=value arguments, same demo
defaults without data=). Per optimizer step the input batch, the loss components and every gradient are
fingerprinted; at the end the weights. The runs are compared step by step: either "bitwise identical"
(exit 0) or the first divergence (exit 1): the step, what differed first (data order or content, loss,
gradients, weights), the parameter with the largest difference and its size. Bad input exits 2. When
everything matches but the trained weights equal the initial ones, the verdict is "nothing compared"
(exit 3): more --steps or epochs=, or warmup_epochs=0.

Across processes and machines: --save FILE writes one run's per-step fingerprints (batch, loss, gradient
per parameter, weights after each step) with its environment to a small versioned JSON file; --against
FILE trains once here and compares with it: the first diverging step and what diverged (data order,
data content, loss, gradients naming the parameters, weights), then the environment differences (as
`yolo-det diff` lists them). With --save or --against one run is trained unless --runs says more, and
--steps defaults to the saved run's. Pass the same key=value arguments on both sides. The file is checked
field by field before any training (a malformed one: one line, exit 2). A saved run from another device
type compares data and losses only and is never a pass (exit 1: not verified bitwise).
--trace-ops STEPS (with --save FILE) also writes FILE.ops.jsonl: digests of every module's forward, the
backward and the optimizer step of those steps, which `yolo-det bisect` compares with another trace.

Without --steps the runs last the epochs given (demo: 3; other data: epochs=1 unless you pass epochs=).
With --steps K the runs stop after K optimizer steps, or earlier when their epochs end first: the report
says so and how many epochs would reach K. --import MODULE: as in `yolo-det train`.
Without project= the runs go to a temporary folder that is removed afterwards.

With --resume-at K, run 2 is stopped cleanly after epoch K (checkpoint written, as an interrupted job
leaves it) and resumed from its last.pt as `yolo-det train resume=...` does; the report compares it with
the straight run 1 in the same way. --drop-resume-state deletes yolo-det's resume state before
resuming, which shows what a plain Ultralytics resume gives.

In CI: --junit FILE.xml writes JUnit XML with one test case per compared quantity (data, loss, gradients,
final weights; and the environment with --against); --annotations github prints ::error:: lines for
GitHub Actions. A baseline committed once (--save baseline.json) and checked with --against baseline.json
catches drift after an upgrade (docs/ci.md).

examples:
  yolo-det verify --profile repro                          # the demo, twice: bitwise identical
  yolo-det verify --profile fast --steps 5 --plot loss.png
  yolo-det verify --profile repro --runs 3 --steps 20 model=my-model.yaml data=my.yaml imgsz=320 device=0
  yolo-det verify --profile balanced --json > verify.json
  yolo-det verify --profile repro --steps 10 --save gpu-a.json device=0      # on machine A
  yolo-det verify --profile repro --against gpu-a.json device=0              # on machine B
  yolo-det verify --profile repro --resume-at 2 epochs=4          # interrupted after epoch 2 and resumed
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..core.constants import DEFAULT_KEEP_MIB
from ..core.errors import ConfigError
from ..core.fileio import check_output_path
from ..core.text import printable
from ..tools.overrides import parse_overrides
from . import add_ci_options, add_import_option, add_trust_flag, check_ci_options, emit_ci, profile_names, user_inputs

USER_DATA_EPOCHS = 1


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``verify`` arguments."""
    parser.add_argument(
        "--profile",
        default="repro",
        metavar="NAME|FILE",
        help=f"built-in profile ({profile_names()}) or a profile YAML file (default: repro)",
    )
    parser.add_argument(
        "--runs",
        type=int,
        default=None,
        metavar="N",
        help="number of trainings to compare (default: 2; 1 with --save or --against)",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        metavar="K",
        help="stop each run after K optimizer steps (default: the epochs decide)",
    )
    parser.add_argument(
        "--keep-mib",
        type=float,
        default=DEFAULT_KEEP_MIB,
        metavar="MIB",
        help="memory for the gradient values of run 1's first steps, used to measure a difference "
        f"(default: {DEFAULT_KEEP_MIB})",
    )
    add_import_option(parser)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--plot", default=None, metavar="PATH", help="write the runs' loss curves to this PNG")
    parser.add_argument(
        "--save",
        default=None,
        metavar="FILE",
        help="write run 1's per-step fingerprints and environment to this JSON file",
    )
    parser.add_argument(
        "--against",
        default=None,
        metavar="FILE",
        help="compare run 1 with the fingerprints a --save run wrote (another process or machine)",
    )
    parser.add_argument(
        "--trace-ops",
        default=None,
        metavar="STEPS",
        help="with --save FILE: also trace every op of these steps of run 1 (7, 3-5, first:2) into FILE's "
        ".ops.jsonl, for `yolo-det bisect`",
    )
    parser.add_argument(
        "--resume-at",
        type=int,
        default=None,
        metavar="K",
        help="run 2 is interrupted after epoch K and resumed; compare it with a straight run",
    )
    parser.add_argument(
        "--drop-resume-state",
        action="store_true",
        help="with --resume-at: delete yolo-det's resume state before resuming (a plain resume)",
    )
    parser.add_argument("--verbose", action="store_true", help="show Ultralytics' training log (on stderr)")
    add_ci_options(parser)
    add_trust_flag(parser)
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="Ultralytics train arguments")


def run(args: argparse.Namespace) -> int:
    """Run ``yolo-det verify``: exit 0 when the runs (and the saved run) are bitwise identical, 1 when not,
    3 when they match over weights that never changed (nothing compared)."""
    from ..core.profiles import load_profile

    tokens = list(args.overrides)
    given = parse_overrides(tokens)  # what needs no torch is checked before torch starts
    load_profile(args.profile)
    from ..tools.ci_report import against_suite, verify_suite
    from ..tools.prechecks import check_device
    from ..tools.prepare import prepare
    from ..tools.verify import check_args, progress_to_stderr, verify
    from ..tools.verify.crossverify import compare_against, load_saved, save_run
    from ..tools.verify.records import RESERVED

    if given.get("resume") not in (None, False):
        raise ConfigError(
            f"'resume=' cannot be passed to verify: {RESERVED['resume']} (to check a resume, use --resume-at K)"
        )
    if args.drop_resume_state and args.resume_at is None:
        raise ConfigError("--drop-resume-state goes with --resume-at K")
    check_ci_options(args)
    if args.trace_ops is not None:
        from ..tools.trace import parse_steps

        if args.save is None or args.resume_at is not None:
            raise ConfigError("--trace-ops goes with --save FILE (the trace is written beside it, FILE.ops.jsonl)")
        parse_steps(args.trace_ops)
    with user_inputs(args):  # the user's modules first: a bad one fails before any work
        profile, ul_args = prepare(args.profile, tokens, check_device=False)
        if given.get("data") is not None and "epochs" not in given:
            ul_args["epochs"] = USER_DATA_EPOCHS
        plot_path = check_output_path(args.plot, suffix=".png", what="--plot")
        if args.resume_at is not None:
            return _run_resume_at(args, profile, ul_args, plot_path)
        save_path = check_output_path(args.save, suffix=".json", what="--save")
        saved = load_saved(args.against) if args.against is not None else None
        portable = save_path is not None or saved is not None
        runs = args.runs if args.runs is not None else (1 if portable else 2)
        steps = args.steps if args.steps is not None or saved is None else saved.steps_requested
        trace_file = save_path.with_suffix(".ops.jsonl") if save_path is not None and args.trace_ops else None
        check_args(ul_args, runs, steps, args.keep_mib, min_runs=1 if portable else 2)
        check_device(ul_args.get("device"))
        shown = verify(
            profile,
            ul_args,
            runs=runs,
            steps=steps,
            keep_mib=args.keep_mib,
            verbose=args.verbose,
            progress=progress_to_stderr,
            portable=portable,
            trace_ops=args.trace_ops,
            trace_file=trace_file,
        )
        records = shown.runs
        report = shown if runs >= 2 else None  # one run: recorded to save or compare, nothing to verify here
    device = shown.device
    if save_path is not None:
        save_run(save_path, records[0], profile=profile.name, args=ul_args, steps_requested=steps, device=device)
    against = compare_against(saved, records[0]) if saved is not None else None
    if plot_path is not None:
        from ..tools.verify import plot_losses

        shown.plot = str(plot_losses(shown, plot_path))
    if args.json:
        out = shown.to_dict()
        if report is None:
            out.pop("identical", None)
            out["verdict"] = "one run recorded"
        if portable:
            out["saved"] = str(save_path) if save_path is not None else None
            out["against"] = against.to_dict() if against is not None else None
        print(json.dumps(out, indent=2, default=str))
    else:
        if report is not None:
            print(printable(report.summary()))
        else:
            r = records[0]
            print(
                f"yolo-det verify: profile {profile.name}, 1 run of {len(r.steps)} optimizer steps in "
                f"{r.seconds:.1f} s, "
                f"device {device}, weights digest {r.weights.get('sha256', '?')}"
            )
            if shown.steps_note:
                print(f"note: {shown.steps_note}")
        if save_path is not None:
            print(f"fingerprints saved: {save_path}")
        if trace_file is not None and trace_file.is_file():
            print(f"op trace: {trace_file}")
        elif trace_file is not None:  # the steps asked for never ran
            ran = len(records[0].steps)
            print(
                f"yolo-det: warning: --trace-ops {args.trace_ops} traced nothing: run 1 had {ran} optimizer "
                f"step{'s' if ran != 1 else ''}, so no op trace was written",
                file=sys.stderr,
            )
        if against is not None:
            print(printable(against.summary()))
        if shown.plot:
            print(f"loss curves: {shown.plot}")
    suites = ([verify_suite(report)] if report is not None else []) + ([against_suite(against)] if against else [])
    emit_ci(args, suites)
    codes = ([report.exit_code] if report is not None else []) + ([against.exit_code] if against else [])
    return 1 if 1 in codes else 3 if 3 in codes else 0


def _run_resume_at(args: argparse.Namespace, profile: Any, ul_args: dict[str, Any], plot_path: Any) -> int:
    """``--resume-at K``: a straight run against one interrupted after epoch K and resumed (called inside
    :func:`user_inputs`)."""
    from ..tools.ci_report import verify_suite
    from ..tools.prechecks import check_device
    from ..tools.verify import check_args, plot_losses, progress_to_stderr
    from ..tools.verify.resume import check_resume_at, verify_resume

    if args.runs not in (None, 2) or args.steps is not None or args.save or args.against:
        raise ConfigError("--resume-at compares two runs over whole epochs; drop --runs, --steps, --save and --against")
    check_args(ul_args, 2, None, args.keep_mib)
    check_resume_at(ul_args, args.resume_at)
    check_device(ul_args.get("device"))
    report = verify_resume(
        profile,
        ul_args,
        resume_at=args.resume_at,
        drop_state=args.drop_resume_state,
        keep_mib=args.keep_mib,
        verbose=args.verbose,
        progress=progress_to_stderr,
    )
    if plot_path is not None:
        report.plot = str(plot_losses(report, plot_path))
    if args.json:
        print(json.dumps(report.to_dict(), indent=2, default=str))
    else:
        print(printable(report.summary()))
        if report.plot:
            print(f"loss curves: {report.plot}")
    emit_ci(args, [verify_suite(report)])
    return report.exit_code
