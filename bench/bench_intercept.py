"""What functional interception adds to a YOLO training step.

Runs forward + loss-free backward + SGD step of Ultralytics models on the CPU, alternating steps with and
without :func:`yolo_det.fixes.intercept.interception` (same weights, same inputs, interleaved so machine noise hits
both alike), and reports the median step time of each and their ratio. ``yolov8n.yaml`` routes nothing
(its nearest upsampling passes straight through the router): the ratio is the pure cost of interception.

Usage: python bench/bench_intercept.py [--steps 30] [--imgsz 160] [--batch 8] [--out bench/results/intercept.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("YOLO_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

MODELS = ("yolov8n.yaml", "yolo11n.yaml")


def leaves(out):
    import torch

    if isinstance(out, torch.Tensor):
        yield out
    elif isinstance(out, dict):
        for v in out.values():
            yield from leaves(v)
    elif isinstance(out, (list, tuple)):
        for v in out:
            yield from leaves(v)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--imgsz", type=int, default=160)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--out", type=Path, default=Path("bench/results/intercept.json"))
    args = parser.parse_args()

    import torch
    from ultralytics.nn.tasks import DetectionModel

    from yolo_det import environment
    from yolo_det.core.fileio import atomic_write_json
    from yolo_det.fixes.intercept import interception

    rows = []
    for name in MODELS:
        torch.manual_seed(0)
        model = DetectionModel(name, nc=3, verbose=False).train()
        opt = torch.optim.SGD(model.parameters(), lr=1e-4)
        x = torch.rand(args.batch, 3, args.imgsz, args.imgsz)

        def step(model=model, x=x, opt=opt) -> float:
            t = time.perf_counter()
            loss = sum(o.float().mean() for o in leaves(model(x)) if o.requires_grad)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return time.perf_counter() - t

        for _ in range(args.warmup):
            step()
            with interception():
                step()
        plain, routed = [], []
        for i in range(args.steps):
            if i % 2:
                plain.append(step())
                with interception():
                    routed.append(step())
            else:
                with interception():
                    routed.append(step())
                plain.append(step())
        rows.append(
            {
                "model": name,
                "steps": args.steps,
                "plain_ms": statistics.median(plain) * 1e3,
                "intercepted_ms": statistics.median(routed) * 1e3,
                "ratio": statistics.median(routed) / statistics.median(plain),
            }
        )
    print(
        f"\nTraining step (forward, backward, SGD), imgsz {args.imgsz}, batch {args.batch}, CPU "
        f"({os.cpu_count()} cores), {args.steps} interleaved steps each"
    )
    print("| model | without (ms) | with interception (ms) | ratio |")
    print("|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['model']} | {r['plain_ms']:.1f} | {r['intercepted_ms']:.1f} | {r['ratio']:.3f} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out, {"rows": rows, "imgsz": args.imgsz, "batch": args.batch, "environment": environment()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
