"""Ultralytics' own multi-GPU path on two CPU ranks: what yolo-det guarantees there.

Each launch runs ``bench/ddp_cpu.py`` in its own process: ``model.train(device="0,1")`` through
Ultralytics' ``generate_ddp_file`` (cloudpickle) and ``torch.distributed.run``, with gloo instead of NCCL
and the CPU instead of CUDA devices (the harness's only changes, see docs/multi-gpu.md). Every launch is
shared by the tests that need it (module-scoped fixtures, started on first use), and the plugin-less
control shows that the checks of the plugin and of the seeds fail without yolo-det.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from helpers import ROOT

pytestmark = pytest.mark.slow

HARNESS = ROOT / "bench" / "ddp_cpu.py"
sys.path.insert(0, str(HARNESS.parent))
try:
    from ddp_cpu import plugin_problems, seed_problems  # the checks bench/gpu_ddp.py runs on GPUs
finally:
    sys.path.remove(str(HARNESS.parent))
SEED = 5
# Every layer that has a deterministic equivalent swapped, and functional calls intercepted, in training.
KEEP = """name: ddp-proof
description: strict determinism, every swap and interception while training
defaults:
  deterministic_algorithms: strict
  cudnn_benchmark: false
  cudnn_deterministic: true
  allow_tf32: false
  fill_uninitialized_memory: false
  backward: keep
  swaps: none
  intercept: false
  env:
    CUBLAS_WORKSPACE_CONFIG: ":4096:8"
train:
  swaps: all
  intercept: true
"""
TOGGLE = KEEP.replace("name: ddp-proof", "name: ddp-toggle").replace(
    "  swaps: all\n", "  swaps: all\n  backward: disable\n"
)


def _launch(tmp: Path, out: str, *args: str) -> dict[str, Any]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
        "YOLO_OFFLINE": "1",
        "YOLO_CONFIG_DIR": str(tmp / "ultralytics-config"),
    }
    proc = subprocess.run(
        [sys.executable, str(HARNESS), "--out", str(tmp / out), *args],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert lines, f"the harness printed no result (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
    result = json.loads(lines[-1])
    result["returncode"], result["stderr"] = proc.returncode, proc.stderr
    record = Path(result["save_dir"] or tmp, "determinism.json")
    result["record_json"] = json.loads(record.read_text()) if result.get("save_dir") and record.exists() else None
    return result


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ddp")
    (path / "keep.yaml").write_text(KEEP)
    (path / "toggle.yaml").write_text(TOGGLE)
    return path


def _args(tmp: Path, profile: str = "keep", *, epochs: int = 2, seed: int = SEED, name: str) -> list[str]:
    return [
        "--profile",
        str(tmp / f"{profile}.yaml"),
        "--epochs",
        str(epochs),
        "--seed",
        str(seed),
        "--fraction",
        "0.34",
        "--name",
        name,
    ]


@pytest.fixture(scope="module")
def straight(tmp: Path) -> dict[str, Any]:
    """Two epochs, uninterrupted."""
    return _launch(tmp, "straight", *_args(tmp, name="straight"))


@pytest.fixture(scope="module")
def stopped(tmp: Path) -> dict[str, Any]:
    """The same run stopped on every rank after epoch 1's checkpoint, with the resume states it left (the
    resumed run completes in the same folder and removes them)."""
    result = _launch(tmp, "stopped", *_args(tmp, name="resumed"), "--at", "stop@1")
    weights = Path(result["save_dir"]) / "weights"
    result["state_files"] = {p.name for p in weights.glob("yolo-det-resume.*")}
    return result


@pytest.fixture(scope="module")
def resumed(tmp: Path, stopped: dict[str, Any]) -> dict[str, Any]:
    """The stopped run resumed with 2 ranks (the checkpoint's device=0,1)."""
    return _launch(
        tmp,
        "resumed",
        "--resume",
        str(Path(stopped["save_dir"]) / "weights" / "last.pt"),
        "--profile",
        str(tmp / "keep.yaml"),
    )


@pytest.fixture(scope="module")
def other_seed(tmp: Path) -> dict[str, Any]:
    """Another seed; rank 1 turns cudnn.benchmark on after the profile (no effect on a CPU's numbers)."""
    return _launch(tmp, "other", *_args(tmp, epochs=1, seed=SEED + 1, name="other"), "--skew", "1:cudnn_benchmark")


@pytest.fixture(scope="module")
def terminated(tmp: Path) -> dict[str, Any]:
    """Backward through the toggle; SIGTERM to the launching process once rank 0 has saved epoch 1."""
    return _launch(tmp, "terminated", *_args(tmp, "toggle", name="terminated"), "--at", "sigterm@1")


@pytest.fixture(scope="module")
def one_rank(tmp: Path, terminated: dict[str, Any]) -> dict[str, Any]:
    """The terminated 2-rank run resumed in one process (device=cpu)."""
    return _launch(
        tmp,
        "one-rank",
        "--resume",
        str(Path(terminated["save_dir"]) / "weights" / "last.pt"),
        "--profile",
        str(tmp / "toggle.yaml"),
        "--devices",
        "cpu",
    )


@pytest.fixture(scope="module")
def control(tmp: Path) -> dict[str, Any]:
    """The negative control: the same launch without yolo-det."""
    return _launch(tmp, "control", *_args(tmp, epochs=1, name="control"), "--no-plugin")


def _digest(path: str) -> str:
    from yolo_det.core.record import checkpoint_digest

    return checkpoint_digest(Path(path))


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


# -- 1. the plugin on every rank ------------------------------------------------------------------------------
def test_plugin_in_force_on_every_rank(straight: dict[str, Any], terminated: dict[str, Any]) -> None:
    assert straight["error"] is None, straight["stderr"][-3000:]
    assert plugin_problems(straight, "ddp-proof") == []
    assert plugin_problems(terminated, "ddp-toggle", toggle=True) == []
    assert all(not seen["start"]["toggle_scaler"] for seen in straight["ranks"].values())  # backward: keep


# -- 2. seeds -----------------------------------------------------------------------------------------------
def test_every_rank_seeded_from_the_user_seed(straight: dict[str, Any], other_seed: dict[str, Any]) -> None:
    assert seed_problems(straight, SEED) == []
    assert seed_problems(other_seed, SEED + 1) == []
    for r in ("0", "1"):  # the data order follows the seed
        assert straight["ranks"][r]["start"]["sampler_order"] != other_seed["ranks"][r]["start"]["sampler_order"]
        assert straight["ranks"][r]["start"]["rng_digest"] != other_seed["ranks"][r]["start"]["rng_digest"]


# -- 3. two launches, bitwise --------------------------------------------------------------------------------
def test_two_launches_give_bitwise_equal_weights(straight: dict[str, Any], stopped: dict[str, Any]) -> None:
    for r in ("0", "1"):
        a, b = straight["ranks"][r]["epochs"], stopped["ranks"][r]["epochs"]
        assert a["1"] == {**b["1"]}  # parameters and this rank's BatchNorm statistics after epoch 1
        assert a["2"]["params"] != a["1"]["params"]  # the weights did change: equality is not trivial
    assert straight["ranks"]["0"]["epochs"]["2"]["params"] == straight["ranks"]["1"]["epochs"]["2"]["params"]


def test_another_seed_gives_other_weights(straight: dict[str, Any], other_seed: dict[str, Any]) -> None:
    assert other_seed["error"] is None, other_seed["stderr"][-3000:]
    for r in ("0", "1"):
        assert other_seed["ranks"][r]["epochs"]["1"]["params"] != straight["ranks"][r]["epochs"]["1"]["params"]


# -- 4. one record, with every rank, rank problems only where ranks must agree ---------------------------------
def test_rank_zero_records_every_rank_and_flags_only_real_differences(
    straight: dict[str, Any], other_seed: dict[str, Any]
) -> None:
    record = straight["record_json"]
    assert record["status"] == "completed"
    assert [s["rank"] for s in record["ranks"]] == [0, 1]
    assert [s["state"]["env"]["PYTHONHASHSEED"] for s in record["ranks"]] == [str(SEED + 1), str(SEED + 2)]
    assert record["rank_problems"] == []  # PYTHONHASHSEED = seed + 1 + rank by design
    assert record["weights"]["sha256"] == _digest(record["weights"]["file"])
    skewed = other_seed["record_json"]
    assert skewed["rank_problems"] == ["rank 1 differs from rank 0 in cudnn_benchmark"]
    save_dir = Path(straight["save_dir"])
    assert list(save_dir.rglob("determinism.json")) == [save_dir / "determinism.json"]  # one record, rank 0's


# -- 5. SIGTERM -------------------------------------------------------------------------------------------------
def test_sigterm_to_the_launching_process_leaves_a_true_record_and_no_rank(terminated: dict[str, Any]) -> None:
    assert terminated["error"] == "Terminated: terminated by SIGTERM"
    record = terminated["record_json"]
    assert record["status"] == "terminated", record.get("error")
    assert record["signal"] == "SIGTERM"
    assert record["epochs_completed"] >= 1
    for entry in record["weights"]["files"]:  # what the record says is on disk is on disk
        assert _digest(entry["file"]) == entry["sha256"], entry["file"]
    assert record["rank_problems"] == []
    pids = [seen["start"]["pid"] for seen in terminated["ranks"].values()]
    assert len(pids) == 2
    assert not [p for p in pids if _alive(p)]


# -- 6. resume --------------------------------------------------------------------------------------------------
def test_interrupted_two_rank_run_resumed_with_two_ranks_is_bitwise_equal(
    straight: dict[str, Any], stopped: dict[str, Any], resumed: dict[str, Any]
) -> None:
    assert stopped["record_json"]["status"] == "interrupted"
    assert stopped["state_files"] >= {"yolo-det-resume.last.pt", "yolo-det-resume.last.rank1.pt"}
    record = resumed["record_json"]
    assert resumed["error"] is None, resumed["stderr"][-3000:]
    assert record["status"] == "completed"
    assert record["resume"]["state_found"]
    assert record["resume"]["bitwise_expected"]
    assert not list((Path(stopped["save_dir"]) / "weights").glob("yolo-det-resume.*"))  # completed: none kept
    for r in ("0", "1"):
        assert list(resumed["ranks"][r]["epochs"]) == ["2"]  # the resumed run trained epoch 2 only
        assert list(straight["ranks"][r]["epochs"]) == ["1", "2"]
        assert resumed["ranks"][r]["epochs"]["2"] == straight["ranks"][r]["epochs"]["2"]
    assert record["weights"]["ema_fp32_sha256"] == straight["record_json"]["weights"]["ema_fp32_sha256"]


def test_resuming_with_another_number_of_ranks_is_reported_and_not_bitwise(one_rank: dict[str, Any]) -> None:
    record = one_rank["record_json"]
    assert one_rank["error"] is None, one_rank["stderr"][-3000:]
    resume = record["resume"]
    assert not resume["state_found"]
    assert not resume["bitwise_expected"]
    assert "written by a run of 2 rank(s), this run has 1" in resume["problem"]
    lines = [ln for ln in one_rank["stderr"].splitlines() if ln.startswith("yolo-det: no resume state")]
    assert len(lines) == 1
    assert "2 rank(s)" in lines[0]


# -- the negative control -----------------------------------------------------------------------------------------
def test_the_checks_fail_without_the_plugin(control: dict[str, Any]) -> None:
    assert control["error"] is None, control["stderr"][-3000:]
    problems = plugin_problems(control, "ddp-proof")
    assert problems
    assert all(p.startswith("rank ") for p in problems)
    assert any("plugin False" in p for p in problems)
    assert any("swapped []" in p for p in problems)
    # Ultralytics 8.4 seeds its DistributedSampler from the seed itself (older releases did not); the check
    # still tells a sampler seeded otherwise:
    assert seed_problems(control, SEED) == []
    assert any(f"seeded with {SEED}, the user's seed is {SEED + 1}" in p for p in seed_problems(control, SEED + 1))
    assert control["record_json"] is None
