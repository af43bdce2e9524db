#!/usr/bin/env python
"""What the dataset fingerprint costs next to a demo training, with a cold and a warm digest cache.

usage: python bench/bench_datafp.py [--repeats R] [--out FILE] [key=value ...]

Target: the dataset fingerprint costs under 2% of a demo training. Two measurements:

1. In training: the demo is trained twice the way ``yolo-det train --profile repro`` does (the demo
   defaults: yolov8n.yaml, imgsz 96, batch 16, 3 epochs, CPU; key=value changes them), with an empty
   digest cache (``YOLO_DET_CACHE`` points at a fresh folder), so the first run hashes every image (cold)
   and the second finds them cached (warm). The fingerprint's own time is what ``determinism.json`` records
   (``data.seconds``); the ratio is that time over the training's wall time.
2. Alone: :func:`yolo_det.datafp.dataset_fingerprint` on the demo's image lists, R times each with a fresh
   cache folder (cold) and with a filled one (warm); medians. "Cold" means cold for yolo-det's cache; the
   files themselves may sit in the OS page cache.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TARGET = 0.02


def _train(tokens: list[str], project: str, name: str) -> tuple[float, dict]:
    from yolo_det.commands.train import train
    from yolo_det.tools.prepare import prepare

    profile, args = prepare("repro", [*tokens, f"project={project}", f"name={name}", "exist_ok=True"])
    started = time.perf_counter()
    plugin = train(profile, args)
    seconds = time.perf_counter() - started
    record = json.loads(Path(plugin.record_path).read_text())
    return seconds, record


def _alone(repeats: int) -> dict[str, float]:
    from yolo_det.core.datafp import dataset_fingerprint

    demo = ROOT / "data" / "demo"
    splits = {s: sorted(str(p) for p in (demo / "images" / s).glob("*.png")) for s in ("train", "val")}
    cold, warm = [], []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(prefix="datafp-") as tmp:
            os.environ["YOLO_DET_CACHE"] = tmp
            t0 = time.perf_counter()
            dataset_fingerprint(splits, root=demo.parent)
            cold.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            dataset_fingerprint(splits, root=demo.parent)
            warm.append(time.perf_counter() - t0)
    return {
        "cold_s": statistics.median(cold),
        "warm_s": statistics.median(warm),
        "images": sum(len(v) for v in splits.values()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_datafp.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=20, help="repeats of the stand-alone measurement")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "datafp.json"))
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    args = parser.parse_args(argv)
    os.environ.setdefault("YOLO_OFFLINE", "1")
    saved = os.environ.get("YOLO_DET_CACHE")
    try:
        with tempfile.TemporaryDirectory(prefix="bench-datafp-") as tmp:
            os.environ["YOLO_DET_CACHE"] = str(Path(tmp) / "cache")
            runs = {}
            for label in ("cold", "warm"):
                seconds, record = _train(list(args.overrides), str(Path(tmp) / "runs"), label)
                data = record["data"]
                runs[label] = {
                    "training_s": round(seconds, 3),
                    "fingerprint_s": data["seconds"],
                    "ratio": data["seconds"] / seconds,
                    "hashed": data["hashed"],
                    "cached": data["cached"],
                }
        alone = _alone(args.repeats)
    finally:
        if saved is None:
            os.environ.pop("YOLO_DET_CACHE", None)
        else:
            os.environ["YOLO_DET_CACHE"] = saved
    result = {
        "target_ratio": TARGET,
        "in_training": runs,
        "alone": alone,
        "ok": all(r["ratio"] < TARGET for r in runs.values()),
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform()},
        "args": args.overrides,
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    for label, r in runs.items():
        print(
            f"{label:4s} cache: fingerprint {r['fingerprint_s'] * 1e3:.1f} ms ({r['hashed']} hashed, "
            f"{r['cached']} cached) / training {r['training_s']:.1f} s = {r['ratio']:.3%} (target < {TARGET:.0%})"
        )
    print(
        f"alone ({alone['images']} images, median of {args.repeats}): cold {alone['cold_s'] * 1e3:.1f} ms, "
        f"warm {alone['warm_s'] * 1e3:.1f} ms"
    )
    print(f"written: {args.out}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
