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
#: another core count (17: above the 8 threads Ultralytics gives a CPU training at most) and another instruction set
OTHERS = (Machine(cpus=17), Machine(isa="avx2"))


def _train(machine: Machine, profile: str, tmp: Path, name: str) -> str:
    argv = ["train", "--profile", profile, "epochs=2", *TINY, f"project={tmp / 'runs'}", f"name={name}"]
    done = run_yolo_det(machine, argv, tmp)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((tmp / "runs" / name / "determinism.json").read_text(encoding="utf-8"))
    return str(record["weights"]["sha256"])


def _predict(machine: Machine, run: Path, profile: str, tmp: Path) -> int:
    done = run_yolo_det(machine, ["check-machine", str(run), "--profile", profile], tmp)
    assert done.returncode in (0, 1), done.stderr[-2000:]
    assert ("will agree" in done.stdout) == (done.returncode == 0), done.stdout
    return done.returncode


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str], list[tuple[str, str, int, bool]]]:
    """Both profiles trained here and on every simulated machine, each machine predicting the outcome first:
    the folder, the digests made here, and (machine, profile, predicted exit code, digest equal to here's)."""
    tmp = tmp_path_factory.mktemp("machines")
    ref = {p: _train(HERE, p, tmp, f"{p}-here") for p in ("portable", "repro")}
    outcomes = []
    for machine in OTHERS:
        for profile in ("portable", "repro"):
            predicted = _predict(machine, tmp / "runs" / f"{profile}-here", profile, tmp)
            digest = _train(machine, profile, tmp, f"{profile}-{machine.cpus}-{machine.isa}")
            outcomes.append((str(machine), profile, predicted, digest == ref[profile]))
    return tmp, ref, outcomes


def test_portable_agrees_on_every_simulated_machine_and_repro_does_not(
    trained: tuple[Path, dict[str, str], list[tuple[str, str, int, bool]]],
) -> None:
    tmp, ref, outcomes = trained
    # control: the digest does see a change of the weights (the checkpoint one epoch before the end, from the
    # record), and the profiles differ here
    record = json.loads((tmp / "runs" / "portable-here" / "determinism.json").read_text(encoding="utf-8"))
    *_, before, last = [entry["sha256"] for entry in record["epoch_weights"]]
    assert last == ref["portable"] != before
    assert ref["portable"] != ref["repro"]
    assert _predict(HERE, tmp / "runs" / "portable-here", "repro", tmp) == 1
    assert _predict(HERE, tmp / "runs" / "repro-here", "repro", tmp) == 0
    for machine, profile, predicted, agreed in outcomes:
        assert agreed == (profile == "portable"), (machine, profile)
        assert (predicted == 0) == agreed, (machine, profile, predicted)


def test_a_portable_run_records_the_pinned_machine_whatever_the_core_count(
    trained: tuple[Path, dict[str, str], list[tuple[str, str, int, bool]]],
) -> None:
    seventeen = Machine(cpus=17)
    assert seventeen in OTHERS  # its portable run is in the shared ones
    record = trained[0] / "runs" / f"portable-{seventeen.cpus}-{seventeen.isa}" / "determinism.json"
    host = json.loads(record.read_text())["environment"]["host"]
    assert host["cpu_count"] == 17
    assert host["intra_op_threads"] == 1  # not Ultralytics' min(8, 17 - 1)
    assert host["cpu_capability"] == "AVX2"
    assert host["env"]["MKL_CBWR"] == "COMPATIBLE"
    assert host["env"]["ONEDNN_MAX_CPU_ISA"] == "AVX2"
