"""Accuracy of each profile against plain Ultralytics: final mAP50 and mAP50-95 over seeds, on generated shapes.

The data set is generated from a seed (``--data-seed``): filled circles, squares and triangles (3 classes, 1-3 per
image, 20-45% of the image wide) on Gaussian noise, 120 train / 40 val PNG images of ``--imgsz`` pixels, with
YOLO label files, written into ``--data DIR`` (or a temporary folder). Every arm trains yolov8n from its YAML (no
download, ``YOLO_OFFLINE=1``) with the same arguments, one fresh process per run, one thread per process
(``OMP_NUM_THREADS=1``, ``workers=0``, CPU; Ultralytics' own thread count is ``min(8, cores - 1)``, so give the
script a 2-core machine, or a container limited to 2 CPUs, to keep it at 1):

- ``plain``: Ultralytics alone (``YOLO("yolov8n.yaml").train(...)``, yolo-det not imported);
- ``repro``, ``portable``, ``balanced``: ``python -m yolo_det train --profile P ...``;
- ``repro-shards4``: a profile extending ``repro`` with ``shards: 4`` in the train phase (one process);
- ``repro-no-data-invariance``: a profile extending ``repro`` with ``data_invariance: false`` (the ablation).

A run's figure is the last epoch's validation (``results.csv``, last row): mAP50 and mAP50-95 of the EMA weights
after the last epoch (``val=false``: Ultralytics validates the last epoch only). An arm's figures are the mean,
standard deviation (n - 1), minimum and maximum over its seeds, and the ratio of its mean mAP50 to plain's, with a
95% percentile bootstrap interval (the seeds of each arm resampled with replacement, independently, 10000 times,
from a fixed bootstrap seed).

The JSON (``--out``) is rewritten atomically after every run. Arms already in it that this call does not run are
kept when they were measured with the same data set and arguments (an arm records the commit it ran on); so an arm
can be measured on one commit and another arm later. ``--label ARM=NAME`` stores an arm's runs under another name
(an ablation measured on an older commit, for example). Prints a markdown table.

Usage: python bench/bench_accuracy.py [--seeds 5] [--epochs 20] [--close-mosaic 5] [--arms plain,repro,...] [--jobs 2]
       [--data DIR] [--out bench/results/accuracy.json] [--label repro=repro-batch-partners]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import csv
import datetime
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from yolo_det.core.fileio import atomic_write_bytes, atomic_write_json, atomic_write_text  # noqa: E402

SCHEMA = "yolo-det/bench-accuracy/1"
CLASSES = ("circle", "square", "triangle")
#: arm -> None (plain Ultralytics), a built-in profile's name, or the text of a profile file
ARMS: dict[str, str | None] = {
    "plain": None,
    "repro": "repro",
    "portable": "portable",
    "balanced": "balanced",
    "repro-shards4": "name: repro-shards4\nextends: repro\ntrain:\n  shards: 4\n",
    "repro-no-data-invariance": "name: repro-no-data-invariance\nextends: repro\ntrain:\n  data_invariance: false\n",
}
REFERENCE = "plain"
#: Ultralytics' training in a fresh process, without yolo-det: the arguments come as JSON in argv[1].
#: the trainings under way, ended when the script stops early
_CHILDREN: set[subprocess.Popen[str]] = set()
PLAIN = (
    "import json, sys\nfrom ultralytics import YOLO\nkw = json.loads(sys.argv[1])\nYOLO(kw.pop('model')).train(**kw)\n"
)


# ---------------------------------------------------------------------------------------------------------
# the data set


def _shape(rng: np.random.Generator, imgsz: int, boxes: list[tuple[int, int, int, int]]) -> tuple[int, ...] | None:
    """A free spot for a shape: (x0, y0, x1, y1), overlapping none of ``boxes``; None after 30 tries."""
    for _ in range(30):
        size = int(rng.integers(int(0.2 * imgsz), int(0.45 * imgsz) + 1))
        x0 = int(rng.integers(0, imgsz - size))
        y0 = int(rng.integers(0, imgsz - size))
        box = (x0, y0, x0 + size, y0 + size)
        if all(box[2] <= b[0] or b[2] <= box[0] or box[3] <= b[1] or b[3] <= box[1] for b in boxes):
            return box
    return None


def _image(rng: np.random.Generator, imgsz: int) -> tuple[np.ndarray, list[str]]:
    """One image (BGR, uint8) of 1-3 filled shapes on noise, and its YOLO label lines."""
    import cv2

    img = np.clip(rng.normal(rng.uniform(60, 190), 40, (imgsz, imgsz, 3)), 0, 255).astype(np.uint8)
    boxes: list[tuple[int, int, int, int]] = []
    lines = []
    for _ in range(int(rng.integers(1, 4))):
        box = _shape(rng, imgsz, boxes)
        if box is None:
            break
        x0, y0, x1, y1 = box
        cls = int(rng.integers(0, len(CLASSES)))
        color = tuple(int(c) for c in rng.choice([0, 255], 3) ^ rng.integers(0, 60, 3))
        if cls == 0:
            cv2.circle(img, ((x0 + x1) // 2, (y0 + y1) // 2), (x1 - x0) // 2, color, -1)
        elif cls == 1:
            cv2.rectangle(img, (x0, y0), (x1 - 1, y1 - 1), color, -1)
        else:
            pts = np.array([[(x0 + x1) // 2, y0], [x0, y1 - 1], [x1 - 1, y1 - 1]], dtype=np.int32)
            cv2.fillPoly(img, [pts], color)
        boxes.append(box)
        cx, cy, w, h = (x0 + x1) / 2 / imgsz, (y0 + y1) / 2 / imgsz, (x1 - x0) / imgsz, (y1 - y0) / imgsz
        lines.append(f"{cls} {cx:.6f} {cy:.6f} {w:.6f} {h:.6f}")
    return img, lines


def make_dataset(
    root: str | os.PathLike[str], *, seed: int = 0, train: int = 120, val: int = 40, imgsz: int = 128
) -> Path:
    """Write the shapes data set into ``root`` (deterministic in ``seed``) and return its data YAML's path.

    ``root`` must be empty or missing, or hold a data set this function wrote (which is written again).
    """
    import cv2

    root = Path(root).resolve()
    yaml_path = root / "data.yaml"
    if root.exists() and any(root.iterdir()) and not yaml_path.is_file():
        raise SystemExit(f"error: {root} is not empty and holds no data.yaml; name an empty or new folder")
    rng = np.random.default_rng(seed)
    for split, count in (("train", train), ("val", val)):
        for sub in ("images", "labels"):
            (root / sub / split).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            img, lines = _image(rng, imgsz)
            ok, png = cv2.imencode(".png", img)
            if not ok:
                raise SystemExit("error: OpenCV could not encode a PNG image; check the opencv installation")
            atomic_write_bytes(root / "images" / split / f"{i:04d}.png", png.tobytes())
            atomic_write_text(root / "labels" / split / f"{i:04d}.txt", "".join(f"{line}\n" for line in lines))
    names = "".join(f"  {i}: {name}\n" for i, name in enumerate(CLASSES))
    atomic_write_text(yaml_path, f"path: {root}\ntrain: images/train\nval: images/val\nnames:\n{names}")
    return yaml_path


# ---------------------------------------------------------------------------------------------------------
# statistics


def describe(values: Sequence[float]) -> dict[str, float | int]:
    """Mean, sample standard deviation (n - 1; 0 for one value), minimum and maximum of ``values``."""
    a = np.asarray(values, dtype=np.float64)
    if a.size == 0:
        raise ValueError("no values to describe; run at least one seed")
    sd = float(a.std(ddof=1)) if a.size > 1 else 0.0
    return {"n": int(a.size), "mean": float(a.mean()), "sd": sd, "min": float(a.min()), "max": float(a.max())}


def bootstrap_ratio(
    arm: Sequence[float], ref: Sequence[float], *, n: int = 10000, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """Percentile bootstrap interval of ``mean(arm) / mean(ref)``, each sample resampled on its own."""
    a, r = np.asarray(arm, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    if a.size == 0 or r.size == 0:
        raise ValueError("bootstrap needs at least one value in each sample")
    if r.mean() <= 0:
        raise ValueError("the reference mean is not positive; its runs learned nothing (train longer)")
    rng = np.random.default_rng(seed)
    means_a = a[rng.integers(0, a.size, (n, a.size))].mean(axis=1)
    means_r = r[rng.integers(0, r.size, (n, r.size))].mean(axis=1)
    ratios = means_a / np.maximum(means_r, np.finfo(np.float64).tiny)
    lo, hi = np.quantile(ratios, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def summarize(arms: dict[str, dict[str, Any]], *, reference: str = REFERENCE, seed: int = 0) -> dict[str, Any]:
    """Per arm: its runs' mAP50 and mAP50-95 described, and the ratio of its mean mAP50 to the reference's.

    ``arms`` maps a name to ``{"runs": [{"seed", "map50", "map50_95"}, ...], ...}``. The ratio (with its bootstrap
    interval, and whether it meets the target: at least 0.98, or a mean inside the reference's mean +- sd) is given
    when the reference arm is present.
    """
    out: dict[str, Any] = {}
    ref = [r["map50"] for r in arms[reference]["runs"]] if reference in arms else None
    ref_stats = describe(ref) if ref else None
    for name, arm in arms.items():
        m50 = [r["map50"] for r in arm["runs"]]
        row: dict[str, Any] = {"map50": describe(m50), "map50_95": describe([r["map50_95"] for r in arm["runs"]])}
        if ref and ref_stats:
            lo, hi = bootstrap_ratio(m50, ref, seed=seed)
            ratio = row["map50"]["mean"] / ref_stats["mean"]
            inside = abs(row["map50"]["mean"] - ref_stats["mean"]) <= ref_stats["sd"]
            row["ratio_to_plain"] = {"mean": ratio, "ci95": [lo, hi], "meets_target": bool(ratio >= 0.98 or inside)}
        out[name] = row
    return out


def table(summary: dict[str, Any], arms: dict[str, dict[str, Any]]) -> str:
    """The markdown table of ``summarize``'s result: one row per arm."""
    lines = [
        "| arm | seeds | mAP50 mean ± sd | mAP50 min-max | mAP50-95 mean ± sd | mAP50 / plain (95% CI) | commit |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, row in summary.items():
        m, b = row["map50"], row["map50_95"]
        ratio = row.get("ratio_to_plain")
        rtext = f"{ratio['mean']:.3f} ({ratio['ci95'][0]:.3f}-{ratio['ci95'][1]:.3f})" if ratio else "-"
        lines.append(
            f"| {name} | {m['n']} | {m['mean']:.3f} ± {m['sd']:.3f} | {m['min']:.3f}-{m['max']:.3f} | "
            f"{b['mean']:.3f} ± {b['sd']:.3f} | {rtext} | {arms[name].get('commit') or '-'} |"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------
# the runs


def final_metrics(results_csv: str | os.PathLike[str]) -> dict[str, float]:
    """mAP50 and mAP50-95 of the last row of an Ultralytics ``results.csv``."""
    with open(results_csv, newline="") as f:
        rows = [{k.strip(): v.strip() for k, v in row.items()} for row in csv.DictReader(f)]
    if not rows:
        raise ValueError(f"{results_csv} has no epoch; the run ended before its first validation")
    last = rows[-1]
    return {
        "epochs": len(rows),
        "map50": float(last["metrics/mAP50(B)"]),
        "map50_95": float(last["metrics/mAP50-95(B)"]),
    }


def train_args(
    data: Path, epochs: int, imgsz: int, batch: int, close_mosaic: int, seed: int, project: Path, name: str
) -> dict[str, Any]:
    """The arguments every arm trains with."""
    return {
        "model": "yolov8n.yaml",
        "data": str(data),
        "epochs": epochs,
        "imgsz": imgsz,
        "batch": batch,
        "close_mosaic": close_mosaic,
        "seed": seed,
        "workers": 0,
        "device": "cpu",
        "val": False,
        "plots": False,
        "project": str(project),
        "name": name,
        "exist_ok": True,
    }


def _argv(arm: str, profile: str | None, kwargs: dict[str, Any], project: Path) -> list[str]:
    if profile is None:
        return [sys.executable, "-c", PLAIN, json.dumps(kwargs)]
    if "\n" in profile:
        path = project / f"{arm}.yaml"
        if not path.exists():
            atomic_write_text(path, profile)
        profile = str(path)
    pairs = [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in kwargs.items()]
    return [sys.executable, "-m", "yolo_det", "train", "--profile", profile, *pairs]


def _run(arm: str, seed: int, kwargs: dict[str, Any], project: Path) -> dict[str, Any]:
    env = {**os.environ, "YOLO_OFFLINE": "1", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    for key in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_CBWR"):
        env.pop(key, None)
    start = time.monotonic()
    proc = subprocess.Popen(
        _argv(arm, ARMS[arm], kwargs, project),
        cwd=project,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    _CHILDREN.add(proc)
    try:
        output, _ = proc.communicate()
    finally:
        _CHILDREN.discard(proc)
    if proc.returncode != 0:
        tail = output.strip().splitlines()[-5:]
        raise RuntimeError(f"{arm} seed {seed} failed (exit {proc.returncode}): " + " | ".join(tail))
    return {
        "seed": seed,
        **final_metrics(project / kwargs["name"] / "results.csv"),
        "seconds": time.monotonic() - start,
    }


def _commit() -> str | None:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "yolo_det"], cwd=ROOT, capture_output=True, text=True)
    except OSError:
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def _versions() -> dict[str, str]:
    from importlib.metadata import version

    out = {"python": platform.python_version()}
    for pkg in ("torch", "ultralytics", "numpy", "opencv-python"):
        try:
            out[pkg] = version(pkg)
        except Exception:  # noqa: S112 - a detail of the report
            continue
    return out


def _write(path: Path, setup: dict[str, Any], arms: dict[str, dict[str, Any]], seed: int) -> dict[str, Any]:
    summary = summarize(arms, seed=seed)
    doc = {
        "schema": SCHEMA,
        "setup": setup,
        "machine": {"cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(), **_versions()},
        "arms": arms,
        "summary": summary,
        "table": table(summary, arms),
    }
    try:
        from yolo_det.core.machine_settings import cpu_info

        doc["machine"]["cpu"] = cpu_info().get("model name", doc["machine"]["cpu"])
    except Exception:  # noqa: S110 - a detail of the report
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, doc)
    return doc


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1 per arm")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--close-mosaic", type=int, default=5, help="Ultralytics' close_mosaic (its default: 10)")
    parser.add_argument("--imgsz", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--arms", default=",".join(ARMS), help="comma-separated: " + ", ".join(ARMS))
    parser.add_argument("--jobs", type=int, default=1, help="trainings at a time (each uses one thread)")
    parser.add_argument("--data", type=Path, default=None, help="folder for the data set (default: temporary)")
    parser.add_argument("--data-seed", type=int, default=0)
    parser.add_argument("--label", action="append", default=[], metavar="ARM=NAME", help="store ARM's runs as NAME")
    parser.add_argument("--bootstrap-seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "accuracy.json")
    args = parser.parse_args(argv)
    args.arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in args.arms if a not in ARMS]
    if unknown:
        parser.error(f"unknown arm {unknown[0]!r}; choose from {', '.join(ARMS)}")
    if args.seeds < 1 or args.epochs < 1 or args.jobs < 1:
        parser.error("--seeds, --epochs and --jobs must be at least 1")
    labels = dict(item.split("=", 1) for item in args.label if "=" in item)
    if len(labels) != len(args.label) or not set(labels) <= set(args.arms):
        parser.error("--label takes ARM=NAME for an arm in --arms")
    args.labels = labels
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    setup = {
        "data": {
            "generator": "bench_accuracy.make_dataset",
            "seed": args.data_seed,
            "train": 120,
            "val": 40,
            "imgsz": args.imgsz,
        },
        "classes": list(CLASSES),
        "args": {
            k: v
            for k, v in train_args(
                Path("DATA"), args.epochs, args.imgsz, args.batch, args.close_mosaic, 0, Path("."), ""
            ).items()
            if k not in ("data", "seed", "project", "name")
        },
        "threads": 1,
        "metric": "results.csv last row: validation of the EMA weights after the last epoch",
        "bootstrap": {"resamples": 10000, "seed": args.bootstrap_seed, "level": 0.95},
    }
    arms: dict[str, dict[str, Any]] = {}
    if args.out.is_file():
        old = json.loads(args.out.read_text(encoding="utf-8"))
        if old.get("schema") == SCHEMA and old.get("setup") == setup:
            arms = old["arms"]
        else:
            print(f"{args.out} was measured with other settings; its arms are not kept", flush=True)
    commit = _commit()
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    for arm in args.arms:
        stored = args.labels.get(arm, arm)
        arms[stored] = {"arm": arm, "profile": ARMS[arm], "commit": commit, "date": date, "runs": []}
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    doc = _measure(args, setup, arms)
    print(doc["table"])
    print(f"wrote {args.out}")
    return 0


def _measure(args: argparse.Namespace, setup: dict[str, Any], arms: dict[str, dict[str, Any]]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp)
        data = make_dataset(args.data or project / "data", seed=args.data_seed, imgsz=args.imgsz)
        jobs = [(arm, seed) for arm in args.arms for seed in range(args.seeds)]
        with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
            futures = {
                pool.submit(
                    _run,
                    arm,
                    seed,
                    train_args(
                        data, args.epochs, args.imgsz, args.batch, args.close_mosaic, seed, project, f"{arm}-s{seed}"
                    ),
                    project,
                ): arm
                for arm, seed in jobs
            }
            try:
                for fut in concurrent.futures.as_completed(futures):
                    arm = futures[fut]
                    run = fut.result()
                    runs = arms[args.labels.get(arm, arm)]["runs"]
                    runs.append(run)
                    runs.sort(key=lambda r: r["seed"])
                    print(
                        f"{arm} seed {run['seed']}: mAP50 {run['map50']:.3f} mAP50-95 {run['map50_95']:.3f} "
                        f"({run['seconds']:.0f} s)",
                        flush=True,
                    )
                    _write(args.out, setup, {k: v for k, v in arms.items() if v["runs"]}, args.bootstrap_seed)
            except BaseException:
                for fut in futures:
                    fut.cancel()
                for proc in list(_CHILDREN):
                    proc.kill()
                raise
    return _write(args.out, setup, arms, args.bootstrap_seed)


if __name__ == "__main__":
    sys.exit(main())
