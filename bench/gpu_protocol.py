#!/usr/bin/env python
"""GPU cost protocol: what determinism costs where the GPU, not the loader or the launch overhead, is the limit.

usage: python bench/gpu_protocol.py [--out PATH] [--device 0|cpu] [--models yolov8s.yaml,yolov8m.yaml] [--deploy]
                                    [--imgsz 640] [--batch 32] [--steps 40] [--block 5] [--warmup 10]
                                    [--kernel-steps 3] [--ci]

On a CUDA device, for each model (default yolov8s and yolov8m at imgsz 640, batch 32, AMP):

1. ``yolo-det bench`` of ``repro``, ``balanced`` and ``fast`` in one process: a few input batches are
   loaded once and cycled through (data in memory, loading never timed), every configuration runs
   ``--warmup`` untimed steps and then blocks of ``--block`` measured steps, interleaved round-robin with
   the order rotating, until each has ``--steps`` (CUDA-synchronised) step times;
2. per profile: median step, interquartile range, the ratio to ``fast`` with a 95% bootstrap interval and a
   verdict (``slower``/``faster``/``within noise``);
3. per setting (each toggled alone from its base, as ``yolo-det bench`` does): cost in % with its 95%
   interval and verdict;
4. ``torch.profiler`` over ``--kernel-steps`` extra steps per profile: the GPU kernels whose time per step
   changes most between ``fast`` and ``repro``/``balanced`` (for example cuDNN algorithms chosen by
   autotuning, deterministic index_put/scatter replacements, the swapped layers' kernels).

5. with ``--deploy``: ``bench/bench_deploy.py`` on the GPU (yolov8s at 640, batch 16, 10 interleaved rounds):
   the throughput of ``batch_invariant`` against the plain path, and whether each image's detections at
   ``batch=`` 2, 8 and 16 equal those at ``batch=1`` bit for bit under each path. What it should show: the
   plain path differs on CUDA (cuDNN/cuBLAS pick kernels by the batch's shape) and the invariant path is
   bitwise at every batch size; the cost is the per-image forward's lost batching, larger on a GPU than
   on a CPU. Skipped (with the reason) in the CPU form.

Without CUDA (or with ``--device cpu``, or ``--ci``) it runs the same code path in CI size on the CPU
(yolov8n.yaml, imgsz 64, batch 4, 4 steps): steps 1-3 run and the GPU-only parts (the GPU-bound
configurations, the kernel attribution) are recorded as skipped, with the reason. The results go to one
JSON file (default bench/results/gpu_protocol.json) and a markdown summary is printed. Exit 0 unless a step
failed with an error.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("YOLO_OFFLINE", "1")  # never probe the network (set before Ultralytics is imported)

DEFAULT_OUT = ROOT / "bench" / "results" / "gpu_protocol.json"
PROFILES = ("repro", "balanced", "fast")
REFERENCE = "fast"
GPU_FORM = {
    "models": ("yolov8s.yaml", "yolov8m.yaml"),
    "imgsz": 640,
    "batch": 32,
    "steps": 40,
    "block": 5,
    "warmup": 10,
    "kernel_steps": 3,
}
CI_FORM = {"models": ("yolov8n.yaml",), "imgsz": 64, "batch": 4, "steps": 4, "block": 2, "warmup": 1, "kernel_steps": 0}


@contextlib.contextmanager
def _amp_check_skipped(active: bool) -> Iterator[None]:
    """Ultralytics' AMP self-check downloads weights; keep AMP on without it (put back afterwards)."""
    if not active:
        yield
        return
    import ultralytics.engine.trainer as trainer_module

    original = trainer_module.check_amp
    trainer_module.check_amp = lambda model: True
    try:
        yield
    finally:
        trainer_module.check_amp = original


def kernel_changes(rows: list[dict[str, Any]], reference: str = REFERENCE, top: int = 12) -> dict[str, Any]:
    """Per profile, the kernels whose self GPU time per step differs most from ``reference``'s.

    Returns ``{profile: [{"name", "reference_us", "profile_us", "delta_us"}...]}`` (largest absolute change
    first; a kernel seen in one profile only has 0 on the other side), or ``{}`` when nothing was profiled.
    """
    by_name = {r["profile"]: {k["name"]: k["self_us_per_step"] for k in (r.get("kernels") or [])} for r in rows}
    ref = by_name.get(reference)
    if not ref:
        return {}
    out: dict[str, Any] = {}
    for name, kernels in by_name.items():
        if name == reference or not kernels:
            continue
        changes = []
        for kernel in set(ref) | set(kernels):
            a, b = ref.get(kernel, 0.0), kernels.get(kernel, 0.0)
            changes.append({"name": kernel, "reference_us": a, "profile_us": b, "delta_us": b - a})
        changes.sort(key=lambda c: -abs(c["delta_us"]))
        out[name] = changes[:top]
    return out


def summarize_bench(data: dict[str, Any], reference: str = REFERENCE) -> dict[str, Any]:
    """The protocol's view of one ``bench`` report: ratios to ``reference`` and per-setting costs."""
    from yolo_det.tools.bench.stats import ratio_interval, verdict

    rows = data["rows"]
    ref = next((r for r in rows if r["profile"] == reference and r.get("step_ms") is not None), None)
    profiles = []
    for r in rows:
        entry: dict[str, Any] = {"profile": r["profile"], "error": r.get("error"), "steps": r.get("steps")}
        if r.get("step_ms") is not None:
            entry.update(
                step_ms=r["step_ms"],
                iqr_ms=[r["step_ms_q1"], r["step_ms_q3"]],
                images_per_s=r["images_per_s"],
                peak_memory_bytes=r["peak_memory_bytes"],
            )
            if ref is not None and r is not ref and r.get("step_times_ms") and ref.get("step_times_ms"):
                ratio, low, high = ratio_interval(r["step_times_ms"], ref["step_times_ms"])
                entry.update(
                    ratio_to_reference=ratio, ratio_low=low, ratio_high=high, verdict=verdict(ratio, low, high)
                )
            elif r is ref:
                entry.update(ratio_to_reference=1.0, ratio_low=1.0, ratio_high=1.0, verdict="reference")
        profiles.append(entry)
    settings = [
        {
            "setting": s["setting"],
            "label": s["label"],
            "status": s["status"],
            "cost_pct": s.get("cost_pct"),
            "cost_pct_low": s.get("cost_pct_low"),
            "cost_pct_high": s.get("cost_pct_high"),
            "verdict": s.get("verdict"),
        }
        for s in data["settings"]
    ]
    return {"profiles": profiles, "settings": settings, "kernel_changes": kernel_changes(rows, reference)}


def _markdown(result: dict[str, Any]) -> str:
    lines = [
        f"### {result['model']} at imgsz {result['imgsz']}, batch {result['batch']} on {result['device']}",
        "",
        f"| profile | median step | IQR | ratio to {REFERENCE} (95% CI) | verdict | images/s |",
        "|---|---:|---:|---:|---|---:|",
    ]
    for p in result["summary"]["profiles"]:
        if p.get("step_ms") is None:
            lines.append(f"| {p['profile']} | raised: {p['error']} | | | | |")
            continue
        ci = "-"
        if p.get("ratio_low") is not None:
            ci = f"{p['ratio_to_reference']:.3f} ({p['ratio_low']:.3f}-{p['ratio_high']:.3f})"
        iqr = f"{p['iqr_ms'][0]:.1f}-{p['iqr_ms'][1]:.1f} ms"
        lines.append(
            f"| {p['profile']} | {p['step_ms']:.1f} ms | {iqr} | {ci} | "
            f"{p.get('verdict') or '-'} | {p['images_per_s']:.1f} |"
        )
    lines += ["", "| setting (toggled alone) | cost | 95% CI | verdict |", "|---|---:|---:|---|"]
    for s in result["summary"]["settings"]:
        if s["status"] != "measured":
            lines.append(f"| {s['label']} | {s['status']} | | |")
            continue
        interval = f"{s['cost_pct_low']:+.1f}% .. {s['cost_pct_high']:+.1f}%"
        lines.append(f"| {s['label']} | {s['cost_pct']:+.1f}% | {interval} | {s['verdict']} |")
    changes = result["summary"]["kernel_changes"]
    if changes:
        for profile, items in changes.items():
            lines += ["", f"kernels changed most from {REFERENCE} to {profile} (self GPU time per step):"]
            for c in items[:8]:
                lines.append(f"  {c['delta_us']:+10.1f} us  {c['name'][:110]}")
    return "\n".join(lines)


def run_protocol(args: argparse.Namespace) -> dict[str, Any]:
    """Run the protocol; return the results document."""
    import torch

    from yolo_det.core.record import environment
    from yolo_det.tools.bench import bench
    from yolo_det.tools.prepare import prepare

    cuda = torch.cuda.is_available() and args.device != "cpu" and not args.ci
    form = dict(GPU_FORM if cuda else CI_FORM)
    for key in ("imgsz", "batch", "steps", "block", "warmup", "kernel_steps"):
        if getattr(args, key) is not None:
            form[key] = getattr(args, key)
    if args.models:
        form["models"] = tuple(m.strip() for m in args.models.split(",") if m.strip())
    device = args.device if cuda else "cpu"
    skipped = []
    if not cuda:
        why = (
            "--ci was given"
            if args.ci
            else ("--device cpu was given" if args.device == "cpu" else "no CUDA device on this machine")
        )
        skipped = [
            f"GPU-bound configurations (yolov8s/yolov8m at 640, batch 32, AMP): skipped, {why}; "
            f"ran the CI-sized CPU form instead",
            f"kernel attribution with torch.profiler: skipped, {why} (needs CUDA kernels)",
        ]
        for line in skipped:
            print(f"gpu_protocol: {line}", file=sys.stderr, flush=True)
    results = []
    started = time.perf_counter()
    with _amp_check_skipped(cuda):
        for model in form["models"]:
            tokens = [
                f"model={model}",
                f"imgsz={form['imgsz']}",
                f"batch={form['batch']}",
                f"device={device}",
                "workers=0",
                f"amp={cuda}",
            ]
            print(
                f"gpu_protocol: bench {','.join(PROFILES)} on {model}, imgsz {form['imgsz']}, batch {form['batch']} "
                f"({device}) ...",
                file=sys.stderr,
                flush=True,
            )
            t0 = time.perf_counter()
            try:
                _, train_args = prepare("repro", tokens)
                report = bench(
                    ",".join(PROFILES),
                    train_args,
                    steps=form["steps"],
                    warmup=form["warmup"],
                    block=form["block"],
                    kernel_steps=form["kernel_steps"] if cuda else 0,
                )
                data = report.to_dict()
                entry: dict[str, Any] = {
                    "model": model,
                    "imgsz": form["imgsz"],
                    "batch": form["batch"],
                    "device": data["device"],
                    "device_name": data["device_name"],
                    "status": "measured",
                    "bench": data,
                    "summary": summarize_bench(data),
                }
            except Exception as e:
                entry = {
                    "model": model,
                    "imgsz": form["imgsz"],
                    "batch": form["batch"],
                    "device": device,
                    "status": "error",
                    "message": f"{type(e).__name__}: {' '.join(str(e).split())[:400]}",
                    "traceback": traceback.format_exc(limit=8),
                }
            entry["seconds"] = round(time.perf_counter() - t0, 1)
            results.append(entry)
    deploy = _deploy_section(args, cuda, device)
    return {
        "schema": "yolo-det/gpu-protocol/1",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "form": "gpu" if cuda else "ci-cpu",
        "cuda": cuda,
        "settings": {k: list(v) if isinstance(v, tuple) else v for k, v in form.items()},
        "reference": REFERENCE,
        "skipped": skipped,
        "results": results,
        **({"deploy": deploy} if deploy is not None else {}),
        "seconds": round(time.perf_counter() - started, 1),
        "environment": environment(),
    }


#: ``--deploy`` on a GPU: bench/bench_deploy.py in this form.
DEPLOY_FORM = {"model_name": "yolov8s.yaml", "imgsz": 640, "batch": 16, "rounds": 10, "check_batches": [2, 8, 16]}


def _deploy_section(args: argparse.Namespace, cuda: bool, device: str) -> dict[str, Any] | None:
    """``--deploy``: the batch-invariant path's cost and batch identity on the GPU (skipped without one)."""
    if not getattr(args, "deploy", False):
        return None
    if not cuda:
        line = "deploy (batch_invariant cost and identity): skipped, needs a CUDA device"
        print(f"gpu_protocol: {line}", file=sys.stderr, flush=True)
        return {"status": "skipped", "reason": line}
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from bench_deploy import measure

        return {"status": "measured", **measure(device=device, **DEPLOY_FORM)}  # type: ignore[arg-type]
    except Exception as e:
        return {"status": "error", "message": f"{type(e).__name__}: {' '.join(str(e).split())[:400]}"}
    finally:
        sys.path.remove(str(ROOT / "bench"))


def summarize(doc: dict[str, Any]) -> str:
    """The markdown summary stored under "summary" and printed."""
    head = (
        "GPU form"
        if doc["form"] == "gpu"
        else "CI-sized CPU form (NOT a GPU measurement: the numbers only show that the protocol runs)"
    )
    lines = [f"yolo-det GPU cost protocol, {doc['date']}: {head}"]
    lines += [f"- {s}" for s in doc["skipped"]]
    for r in doc["results"]:
        lines.append("")
        if r["status"] != "measured":
            lines.append(f"### {r['model']}: error: {r['message']}")
            continue
        lines.append(_markdown(r))
    deploy = doc.get("deploy")
    if deploy and deploy.get("status") == "measured":
        for label, row in deploy["shapes"].items():
            lines.append(
                f"- deploy {label}: batch_invariant costs {row['cost_percent']:+.1f}% "
                f"({row['median_ms_per_image']['plain']:.2f} -> "
                f"{row['median_ms_per_image']['batch_invariant']:.2f} ms/image)"
            )
        for path, checks in deploy["identical_to_batch_1"].items():
            lines.append(
                f"- deploy {path}: bitwise images vs batch=1: "
                + ", ".join(f"batch={b} {c['bitwise_images']}/{c['images']}" for b, c in checks.items())
            )
    elif deploy:
        lines.append(f"- deploy: {deploy.get('reason') or deploy.get('message')}")
    lines += ["", f"total {doc['seconds']:.0f} s"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the protocol and write the results file."""
    parser = argparse.ArgumentParser(prog="gpu_protocol.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(DEFAULT_OUT), help=f"results file (default: {DEFAULT_OUT})")
    parser.add_argument("--device", default="0", help="CUDA device (default 0); 'cpu' runs the CI-sized CPU form")
    parser.add_argument("--ci", action="store_true", help="the CI-sized CPU form even where CUDA exists")
    parser.add_argument("--models", default=None, help="comma-separated model YAMLs (default: per form)")
    parser.add_argument(
        "--deploy",
        action="store_true",
        help="also measure the batch-invariant deploy path and its batch identity (GPU only)",
    )
    for key in ("imgsz", "batch", "steps", "block", "warmup", "kernel_steps"):
        parser.add_argument(
            f"--{key.replace('_', '-')}",
            type=int,
            default=None,
            help=f"override (GPU form {GPU_FORM[key]}, CI form {CI_FORM[key]})",
        )
    args = parser.parse_args(argv)
    for key in ("imgsz", "batch", "steps", "block"):
        value = getattr(args, key)
        if value is not None and value < 1:
            parser.error(f"--{key} must be at least 1")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    from yolo_det.core.fileio import atomic_write_json

    doc = run_protocol(args)
    doc["summary"] = summarize(doc)
    atomic_write_json(out, doc)
    print(doc["summary"])
    print(f"results: {out}")
    return (
        1
        if any(r["status"] == "error" for r in doc["results"]) or doc.get("deploy", {}).get("status") == "error"
        else 0
    )


if __name__ == "__main__":
    raise SystemExit(main())
