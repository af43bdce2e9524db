"""Where a whole-process ``yolo-det audit`` spends its CPU time, stage by stage.

Three measurements, each in fresh Python processes (nothing warm from an earlier audit):

1. **Stages** (``time.process_time()``, the CPU time of the process, all threads, user + system): a
   child process runs the audit's steps in order and reads the clock between them: interpreter
   start, ``import torch``, ``import ultralytics`` (with ``ultralytics.nn.tasks``, which builds the
   model), yolo-det's imports (the command line, the ``audit`` command and its analysis modules),
   the profile and the op table, the model build, the set-up of torch's fake CUDA device (the first op
   under ``FakeTensorMode``, whose construction imports ``torch._dynamo``), the trace, the match, and the
   report. The median of ``--repeats`` children per stage.
2. **The command itself**: ``python -m yolo_det audit MODEL`` as a user runs it, its CPU time from
   ``resource.getrusage(RUSAGE_CHILDREN)``; the stage sum should come close to it.
3. **Attribution**: ``python -X importtime`` of that command (self time of every imported module,
   summed per top-level package; import time is wall-clock, so on a busy machine it gives the shares,
   not the CPU seconds), and ``cProfile`` with ``time.process_time`` as its timer over the command
   (self CPU time per package: yolo-det's own Python code, torch, Ultralytics, the rest).

yolo-det's own share is everything but the interpreter start, torch's and Ultralytics' imports, the
model build, the device set-up and the trace: its imports, profile and table, match and report
(target: under 0.5 s of CPU).

CPU time, not wall time: on a shared machine wall time measures the neighbours.

usage: python bench/bench_audit_breakdown.py [--model yolov8n.yaml] [--imgsz 640] [--repeats 3]
                                             [--out bench/results/audit_breakdown.json]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Stages that are not yolo-det's own work (the target counts the rest).
NOT_OURS = ("interpreter", "import torch", "import ultralytics", "model build", "device set-up", "trace")
#: yolo-det's own share must stay under this many CPU seconds.
TARGET_S = 0.5


def _stages(model: str, imgsz: int) -> dict[str, float]:
    """Run the audit's steps in this (fresh) process, CPU seconds per step."""
    marks: list[tuple[str, float]] = [("interpreter", time.process_time())]

    def mark(name: str) -> None:
        marks.append((name, time.process_time()))

    import torch

    mark("import torch")
    import ultralytics
    import ultralytics.nn.tasks  # noqa: F401  (what builds a model from its YAML)

    mark("import ultralytics")
    import yolo_det.cli
    import yolo_det.commands.audit  # noqa: F401
    from yolo_det.analysis.audit import entry
    from yolo_det.analysis.audit.match import _match
    from yolo_det.analysis.audit.report import AuditReport
    from yolo_det.analysis.audit.trace import _fake_trace
    from yolo_det.analysis.optable import load_table, torch_version
    from yolo_det.core.profiles import load_profile

    mark("import yolo-det")
    prof = load_profile("repro")
    table = load_table(None)
    mark("profile and op table")
    loaded = entry._load(model)
    mark("model build")
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True):
        torch.empty(1, device="cuda") + 1
    mark("device set-up")
    trace = _fake_trace(loaded, table, imgsz=imgsz, batch=2, forward_det=prof.train.deterministic)
    mark("trace")
    findings = _match(trace, table, torch_version(), loaded, prof.train)
    findings, fixed = entry._split_fixed(findings, loaded.model)
    mark("match")
    report = AuditReport(
        model=loaded.source,
        findings=findings,
        fixed=fixed,
        torch_version=torch_version(),
        running_torch=torch_version(),
        profile=prof.name,
        imgsz=imgsz,
        batch=2,
        device="fake-cuda",
        yaml_path=str(loaded.yaml_path) if loaded.yaml_path else None,
        notes=list(trace.notes),
        stats={"ops": trace.counts["ops"]},
    )
    text = report.format_table()
    mark("report")
    if not text:
        raise SystemExit("the audit produced no report")
    return {name: round(t - marks[i - 1][1], 4) if i else round(t, 4) for i, (name, t) in enumerate(marks)}


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
    }


def _child_cpu(cmd: list[str], cwd: Path) -> tuple[float, subprocess.CompletedProcess[str]]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    return cpu, proc


def _package(name: str) -> str:
    top = name.split(".")[0]
    return {"yolo_det": "yolo-det", "torch": "torch", "ultralytics": "ultralytics"}.get(top, "other")


def _importtime(stderr: str) -> dict[str, float]:
    """Self import time (wall seconds) per top-level package, from ``-X importtime`` output."""
    totals: dict[str, float] = {}
    for m in re.finditer(r"^import time:\s+(\d+) \|\s+\d+ \|\s*(\S+)", stderr, re.M):
        pkg = _package(m.group(2))
        totals[pkg] = totals.get(pkg, 0.0) + int(m.group(1)) / 1e6
    return {k: round(v, 3) for k, v in sorted(totals.items())}


def _file_package(filename: str) -> str:
    parts = Path(filename).parts
    for key, label in (("yolo_det", "yolo-det"), ("ultralytics", "ultralytics"), ("torch", "torch")):
        if key in parts:
            return label
    return "other"


def _profile_child(model: str, imgsz: int, out: Path) -> None:
    """In a fresh child: the command under cProfile, CPU-time clock."""
    from yolo_det.cli import run_cli

    prof = cProfile.Profile(time.process_time)
    sys.argv = ["yolo-det", "audit", model, "--imgsz", str(imgsz)]
    saved = sys.stdout
    sys.stdout = io.StringIO()
    prof.enable()
    try:
        run_cli()
    except SystemExit:
        pass
    finally:
        prof.disable()
        sys.stdout = saved
    prof.dump_stats(str(out))


def _profile_summary(path: Path) -> dict[str, object]:
    stats = pstats.Stats(str(path))
    self_cpu: dict[str, float] = {}
    rows = []
    for (filename, line, func), (_cc, _nc, tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        pkg = _file_package(filename)
        self_cpu[pkg] = self_cpu.get(pkg, 0.0) + tt
        if pkg == "yolo-det":
            where = Path(filename).relative_to(ROOT) if ROOT in Path(filename).parents else filename
            rows.append({"function": f"{where}:{line}({func})", "self_s": round(tt, 4), "cumulative_s": round(ct, 4)})
    rows.sort(key=lambda r: -float(r["self_s"]))  # type: ignore[arg-type]
    return {
        "self_cpu_s_by_package": {k: round(v, 3) for k, v in sorted(self_cpu.items())},
        "yolo_det_top_self": rows[:15],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="yolov8n.yaml")
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes for the stage measurement")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "audit_breakdown.json")
    parser.add_argument("--child", choices=["stages", "profile"], help=argparse.SUPPRESS)
    parser.add_argument("--profile-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child == "stages":
        print(json.dumps(_stages(args.model, args.imgsz)))
        return 0
    if args.child == "profile":
        _profile_child(args.model, args.imgsz, args.profile_out)
        return 0
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")

    from yolo_det.core.fileio import atomic_write_json

    script = str(Path(__file__).resolve())
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        runs = []
        for _ in range(args.repeats):
            _cpu, proc = _child_cpu(
                [sys.executable, script, "--child", "stages", "--model", args.model, "--imgsz", str(args.imgsz)], work
            )
            runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        stages = {k: round(statistics.median(r[k] for r in runs), 3) for k in runs[0]}
        command = [sys.executable, "-m", "yolo_det", "audit", args.model, "--imgsz", str(args.imgsz)]
        totals = [_child_cpu(command, work)[0] for _ in range(args.repeats)]
        _cpu, proc = _child_cpu([sys.executable, "-X", "importtime", *command[1:]], work)
        imports = _importtime(proc.stderr)
        pstats_path = work / "audit.pstats"
        _child_cpu(
            [
                sys.executable,
                script,
                "--child",
                "profile",
                "--model",
                args.model,
                "--imgsz",
                str(args.imgsz),
                "--profile-out",
                str(pstats_path),
            ],
            work,
        )
        profile = _profile_summary(pstats_path)

    ours = {k: v for k, v in stages.items() if k not in NOT_OURS}
    own = round(sum(ours.values()), 3)
    import torch

    result = {
        "model": args.model,
        "imgsz": args.imgsz,
        "repeats": args.repeats,
        "clock": "CPU time (user + system), time.process_time() per stage, getrusage(RUSAGE_CHILDREN) for the command",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_average": list(os.getloadavg()),
        "stages_cpu_s": stages,
        "stage_runs": runs,
        "stage_sum_cpu_s": round(sum(stages.values()), 3),
        "command_cpu_s": [round(t, 3) for t in totals],
        "command_cpu_median_s": round(statistics.median(totals), 3),
        "yolo_det_own_cpu_s": own,
        "yolo_det_own_stages": ours,
        "target_s": TARGET_S,
        "target_met": own < TARGET_S,
        "importtime_self_wall_s_by_package": imports,
        "cprofile": profile,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out, result)
    width = max(map(len, stages))
    print(
        f"yolo-det audit {args.model} --imgsz {args.imgsz}: CPU seconds per stage (median of {args.repeats} "
        "fresh processes)"
    )
    for k, v in stages.items():
        print(f"  {k:{width}s} {v:7.3f}{'' if k in NOT_OURS else '  (yolo-det)'}")
    print(f"  {'sum':{width}s} {result['stage_sum_cpu_s']:7.3f}   whole command: {result['command_cpu_median_s']:.3f}")
    print(f"yolo-det's own share: {own:.3f} s (target < {TARGET_S} s: {'met' if own < TARGET_S else 'MISSED'})")
    print(f"import self time by package (wall): {imports}")
    print(f"cProfile self CPU by package: {profile['self_cpu_s_by_package']}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
