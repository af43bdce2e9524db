"""bench/bench_layers.py: torch.utils.benchmark timing, per-round ratios, memory ratios and targets in its JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import subprocess_env

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "bench_layers.py"


@pytest.mark.slow
def test_quick_run_reports_time_and_memory_ratios_with_targets(tmp_path):
    out = tmp_path / "layers.json"
    env = subprocess_env()
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--quick",
            "--rounds",
            "2",
            "--min-time",
            "0.01",
            "--batches",
            "2",
            "--only",
            r"AdaptiveMaxPool2d\(3\)|bilinear x2$",
            "--out",
            str(out),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| time ratio (IQR) |" in proc.stdout
    assert "memory target" in proc.stdout
    data = json.loads(out.read_text())
    assert data["threads"] == 1
    assert data["timer"].startswith("torch.utils.benchmark")
    layers = {(r["layer"], tuple(r["shape"])) for r in data["rows"]}
    assert len(layers) == 7  # max pool: three levels and the map its windows divide; bilinear: three levels
    for row in data["rows"]:
        assert row["float64_same_function"]
        assert row["float64_max_abs_diff"] <= 1e-10
        for impl, st in row["stats"].items():
            assert st["median_ms"] > 0, impl
            assert st["iqr_ms"] >= 0, impl
            assert st["blocks"] >= 2, impl
        ratio = row["ratio_native"]
        assert ratio["min"] <= ratio["median"] <= ratio["max"]
        assert ratio["iqr"] >= 0
        assert row["memory_target"]["max_ratio"] == 1.25
        assert row["memory_ratio"] > 0
        assert row["memory_target"]["met"] == (row["memory_ratio"] <= 1.25)
        target = row["time_target"]
        if row["layer"].startswith("bilinear"):
            assert target["reference"] == "torch-det"
            assert row["ratio_torch_det"] is not None
        else:
            assert target["reference"] == "native"
            assert target["max_ratio"] == 1.3
        assert target["met"] == (
            (row["ratio_native"] if target["reference"] == "native" else row["ratio_torch_det"])["median"]
            <= target["max_ratio"]
        )


def _bench_module(monkeypatch):
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_layers_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_shape_rule_covers_batches_levels_and_both_window_classes(monkeypatch):
    bench = _bench_module(monkeypatch)
    shapes = bench.shape_set((16, 1), 1, pool_out=(6, 6))
    assert (16, 128, 40, 40) in shapes  # the overlapping 7-8 pixel windows
    assert {s[0] for s in shapes} == {16, 1}
    assert {s[1] for s in shapes} == {32, 128, 512}
    kinds = {bench._windows_kind(s[2:], (6, 6)) for s in shapes}
    assert kinds == {"tile", "overlap"}
    # outputs whose windows tile every level get no extra map; a global output has no overlap class
    assert len(bench.shape_set((16, 1), 1, pool_out=(None, 1))) == len(bench.shape_set((16, 1), 1)) == 5
    assert bench._windows_kind((20, 20), (1, 1)) == "global"
    # --quick keeps a tiling map tiling
    quick = bench.shape_set((2,), 4, pool_out=(3, 3))
    assert any(bench._windows_kind(s[2:], (3, 3)) == "tile" for s in quick)
    assert any(bench._windows_kind(s[2:], (3, 3)) == "overlap" for s in quick)


def test_float64_check_catches_a_different_function(monkeypatch):
    bench = _bench_module(monkeypatch)
    import torch.nn.functional as F

    same = bench.Case(
        "pooling",
        "avg",
        (2, 3, 13, 11),
        {
            "native": lambda x, _: F.adaptive_avg_pool2d(x, 4),
            "yolo-det": lambda x, _: bench.L.adaptive_avg_pool2d(x, 4),
        },
        pool_out=(4, 4),
    )
    wrong = bench.Case(
        "pooling",
        "avg",
        (2, 3, 13, 11),
        {
            "native": lambda x, _: F.adaptive_avg_pool2d(x, 4),
            "yolo-det": lambda x, _: F.adaptive_avg_pool2d(x * 1.0001, 4),
        },
        pool_out=(4, 4),
    )
    assert bench.float64_error(same) <= bench.FLOAT64_ATOL
    assert bench.float64_error(wrong) > bench.FLOAT64_ATOL


def _row(layer, shape, *, time_met=True, mem_met=True, exception=None, same=True):
    return {
        "layer": layer,
        "shape": list(shape),
        "float64_same_function": same,
        "time_target": {"met": time_met},
        "memory_target": {"met": mem_met},
        "exception": exception,
    }


def test_documented_exceptions_pass_check_only_within_their_bound(monkeypatch):
    bench = _bench_module(monkeypatch)
    cases = {(c.name, c.shape): c for c in bench.build_cases((16, 1), 1)}
    small = cases[("AdaptiveAvgPool2d(6)", (1, 32, 80, 80))]
    exc = bench._exception(small, "time")
    assert exc is not None
    assert exc.bound > bench.TARGETS["pooling"][1]
    assert "Python dispatch" in exc.reason
    # the same layer at batch 16, its tiling map at batch 1 and its memory are not covered
    assert bench._exception(cases[("AdaptiveAvgPool2d(6)", (16, 128, 40, 40))], "time") is None
    assert bench._exception(small, "memory") is None
    assert bench._exception(cases[("AdaptiveAvgPool2d((None,1))", (1, 32, 80, 80))], "time") is None
    within = {"time": {"shape_class": exc.name, "bound": exc.bound, "within_bound": True, "reason": exc.reason}}
    over = {"time": {**within["time"], "within_bound": False}}
    rows = [
        _row("a", (1, 2, 3, 3)),
        _row("b", (1, 2, 3, 3), time_met=False, exception=within),
        _row("c", (1, 2, 3, 3), time_met=False, exception=over),
        _row("d", (1, 2, 3, 3), time_met=False),
        _row("e", (1, 2, 3, 3), mem_met=False, exception=within),  # a time exception does not excuse memory
        _row("f", (1, 2, 3, 3), same=False, exception=within),
    ]
    assert bench.failures(rows) == ["c 1x2x3x3", "d 1x2x3x3", "e 1x2x3x3", "f 1x2x3x3"]
