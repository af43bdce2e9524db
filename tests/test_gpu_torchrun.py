"""bench/gpu_torchrun.py: with fewer than 2 GPUs it runs nothing and says what it skipped."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from helpers import ROOT

SCRIPT = ROOT / "bench" / "gpu_torchrun.py"


def _load():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import gpu_torchrun
    finally:
        sys.path.remove(str(SCRIPT.parent))
    return gpu_torchrun


def test_plan_runs_on_two_gpus_and_skips_every_proof_below() -> None:
    gpu_torchrun = _load()
    assert gpu_torchrun.plan(2) == (True, [])
    runnable, skipped = gpu_torchrun.plan(1)
    assert not runnable
    assert [line.split(": skipped")[0] for line in skipped] == list(gpu_torchrun.PROOFS)


def test_without_two_gpus_it_writes_what_it_skipped_and_succeeds(tmp_path: Path) -> None:
    gpu_torchrun = _load()
    out = tmp_path / "gpu_torchrun.json"
    assert gpu_torchrun.main(["--out", str(out), "--gpus", "1"]) == 0
    doc = json.loads(out.read_text())
    assert doc["gpus"] <= 1
    assert len(doc["skipped"]) == len(gpu_torchrun.PROOFS)
    assert "proofs" not in doc
