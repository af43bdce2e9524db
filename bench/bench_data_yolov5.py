#!/usr/bin/env python
"""What worker-invariant data costs on YOLOv5's training loader, as a patched ``train.py`` runs it.

usage: python bench/bench_data_yolov5.py [--rounds R] [--workers W] [--out FILE]

The loader is built from YOLOv5's own (``create_dataloader`` of the installed ``yolov5`` package, mosaic and mixup
on) as a run builds it under a profile, with and without ``data_invariance``
(:func:`yolo_det.fixes.data_invariance.keyed_loader`: one stream of epochs over workers that live for the run;
:class:`yolo_det.integrations.yolov5.data.EpochLoader`: new workers every epoch). One round
times three epochs of each mode after one warm-up epoch; the rounds interleave the two modes (alternating which
goes first) and the figure is the median over rounds of the per-round ratio. Throughput is counted per CPU
second of the process and its workers (read when each epoch's last batch arrives), and per wall-clock second.
Dataset: 192 synthetic 160x160 images at imgsz 160, batch 4 (see ``bench/bench_data.py``).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for folder in (ROOT, ROOT / "bench"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

from bench_data import TARGET, _large_dataset  # noqa: E402


def _workers_cpu(loader: Any) -> float:
    """CPU seconds used by the live worker processes of a loader's iterator since they started (Linux /proc)."""
    iterator = getattr(loader, "iterator", loader)
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for worker in getattr(iterator, "_workers", ()):
        try:
            fields = Path(f"/proc/{worker.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick  # utime + stime
    return total


def _images_per_second(images_dir: str, workers: int, invariant: bool) -> tuple[float, float]:
    """(images per wall-clock second, images per CPU second of the process and its workers)."""
    import yaml
    import yolov5
    from yolov5.utils.dataloaders import create_dataloader

    from yolo_det.fixes.data_invariance import keyed_loader
    from yolo_det.integrations.yolov5.data import EpochLoader

    hyp_file = Path(next(iter(yolov5.__path__))) / "data" / "hyps" / "hyp.scratch-low.yaml"
    hyp = {**yaml.safe_load(hyp_file.read_text(encoding="utf-8")), "mosaic": 1.0, "mixup": 0.5}
    like, _ = create_dataloader(images_dir, 160, 4, 32, hyp=hyp, augment=True, workers=workers, shuffle=True, seed=0)
    # as a run builds it: keyed, one stream of epochs over workers that live for the run; else a new pass (and new
    # workers) every epoch
    loader = keyed_loader(like, 0) if invariant else EpochLoader(like, seed=0)
    images, wall, cpu, before = 0, 0.0, 0.0, 0.0
    for epoch in range(4):
        t0, c0 = time.perf_counter(), time.process_time()
        iterator = loader.iterator if invariant else iter(loader)
        n = sum(int(next(iterator)[0].shape[0]) for _ in range(len(loader)))  # the epoch's workers still live
        workers_cpu = _workers_cpu(iterator)
        if not invariant:
            iterator._shutdown_workers()
        if epoch > 0:  # epoch 0 warms up
            cpu += time.process_time() - c0 + workers_cpu - before
            wall += time.perf_counter() - t0
            images += n
        before = workers_cpu if invariant else 0.0
    if invariant:
        loader.iterator._shutdown_workers()
    return images / wall, images / cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "data_yolov5.json")
    args = parser.parse_args(argv)
    import torch

    from yolo_det.core.fileio import atomic_write_json

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    cpu_ratio, wall_ratio = [], []
    with tempfile.TemporaryDirectory(prefix="bench-data-yolov5-") as tmp:
        _large_dataset(Path(tmp))
        images_dir = str(Path(tmp) / "images" / "train")
        for r in range(args.rounds):
            order = (False, True) if r % 2 == 0 else (True, False)
            got = {inv: _images_per_second(images_dir, args.workers, inv) for inv in order}
            wall_ratio.append(got[True][0] / got[False][0])
            cpu_ratio.append(got[True][1] / got[False][1])
            print(
                f"round {r}: images/s wall off {got[False][0]:.1f} on {got[True][0]:.1f}; "
                f"images per CPU-s off {got[False][1]:.1f} on {got[True][1]:.1f}",
                flush=True,
            )
    cpu_med, wall_med = statistics.median(cpu_ratio), statistics.median(wall_ratio)
    result = {
        "target": TARGET,
        "measure": "median over interleaved rounds of (invariant / YOLOv5) training loader throughput in images "
        "per CPU second of the process and its workers (cost) and per wall-clock second (wall_cost), 3 timed "
        "epochs per round after one warm-up epoch, each loader as a patched train.py builds it (keyed: one stream over "
        "workers that live for the run; without invariance: new workers every epoch)",
        "dataset": "192 synthetic 160x160 images, imgsz 160, batch 4, mosaic 1.0, mixup 0.5",
        "workers": args.workers,
        "rounds": args.rounds,
        "cpu_ratios": [round(x, 4) for x in cpu_ratio],
        "cost": round(1 - cpu_med, 4),
        "wall_cost": round(1 - wall_med, 4),
        "within_target": 1 - cpu_med <= TARGET,
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__},
    }
    atomic_write_json(args.out, result)
    print(
        f"YOLOv5 loader, {args.workers} workers: cost {100 * result['cost']:+.1f}% of CPU throughput, "
        f"{100 * result['wall_cost']:+.1f}% of wall-clock throughput (target {100 * TARGET:.0f}%)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
