"""Whole-process wall time of the answers that need no training: --help, argument errors, digest, diff, audit.

Each case runs ``python -m yolo_det ...`` as a user does, in a fresh process, ``--repeats`` times (default 10),
interleaved (one round runs every case once, so the machine's load hits all alike); the figure is the median of
the wall time, with the median CPU time (user + system) of the process beside it (less sensitive to the load).
Targets: under 1 s for --help, argument errors and ``diff`` of two run folders; under 8 s for the answers that
read with torch: ``digest`` of a checkpoint (torch's tensors, and the classes its objects are checked against)
and ``audit yolov8n.yaml --imgsz 64`` (it traces on torch's fake tensors, whose first use imports
``torch._dynamo``; ``bench/bench_audit.py`` measures the audit alone). Each child also reports whether it
imported torch.

The checkpoint is a yolov8n (2 classes) saved the way Ultralytics saves one (half-precision EMA); the two run
folders are two demo trainings (``yolo-det train``, 1 epoch at imgsz 64), or ``--runs A B``.

With ``--only TEXT`` only the cases whose name contains TEXT run (``--only audit`` times the audit alone, in
a few seconds per round; no checkpoint or runs are made unless a selected case needs them). Every round also
times ``python -c "import torch"``: the floor of any command that needs torch on this machine.

usage: python bench/bench_startup.py [--repeats 10] [--runs A B] [--only TEXT] [--json bench/results/startup.json]
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

FAST_TARGET_S = 1.0
TORCH_TARGET_S = 8.0

# Runs the command line as `python -m yolo_det` does, then says on stderr whether torch was imported.
CHILD = (
    "import sys\n"
    "from yolo_det.cli import main\n"
    "try:\n"
    "    rc = main(sys.argv[1:])\n"
    "except SystemExit as e:\n"
    "    rc = e.code\n"
    "sys.stderr.write('\\nTORCH=%d\\n' % ('torch' in sys.modules))\n"
    "sys.exit(rc)\n"
)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "YOLO_OFFLINE": "1"}


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _once(argv: list[str], cwd: Path) -> tuple[float, float, int, bool]:
    cpu, start = _cpu(), time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, *argv], cwd=cwd, env=_env(), capture_output=True, text=True, check=False
    )
    seconds = time.perf_counter() - start
    return seconds, _cpu() - cpu, proc.returncode, "TORCH=1" in proc.stderr


def _checkpoint(folder: Path) -> Path:
    import torch
    from ultralytics.nn.tasks import DetectionModel

    model = DetectionModel("yolov8n.yaml", nc=2, verbose=False).half()
    path = folder / "yolov8n-ckpt.pt"
    torch.save({"epoch": 0, "model": None, "ema": model, "updates": 1, "train_args": {}}, path)
    return path


def _runs(folder: Path) -> list[str]:
    out = []
    for name in ("a", "b"):
        argv = [
            "train",
            "--profile",
            "repro",
            "epochs=1",
            "imgsz=64",
            "batch=8",
            "fraction=0.25",
            "workers=0",
            "device=cpu",
            "plots=False",
            "val=False",
            f"project={folder / 'runs'}",
            f"name={name}",
        ]
        subprocess.run(
            [sys.executable, "-m", "yolo_det", *argv], cwd=folder, env=_env(), check=True, capture_output=True
        )
        out.append(str(folder / "runs" / name))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--runs", nargs=2, default=None, metavar=("A", "B"), help="two run folders for diff")
    parser.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "startup.json")
    parser.add_argument("--only", default="", metavar="TEXT", help="run only the cases whose name contains TEXT")
    args = parser.parse_args(argv)

    from yolo_det.cli import COMMANDS
    from yolo_det.core.fileio import atomic_write_json

    def wanted(name: str) -> bool:
        return args.only in name

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        ckpt = _checkpoint(work) if wanted("digest CHECKPOINT (yolov8n)") else work / "unused.pt"
        runs = args.runs or (_runs(work) if wanted("diff RUN_A RUN_B") else ["A", "B"])
        cases: list[tuple[str, list[str], float]] = [("yolo-det --help", ["--help"], FAST_TARGET_S)]
        cases += [(f"yolo-det {c} --help", [c, "--help"], FAST_TARGET_S) for c in COMMANDS]
        cases += [
            ("argument error: train foo=", ["train", "epochs=1", "foo="], FAST_TARGET_S),
            ("argument error: train epoch=3 (misspelled key)", ["train", "epoch=3"], FAST_TARGET_S),
            ("argument error: train --profile nope", ["train", "--profile", "nope"], FAST_TARGET_S),
            ("argument error: unknown command", ["nocommand"], FAST_TARGET_S),
            ("digest CHECKPOINT (yolov8n)", ["digest", str(ckpt)], TORCH_TARGET_S),
            ("diff RUN_A RUN_B", ["diff", *runs], FAST_TARGET_S),
            ("audit yolov8n.yaml --imgsz 64", ["audit", "yolov8n.yaml", "--imgsz", "64"], TORCH_TARGET_S),
        ]
        cases = [c for c in cases if wanted(c[0])]
        if not cases:
            parser.error(f"no case name contains {args.only!r}")
        times: dict[str, list[float]] = {name: [] for name, _, _ in cases}
        cpus: dict[str, list[float]] = {name: [] for name, _, _ in cases}
        codes: dict[str, int] = {}
        torch_seen: dict[str, bool] = {}
        _once(["--help"], work)  # the first process warms the file cache
        _once_plain(work, "import torch")
        floor: list[tuple[float, float]] = []
        loads: list[float] = []
        for _ in range(args.repeats):
            loads.append(os.getloadavg()[0])
            for name, case_argv, _target in cases:
                seconds, cpu, code, imported = _once(case_argv, work)
                times[name].append(seconds)
                cpus[name].append(cpu)
                codes[name] = code
                torch_seen[name] = imported
            floor.append(_once_plain(work, "import torch"))
        baseline = statistics.median(_once_plain(work)[0] for _ in range(args.repeats))
    # the temporary paths are not shown: what they stand for is
    shown = {"digest CHECKPOINT (yolov8n)": ["digest", "CHECKPOINT"], "diff RUN_A RUN_B": ["diff", "RUN_A", "RUN_B"]}
    rows = []
    for name, case_argv, target in cases:
        median = statistics.median(times[name])
        rows.append(
            {
                "case": name,
                "argv": shown.get(name, case_argv),
                "median_s": round(median, 3),
                "min_s": round(min(times[name]), 3),
                "max_s": round(max(times[name]), 3),
                "cpu_median_s": round(statistics.median(cpus[name]), 3),
                "target_s": target,
                "within_target": median < target,
                "exit_code": codes[name],
                "imports_torch": torch_seen[name],
            }
        )
    result = {
        "what": "whole-process wall time of `python -m yolo_det ...` (and its CPU time, user + system), median of "
        "the repeats, interleaved rounds",
        "repeats": args.repeats,
        "python_start_s": round(baseline, 3),
        "import_torch_median_s": round(statistics.median(t for t, _ in floor), 3),
        "import_torch_cpu_median_s": round(statistics.median(c for _, c in floor), 3),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_average": round(os.getloadavg()[0], 1),
        "load_average_during": [round(min(loads), 2), round(max(loads), 2)],
        "results": rows,
    }
    atomic_write_json(args.json, result)
    print(
        f"whole process, median of {args.repeats}; python start {baseline:.2f} s; "
        f"import torch {result['import_torch_median_s']:.2f} s (CPU {result['import_torch_cpu_median_s']:.2f} s); "
        f"load average {result['load_average_during'][0]}-{result['load_average_during'][1]} during the rounds"
    )
    print(f"{'case':<44} {'median s':>9} {'min s':>7} {'CPU s':>6} {'target':>7}  torch")
    for r in rows:
        mark = "ok" if r["within_target"] else "OVER"
        print(
            f"{r['case']:<44} {r['median_s']:>9.2f} {r['min_s']:>7.2f} {r['cpu_median_s']:>6.2f} "
            f"{r['target_s']:>6.0f}s  {'yes' if r['imports_torch'] else 'no':<4} {mark}"
        )
    print(f"written: {args.json}")
    return 0


def _once_plain(cwd: Path, code: str = "pass") -> tuple[float, float]:
    """Wall and CPU seconds of ``python -c CODE``."""
    cpu, start = _cpu(), time.perf_counter()
    subprocess.run([sys.executable, "-c", code], cwd=cwd, env=_env(), check=True)
    return time.perf_counter() - start, _cpu() - cpu


if __name__ == "__main__":
    raise SystemExit(main())
