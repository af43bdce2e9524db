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
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick",
                           "--rounds", "2", "--min-time", "0.01", "--batch", "2",
                           "--only", r"AdaptiveMaxPool2d\(3\)|bilinear x2$", "--out", str(out)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| time ratio (IQR) |" in proc.stdout
    assert "memory target" in proc.stdout
    data = json.loads(out.read_text())
    assert data["threads"] == 1
    assert data["timer"].startswith("torch.utils.benchmark")
    layers = {(r["layer"], tuple(r["shape"])) for r in data["rows"]}
    assert len(layers) == 5  # three max-pool shapes, two bilinear shapes
    for row in data["rows"]:
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
        assert target["met"] == ((row["ratio_native"] if target["reference"] == "native" else row["ratio_torch_det"])
                                 ["median"] <= target["max_ratio"])
