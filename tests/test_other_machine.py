"""Other machines, simulated on this one (another core count, a capped instruction set): under ``portable``
they all end on the weights made here; under ``repro`` they do not; and ``check-machine``, run on each
machine before it trains, predicted every case, both ways."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from simulated_machine import Machine, run_yolo_det

from helpers import small_train_tokens

pytestmark = pytest.mark.slow

TINY = small_train_tokens(epochs=None, imgsz=32, batch=8, nbs=8, fraction=0.25, val=False)
HERE = Machine()
OTHERS = (Machine(cpus=4), Machine(cpus=17), Machine(isa="avx2"))


def _train(machine: Machine, profile: str, tmp: Path, name: str, *, epochs: int = 2) -> str:
    argv = ["train", "--profile", profile, f"epochs={epochs}", *TINY, f"project={tmp / 'runs'}", f"name={name}"]
    done = run_yolo_det(machine, argv, tmp)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((tmp / "runs" / name / "determinism.json").read_text(encoding="utf-8"))
    return str(record["weights"]["sha256"])


def _predict(machine: Machine, run: Path, profile: str, tmp: Path) -> int:
    done = run_yolo_det(machine, ["check-machine", str(run), "--profile", profile], tmp)
    assert done.returncode in (0, 1), done.stderr[-2000:]
    assert ("will agree" in done.stdout) == (done.returncode == 0), done.stdout
    return done.returncode


def test_portable_agrees_on_every_simulated_machine_and_repro_does_not(tmp_path: Path) -> None:
    ref = {p: _train(HERE, p, tmp_path, f"{p}-here") for p in ("portable", "repro")}
    # control: the digest does see a change of the weights (one epoch fewer), and the profiles differ here
    assert _train(HERE, "portable", tmp_path, "portable-short", epochs=1) != ref["portable"]
    assert ref["portable"] != ref["repro"]
    assert _predict(HERE, tmp_path / "runs" / "portable-here", "repro", tmp_path) == 1
    assert _predict(HERE, tmp_path / "runs" / "repro-here", "repro", tmp_path) == 0
    outcomes = []
    for machine in OTHERS:
        for profile in ("portable", "repro"):
            predicted = _predict(machine, tmp_path / "runs" / f"{profile}-here", profile, tmp_path)
            digest = _train(machine, profile, tmp_path, f"{profile}-{machine.cpus}-{machine.isa}")
            outcomes.append((str(machine), profile, predicted, digest == ref[profile]))
    for machine, profile, predicted, agreed in outcomes:
        assert agreed == (profile == "portable"), (machine, profile)
        assert (predicted == 0) == agreed, (machine, profile, predicted)


def test_a_portable_run_records_the_pinned_machine_whatever_the_core_count(tmp_path: Path) -> None:
    _train(Machine(cpus=17), "portable", tmp_path, "seventeen", epochs=1)
    host = json.loads((tmp_path / "runs" / "seventeen" / "determinism.json").read_text())["environment"]["host"]
    assert host["cpu_count"] == 17
    assert host["intra_op_threads"] == 1  # not Ultralytics' min(8, 17 - 1)
    assert host["cpu_capability"] == "AVX2"
    assert host["env"]["MKL_CBWR"] == "COMPATIBLE"
    assert host["env"]["ONEDNN_MAX_CPU_ISA"] == "AVX2"
