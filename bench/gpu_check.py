#!/usr/bin/env python
"""GPU check: reproducibility and cost of the profiles on a CUDA machine, in one command (< 8 minutes).

usage: python bench/gpu_check.py [--out PATH] [--attention-model PATH] [--steps K] [--bench-steps K]

On a CUDA machine it

1. runs ``verify`` with ``repro`` on a stock model (yolov8n.yaml, demo data): expects bitwise identical runs;
2. runs ``verify`` with ``repro`` on ``data/models/attention-mix.yaml`` (CBAM with max pooling and coordinate
   attention): expects bitwise identical runs (skipped, saying so, while that file does not exist);
3. trains that model with plain Ultralytics and strict ``torch.use_deterministic_algorithms(True)``, without
   yolo-det and without swaps: expects the CUDA "does not have a deterministic implementation" error;
4. runs ``bench`` for repro, balanced and fast on the stock model at imgsz 640.

On a machine without CUDA every step is skipped with the reason. The results (JSON with a short text
summary under "summary") go to ONE file, by default bench/results/gpu_check.json; the summary is also
printed. Exit 0 when no check failed, 1 otherwise. ``--device cpu`` runs the same steps on a CPU, to try
this script without a GPU (the strict step then cannot raise, and says so).

The machine needs Ultralytics; where it is missing and nothing can be downloaded, bring the wheels
(``ultralytics==8.4.190`` and ``ultralytics-thop``, pure Python) in an ignored folder such as ``build/whl``,
install them with ``pip install --no-index --no-deps --target /tmp/site build/whl/*.whl``, put
``/tmp/site`` on ``PYTHONPATH`` and run ``PYTHONUNBUFFERED=1 python3 bench/gpu_check.py --out OUT.json``.
Offline, Ultralytics' AMP self-check would try to download weights; this script keeps AMP on and skips
that check for its runs (put back afterwards).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("YOLO_OFFLINE", "1")  # never probe the network (set before Ultralytics is imported)

ATTENTION_MODEL = ROOT / "data" / "models" / "attention-mix.yaml"
STOCK_MODEL = "yolov8n.yaml"
NONDET_MESSAGE = "does not have a deterministic implementation"
DEFAULT_OUT = ROOT / "bench" / "results" / "gpu_check.json"


@contextlib.contextmanager
def amp_check_skipped() -> Iterator[None]:
    """Ultralytics' AMP check downloads weights; this machine is offline. Keep AMP on without the check."""
    import ultralytics.engine.trainer as trainer_module

    original = trainer_module.check_amp
    trainer_module.check_amp = lambda model: True
    try:
        yield
    finally:
        trainer_module.check_amp = original


def _verify_args(model: str, device: str) -> dict[str, Any]:
    from yolo_det.tools.prepare import prepare

    _, args = prepare(
        "repro",
        [
            f"model={model}",
            "imgsz=128",
            "batch=16",
            "nbs=16",
            "epochs=3",
            f"device={device}",
            "workers=2",
            "plots=False",
            "val=False",
        ],
    )
    return args


def check_verify(model: str, steps: int, device: str) -> dict[str, Any]:
    """``verify`` with ``repro``: expect bitwise identical runs."""
    from yolo_det.tools.verify import verify

    report = verify("repro", _verify_args(model, device), runs=2, steps=steps)
    data = report.to_dict()
    status = "passed" if report.identical else "failed"
    message = "bitwise identical" if report.identical else report.summary().splitlines()[-1]
    return {
        "status": status,
        "message": message,
        "details": {k: data[k] for k in ("steps", "run_seconds", "weights", "first_divergence")},
    }


def check_strict_plain(model: str, device: str) -> dict[str, Any]:
    """Plain Ultralytics training under strict determinism, no yolo-det: expect the CUDA error."""
    import torch
    from ultralytics import YOLO

    from yolo_det.core.state import restore, snapshot

    args = _verify_args(model, device)
    yolo = YOLO(args.pop("model"))

    def strict(trainer: Any) -> None:  # after Ultralytics' own init_seeds(deterministic=True), which warns only
        torch.use_deterministic_algorithms(True)

    def stop(trainer: Any) -> None:
        trainer.stop = True

    yolo.add_callback("on_pretrain_routine_start", strict)
    yolo.add_callback("on_train_batch_end", stop)
    before = snapshot()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            yolo.train(**{**args, "epochs": 1}, project=tmp, name="strict", exist_ok=True)
    except RuntimeError as e:
        text = " ".join(str(e).split())
        if NONDET_MESSAGE in text:
            return {"status": "passed", "message": f"raised as expected: {text[:200]}"}
        return {"status": "failed", "message": f"raised something else: {text[:300]}"}
    finally:
        restore(before)
    return {"status": "failed", "message": "trained one step under strict determinism without raising"}


def check_bench(steps: int, device: str, imgsz: int) -> dict[str, Any]:
    """``bench`` for the three profiles on the stock model."""
    from yolo_det.tools.bench import bench
    from yolo_det.tools.prepare import prepare

    _, args = prepare("repro", [f"model={STOCK_MODEL}", f"imgsz={imgsz}", "batch=16", f"device={device}", "workers=2"])
    report = bench("repro,balanced,fast", args, steps=steps, warmup=5, block=5)
    return {
        "status": "passed",
        "message": f"fastest: {report.fastest}",
        "table": report.table(),
        "details": report.to_dict(),
    }


def cuda_available() -> bool:
    """Whether this machine has a CUDA device."""
    import torch

    return torch.cuda.is_available()


def run_checks(args: argparse.Namespace) -> dict[str, Any]:
    """Run every check; return the results document."""
    from yolo_det.core.record import environment

    cuda = cuda_available()
    active = cuda or args.device == "cpu"  # --device cpu: smoke-test this script on a CPU
    dev = args.device
    attention = Path(args.attention_model)
    no_cuda = "skipped: no CUDA device on this machine (the GPU steps need one)"
    no_model = (
        f"skipped: {attention} does not exist yet (the attention test model is added with the deterministic layers)"
    )

    plan: list[tuple[str, str, Callable[[], dict[str, Any]], str | None]] = [
        (
            "verify_repro_stock",
            f"verify --profile repro on {STOCK_MODEL}: bitwise identical",
            lambda: check_verify(STOCK_MODEL, args.steps, dev),
            None if active else no_cuda,
        ),
        (
            "verify_repro_attention",
            f"verify --profile repro on {attention.name}: bitwise identical",
            lambda: check_verify(str(attention), args.steps, dev),
            no_cuda if not active else (None if attention.is_file() else no_model),
        ),
        (
            "strict_plain_attention",
            f"plain Ultralytics, strict determinism, no swaps, on {attention.name}: raises",
            lambda: check_strict_plain(str(attention), dev),
            no_cuda if not active else (None if attention.is_file() else no_model),
        ),
        (
            "bench_profiles",
            f"bench repro, balanced, fast on {STOCK_MODEL} at imgsz {args.bench_imgsz}",
            lambda: check_bench(args.bench_steps, dev, args.bench_imgsz),
            None if active else no_cuda,
        ),
    ]
    checks = []
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        if active and dev != "cpu":
            stack.enter_context(amp_check_skipped())
        for name, title, fn, skip in plan:
            t0 = time.perf_counter()
            if skip is not None:
                result: dict[str, Any] = {"status": "skipped", "message": skip}
            else:
                print(f"gpu_check: {title} ...", file=sys.stderr, flush=True)
                try:
                    result = fn()
                except Exception as e:  # a failing step is a result, the next steps still run
                    result = {
                        "status": "error",
                        "message": f"{type(e).__name__}: {' '.join(str(e).split())[:400]}",
                        "traceback": traceback.format_exc(limit=8),
                    }
            checks.append({"name": name, "title": title, **result, "seconds": round(time.perf_counter() - t0, 2)})
    env = environment()
    return {
        "schema": "yolo-det/gpu-check/1",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "cuda": cuda,
        "device": dev if active else None,
        "gpu": env["gpus"][0] if env["gpus"] else None,
        "seconds": round(time.perf_counter() - started, 2),
        "checks": checks,
        "environment": env,
    }


def summarize(results: dict[str, Any]) -> str:
    """The short text summary stored under "summary" and printed."""
    lines = [
        f"yolo-det GPU check, {results['date']}: "
        + (
            f"CUDA on {results['gpu']}"
            if results["cuda"]
            else "no CUDA device: GPU steps skipped"
            if results["device"] is None
            else "CPU smoke test (--device cpu)"
        )
    ]
    for c in results["checks"]:
        lines.append(f"  [{c['status']:>7}] {c['title']} ({c['seconds']:.0f} s): {c['message']}")
    for c in results["checks"]:
        if c.get("table"):
            lines += ["", c["table"]]
    failed = [c["name"] for c in results["checks"] if c["status"] in {"failed", "error"}]
    lines.append("")
    lines.append(f"total {results['seconds']:.0f} s; " + (f"FAILED: {', '.join(failed)}" if failed else "no failures"))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the GPU check and write the results file."""
    parser = argparse.ArgumentParser(prog="gpu_check.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(DEFAULT_OUT), help=f"results file (default: {DEFAULT_OUT})")
    parser.add_argument("--attention-model", default=str(ATTENTION_MODEL), help="the attention test model YAML")
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps per verify run (default: 8)")
    parser.add_argument(
        "--bench-steps", type=int, default=30, help="measured steps per bench configuration (default: 30)"
    )
    parser.add_argument("--bench-imgsz", type=int, default=640, help="image size of the bench (default: 640)")
    parser.add_argument(
        "--device",
        default="0",
        help="CUDA device (default: 0); 'cpu' runs the steps on the CPU to smoke-test this script",
    )
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    from yolo_det.analysis.models import model_names
    from yolo_det.core.fileio import atomic_write_json

    with model_names():  # the attention model's blocks resolve in its YAML
        results = run_checks(args)
    results["summary"] = summarize(results)
    atomic_write_json(out, results)
    print(results["summary"])
    print(f"results: {out}")
    return 1 if any(c["status"] in {"failed", "error"} for c in results["checks"]) else 0


if __name__ == "__main__":
    raise SystemExit(main())
