"""What the yolo-det plugin costs per training step, against plain Ultralytics.

Trains a stock model (yolov8n.yaml) on the bundled demo data in one process, interleaving three
configurations round by round so that machine noise hits them alike:

- ``ultralytics``: plain Ultralytics with ``deterministic=True`` (its own warn-only determinism);
- ``plugin``: yolo-det with a profile that asks for exactly Ultralytics' own settings (warn-only,
  cuDNN deterministic, no uninitialized-memory fill): the cost of the plugin's machinery alone;
- ``repro``: yolo-det with the ``repro`` profile (strict, uninitialized-memory fill, swaps and
  interception): the cost of the plugin plus what ``repro`` asks for.

A step is timed from ``on_train_batch_start`` to ``on_train_batch_end`` (forward, backward, optimizer
step), in wall time and in process CPU time (the steadier number on a busy machine). The first steps of
every run are dropped as warm-up. Prints a markdown table of medians and ratios to ``ultralytics`` and
writes JSON.

Usage: python bench/bench_plugin.py [--rounds 3] [--epochs 4] [--imgsz 96] [--out bench/results/plugin.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("YOLO_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PLUGIN_PROFILE = """\
name: ultralytics-equivalent
description: Ultralytics' own deterministic settings, applied by yolo-det.
defaults:
  deterministic_algorithms: warn
  cudnn_benchmark: false
  cudnn_deterministic: true
  allow_tf32: true
  fill_uninitialized_memory: false
  env: {CUBLAS_WORKSPACE_CONFIG: ":4096:8"}
"""


def run_once(
    config: str, args: argparse.Namespace, workdir: Path, profile_path: Path, index: int
) -> list[tuple[float, float]]:
    from ultralytics import YOLO

    import yolo_det
    from yolo_det.tools.demo import demo_data_yaml

    times: list[tuple[float, float]] = []
    start: list[tuple[float, float]] = []
    model = YOLO("yolov8n.yaml")
    if config == "plugin":
        yolo_det.attach(model, profile_path)
    elif config == "repro":
        yolo_det.attach(model, "repro")
    model.add_callback("on_train_batch_start", lambda t: start.append((time.perf_counter(), time.process_time())))
    model.add_callback(
        "on_train_batch_end",
        lambda t: times.append((time.perf_counter() - start[-1][0], time.process_time() - start[-1][1])),
    )
    model.train(
        data=str(demo_data_yaml()),
        epochs=args.epochs,
        imgsz=args.imgsz,
        batch=args.batch,
        device="cpu",
        workers=0,
        plots=False,
        val=False,
        project=str(workdir),
        name=f"{config}{index}",
        exist_ok=True,
        deterministic=True,
        seed=0,
        verbose=False,
    )
    return times[args.warmup :]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--imgsz", type=int, default=96)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=2, help="steps dropped at the start of every run")
    parser.add_argument("--out", type=Path, default=Path("bench/results/plugin.json"))
    args = parser.parse_args()

    from yolo_det.core.fileio import atomic_write_json
    from yolo_det.integrations.fonts import ensure_local_font

    ensure_local_font()
    configs = ("ultralytics", "plugin", "repro")
    steps: dict[str, list[tuple[float, float]]] = {c: [] for c in configs}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        profile_path = workdir / "ultralytics-equivalent.yaml"
        profile_path.write_text(PLUGIN_PROFILE)
        for r in range(args.rounds):
            order = configs if r % 2 == 0 else tuple(reversed(configs))
            for config in order:
                steps[config] += run_once(config, args, workdir, profile_path, r)
    wall = {c: statistics.median(w for w, _ in v) for c, v in steps.items()}
    cpu = {c: statistics.median(p for _, p in v) for c, v in steps.items()}
    rows = [
        {
            "config": c,
            "steps": len(steps[c]),
            "median_step_s": wall[c],
            "ratio": wall[c] / wall["ultralytics"],
            "median_step_cpu_s": cpu[c],
            "cpu_ratio": cpu[c] / cpu["ultralytics"],
        }
        for c in configs
    ]
    print(
        f"\nTraining step, yolov8n.yaml, imgsz {args.imgsz}, batch {args.batch}, CPU "
        f"({os.cpu_count()} cores), {args.rounds} interleaved rounds"
    )
    print("| config | steps | median step, wall (ms) | ratio | median step, process CPU time (ms) | ratio |")
    print("|---|---:|---:|---:|---:|---:|")
    for row in rows:
        print(
            f"| {row['config']} | {row['steps']} | {row['median_step_s'] * 1e3:.1f} | {row['ratio']:.3f} | "
            f"{row['median_step_cpu_s'] * 1e3:.1f} | {row['cpu_ratio']:.3f} |"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(
        args.out,
        {
            "imgsz": args.imgsz,
            "batch": args.batch,
            "rounds": args.rounds,
            "rows": rows,
            "environment": __import__("yolo_det").environment(),
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
