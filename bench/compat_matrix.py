"""The compatibility matrix: yolo-det's commands under other torch and Ultralytics versions.

Each cell is a Python environment (a torch and an Ultralytics version). In each, the demo (yolov8n.yaml, the
bundled demo data, CPU, imgsz 64) is trained twice under ``repro`` (the weights digests must be equal), once
with one epoch fewer (the control: its digest must differ), then ``audit`` runs on the model and
``verify --resume-at 1`` trains straight and interrupted-and-resumed and compares them step by step. A cell
passes when the digests match, the control differs, verify says bitwise identical, and the audit either
gives its verdict or says in one line why it cannot trace with that torch (``degraded``).

Cells:
- ``--ultralytics 8.3.253,8.3.0``: Ultralytics versions under the running interpreter's torch. Each wheel is
  installed with ``pip install --target`` into ``--cache`` (only Ultralytics and the requirements it declares
  that this environment lacks, all without their dependencies), put first on ``PYTHONPATH``.
- ``--python /path/venv/bin/python``: another environment as it is (for an older torch: a venv with
  ``torch==2.4.1 torchvision==0.19.1 ultralytics==8.3.0`` and yolo-det's other requirements).
- ``--installed``: the running environment as it is (the newest cell).

``close_mosaic=1``: with Ultralytics 8.3, a run shorter than ``close_mosaic`` epochs keeps mosaic on while a
resumed one switches it off (yolo-det names that in the resumed run's record).

Writes JSON (``--out``, default bench/results/compat.json) with the date, the machine and a row per cell, and
prints a line per cell. Exit 1 when a cell fails.

Usage: python bench/compat_matrix.py [--ultralytics 8.3.253,8.3.0] [--python PY ...] [--installed]
       [--cache DIR] [--out FILE] [--merge] [--epochs 2]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from yolo_det.core.compat import NUMPY_WITHOUT_TRAPZ, numpy_pair_problem  # noqa: E402 - after the path

DIGEST = re.compile(r"weights digest: ([0-9a-f]{64})")
VERSIONS = (
    "import sys, torch, torchvision, ultralytics; "
    "print(torch.__version__, torchvision.__version__, ultralytics.__version__, sys.version.split()[0])"
)


def _missing_requirements(site: Path, version: str) -> list[str]:
    """The requirements the Ultralytics wheel in ``site`` declares that this environment does not have."""
    from importlib import metadata

    from packaging.requirements import Requirement

    meta = site / f"ultralytics-{version}.dist-info" / "METADATA"
    missing = []
    for line in meta.read_text().splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        try:
            metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            missing.append(req.name)
    return missing


def install_ultralytics(version: str, cache: Path) -> Path:
    """``cache/ultralytics-VERSION`` holding that Ultralytics and what this environment lacks of its needs."""
    site = cache / f"ultralytics-{version}"
    done = site / ".complete"
    if done.is_file():
        return site
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site)]
    subprocess.run([*pip, f"ultralytics=={version}"], check=True, timeout=600)
    missing = _missing_requirements(site, version)
    if missing:
        subprocess.run([*pip, *missing], check=True, timeout=600)
    if numpy_pair_problem(version):  # an Ultralytics that calls np.trapz: the NumPy docs/usage.md names for it
        subprocess.run([*pip, f"numpy<{'.'.join(map(str, NUMPY_WITHOUT_TRAPZ))}"], check=True, timeout=600)
    done.write_text("")
    return site


def _run(python: str, args: list[str], env: dict[str, str], cwd: Path, timeout: int = 900) -> tuple[int, str]:
    done = subprocess.run(
        [python, "-m", "yolo_det", *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout
    )
    return done.returncode, done.stdout + done.stderr


def _train(python: str, env: dict[str, str], work: Path, name: str, epochs: int, common: list[str]) -> str | None:
    code, out = _run(python, ["train", "--profile", "repro", *common, f"epochs={epochs}", f"name={name}"], env, work)
    found = DIGEST.findall(out)
    return found[-1] if code == 0 and found else None


#: Turns every tracker integration off in the Ultralytics settings of the cell (the keys that release has).
TRACKERS_OFF = (
    "from ultralytics.utils import SETTINGS; "
    "SETTINGS.update({k: False for k in ('clearml', 'comet', 'dvc', 'mlflow', 'neptune', 'raytune', 'tensorboard', "
    "'wandb') if k in SETTINGS})"
)


def run_cell(python: str, pythonpath: list[str], label: str, epochs: int) -> dict[str, Any]:
    """Train, audit, resume and verify in one environment; the cell's row."""
    with tempfile.TemporaryDirectory(prefix="yolo-det-compat-") as tmp:
        work = Path(tmp)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env.update(
            PYTHONPATH=os.pathsep.join([*pythonpath, str(ROOT)]),
            YOLO_OFFLINE="1",
            YOLO_CONFIG_DIR=str(work / "ultralytics"),
        )
        # The cell measures yolo-det with this Ultralytics, not the trackers the test extra installs: their
        # integrations are off in the cell's own settings (8.3.0 turns W&B and TensorBoard on by default; W&B
        # refuses the cell's project path, and 8.3 does not catch MLflow 3's refusal of a local file store).
        subprocess.run([python, "-c", TRACKERS_OFF], env=env, capture_output=True, check=True, timeout=300)
        versions = (
            subprocess.run([python, "-c", VERSIONS], env=env, capture_output=True, text=True, check=True, timeout=300)
            .stdout.strip()
            .splitlines()[-1]
            .split()
        )  # Ultralytics may print its settings notice first
        data = str(ROOT / "data" / "demo.yaml")
        common = [f"data={data}", "model=yolov8n.yaml", "imgsz=64", "close_mosaic=1", f"project={work / 'runs'}"]
        row: dict[str, Any] = {
            "cell": label,
            "torch": versions[0],
            "torchvision": versions[1],
            "ultralytics": versions[2],
            "python": versions[3],
        }
        first = _train(python, env, work, "a", epochs, common)
        second = _train(python, env, work, "b", epochs, common)
        control = _train(python, env, work, "c", epochs - 1, common)
        row["train_digests_equal"] = first is not None and first == second
        row["control_differs"] = control is not None and control != first
        row["digest"] = first
        code, out = _run(python, ["audit", "yolov8n.yaml", "--imgsz", "64"], env, work)
        if code in (0, 1):
            row["audit"] = "ok"
        elif code == 2 and "cannot trace here" in out:
            row["audit"] = "degraded"
            row["audit_note"] = next(line for line in out.splitlines() if "cannot trace here" in line)
        else:
            row["audit"] = f"failed (exit {code}): {out.strip().splitlines()[-1:]}"
        code, out = _run(
            python, ["verify", "--profile", "repro", "--resume-at", "1", *common, f"epochs={epochs}"], env, work
        )
        row["resume_verify"] = "bitwise identical" if code == 0 and "bitwise identical" in out else f"exit {code}"
        if code != 0:
            row["verify_output"] = out.strip().splitlines()[-6:]
        row["ok"] = (
            row["train_digests_equal"]
            and row["control_differs"]
            and row["audit"] in ("ok", "degraded")
            and row["resume_verify"] == "bitwise identical"
        )
        return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ultralytics", default="", help="comma-separated Ultralytics versions (running torch)")
    parser.add_argument("--python", action="append", default=[], help="another environment's interpreter")
    parser.add_argument("--installed", action="store_true", help="also the running environment as it is")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "yolo-det-compat")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "compat.json")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument(
        "--merge", action="store_true", help="keep --out's other rows (a cell of the same versions is replaced)"
    )
    args = parser.parse_args(argv)
    if args.epochs < 2:
        parser.error("--epochs must be at least 2 (the control trains one epoch fewer; resume is after epoch 1)")
    cells: list[tuple[str, list[str], str]] = []
    for version in filter(None, (v.strip() for v in args.ultralytics.split(","))):
        site = install_ultralytics(version, args.cache)
        cells.append((sys.executable, [str(site)], f"running torch, ultralytics {version}"))
    cells += [(python, [], f"environment {python}") for python in args.python]
    if args.installed:
        cells.append((sys.executable, [], "running environment"))
    if not cells:
        parser.error("no cell: give --ultralytics, --python or --installed")
    rows = []
    for python, path, label in cells:
        row = run_cell(python, path, label, args.epochs)
        row["date"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        rows.append(row)
        verdict = "ok" if row["ok"] else "FAILED"
        print(
            f"torch {row['torch']:<16} ultralytics {row['ultralytics']:<9} train x2 "
            f"{'equal' if row['train_digests_equal'] else 'DIFFER'}, control "
            f"{'differs' if row['control_differs'] else 'SAME'}, audit {row['audit']}, resume+verify "
            f"{row['resume_verify']}: {verdict}",
            flush=True,
        )
    sys.path.insert(0, str(ROOT))
    from yolo_det.core.fileio import atomic_write_json

    if args.merge and args.out.is_file():
        ours = {(r["torch"], r["ultralytics"]) for r in rows}
        kept = [r for r in json.loads(args.out.read_text())["cells"] if (r["torch"], r["ultralytics"]) not in ours]
        rows = kept + rows
    report = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
        },
        "epochs": args.epochs,
        "cells": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out, report)
    print(f"wrote {args.out}")
    print(json.dumps({"cells": len(rows), "ok": sum(bool(r["ok"]) for r in rows)}))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
