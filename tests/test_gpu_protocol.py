"""bench/gpu_protocol.py: the CI-sized CPU form runs end to end; its statistics and kernel attribution."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import subprocess_env
from yolo_det.tools.bench.stats import iqr, ratio_interval, verdict

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "gpu_protocol.py"


def _load():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import gpu_protocol
    finally:
        sys.path.remove(str(SCRIPT.parent))
    return gpu_protocol


@pytest.mark.slow
def test_cpu_form_runs_skips_the_gpu_steps_and_writes_one_file(tmp_path):
    out = tmp_path / "results" / "protocol.json"
    env = subprocess_env()
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--ci",
            "--out",
            str(out),
            "--imgsz",
            "32",
            "--batch",
            "2",
            "--steps",
            "2",
            "--block",
            "1",
            "--warmup",
            "0",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    written = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert written == ["results/protocol.json"]  # nothing else (the bench's run folder is temporary)
    doc = json.loads(out.read_text())
    assert doc["schema"] == "yolo-det/gpu-protocol/1"
    assert doc["form"] == "ci-cpu"
    assert doc["cuda"] is False
    assert len(doc["skipped"]) == 2
    assert all("skipped, --ci was given" in s for s in doc["skipped"])
    (result,) = doc["results"]
    assert result["status"] == "measured"
    assert result["model"] == "yolov8n.yaml"
    assert result["device"] == "cpu"
    profiles = {p["profile"]: p for p in result["summary"]["profiles"]}
    assert set(profiles) == {"repro", "balanced", "fast"}
    assert profiles["fast"]["verdict"] == "reference"
    assert profiles["fast"]["ratio_to_reference"] == 1.0
    for name in ("repro", "balanced"):
        p = profiles[name]
        assert p["ratio_low"] <= p["ratio_to_reference"] <= p["ratio_high"]
        assert p["verdict"] in {"slower", "faster", "within noise"}
        assert p["iqr_ms"][0] <= p["step_ms"] <= p["iqr_ms"][1]
    settings = {s["setting"]: s for s in result["summary"]["settings"]}
    assert settings["allow_tf32"]["status"] == "not applicable on cpu"
    assert settings["deterministic_algorithms"]["status"] == "measured"
    assert result["summary"]["kernel_changes"] == {}  # no CUDA kernels profiled on the CPU
    assert "NOT a GPU measurement" in doc["summary"]
    assert "ratio to fast" in doc["summary"]
    assert doc["summary"].splitlines()[0] in proc.stdout


def test_kernel_changes_rank_the_kernels_that_moved_most():
    gp = _load()
    rows = [
        {
            "profile": "fast",
            "kernels": [
                {"name": "conv_autotuned", "self_us_per_step": 900.0},
                {"name": "scatter_add_atomic", "self_us_per_step": 50.0},
                {"name": "gemm", "self_us_per_step": 400.0},
            ],
        },
        {
            "profile": "repro",
            "kernels": [
                {"name": "conv_deterministic", "self_us_per_step": 1500.0},
                {"name": "index_put_sorted", "self_us_per_step": 80.0},
                {"name": "gemm", "self_us_per_step": 401.0},
            ],
        },
        {"profile": "balanced", "kernels": None},
    ]
    changes = gp.kernel_changes(rows)
    assert set(changes) == {"repro"}  # balanced was not profiled
    names = [c["name"] for c in changes["repro"]]
    assert names[:2] == ["conv_deterministic", "conv_autotuned"]
    by = {c["name"]: c for c in changes["repro"]}
    assert by["conv_autotuned"]["delta_us"] == -900.0
    assert by["index_put_sorted"]["reference_us"] == 0.0
    assert names[-1] == "gemm"  # 1 us: the smallest change
    assert gp.kernel_changes([{"profile": "repro", "kernels": []}]) == {}


def test_ratio_interval_separates_signal_from_noise():
    base = [100.0 + (i % 5) for i in range(40)]
    same = [100.0 + ((i + 2) % 5) for i in range(40)]
    slower = [t * 1.3 for t in base]
    r, lo, hi = ratio_interval(same, base)
    assert lo <= 1.0 <= hi
    assert verdict(r, lo, hi) == "within noise"
    r, lo, hi = ratio_interval(slower, base)
    assert lo > 1.2
    assert verdict(r, lo, hi) == "slower"
    r, lo, hi = ratio_interval(base, slower)
    assert verdict(r, lo, hi) == "faster"
    assert ratio_interval(slower, base) == ratio_interval(slower, base)  # fixed seed: reproducible
    assert verdict(1.005, 1.002, 1.008) == "within noise"  # under the 1% floor
    assert iqr([1.0, 2.0, 3.0, 4.0, 5.0]) == (2.0, 4.0)
    with pytest.raises(ValueError):
        ratio_interval([], base)
