#!/usr/bin/env python
"""What worker-invariant data costs: Ultralytics' training loader throughput with and without it.

usage: python bench/bench_data.py [--rounds R] [--workers W] [--out FILE]

Target: at 2 workers, the invariant loader's throughput is within 3% of Ultralytics' own.

The loader is Ultralytics' own (``build_yolo_dataset`` + ``build_dataloader``, mosaic and mixup on), seeded
by yolo-det, with and without :func:`yolo_det.fixes.data_invariance.keyed_loader`. One round builds both
loaders, lets each run one epoch to start its workers and fill its image buffer, then times three more
epochs; the rounds interleave the two modes (alternating which goes first) and the figure is the median
over rounds of the per-round ratio. Throughput is counted per CPU second of the process and its workers
(what the cost figure uses: on a shared machine it moves far less than wall-clock time, also reported), and
the image decodes per image fed are counted (an epoch without workers; noise-free).
Two datasets:

- ``demo``: the bundled demo (48 images); every image fits in a worker's mosaic buffer;
- ``large``: 192 synthetic 160x160 images at imgsz 160, batch 4: a worker's buffer holds 32 of them, more
  than a batch but far fewer than the dataset. Ultralytics draws mosaic partners from that buffer (already
  decoded); the invariant loader draws them uniformly over the dataset (Ultralytics' rule without the buffer),
  so most partners are decoded again. Measured again with ``cache=ram``, where every image is decoded before
  training and only the reseeding is left.
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
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TARGET = 0.03


def _large_dataset(root: Path, n: int = 192, size: int = 160) -> str:
    import cv2
    import numpy as np

    rng = np.random.default_rng(0)
    (root / "images" / "train").mkdir(parents=True)
    (root / "labels" / "train").mkdir(parents=True)
    for i in range(n):
        img = rng.integers(0, 255, size=(size, size, 3)).astype(np.uint8)
        w, h = (int(v) for v in rng.integers(size // 6, size // 3, size=2))
        x0, y0 = int(rng.integers(0, size - w)), int(rng.integers(0, size - h))
        cv2.rectangle(img, (x0, y0), (x0 + w, y0 + h), (255, 0, 0), thickness=-1)
        cv2.imwrite(str(root / "images" / "train" / f"{i:04d}.png"), img)
        box = ((x0 + w / 2) / size, (y0 + h / 2) / size, w / size, h / size)
        (root / "labels" / "train" / f"{i:04d}.txt").write_text("0 " + " ".join(f"{v:.6f}" for v in box) + "\n")
    yaml_path = root / "data.yaml"
    yaml_path.write_text(f"path: {root}\ntrain: images/train\nval: images/train\nnames:\n  0: box\n")
    return str(yaml_path)


def _loader(data_yaml: str, imgsz: int, batch: int, workers: int, invariant: bool, cache: str | None = None) -> Any:
    from ultralytics.cfg import get_cfg
    from ultralytics.data import build_dataloader, build_yolo_dataset
    from ultralytics.data.utils import check_det_dataset
    from ultralytics.utils import DEFAULT_CFG

    from yolo_det.core.seeding import seed_dataloader
    from yolo_det.fixes.data_invariance import keyed_loader

    cfg = get_cfg(DEFAULT_CFG, {"imgsz": imgsz, "mosaic": 1.0, "mixup": 0.5, "fliplr": 0.5, "cache": cache or False})
    data = check_det_dataset(data_yaml)
    dataset = build_yolo_dataset(cfg, data["train"], batch, data, mode="train", stride=32)
    loader = build_dataloader(dataset, batch=batch, workers=workers, shuffle=True, device="cpu")
    seed_dataloader(loader, 0)
    return keyed_loader(loader, 0) if invariant else loader


def _cpu_seconds(loader: Any) -> float:
    """CPU seconds used so far by this process and the loader's live worker processes (Linux /proc)."""
    total = time.process_time()
    tick = os.sysconf("SC_CLK_TCK")
    for worker in getattr(getattr(loader, "iterator", None), "_workers", ()):
        try:
            fields = Path(f"/proc/{worker.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick  # utime + stime
    return total


def _images_per_second(
    data_yaml: str, imgsz: int, batch: int, workers: int, invariant: bool, cache: str | None
) -> tuple[float, float]:
    """(images per wall-clock second, images per CPU second of the process and its workers)."""
    loader = _loader(data_yaml, imgsz, batch, workers, invariant, cache)
    try:
        for _ in loader:  # start the workers, fill their buffers
            pass
        images, t0, c0 = 0, time.perf_counter(), _cpu_seconds(loader)
        for _ in range(3):
            for b in loader:
                images += int(b["img"].shape[0])
        return images / (time.perf_counter() - t0), images / (_cpu_seconds(loader) - c0)
    finally:
        loader.reset()


def _decodes_per_image(data_yaml: str, imgsz: int, batch: int, invariant: bool, cache: str | None) -> float:
    """Image decodes per image fed in the second epoch of a loader without workers (counted, so noise-free)."""
    import ultralytics.data.base as base

    own = base.imread
    decodes = [0]

    def counting_imread(*args: Any, **kwargs: Any) -> Any:
        decodes[0] += 1
        return own(*args, **kwargs)

    loader = _loader(data_yaml, imgsz, batch, 0, invariant, cache)
    base.imread = counting_imread
    try:
        for _ in loader:
            pass
        decodes[0], images = 0, 0
        for b in loader:
            images += int(b["img"].shape[0])
        return decodes[0] / images
    finally:
        base.imread = own
        loader.reset()


def _measure(
    name: str, data_yaml: str, imgsz: int, batch: int, workers: int, rounds: int, cache: str | None = None
) -> dict[str, Any]:
    wall: dict[bool, list[float]] = {False: [], True: []}
    cpu: dict[bool, list[float]] = {False: [], True: []}
    wall_ratio, cpu_ratio = [], []
    for r in range(rounds):
        order = (False, True) if r % 2 == 0 else (True, False)
        got = {inv: _images_per_second(data_yaml, imgsz, batch, workers, inv, cache) for inv in order}
        for inv in (False, True):
            wall[inv].append(got[inv][0])
            cpu[inv].append(got[inv][1])
        wall_ratio.append(got[True][0] / got[False][0])
        cpu_ratio.append(got[True][1] / got[False][1])
        print(
            f"{name} round {r}: images/s wall off {got[False][0]:.1f} on {got[True][0]:.1f}; "
            f"images per CPU-s off {got[False][1]:.1f} on {got[True][1]:.1f}",
            flush=True,
        )
    cpu_med, wall_med = statistics.median(cpu_ratio), statistics.median(wall_ratio)
    decodes = {inv: round(_decodes_per_image(data_yaml, imgsz, batch, inv, cache), 3) for inv in (False, True)}
    return {
        "dataset": name,
        "cache": cache,
        "imgsz": imgsz,
        "batch": batch,
        "workers": workers,
        "rounds": rounds,
        "decodes_per_image_off": decodes[False],
        "decodes_per_image_on": decodes[True],
        "images_per_cpu_s_off": round(statistics.median(cpu[False]), 2),
        "images_per_cpu_s_on": round(statistics.median(cpu[True]), 2),
        "cpu_ratio_on_off": round(cpu_med, 4),
        "cost": round(1 - cpu_med, 4),
        "images_per_s_off": round(statistics.median(wall[False]), 2),
        "images_per_s_on": round(statistics.median(wall[True]), 2),
        "wall_ratio_on_off": round(wall_med, 4),
        "wall_cost": round(1 - wall_med, 4),
        "within_target": 1 - cpu_med <= TARGET,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "data.json")
    args = parser.parse_args(argv)
    import torch

    from yolo_det.core.fileio import atomic_write_json
    from yolo_det.tools.demo import demo_data_yaml

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    results = [_measure("demo", str(demo_data_yaml()), 96, 8, args.workers, args.rounds)]
    with tempfile.TemporaryDirectory(prefix="bench-data-") as tmp:
        large = _large_dataset(Path(tmp))
        results.append(_measure("large", large, 160, 4, args.workers, args.rounds))
        results.append(_measure("large", large, 160, 4, args.workers, args.rounds, cache="ram"))
    out = {
        "target": TARGET,
        "measure": "median over interleaved rounds of (invariant / Ultralytics) loader "
        "throughput in images per CPU second of the process and its workers "
        "(cost) and per wall-clock second (wall_cost), 3 timed epochs per round "
        "after one warm-up epoch; decodes_per_image: image decodes per image "
        "fed in the second epoch without workers (counted)",
        "results": results,
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__},
    }
    atomic_write_json(args.out, out)
    for r in results:
        print(
            f"{r['dataset']} cache={r['cache']}: cost {100 * r['cost']:+.1f}% of CPU throughput, "
            f"{100 * r['wall_cost']:+.1f}% of wall-clock throughput (target {100 * TARGET:.0f}%)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
