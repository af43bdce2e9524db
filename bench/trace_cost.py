#!/usr/bin/env python
"""What ``--trace-ops`` costs per traced step: time and disk, on one training.

usage: python bench/trace_cost.py [--steps K] [--trace A-B] [--out FILE.json] [key=value ...]

One run of ``yolo-det verify``'s training loop (``record_runs``, the profile attached as ``yolo-det train``
does) for K optimizer steps, tracing steps A-B: the wall and CPU time of every optimizer step is taken
between consecutive ``on_train_batch_end`` calls (``nbs=batch``, so one micro-batch a step). The traced steps'
median minus the untraced steps' median (the first step, with its one-off costs, left out) is the cost of
tracing a step; the trace file's size divided by the traced steps is its disk cost. Default: yolov8n.yaml at
imgsz 640, batch 2, on the CPU, the bundled demo images. Results go to bench/results/trace_cost.json.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DEFAULTS = [
    "model=yolov8n.yaml",
    "imgsz=640",
    "batch=2",
    "nbs=2",
    "workers=0",
    "plots=False",
    "val=False",
    "device=cpu",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trace_cost.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--trace", default="4-5")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "trace_cost.json"))
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    args = parser.parse_args(argv)

    import torch

    from yolo_det.core.fileio import atomic_write_json
    from yolo_det.tools.prepare import prepare
    from yolo_det.tools.trace import parse_steps, read_trace
    from yolo_det.tools.verify import record_runs

    traced = parse_steps(args.trace)
    stamps: list[tuple[float, float]] = []

    def tick(trainer: Any) -> None:
        stamps.append((time.perf_counter(), time.process_time()))

    with tempfile.TemporaryDirectory() as tmp:
        given = {t.split("=", 1)[0] for t in args.overrides}
        tokens = [
            *(t for t in DEFAULTS if t.split("=", 1)[0] not in given),
            *args.overrides,
            f"project={tmp}",
            "epochs=100",
        ]
        profile, ul_args = prepare("repro", tokens, check_device=False)
        path = Path(tmp) / "trace.jsonl"
        (run,) = record_runs(
            profile,
            ul_args,
            runs=1,
            steps=args.steps,
            callbacks={"on_train_batch_start": tick, "on_train_batch_end": tick},
            record=False,
            trace_ops=str(traced),
            trace_file=path,
        )
        size = path.stat().st_size
        trace = read_trace(path)
    # stamps: start and end of every micro-batch (one a step): the step's time is end - start
    wall = {i + 1: stamps[2 * i + 1][0] - stamps[2 * i][0] for i in range(len(stamps) // 2)}
    cpu = {i + 1: stamps[2 * i + 1][1] - stamps[2 * i][1] for i in range(len(stamps) // 2)}
    plain = [s for s in wall if s not in traced and s > 1]
    in_trace = [s for s in wall if s in traced]
    med = {
        "wall_untraced_s": statistics.median(wall[s] for s in plain),
        "wall_traced_s": statistics.median(wall[s] for s in in_trace),
        "cpu_untraced_s": statistics.median(cpu[s] for s in plain),
        "cpu_traced_s": statistics.median(cpu[s] for s in in_trace),
    }
    step0 = trace.steps[0]
    result = {
        "benchmark": "trace_cost",
        "config": {k: ul_args.get(k) for k in ("model", "imgsz", "batch", "nbs", "device")},
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
        "steps": args.steps,
        "traced_steps": str(traced),
        "optimizer_steps": run.optimizer_steps,
        "step_wall_s": wall,
        "step_cpu_s": cpu,
        **med,
        "overhead_wall_s_per_traced_step": med["wall_traced_s"] - med["wall_untraced_s"],
        "overhead_ratio_wall": med["wall_traced_s"] / med["wall_untraced_s"],
        "overhead_cpu_s_per_traced_step": med["cpu_traced_s"] - med["cpu_untraced_s"],
        "trace_bytes": size,
        "bytes_per_traced_step": size / len(trace.steps),
        "forward_calls_per_micro_batch": len(step0.micro[0].forward),
        "backward_events_per_micro_batch": len(step0.micro[0].backward),
    }
    atomic_write_json(args.out, result)
    print(
        f"trace cost ({ul_args['model']}, imgsz {ul_args['imgsz']}, batch {ul_args['batch']}, {ul_args['device']}): "
        f"untraced step {med['wall_untraced_s']:.2f} s, traced {med['wall_traced_s']:.2f} s "
        f"({result['overhead_ratio_wall']:.2f}x, +{result['overhead_wall_s_per_traced_step']:.2f} s wall, "
        f"+{result['overhead_cpu_s_per_traced_step']:.2f} s CPU); "
        f"{result['bytes_per_traced_step'] / 1024:.0f} KiB per traced step; results: {args.out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
