"""What ``portable`` costs against ``repro``, and what the plain x86-64 branch would cost, per training epoch.

Trains the demo (yolov8n.yaml, bundled demo data, CPU) as ``yolo-det train`` does, in a fresh process per run,
under ``repro``, ``portable`` (threads pinned to 1, the AVX2 branches of ATen/oneDNN/MKL) and ``portable`` with
``cpu_isa: default`` (the plain x86-64 branch: what a baseline every x86-64 CPU could match would cost). The
runs are interleaved (round after round, each round in a rotated order) so a change of the machine's load
touches every profile alike. An epoch's time is Ultralytics' own (``results.csv`` ``time``, differences of
consecutive epochs; the first epoch, which warms up, is left out); a run's figure is its median epoch, a
profile's the median of its runs. Prints a line per profile and writes JSON.

``--cpus N`` runs every training on a machine of N logical CPUs simulated here (``tests/simulated_machine.py``:
``os.cpu_count()`` patched in every process), so ``repro`` trains with Ultralytics' ``min(8, N - 1)`` threads
while ``portable`` pins one: the thread pin's cost is in the figure, as far as this machine's real cores carry
those threads (``--cpus 3`` gives ``repro`` two threads, which a 2-core machine runs on its two cores).

Usage: python bench/bench_portable.py [--rounds 5] [--epochs 3] [--imgsz 64] [--cpus N]
       [--out bench/results/portable.json]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_ISA = "name: portable-default\nextends: portable\ndefaults:\n  cpu_isa: default\n"


def _env(project: Path, cpus: int | None) -> dict[str, str]:
    """The training's environment: this one's, or that of a simulated machine of ``cpus`` logical CPUs."""
    if cpus is None:
        env = {**os.environ, "YOLO_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    else:
        sys.path.insert(0, str(ROOT / "tests"))
        from simulated_machine import Machine

        env = Machine(cpus=cpus).env(project)
    for key in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_CBWR"):
        env.pop(key, None)
    return env


def _run(profile: str, project: Path, name: str, args: argparse.Namespace) -> list[float]:
    env = _env(project, args.cpus)
    argv = [
        sys.executable,
        "-m",
        "yolo_det",
        "train",
        "--profile",
        profile,
        f"epochs={args.epochs}",
        f"imgsz={args.imgsz}",
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--imgsz", type=int, default=64)
    parser.add_argument("--cpus", type=int, default=None, help="simulate a machine of this many logical CPUs")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "portable.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp)
        default_yaml = project / "portable-default.yaml"
        default_yaml.write_text(DEFAULT_ISA, encoding="utf-8")
        profiles = {"repro": "repro", "portable": "portable", "portable (cpu_isa: default)": str(default_yaml)}
        runs: dict[str, list[float]] = {k: [] for k in profiles}
        names = list(profiles)
        for r in range(args.rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for label in order:
                epochs = _run(profiles[label], project, f"r{r}-{names.index(label)}", args)
                runs[label].append(statistics.median(epochs))
                print(f"round {r}: {label}: {runs[label][-1]:.3f} s/epoch", flush=True)
    medians = {k: statistics.median(v) for k, v in runs.items()}
    ref = medians["repro"]
    out: dict[str, Any] = {
        "schema": "yolo-det/bench-portable/1",
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "simulated_cpus": args.cpus,
            "repro_threads": min(8, max(1, (args.cpus or os.cpu_count() or 1) - 1)),
        },
        "setup": {"model": "yolov8n.yaml", "data": "bundled demo", "imgsz": args.imgsz, "epochs": args.epochs},
        "rounds": args.rounds,
        "seconds_per_epoch": runs,
        "median_seconds_per_epoch": medians,
        "cost_vs_repro_percent": {k: round(100 * (v / ref - 1), 1) for k, v in medians.items()},
    }
    try:
        from yolo_det.core.machine_settings import cpu_info

        out["machine"]["cpu"] = cpu_info().get("model name", out["machine"]["cpu"])
    except Exception:  # noqa: S110 - a detail of the report
        pass
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    for k, v in medians.items():
        print(f"{k}: median {v:.3f} s/epoch ({out['cost_vs_repro_percent'][k]:+.1f}% vs repro)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
