#!/usr/bin/env python
"""What ``yolo-det verify`` costs: 2 recorded runs plus the comparison, against one plain run.

usage: python bench/verify_cost.py [--repeats R] [--steps K] [key=value ...]

Target: verify with 2 runs costs at most 2.1x one run. "One run" is the same training (same profile,
arguments and stopping rule) without any recording; "verify" is ``yolo_det.tools.verify.verify`` with 2 runs
(recording, comparison). Both run in this process, after one untimed warm-up run (lazy imports, the
dataset's label cache); they alternate R times and the medians are compared. Also printed: the recording
cost per optimizer step (recorded run minus plain run, divided by the steps).

Default configuration: what ``yolo-det verify --profile repro`` runs without arguments (the demo data,
yolov8n.yaml, imgsz 96, batch 16, 3 epochs, CPU). Pass ``--steps K`` and key=value to change it, e.g. the
smallest configuration, where recording weighs most: ``--steps 12 imgsz=64 batch=8 nbs=8 plots=False val=False``.
Wall times on a shared machine are noisy; the CPU time of this process is reported next to them.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TARGET = 2.1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="verify_cost.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per run (default: the epochs decide)")
    parser.add_argument("--profile", default="repro")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    args = parser.parse_args(argv)

    from yolo_det.tools.prepare import prepare
    from yolo_det.tools.verify import record_runs, verify

    profile, ul_args = prepare(args.profile, list(args.overrides))
    record_runs(profile, ul_args, runs=1, steps=args.steps, record=False)  # warm-up

    wall: dict[str, list[float]] = {"plain": [], "verify": []}
    cpu: dict[str, list[float]] = {"plain": [], "verify": []}
    for r in range(args.repeats):
        for kind in ("plain", "verify"):
            w0, c0 = time.perf_counter(), time.process_time()
            if kind == "plain":
                runs = record_runs(profile, ul_args, runs=1, steps=args.steps, record=False)
            else:
                report = verify(profile, ul_args, runs=2, steps=args.steps)
                if not report.identical:
                    print(f"warning: repeat {r + 1}: the runs were not identical", file=sys.stderr)
            wall[kind].append(time.perf_counter() - w0)
            cpu[kind].append(time.process_time() - c0)
        print(
            f"repeat {r + 1}/{args.repeats}: one run {wall['plain'][-1]:.2f} s wall / {cpu['plain'][-1]:.2f} s CPU, "
            f"verify {wall['verify'][-1]:.2f} s wall / {cpu['verify'][-1]:.2f} s CPU",
            file=sys.stderr,
        )
    steps = runs[0].optimizer_steps
    print(
        f"verify cost: {args.profile}, {ul_args['model']}, imgsz {ul_args.get('imgsz')}, "
        f"batch {ul_args.get('batch')}, {steps} optimizer steps per run, device {ul_args.get('device')}, "
        f"{args.repeats} repeats (medians)"
    )
    print(f"{'':<36}{'wall s':>9}{'CPU s':>9}")
    ratios = {}
    for label, kind in (("one plain run", "plain"), ("verify: 2 recorded runs + compare", "verify")):
        print(f"{label:<36}{statistics.median(wall[kind]):>9.2f}{statistics.median(cpu[kind]):>9.2f}")
    for name, series in (("wall", wall), ("CPU", cpu)):
        ratios[name] = statistics.median(series["verify"]) / statistics.median(series["plain"])
    print(f"{'ratio (target <= ' + str(TARGET) + ')':<36}{ratios['wall']:>8.2f}x{ratios['CPU']:>8.2f}x")
    extra = statistics.median(cpu["verify"]) - 2 * statistics.median(cpu["plain"])
    per_step = extra / max(2 * steps, 1) * 1e3
    print(
        f"verify minus two plain runs: {extra:+.2f} CPU s ({per_step:+.1f} CPU ms per recorded "
        "step; a negative value is within the noise)"
    )
    return 0 if min(ratios.values()) <= TARGET else 1


if __name__ == "__main__":
    raise SystemExit(main())
