"""What ``shards: K`` costs against plain data-parallel training, per training epoch and per step's traffic.

Trains yolov8n.yaml on the bundled demo data (CPU, gloo) in fresh processes: one process without a launcher and
two torchrun ranks, each plain (``repro``: DDP's all-reduce on 2 ranks) and under ``shards: 2`` and ``shards: 4``.
The runs are interleaved (round after round, each round in a rotated order) so a change of the machine's load
touches every configuration alike. An epoch's time is Ultralytics' own (``results.csv`` ``time``, differences of
consecutive epochs; the first epoch, which warms up, is left out); a run's figure is its median epoch, a
configuration's the median of its runs, and the ratio is against plain training with as many ranks.

The traffic and memory per step are counted, not timed: DDP's ring all-reduce sends and receives about
``2 (W-1)/W x P`` values per rank; the shards' all-gather brings each rank the other ranks' ``(W-1) x K/W`` rows of
``P + 2 x (BatchNorm channels) + loss values`` values, and holds ``K/W + K`` such rows while it sums them (``K`` in
one process).

Usage: python bench/bench_shards.py [--rounds 3] [--epochs 3] [--batch 8] [--out bench/results/shards.json]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
#: name -> (shards or None, ranks)
CONFIGS: dict[str, tuple[int | None, int]] = {
    "plain, 1 process": (None, 1),
    "shards 4, 1 process": (4, 1),
    "plain DDP, 2 ranks": (None, 2),
    "shards 2, 2 ranks": (2, 2),
    "shards 4, 2 ranks": (4, 2),
}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(shards: int | None, ranks: int, project: Path, name: str, args: argparse.Namespace) -> list[float]:
    env = {**os.environ, "YOLO_OFFLINE": "1", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    profile = "repro"
    if shards:
        profile = str(project / f"shards{shards}.yaml")
        Path(profile).write_text(f"name: repro-shards{shards}\nextends: repro\ntrain:\n  shards: {shards}\n")
    launcher = (
        ["-m", "torch.distributed.run", "--nproc_per_node", str(ranks), "--master_port", str(_port())]
        if ranks > 1
        else []
    )
    argv = [
        sys.executable,
        *launcher,
        "-m",
        "yolo_det",
        "train",
        "--profile",
        profile,
        "model=yolov8n.yaml",
        f"data={ROOT / 'data' / 'demo.yaml'}",
        f"epochs={args.epochs}",
        f"imgsz={args.imgsz}",
        f"batch={args.batch}",
        f"nbs={args.batch}",
        "val=false",
        "plots=false",
        "workers=0",
        "device=cpu",
        f"project={project}",
        f"name={name}",
    ]
    subprocess.run(argv, cwd=ROOT, env=env, check=True, capture_output=True, text=True)
    with open(project / name / "results.csv", newline="") as f:
        times = [float(row["time"]) for row in csv.DictReader(f)]
    return [b - a for a, b in zip(times, times[1:])]


def _sizes() -> dict[str, int]:
    """yolov8n's trainable values and BatchNorm channels (what a shard's row holds)."""
    from ultralytics.nn.tasks import DetectionModel

    model = DetectionModel("yolov8n.yaml", nc=3, verbose=False)
    import torch

    params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    channels = sum(m.num_features for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d))
    return {"params": int(params), "batchnorm_channels": int(channels)}


def _traffic(sizes: dict[str, int], shards: int | None, ranks: int) -> dict[str, float]:
    """Values each rank sends and receives per step, and the extra values it holds, in MiB of float32."""
    mib = 4 / 2**20
    if not shards:
        moved = 2 * (ranks - 1) / ranks * sizes["params"] if ranks > 1 else 0.0
        return {"received_mib_per_step": moved * mib, "extra_memory_mib": 0.0}
    row = sizes["params"] + 2 * sizes["batchnorm_channels"] + 4
    return {
        "received_mib_per_step": (ranks - 1) * (shards // ranks) * row * mib,
        "extra_memory_mib": (shards if ranks == 1 else shards // ranks + shards) * row * mib,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--imgsz", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "shards.json")
    args = parser.parse_args()
    names = list(CONFIGS)
    runs: dict[str, list[float]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order:
                shards, ranks = CONFIGS[name]
                epochs = _run(shards, ranks, Path(tmp), f"r{r}-{names.index(name)}", args)
                runs[name].append(statistics.median(epochs))
                print(f"round {r + 1}: {name}: {runs[name][-1]:.2f} s/epoch", flush=True)
    sizes = _sizes()
    results: dict[str, Any] = {}
    for name in names:
        shards, ranks = CONFIGS[name]
        plain = "plain, 1 process" if ranks == 1 else "plain DDP, 2 ranks"
        median = statistics.median(runs[name])
        results[name] = {
            "shards": shards,
            "ranks": ranks,
            "epoch_s_median": round(median, 3),
            "epoch_s_runs": [round(x, 3) for x in runs[name]],
            "ratio_to_plain": round(median / statistics.median(runs[plain]), 3),
            **{k: round(v, 2) for k, v in _traffic(sizes, shards, ranks).items()},
        }
        print(
            f"{name:22s} {median:6.2f} s/epoch  x{results[name]['ratio_to_plain']:.2f}  "
            f"received {results[name]['received_mib_per_step']:.1f} MiB/step  "
            f"extra memory {results[name]['extra_memory_mib']:.1f} MiB"
        )
    out = {
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor(), "load_average": os.getloadavg()},
        "settings": {"rounds": args.rounds, "epochs": args.epochs, "imgsz": args.imgsz, "batch": args.batch},
        "model": {"name": "yolov8n.yaml", **sizes},
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
