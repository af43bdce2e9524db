"""Speed and peak memory of yolo-det's deterministic layers against PyTorch, on the CPU.

For each layer, at YOLO neck shapes (batch 16, 64-256 channels, 20x20 to 160x160), one forward plus
backward is timed for up to three implementations:

- ``native``: the PyTorch op (its CUDA backward is the non-deterministic one);
- ``torch-det``: PyTorch's own deterministic fallback where it has one (the index-based decompositions
  ``F.interpolate`` uses for bilinear and ``F.pad`` for replicate when the deterministic flag is on, on
  CUDA: ``torch._decomp.decompositions._upsample_linear_vec`` and ``_replication_pad``);
- ``yolo-det``: the layer from :mod:`yolo_det.layers`.

Timing: every implementation is warmed up once, then the implementations run in turn, round after
round (the order alternates), so machine noise hits them alike; the table shows the median of the
rounds. Peak memory: one extra, profiled run per implementation; PyTorch's profiler records every
CPU-allocator allocation and free, and the peak is the largest amount held above what was allocated
before the forward (so it counts the output, everything saved for the backward, temporaries and the
gradient, and not the input). Prints a markdown table and writes JSON.

Targets (CPU): pooling and padding within 1.3x of native, upsampling at least as fast as PyTorch's
deterministic decomposition, grid_sample within 3x of native.

Usage: python bench/bench_layers.py [--rounds 5] [--threads N] [--quick] [--only REGEX]
                                   [--out bench/results/layers.json]
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import yolo_det.layers as L  # noqa: E402
from yolo_det.core.fileio import atomic_write_json  # noqa: E402

try:
    from torch._decomp.decompositions import _replication_pad, _upsample_linear_vec
except ImportError:  # pragma: no cover - older torch names
    _upsample_linear_vec = None
    _replication_pad = None

Fn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

#: Ratio targets: group -> (reference implementation, largest allowed yolo-det / reference time).
TARGETS = {"pooling": ("native", 1.3), "padding": ("native", 1.3), "upsample": ("torch-det", 1.0),
           "grid_sample": ("native", 3.0)}


@dataclass
class Case:
    """One benchmark row: a layer call at one shape, with its implementations."""

    group: str
    name: str
    shape: tuple[int, ...]
    impls: dict[str, Fn]
    extra: Callable[[tuple[int, ...]], torch.Tensor] | None = None  # second input (grid, target)
    extra_grad: bool = False
    times: dict[str, list[float]] = field(default_factory=dict)
    peak: dict[str, float | None] = field(default_factory=dict)


def _grid(size: tuple[int, int]) -> Callable[[tuple[int, ...]], torch.Tensor]:
    def make(shape: tuple[int, ...]) -> torch.Tensor:
        return torch.rand(shape[0], size[0], size[1], 2) * 2.2 - 1.1

    return make


def _target(shape: tuple[int, ...]) -> torch.Tensor:
    return torch.randint(0, shape[1], (shape[0],) + shape[2:])


def build_cases(batch: int, scale: int) -> list[Case]:
    """The benchmark grid; ``scale`` divides the spatial sizes (``--quick``)."""

    def s(c: int, hw: int) -> tuple[int, int, int, int]:
        return (batch, c, hw // scale, hw // scale)

    cases: list[Case] = []
    for c, hw in [(256, 20), (128, 40), (64, 80)]:
        cases.append(Case("pooling", "AdaptiveMaxPool2d(1)", s(c, hw), {
            "native": lambda x, _: F.adaptive_max_pool2d(x, 1), "yolo-det": lambda x, _: L.adaptive_max_pool2d(x, 1)}))
    for c, hw in [(256, 20), (128, 40), (64, 80)]:
        cases.append(Case("pooling", "AdaptiveMaxPool2d(3)", s(c, hw), {
            "native": lambda x, _: F.adaptive_max_pool2d(x, 3), "yolo-det": lambda x, _: L.adaptive_max_pool2d(x, 3)}))
    for c, hw in [(128, 40), (64, 80)]:
        cases.append(Case("pooling", "AdaptiveAvgPool2d((None,1))", s(c, hw), {
            "native": lambda x, _: F.adaptive_avg_pool2d(x, (None, 1)),
            "yolo-det": lambda x, _: L.adaptive_avg_pool2d(x, (None, 1))}))
    for c, hw in [(128, 40), (64, 80)]:
        cases.append(Case("pooling", "AdaptiveAvgPool2d(6)", s(c, hw), {
            "native": lambda x, _: F.adaptive_avg_pool2d(x, 6), "yolo-det": lambda x, _: L.adaptive_avg_pool2d(x, 6)}))
    for c, hw in [(128, 40), (64, 80)]:
        impls: dict[str, Fn] = {"native": lambda x, _: F.interpolate(x, scale_factor=2, mode="bilinear")}
        if _upsample_linear_vec is not None:
            impls["torch-det"] = lambda x, _: _upsample_linear_vec(x, [x.shape[2] * 2, x.shape[3] * 2], False, None)
        impls["yolo-det"] = lambda x, _: L.interpolate(x, scale_factor=2, mode="bilinear")
        cases.append(Case("upsample", "bilinear x2", s(c, hw), impls))
    cases.append(Case("upsample", "bilinear x2 align_corners", s(128, 40), {
        "native": lambda x, _: F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=True),
        **({"torch-det": lambda x, _: _upsample_linear_vec(x, [x.shape[2] * 2, x.shape[3] * 2], True, None)}
           if _upsample_linear_vec is not None else {}),
        "yolo-det": lambda x, _: L.interpolate(x, scale_factor=2, mode="bilinear", align_corners=True)}))
    for c, hw in [(128, 40), (64, 80)]:
        cases.append(Case("upsample", "bicubic x2", s(c, hw), {
            "native": lambda x, _: F.interpolate(x, scale_factor=2, mode="bicubic"),
            "yolo-det": lambda x, _: L.interpolate(x, scale_factor=2, mode="bicubic")}))
    cases.append(Case("upsample", "bilinear antialias /2", s(64, 160), {
        "native": lambda x, _: F.interpolate(x, scale_factor=0.5, mode="bilinear", antialias=True),
        "yolo-det": lambda x, _: L.interpolate(x, scale_factor=0.5, mode="bilinear", antialias=True)}))
    for c, hw, out in [(64, 40, 80), (128, 20, 40)]:  # DySample-style: 2x upsampling by sampling
        cases.append(Case("grid_sample", f"grid_sample border {out}x{out}", s(c, hw), {
            "native": lambda x, g: F.grid_sample(x, g, padding_mode="border", align_corners=False),
            "yolo-det": lambda x, g: L.grid_sample(x, g, padding_mode="border", align_corners=False)},
            extra=_grid((out // scale, out // scale)), extra_grad=True))
    cases.append(Case("grid_sample", "grid_sample zeros 300x4 points", (batch * 8 // 4, 32, 40 // scale, 40 // scale), {
        # MSDeformAttn-style: one level, 8 heads of 32 channels, 300 queries x 4 points
        "native": lambda x, g: F.grid_sample(x, g, padding_mode="zeros", align_corners=False),
        "yolo-det": lambda x, g: L.grid_sample(x, g, padding_mode="zeros", align_corners=False)},
        extra=_grid((300, 4)), extra_grad=True))
    for c, hw in [(128, 40), (64, 80)]:
        cases.append(Case("padding", "ReflectionPad2d(1)", s(c, hw), {
            "native": lambda x, _: F.pad(x, (1, 1, 1, 1), mode="reflect"),
            "yolo-det": lambda x, _: L.pad(x, (1, 1, 1, 1), mode="reflect")}))
    for c, hw in [(128, 40), (64, 80)]:
        impls = {"native": lambda x, _: F.pad(x, (2, 2, 2, 2), mode="replicate")}
        if _replication_pad is not None:
            impls["torch-det"] = lambda x, _: _replication_pad(x, (2, 2, 2, 2))
        impls["yolo-det"] = lambda x, _: L.pad(x, (2, 2, 2, 2), mode="replicate")
        cases.append(Case("padding", "ReplicationPad2d(2)", s(c, hw), impls))
    cases.append(Case("loss", "cross_entropy (N,C,H,W)", (batch, 32, 80 // scale, 80 // scale), {
        "native": lambda x, t: F.cross_entropy(x, t), "yolo-det": lambda x, t: L.cross_entropy(x, t)},
        extra=_target))
    return cases


def _inputs(case: Case) -> tuple[torch.Tensor, torch.Tensor | None]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(case.shape, generator=gen).requires_grad_()
    extra = case.extra(case.shape) if case.extra else None
    if extra is not None and case.extra_grad:
        extra.requires_grad_()
    return x, extra


def _step(fn: Fn, x: torch.Tensor, extra: torch.Tensor | None) -> None:
    x.grad = None
    if extra is not None and extra.requires_grad:
        extra.grad = None
    out = fn(x, extra)  # type: ignore[arg-type]
    out.backward(torch.ones_like(out))


def _peak_bytes(fn: Fn, x: torch.Tensor, extra: torch.Tensor | None) -> float | None:
    """Largest amount the CPU allocator held above the pre-forward state during one step."""
    from torch.profiler import ProfilerActivity, profile

    x.grad = None
    try:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                     with_stack=True) as prof:
            _step(fn, x, extra)
        timeline = prof._memory_profile().timeline
    except Exception:  # private API: report no number rather than a wrong one
        return None
    held = peak = 0
    for _, action, _, nbytes in sorted(timeline, key=lambda e: e[0]):
        name = getattr(action, "name", str(action))
        if name == "CREATE":
            held += nbytes
        elif name == "DESTROY":
            held -= nbytes
        peak = max(peak, held)
    return float(peak)


def run(cases: list[Case], rounds: int) -> None:
    for case in cases:
        x, extra = _inputs(case)
        names = list(case.impls)
        for name in names:  # warm-up (and build yolo-det's cached tables)
            _step(case.impls[name], x, extra)
        case.times = {n: [] for n in names}
        for r in range(rounds):
            for name in names if r % 2 == 0 else reversed(names):
                start = time.perf_counter()
                _step(case.impls[name], x, extra)
                case.times[name].append(time.perf_counter() - start)
        case.peak = {n: _peak_bytes(case.impls[n], x, extra) for n in names}
        print(f"  {case.group:11s} {case.name:32s} {str(case.shape):22s} " +
              "  ".join(f"{n} {statistics.median(t) * 1e3:8.1f} ms" for n, t in case.times.items()), flush=True)


def _ms(case: Case, impl: str) -> float | None:
    t = case.times.get(impl)
    return statistics.median(t) * 1e3 if t else None


def _fmt(v: float | None, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def report(cases: list[Case]) -> list[dict]:
    rows = []
    print("\n| layer | input | native ms | torch-det ms | yolo-det ms | yolo/native | yolo/torch-det | "
          "peak MB native | peak MB torch-det | peak MB yolo-det | target |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for case in cases:
        nat, tdet, ours = _ms(case, "native"), _ms(case, "torch-det"), _ms(case, "yolo-det")
        mb = {k: (None if v is None else v / 2**20) for k, v in case.peak.items()}
        target = TARGETS.get(case.group)
        verdict = "-"
        if target:
            ref = {"native": nat, "torch-det": tdet}[target[0]]
            if ref is not None and ours is not None:
                verdict = f"{'met' if ours / ref <= target[1] else 'MISSED'} (<= {target[1]}x {target[0]})"
        row = {"group": case.group, "layer": case.name, "shape": list(case.shape), "median_ms": {
            k: _ms(case, k) for k in case.impls}, "times_ms": {k: [t * 1e3 for t in v] for k, v in case.times.items()},
            "peak_mb": mb, "ratio_native": None if not (nat and ours) else ours / nat,
            "ratio_torch_det": None if not (tdet and ours) else ours / tdet, "target": verdict}
        rows.append(row)
        print(f"| {case.name} | {'x'.join(map(str, case.shape))} | {_fmt(nat)} | {_fmt(tdet)} | {_fmt(ours)} | "
              f"{_fmt(row['ratio_native'], '.2f')} | {_fmt(row['ratio_torch_det'], '.2f')} | "
              f"{_fmt(mb.get('native'))} | {_fmt(mb.get('torch-det'))} | {_fmt(mb.get('yolo-det'))} | {verdict} |")
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per case (median reported)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--quick", action="store_true", help="quarter spatial sizes (a smoke run)")
    parser.add_argument("--only", default=None, help="regular expression on 'group layer' to select cases")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads (default: torch's; 1 gives steadier numbers on a shared machine)")
    parser.add_argument("--out", type=Path, default=Path("bench/results/layers.json"))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    cases = build_cases(args.batch, 4 if args.quick else 1)
    if args.only:
        cases = [c for c in cases if re.search(args.only, f"{c.group} {c.name}")]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs, "
          f"{platform.processor() or platform.machine()}, {args.rounds} rounds, float32, forward+backward")
    run(cases, args.rounds)
    rows = report(cases)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out, {
        "torch": torch.__version__, "threads": torch.get_num_threads(), "cpus": os.cpu_count(),
        "rounds": args.rounds, "batch": args.batch, "quick": args.quick, "dtype": "float32",
        "peak_memory": "largest CPU-allocator bytes held above the pre-forward state during one forward+backward "
                       "(torch.profiler memory timeline)", "rows": rows})
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
