"""What saving the resume state costs per epoch, on the demo (yolov8n.yaml, bundled demo data).

Trains under ``repro`` as ``yolo-det train`` does and times each epoch (from ``on_train_epoch_start`` to
the end of ``on_fit_epoch_end``: batches, validation, Ultralytics' own checkpoint, the resume state). What
the training thread spends on the resume state is the capture (RNGs, loader state; the parameters and
optimizer moments are referenced, BatchNorm buffers and pending gradients copied) plus any wait for the
background write before the next optimizer step (the write must finish before parameters change). At the
end of one epoch the capture and the write are repeated ``--repeat`` times for steadier numbers. The cost
is that time over the median epoch; a training without the state runs first for comparison. Prints a line
per number and writes JSON.

Usage: python bench/bench_resume.py [--epochs 4] [--imgsz 96] [--repeat 5] [--out bench/results/resume.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("YOLO_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def train(args: argparse.Namespace, *, with_state: bool) -> dict[str, Any]:
    """One training; per epoch its wall time and, with the state, what saving it cost the training thread."""
    from ultralytics import YOLO

    import yolo_det
    from yolo_det.core.quiet import quiet_ultralytics
    from yolo_det.core.resume import save_state, state_path
    from yolo_det.integrations.ultralytics.resume import UltralyticsResume

    epochs: list[float] = []
    blocking: list[float] = []
    repeated_block: list[float] = []
    repeated_write: list[float] = []
    sizes: list[int] = []
    started: list[float] = []
    model = YOLO("yolov8n.yaml")
    plugin = yolo_det.attach(model, "repro")

    def epoch_start(trainer: Any) -> None:
        started.append(time.perf_counter())

    def fit_end(trainer: Any) -> None:  # runs after the plugin's, which submitted the state
        if not started:
            return
        epochs.append(time.perf_counter() - started.pop())
        resume = plugin.resume
        if not with_state or resume is None or not resume.states_written:
            return
        if resume.states_written > len(blocking):
            blocking.append(resume.seconds_saving - sum(blocking))
        if repeated_block:
            return
        resume.flush()
        path = state_path(trainer.last)
        sizes.append(path.stat().st_size)
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            state = resume.capture(trainer, int(trainer.epoch))
            t1 = time.perf_counter()
            save_state(path, state)
            repeated_block.append(t1 - t0)
            repeated_write.append(time.perf_counter() - t1)

    model.add_callback("on_train_epoch_start", epoch_start)
    model.add_callback("on_fit_epoch_end", fit_end)
    saved = UltralyticsResume.on_fit_epoch_end
    if not with_state:
        UltralyticsResume.on_fit_epoch_end = lambda self, trainer: None  # type: ignore[method-assign]
    try:
        with tempfile.TemporaryDirectory(prefix="bench-resume-") as tmp, quiet_ultralytics(False):
            model.train(
                data=str(args.data),
                epochs=args.epochs,
                imgsz=args.imgsz,
                batch=args.batch,
                device="cpu",
                workers=0,
                plots=False,
                project=tmp,
                name="run",
                exist_ok=True,
            )
            record = json.loads(Path(plugin.record_path).read_text()) if plugin.record_path else {}
    finally:
        UltralyticsResume.on_fit_epoch_end = saved  # type: ignore[method-assign]
    waited = record.get("resume_state_wait_seconds")
    return {
        "epochs": epochs,
        "blocking": blocking,
        "repeated_block": repeated_block,
        "repeated_write": repeated_write,
        "bytes": sizes[0] if sizes else None,
        "waited": waited or 0.0,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--imgsz", type=int, default=96)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", default="bench/results/resume.json")
    args = parser.parse_args()

    from yolo_det.integrations.fonts import ensure_local_font
    from yolo_det.tools.demo import demo_data_yaml

    ensure_local_font()
    args.data = demo_data_yaml()
    base = train(args, with_state=False)
    run = train(args, with_state=True)
    epoch = statistics.median(run["epochs"])
    states = max(len(run["blocking"]), 1)
    capture = statistics.median(run["blocking"] or run["repeated_block"])
    block = capture + run["waited"] / states
    write = statistics.median(run["repeated_write"])
    result = {
        "model": "yolov8n.yaml",
        "data": "demo (48 train / 16 val images)",
        "imgsz": args.imgsz,
        "batch": args.batch,
        "epochs": args.epochs,
        "device": "cpu",
        "epoch_seconds_without_state": [round(x, 4) for x in base["epochs"]],
        "epoch_seconds_with_state": [round(x, 4) for x in run["epochs"]],
        "blocking_seconds_in_run": [round(x, 4) for x in run["blocking"]],
        "blocking_seconds_repeated": [round(x, 4) for x in run["repeated_block"]],
        "write_seconds_repeated": [round(x, 4) for x in run["repeated_write"]],
        "state_file_bytes": run["bytes"],
        "waited_for_writes_seconds_total": run["waited"],
        "median_epoch_seconds": round(epoch, 4),
        "median_capture_seconds": round(capture, 4),
        "blocking_seconds_per_state": round(block, 4),
        "median_write_seconds": round(write, 4),
        "cost_percent": round(100 * block / epoch, 3),
        "write_percent_if_synchronous": round(100 * (block + write) / epoch, 3),
    }
    print(f"epoch, median: {epoch:.3f} s with the state, {statistics.median(base['epochs']):.3f} s without")
    print(
        f"training thread per state: capture {capture * 1000:.1f} ms (median of {len(run['blocking'])}) + wait for "
        f"the write before the next step {run['waited'] / states * 1000:.1f} ms (mean) = {block * 1000:.1f} ms "
        f"= {result['cost_percent']:.2f}% of an epoch"
    )
    print(
        f"background write, median: {write * 1000:.1f} ms ({result['state_file_bytes']} bytes; "
        f"{result['write_percent_if_synchronous']:.1f}% of an epoch if it were written in the training thread)"
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
