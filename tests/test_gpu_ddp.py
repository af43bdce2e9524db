"""bench/gpu_ddp.py: with fewer than 2 GPUs it runs nothing and says what it skipped."""

from __future__ import annotations

import json
import sys

import torch

from helpers import ROOT

SCRIPT = ROOT / "bench" / "gpu_ddp.py"


def _load():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import gpu_ddp
    finally:
        sys.path.remove(str(SCRIPT.parent))
    return gpu_ddp


def test_plan_runs_on_two_gpus_and_skips_every_proof_below() -> None:
    gpu_ddp = _load()
    assert gpu_ddp.plan(2) == (True, [])
    assert gpu_ddp.plan(8) == (True, [])
    for gpus in (0, 1):
        runnable, skipped = gpu_ddp.plan(gpus)
        assert not runnable
        assert len(skipped) == len(gpu_ddp.PROOFS) == 6
        assert all(line.endswith(f"needs 2+ CUDA devices and this machine has {gpus}") for line in skipped)
        assert [line.split(": skipped")[0] for line in skipped] == list(gpu_ddp.PROOFS)


def test_without_two_gpus_it_writes_what_it_skipped_and_succeeds(tmp_path, capsys) -> None:
    gpu_ddp = _load()
    out = tmp_path / "gpu_ddp.json"
    assert gpu_ddp.main(["--out", str(out), "--gpus", "1"]) == 0
    doc = json.loads(out.read_text())
    found = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert doc["gpus"] == min(1, found)
    assert "proofs" not in doc
    assert doc["skipped"] == gpu_ddp.plan(doc["gpus"])[1]
    printed = capsys.readouterr().out.splitlines()
    assert printed[:6] == doc["skipped"]
    assert printed[-1] == f"written: {out}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpu_ddp.json"]
