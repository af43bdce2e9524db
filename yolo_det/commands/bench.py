"""Measure what each determinism profile costs on your model and device.

The key=value arguments are the Ultralytics train arguments of `yolo-det train` (model=, data=, imgsz=, batch=,
device=, amp=, ...), with the same demo defaults without data=. In one process, every profile's train phase
runs the trainer's own training step (forward, backward, optimizer step) on the same model and batches, in
interleaved blocks, after warm-up steps. Reported per profile: median step time, throughput (images/s),
peak memory, and ratios to the fastest; then what each setting costs when toggled on its own (deterministic
algorithms, fill_uninitialized_memory, the backward toggle, TF32; on CUDA also cuDNN benchmark and
deterministic). The bench's own per-step overhead is measured and printed.

examples:
  yolo-det bench                                          # the demo model on the CPU, the three profiles
  yolo-det bench --steps 50 --plot cost.png model=yolo11n.yaml imgsz=640 batch=16 device=0
  yolo-det bench --profiles repro,my-profile.yaml --json > bench.json
"""

from __future__ import annotations

import argparse
import json
import sys

from ..core.constants import DEFAULT_BENCH_PROFILES as DEFAULT_PROFILES
from ..core.fileio import check_output_path
from . import add_import_option, add_trust_flag, user_inputs


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``bench`` arguments."""
    parser.add_argument(
        "--profiles",
        default=",".join(DEFAULT_PROFILES),
        metavar="P1,P2,...",
        help=f"profiles to compare, names or YAML files (default: {','.join(DEFAULT_PROFILES)})",
    )
    parser.add_argument(
        "--steps", type=int, default=20, metavar="K", help="measured steps per configuration (default: 20)"
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=3,
        metavar="W",
        help="untimed steps per configuration before measuring (default: 3)",
    )
    parser.add_argument(
        "--block",
        type=int,
        default=5,
        metavar="B",
        help="consecutive steps per configuration before the next takes over (default: 5)",
    )
    parser.add_argument("--no-isolate", action="store_true", help="skip the per-setting measurements")
    add_import_option(parser)
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--plot", default=None, metavar="PATH", help="write a bar chart to this PNG")
    parser.add_argument("--verbose", action="store_true", help="show Ultralytics' log (on stderr)")
    add_trust_flag(parser)
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="Ultralytics train arguments")


def run(args: argparse.Namespace) -> int:
    """Run ``yolo-det bench``."""
    from ..core.profiles import load_profile
    from ..tools.overrides import parse_overrides

    parse_overrides(list(args.overrides))  # what needs no torch is checked before torch starts
    for name in filter(None, (p.strip() for p in args.profiles.split(","))):
        load_profile(name)
    from ..tools.bench import bench, check_args, parse_profiles, plot_bench
    from ..tools.prechecks import check_device
    from ..tools.prepare import prepare

    profiles = parse_profiles(args.profiles)
    with user_inputs(args):
        _, ul_args = prepare(profiles[0], list(args.overrides), check_device=False)
        check_args(ul_args, args.steps, args.warmup, args.block)
        check_device(ul_args.get("device"))
        plot_path = check_output_path(args.plot, suffix=".png", what="--plot")
        report = bench(
            profiles,
            ul_args,
            steps=args.steps,
            warmup=args.warmup,
            block=args.block,
            isolate=not args.no_isolate,
            verbose=args.verbose,
            progress=lambda line: print(line, file=sys.stderr, flush=True),
        )
    if plot_path is not None:
        report.plot = str(plot_bench(report, plot_path))
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(report.table())
        if report.plot:
            print(f"chart: {report.plot}")
    return 0
