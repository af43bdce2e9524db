"""What ``batch_invariant`` costs in prediction, against the plain path, on this machine.

Predicts the same list of same-size images with ``batch=B`` under two profiles that differ in one setting:
``repro`` (deploy ``batch_invariant: true``: per-image letterbox, one image per forward) and ``repro`` with
``batch_invariant: false`` (the plain path: the batch goes through the network at once). Rounds are
interleaved (the order alternates every round) after one untimed warm-up round each; the numbers are the
median time per image over the rounds and the cost of the invariant path in percent, for square images
(the same letterbox on both paths: the cost of the per-image forward alone) and 3:4 images (plus the
square letterbox's extra pixels, where the plain path letterboxes to a rectangle). The same run checks
what the setting promises on this device: the raw outputs and detections of each image at ``batch=1`` and
at ``batch=B`` are compared bit for bit under each path (on a CPU the plain path is usually bit-identical
for same-size batches too; on CUDA it is not, see ``bench/gpu_protocol.py --deploy``).

Usage: python bench/bench_deploy.py [--model yolov8n.yaml] [--imgsz 320] [--batch 8] [--rounds 7]
                                    [--device cpu] [--out bench/results/deploy.json]
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

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("YOLO_OFFLINE", "1")

PATHS = ("plain", "batch_invariant")


def _images(n: int, size: tuple[int, int]) -> list[Any]:
    """``n`` same-size BGR images made from the demo images (no file written)."""
    import cv2

    files = sorted((ROOT / "data" / "demo" / "images" / "train").glob("*.*"))
    return [cv2.resize(cv2.imread(str(files[i % len(files)])), size) for i in range(n)]


def _profiles(folder: Path) -> dict[str, Path]:
    out = {}
    for name, on in (("plain", False), ("batch_invariant", True)):
        out[name] = folder / f"{name}.yaml"
        out[name].write_text(
            f"name: repro-{name}\nextends: repro\ndeploy:\n  batch_invariant: {str(on).lower()}\n", encoding="utf-8"
        )
    return out


def _predict(model: Any, images: list[Any], *, imgsz: int, batch: int, device: str) -> list[Any]:
    import torch

    results = model.predict(images, imgsz=imgsz, batch=batch, conf=0.0, device=device, verbose=False)
    return [torch.cat([r.boxes.xyxy, r.boxes.conf[:, None], r.boxes.cls[:, None]], 1).cpu() for r in results]


def _sync(device: str) -> None:
    import torch

    if device != "cpu" and torch.cuda.is_available():
        torch.cuda.synchronize()


def identity(
    model: Any, images: list[Any], profile: Path, *, imgsz: int, batches: list[int], device: str
) -> dict[str, Any]:
    """Whether each image's detections at every ``batch=`` equal those at ``batch=1``, bit for bit."""
    import torch

    import yolo_det

    yolo_det.attach(model, str(profile), record=False)
    ref = _predict(model, images, imgsz=imgsz, batch=1, device=device)
    out: dict[str, Any] = {}
    for b in batches:
        got = _predict(model, images, imgsz=imgsz, batch=b, device=device)
        same = [r.shape == g.shape and bool(torch.equal(r, g)) for r, g in zip(ref, got)]
        diffs = [float((r[: len(g)] - g[: len(r)]).abs().max()) if len(r) and len(g) else 0.0 for r, g in zip(ref, got)]
        out[str(b)] = {"bitwise_images": sum(same), "images": len(same), "max_abs_diff": max(diffs)}
    return out


def _time_paths(
    model: Any, profiles: dict[str, Path], images: list[Any], *, imgsz: int, batch: int, rounds: int, device: str
) -> dict[str, list[float]]:
    """Milliseconds per image of each path, one number per round; rounds interleaved, order alternating."""
    import yolo_det

    times: dict[str, list[float]] = {p: [] for p in PATHS}
    for name in PATHS:  # warm-up (model set-up, first-call allocations)
        yolo_det.attach(model, str(profiles[name]), record=False)
        _predict(model, images, imgsz=imgsz, batch=batch, device=device)
    for r in range(rounds):
        for name in PATHS if r % 2 == 0 else PATHS[::-1]:
            yolo_det.attach(model, str(profiles[name]), record=False)
            _sync(device)
            t0 = time.perf_counter()
            _predict(model, images, imgsz=imgsz, batch=batch, device=device)
            _sync(device)
            times[name].append((time.perf_counter() - t0) / batch * 1000)
    return times


#: Image shapes measured (height over width): square images take the same letterbox on both paths, so their
#: cost is the per-image forward alone; 3:4 images add the square letterbox's extra pixels.
SHAPES = {"square": 1.0, "3:4": 0.75}


def measure(
    *,
    model_name: str = "yolov8n.yaml",
    imgsz: int = 320,
    batch: int = 8,
    rounds: int = 7,
    device: str = "cpu",
    check_batches: list[int] | None = None,
) -> dict[str, Any]:
    """Time both paths (interleaved rounds) for each image shape and check batch identity; return the document."""
    import torch
    from ultralytics import YOLO

    from yolo_det.core.quiet import quiet_ultralytics
    from yolo_det.core.record import environment

    torch.manual_seed(0)
    shapes: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="yolo-det-bench-") as tmp, quiet_ultralytics():
        profiles = _profiles(Path(tmp))
        model = YOLO(model_name)
        for label, ratio in SHAPES.items():
            images = _images(batch, (imgsz, int(imgsz * ratio)))
            times = _time_paths(model, profiles, images, imgsz=imgsz, batch=batch, rounds=rounds, device=device)
            med = {name: statistics.median(times[name]) for name in PATHS}
            shapes[label] = {
                "image_shape": [int(imgsz * ratio), imgsz],
                "ms_per_image": {name: [round(t, 3) for t in times[name]] for name in PATHS},
                "median_ms_per_image": {name: round(med[name], 3) for name in PATHS},
                "throughput_images_per_s": {name: round(1000 / med[name], 2) for name in PATHS},
                "cost_percent": round((med["batch_invariant"] / med["plain"] - 1) * 100, 1),
            }
        images = _images(batch, (imgsz, imgsz * 3 // 4))
        batches = check_batches or sorted({2, batch})
        checks = {
            name: identity(model, images, profiles[name], imgsz=imgsz, batches=batches, device=device) for name in PATHS
        }
    return {
        "model": model_name,
        "imgsz": imgsz,
        "batch": batch,
        "rounds": rounds,
        "device": device,
        "torch_threads": torch.get_num_threads(),
        "load_average": list(os.getloadavg()),
        "shapes": shapes,
        "identical_to_batch_1": checks,
        "environment": environment(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="yolov8n.yaml")
    parser.add_argument("--imgsz", type=int, default=320)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "deploy.json"))
    args = parser.parse_args(argv)
    doc = measure(model_name=args.model, imgsz=args.imgsz, batch=args.batch, rounds=args.rounds, device=args.device)
    from yolo_det.core.fileio import atomic_write_json

    atomic_write_json(args.out, doc)
    for label, row in doc["shapes"].items():
        print(
            f"{label:>6} {row['image_shape']}: plain {row['median_ms_per_image']['plain']:.1f} ms/image, "
            f"batch_invariant {row['median_ms_per_image']['batch_invariant']:.1f} ms/image, "
            f"cost {row['cost_percent']:+.1f}%"
        )
    print(json.dumps(doc["identical_to_batch_1"]))
    print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
