"""Wall time of `yolo-det audit` per model on this machine: warm (target: under 3 s per model on a CPU) and
whole process (target: under 8 s for ``yolo-det audit yolov8n.yaml --imgsz 64``).

For each model: the time to build it from its YAML (``load``), the time of the fake-CUDA trace with the
matching and the report (``trace``), and their sum, as medians over ``--repeats`` runs in one warm
process. Then the whole command as a user runs it (``python -m yolo_det audit MODEL --imgsz N``, a fresh
process: interpreter, imports, the first use of torch's fake tensors), ``--cold-repeats`` times: the median
and the minimum of its wall time, and the median of its CPU time (user + system, which the machine's load
moves less). The load average is read before and after the fresh processes: on a shared machine the wall
time measures the neighbours too. The model size does not change the trace time (fake tensors hold no
data); the number of ops does.

usage: python bench/bench_audit.py [--repeats 5] [--imgsz 640] [--models yolov8n.yaml yolo11n.yaml rtdetr-l.yaml]
                                   [--cold-repeats 5] [--cold-only] [--json results.json] [--no-cold]
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TARGET_S = 3.0
WHOLE_TARGET_S = 8.0


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _cold(model: str, imgsz: int, repeats: int) -> dict[str, object]:
    """The whole ``yolo-det audit`` command in ``repeats`` fresh processes: wall and CPU seconds, load average."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "YOLO_OFFLINE": "1"}
    command = [sys.executable, "-m", "yolo_det", "audit", model, "--imgsz", str(imgsz)]
    walls, cpus = [], []
    load_before = os.getloadavg()[0]
    for _ in range(repeats):
        cpu, start = _cpu(), time.perf_counter()
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
        walls.append(time.perf_counter() - start)
        cpus.append(_cpu() - cpu)
        if done.returncode not in (0, 1):  # 1: the model is not deterministic, a finished audit all the same
            raise SystemExit(f"{' '.join(command)} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    return {
        "cold_s": round(statistics.median(walls), 3),
        "cold_min_s": round(min(walls), 3),
        "cold_cpu_s": round(statistics.median(cpus), 3),
        "cold_runs_s": [round(w, 3) for w in walls],
        "cold_load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }


def _warm(models: list[str], args: argparse.Namespace) -> list[dict[str, object]]:
    """Build and audit each model ``args.repeats`` times in this process (after one audit for the imports)."""
    from yolo_det.analysis.audit import audit
    from yolo_det.analysis.audit.entry import _load

    audit(_load("yolov8n.yaml"), imgsz=args.imgsz)  # one-time imports of the first trace, not part of a model's time
    rows: list[dict[str, object]] = []
    for model in models:
        loads, traces, totals = [], [], []
        report = loaded = None
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
        assert loaded is not None
        params = sum(p.numel() for p in loaded.model.parameters())
        row: dict[str, object] = {
            "model": model,
            "params_m": round(params / 1e6, 1),
            "ops": report.stats["ops"],
            "nodes": report.stats["autograd_nodes"],
            "findings": len(report.findings),
            "load_s": statistics.median(loads),
            "trace_s": statistics.median(traces),
            "total_s": statistics.median(totals),
        }
        row["vs_target"] = statistics.median(totals) / TARGET_S
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["yolov8n.yaml", "yolo11n.yaml", "rtdetr-l.yaml"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--json", type=Path, default=None, help="also write the results as JSON")
    parser.add_argument("--no-cold", action="store_true", help="skip the whole-process measurement")
    parser.add_argument("--cold-repeats", type=int, default=5, help="fresh processes per model")
    parser.add_argument("--cold-only", action="store_true", help="only the whole-process measurement")
    args = parser.parse_args(argv)

    if args.cold_repeats < 1:
        parser.error("--cold-repeats must be at least 1")
    if args.cold_only and args.no_cold:
        parser.error("--cold-only and --no-cold exclude each other")
    import torch

    from yolo_det.core.fileio import atomic_write_json

    rows = [{"model": model} for model in args.models] if args.cold_only else _warm(args.models, args)
    for row in rows:
        if not args.no_cold:
            row.update(_cold(str(row["model"]), args.imgsz, args.cold_repeats))
            row["cold_vs_target"] = float(row["cold_s"]) / WHOLE_TARGET_S  # type: ignore[arg-type]

    print(
        f"yolo-det audit wall time: imgsz {args.imgsz}"
        + ("" if args.cold_only else f"; warm: median of {args.repeats} in one process")
        + ("" if args.no_cold else f"; whole process: median of {args.cold_repeats}")
        + f"; torch {torch.__version__}, {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs"
    )
    columns = [
        ("model", "model", "{}"),
        ("params (M)", "params_m", "{}"),
        ("aten ops", "ops", "{}"),
        ("nodes", "nodes", "{}"),
        ("findings", "findings", "{}"),
        ("load s", "load_s", "{:.2f}"),
        ("trace s", "trace_s", "{:.2f}"),
        ("total s", "total_s", "{:.2f}"),
        ("total/target", "vs_target", "{:.2f}"),
        ("whole s (median)", "cold_s", "{:.2f}"),
        ("whole s (min)", "cold_min_s", "{:.2f}"),
        ("whole CPU s", "cold_cpu_s", "{:.2f}"),
        ("load avg", "cold_load_average", "{0[0]:.1f}-{0[1]:.1f}"),
    ]
    columns = [c for c in columns if any(c[1] in r for r in rows)]
    table = [tuple(c[0] for c in columns)] + [
        tuple(fmt.format(r[key]) if key in r else "-" for _, key, fmt in columns) for r in rows
    ]
    widths = [max(len(r[i]) for r in table) for i in range(len(columns))]
    for line in table:
        print("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(line, widths))))
    print(
        f"targets: warm total under {TARGET_S:.0f} s per model; the whole command (`python -m yolo_det audit "
        f"MODEL --imgsz {args.imgsz}`: interpreter, imports, the first use of torch's fake tensors) under "
        f"{WHOLE_TARGET_S:.0f} s for yolov8n at imgsz 64"
    )
    if args.json:
        atomic_write_json(
            args.json,
            {
                "imgsz": args.imgsz,
                "repeats": args.repeats,
                "cold_repeats": None if args.no_cold else args.cold_repeats,
                "torch": torch.__version__,
                "python": platform.python_version(),
                "cpus": os.cpu_count(),
                "load_average": list(os.getloadavg()),
                "whole_target_s": WHOLE_TARGET_S,
                "rows": rows,
            },
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
