"""Wall time of `yolo-det audit` per model on this machine (target: under 3 s per model on a CPU).

For each model: the time to build it from its YAML (``load``), the time of the fake-CUDA trace with the
matching and the report (``trace``), and their sum, as medians over ``--repeats`` runs in one warm
process; plus the first audit in a fresh Python process (imports and the first use of torch's meta kernels
included), measured once. The model size does not change the trace time (fake tensors hold no data);
the number of ops does.

usage: python bench/bench_audit.py [--repeats 5] [--imgsz 640] [--models yolov8n.yaml yolo11n.yaml rtdetr-l.yaml]
                                   [--json results.json] [--no-cold]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TARGET_S = 3.0
COLD = """
import time, sys
t = time.perf_counter()
import yolo_det
yolo_det.audit(sys.argv[1], imgsz=int(sys.argv[2]))
print(time.perf_counter() - t)
"""


def _cold(model: str, imgsz: int) -> float:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    out = subprocess.run(
        [sys.executable, "-c", COLD, model, str(imgsz)], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    return float(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["yolov8n.yaml", "yolo11n.yaml", "rtdetr-l.yaml"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--json", type=Path, default=None, help="also write the results as JSON")
    parser.add_argument("--no-cold", action="store_true", help="skip the fresh-process measurement")
    args = parser.parse_args(argv)

    import torch

    from yolo_det.analysis.audit import audit
    from yolo_det.analysis.audit.entry import _load
    from yolo_det.core.fileio import atomic_write_json

    audit(_load("yolov8n.yaml"), imgsz=args.imgsz)  # one-time imports of the first trace, not part of a model's time
    rows = []
    for model in args.models:
        loads, traces, totals = [], [], []
        report = None
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            loaded = _load(model)
            t1 = time.perf_counter()
            report = audit(loaded, imgsz=args.imgsz)
            t2 = time.perf_counter()
            loads.append(t1 - t0)
            traces.append(t2 - t1)
            totals.append(t2 - t0)
        assert report is not None
        params = sum(p.numel() for p in loaded.model.parameters())
        row = {
            "model": model,
            "params_m": round(params / 1e6, 1),
            "ops": report.stats["ops"],
            "nodes": report.stats["autograd_nodes"],
            "findings": len(report.findings),
            "load_s": statistics.median(loads),
            "trace_s": statistics.median(traces),
            "total_s": statistics.median(totals),
            "cold_s": None if args.no_cold else _cold(model, args.imgsz),
        }
        row["vs_target"] = row["total_s"] / TARGET_S
        rows.append(row)

    print(
        f"yolo-det audit wall time: imgsz {args.imgsz}, median of {args.repeats} (warm process); "
        f"torch {torch.__version__}, {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    header = (
        "model",
        "params (M)",
        "aten ops",
        "nodes",
        "findings",
        "load s",
        "trace s",
        "total s",
        "total/target",
        "fresh process s",
    )
    table = [header] + [
        (
            r["model"],
            f"{r['params_m']}",
            str(r["ops"]),
            str(r["nodes"]),
            str(r["findings"]),
            f"{r['load_s']:.2f}",
            f"{r['trace_s']:.2f}",
            f"{r['total_s']:.2f}",
            f"{r['vs_target']:.2f}",
            "-" if r["cold_s"] is None else f"{r['cold_s']:.2f}",
        )
        for r in rows
    ]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    for r in table:
        print("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))))
    print(
        f"target: total under {TARGET_S:.0f} s per model; 'fresh process' adds imports (torch, ultralytics) and "
        "the first trace's one-time imports"
    )
    if args.json:
        atomic_write_json(
            args.json,
            {
                "imgsz": args.imgsz,
                "repeats": args.repeats,
                "torch": torch.__version__,
                "load_average": os.getloadavg()[0],
                "rows": rows,
            },
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
