"""bench/gpu_check.py runs on a machine without CUDA: every GPU step skipped, saying so, one results file."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from helpers import ROOT, subprocess_env

SCRIPT = ROOT / "bench" / "gpu_check.py"


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="this test checks the CPU path of the GPU check")
def test_gpu_check_on_cpu_skips_the_gpu_steps_and_writes_one_file(tmp_path):
    out = tmp_path / "results" / "gpu.json"
    env = subprocess_env()
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["gpu.json"]
    data = json.loads(out.read_text())
    assert data["schema"] == "yolo-det/gpu-check/1"
    assert data["cuda"] is False
    assert data["device"] is None
    names = [c["name"] for c in data["checks"]]
    assert names == ["verify_repro_stock", "verify_repro_attention", "strict_plain_attention", "bench_profiles"]
    for check in data["checks"]:
        assert check["status"] == "skipped"
        assert "no CUDA device" in check["message"]
    assert any("attention-mix.yaml" in c["title"] for c in data["checks"])
    assert "GPU steps skipped" in data["summary"]
    assert data["summary"].splitlines()[0] in proc.stdout
    assert data["environment"]["torch"] == torch.__version__


def test_gpu_check_names_the_missing_attention_model(tmp_path, monkeypatch):
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(SCRIPT.parent))
    monkeypatch.setattr(gpu_check, "cuda_available", lambda: True)
    calls = []
    monkeypatch.setattr(
        gpu_check, "check_verify", lambda *a: calls.append(("verify", a)) or {"status": "passed", "message": "ok"}
    )
    monkeypatch.setattr(
        gpu_check, "check_bench", lambda *a: calls.append(("bench", a)) or {"status": "passed", "message": "ok"}
    )
    monkeypatch.setattr(gpu_check, "amp_check_skipped", lambda: __import__("contextlib").nullcontext())
    monkeypatch.setattr(gpu_check, "check_strict_plain", lambda *a: pytest.fail("needs the attention model"))
    args = gpu_check.argparse.Namespace(
        attention_model=str(tmp_path / "absent.yaml"), steps=3, bench_steps=2, bench_imgsz=64, device="0"
    )
    results = gpu_check.run_checks(args)
    status = {c["name"]: (c["status"], c["message"]) for c in results["checks"]}
    assert status["verify_repro_stock"][0] == "passed"
    assert status["bench_profiles"][0] == "passed"
    for name in ("verify_repro_attention", "strict_plain_attention"):
        assert status[name][0] == "skipped"
        assert "absent.yaml does not exist" in status[name][1]
    assert [c[0] for c in calls] == ["verify", "bench"]
