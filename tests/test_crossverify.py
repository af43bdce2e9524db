"""verify --save / --against: a run saved in one process is compared step by step with a run in another."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from helpers import ROOT, small_train_tokens, subprocess_env
from yolo_det.cli import main
from yolo_det.core.errors import ConfigError
from yolo_det.tools.verify import MicroBatch, RunRecord, StepRecord
from yolo_det.tools.verify.crossverify import SAVED_VERSION, compare_against, read_saved

TINY = small_train_tokens(batch=8, nbs=8, val=False, device=None, exist_ok=None)
STEPS = "3"


def run_cli(*argv: str, cache: Path) -> subprocess.CompletedProcess[str]:
    env = subprocess_env({"YOLO_DET_CACHE": str(cache)})
    return subprocess.run(
        [sys.executable, "-m", "yolo_det", *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """Fingerprints of a 3-step demo run, written by another process."""
    folder = tmp_path_factory.mktemp("saved")
    path = folder / "run.json"
    proc = run_cli("verify", "--steps", STEPS, "--save", str(path), *TINY, cache=folder / "cache")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"fingerprints saved: {path}" in proc.stdout
    return path


def edited(saved: Path, tmp_path: Path, edit: Any) -> Path:
    data = json.loads(saved.read_text())
    edit(data)
    out = tmp_path / "edited.json"
    out.write_text(json.dumps(data))
    return out


# ---------------------------------------------------------------------------------------------------------
# across processes (real trainings)


@pytest.mark.slow
def test_saved_file_is_small_versioned_and_holds_fingerprints_only(saved):
    data = json.loads(saved.read_text())
    assert data["schema"] == "yolo-det/verify-fingerprints"
    assert data["version"] == SAVED_VERSION
    assert data["steps_requested"] == 3
    assert len(data["run"]["steps"]) == 3
    step = data["run"]["steps"][0]
    assert len(step["grads"]) == len(data["run"]["param_names"]) > 100
    assert all(isinstance(g, str) and len(g) == 32 for g in step["grads"])
    assert len(step["weights"]) == 32
    assert all(not f.startswith("/") for b in step["batches"] for f in b["files"])  # relative to the dataset root
    assert all(len(b["raw"]) == 32 and b["raw"] != b["data"] for b in step["batches"])
    assert data["run"]["device_type"] == "cpu"
    assert data["record"]["data"]["splits"]["train"]["images"] == 48
    assert saved.stat().st_size < 100_000
    assert not list(saved.parent.glob(".*.tmp"))


@pytest.mark.slow
def test_same_configuration_in_another_process_exits_0(saved, tmp_path):
    proc = run_cli("verify", "--against", str(saved), *TINY, cache=tmp_path / "cache")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    assert "bitwise identical to the saved run: data, loss, gradients and weights match at all 3 steps" in proc.stdout
    assert "environment: configured the same" in proc.stdout


@pytest.mark.slow
def test_another_seed_names_the_first_step_and_the_seed(saved, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("YOLO_DET_CACHE", str(tmp_path / "cache"))
    code = main(["verify", "--against", str(saved), "--json", *TINY, "seed=1"])
    out = json.loads(capsys.readouterr().out)
    against = out["against"]
    assert code == 1
    assert against["identical"] is False
    first = against["first_divergence"]
    assert first["step"] == 1
    assert first["kind"] == "data"
    assert "order" in first["detail"]
    assert against["verdict"] == "differs from the saved run at step 1 (epoch 1): data"
    causes = [d["name"] for d in against["environment"]["differences"] if d["changes_bits"]]
    assert causes[0] == "seed"


@pytest.mark.slow
def test_gradient_noise_at_one_step_names_that_step_and_parameter(saved, capsys, tmp_path, monkeypatch):
    """The saved run's gradient fingerprint of one parameter at step 2 is changed, as noise in its gradient would."""

    def noise(data: dict[str, Any]) -> None:
        names = data["run"]["param_names"]
        k = names.index("model.4.m.0.cv1.conv.weight")
        data["run"]["steps"][1]["grads"][k] = "f" * 32

    monkeypatch.setenv("YOLO_DET_CACHE", str(tmp_path / "cache"))
    code = main(["verify", "--against", str(edited(saved, tmp_path, noise)), *TINY])
    out = capsys.readouterr().out
    assert code == 1
    assert "differs from the saved run at step 2 (epoch 1): gradients" in out
    assert "gradients differ for 1 of " in out
    assert "model.4.m.0.cv1.conv.weight" in out


def test_unknown_future_version_and_broken_files_exit_2_before_training(tmp_path, capsys, monkeypatch):
    from yolo_det.tools import verify as verify_command  # the command imports record_runs from here when it runs

    def no_training(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("trained despite a bad --against file")

    monkeypatch.setattr(verify_command, "record_runs", no_training)
    future = tmp_path / "future.json"
    future.write_text(json.dumps({"schema": "yolo-det/verify-fingerprints", "version": SAVED_VERSION + 1}))
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"schema": 1}))
    for path, needle in (
        (future, "upgrade yolo-det"),
        (broken, "not JSON"),
        (other, "schema"),
        (tmp_path / "missing.json", "does not exist"),
    ):
        code = main(["verify", "--against", str(path), *TINY])
        out, err = capsys.readouterr()
        assert code == 2, (path, err)
        assert out == ""
        assert len(err.strip().splitlines()) == 1, (path, err)
        assert needle in err, (path, err)
    code = main(["verify", "--save", str(tmp_path / "x.txt"), *TINY])
    assert code == 2
    assert ".json" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------------
# comparison on hand-made records (fast)


def make_run(steps: int = 3, *, root: str = "/data/set", device: str = "cpu") -> RunRecord:
    rec = RunRecord(
        index=1, param_names=["a", "b", "c"], loss_names=["box"], portable=True, data_root=root, device_type=device
    )
    for s in range(1, steps + 1):
        mb = MicroBatch(
            index=s - 1,
            epoch=0,
            data=f"d{s}-{device}",
            files=(f"{root}/images/{s}.png",),
            loss=(1.0 / s,),
            raw=f"raw{s}",
        )
        rec.steps.append(StepRecord(step=s, epoch=0, batches=[mb], grads=[f"g{s}{k}" for k in "abc"], weights=f"w{s}"))
    rec.weights = {"model": "m"}
    return rec


def as_saved(run: RunRecord) -> Any:
    from yolo_det.tools.verify.crossverify import _run_to_dict

    return read_saved(
        {
            "schema": "yolo-det/verify-fingerprints",
            "version": 1,
            "digest": "fingerprint/1",
            "run": _run_to_dict(run),
            "record": {},
        },
        "saved.json",
    )


def test_same_records_on_two_machines_compare_equal():
    report = compare_against(as_saved(make_run(root="/home/a/data")), make_run(root="/mnt/b/data"))
    assert report.identical
    assert report.steps == [3, 3]
    assert "not compared" in report.notes[0]
    here = make_run(root="/mnt/b/data")
    here.steps[0].batches[0].files = ("/mnt/b/data/images/other.png",)
    here.steps[0].batches[0].data = "another image"
    d = compare_against(as_saved(make_run(root="/home/a/data")), here).divergence
    assert d is not None
    assert (d.step, d.kind) == (1, "data")
    assert d.files == [["images/1.png"], ["images/other.png"]]


def test_a_cpu_run_against_a_gpu_run_compares_loader_batches_and_losses_only():
    gpu, cpu = make_run(device="cuda"), make_run(device="cpu")
    for s in cpu.steps:
        s.grads = ["x"] * 3
    report = compare_against(as_saved(gpu), cpu)
    assert report.identical
    assert report.across_devices
    assert "gradients and weights were not compared" in report.verdict
    assert not report.verified
    assert report.to_dict()["identical"] is False  # never a pass: exit 1
    cpu.steps[1].batches[0].loss = (0.25000001,)
    d = compare_against(as_saved(gpu), cpu).divergence
    assert d is not None
    assert (d.step, d.kind) == (2, "loss")
    cpu.steps[0].batches[0].raw = "augmented differently"
    d = compare_against(as_saved(gpu), cpu).divergence
    assert d is not None
    assert (d.step, d.kind) == (1, "data")


def test_weights_after_a_step_differ_while_its_gradients_match():
    here = make_run()
    here.steps[1].weights = "other"
    here.steps[2].batches[0].loss = (9.0,)
    report = compare_against(as_saved(make_run()), here)
    d = report.divergence
    assert d is not None
    assert (d.step, d.kind) == (2, "weights")
    assert "optimizer" in d.detail


def test_a_different_model_is_named_and_unportable_runs_are_refused():
    here = make_run()
    here.param_names = ["a", "b", "x"]
    d = compare_against(as_saved(make_run()), here).divergence
    assert d is not None
    assert d.kind == "model"
    assert "c vs x" in d.detail
    here.portable = False
    with pytest.raises(ConfigError, match="portable"):
        compare_against(as_saved(make_run()), here)


def _stream_record(**changes: Any) -> dict[str, Any]:
    section = {
        "mode": "worker-stream",
        "workers": 0,
        "seed": 0,
        "dataset": "d" * 64,
        "augment": {"mosaic": 1.0},
        "fingerprint": "f" * 64,
        "fingerprint_batches": 2,
        "fingerprint_epoch": 0,
    }
    return {"data_stream": {**section, **changes}}


def _with_record(run: RunRecord, record: dict[str, Any]) -> RunRecord:
    run.record = record
    return run


def test_data_is_named_first_with_its_cause_when_only_the_stream_differs():
    saved_run = make_run()
    saved = as_saved(saved_run)
    saved.record = _stream_record()
    # the batches differ from the first step on: "data", and the records say why (the worker count)
    here = make_run()
    for s in here.steps:
        s.batches[0].data = f"other {s.step}"
        s.grads = ["x"] * 3
    here = _with_record(here, _stream_record(workers=2, fingerprint="e" * 64))
    d = compare_against(saved, here).divergence
    assert d is not None
    assert (d.step, d.kind) == (1, "data")
    assert d.cause is not None
    assert d.cause.startswith("workers (saved 0 | here 2)")
    assert "data_invariance" in d.cause
    report = compare_against(saved, here)
    assert "  cause: workers (saved 0 | here 2)" in report.summary()
    assert report.to_dict()["first_divergence"]["cause"] == d.cause
    # the steps show only a weights difference, the fingerprints say the data differed: data comes first
    here = _with_record(make_run(), _stream_record(seed=1, fingerprint="e" * 64))
    here.weights = {"model": "other"}
    d = compare_against(saved, here).divergence
    assert d is not None
    assert (d.step, d.kind) == (1, "data")
    assert d.cause is not None
    assert d.cause.startswith("seed (saved 0 | here 1)")
    # control: the same stream and the same weights difference stays a weights divergence, with no cause
    here = _with_record(make_run(), _stream_record())
    here.weights = {"model": "other"}
    d = compare_against(saved, here).divergence
    assert d is not None
    assert d.kind == "weights"
    assert d.cause is None
    # both worker-invariant with other worker counts: the count is no cause
    saved.record = _stream_record(mode="keyed")
    here = _with_record(make_run(), _stream_record(mode="keyed", workers=4, dataset="e" * 64, fingerprint="e" * 64))
    d = compare_against(saved, here).divergence
    assert d is not None
    assert d.kind == "data"
    assert d.cause is not None
    assert d.cause.startswith("dataset (")
    assert "workers" not in d.cause


def test_a_baseline_naming_a_hostile_data_yaml_is_refused_before_training(tmp_path, capsys, monkeypatch):
    """A verify baseline is a file from others: the paths it carries (its arguments, its record's run section)
    pass the same gate as data= on the command line, before any training."""
    import yolo_det.tools.verify as verify_tools  # the command imports record_runs from here when it runs
    from yolo_det.tools.verify.crossverify import _run_to_dict

    def no_training(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("trained despite a hostile --against file")

    monkeypatch.setattr(verify_tools, "record_runs", no_training)
    canary = tmp_path / "CANARY"
    hostile = tmp_path / "hostile.yaml"
    hostile.write_text(
        f"path: {tmp_path}\ntrain: images/train\nval: images/val\nnames: {{0: a}}\n"
        f"download: open({str(canary)!r}, 'w').write('ran')\n"
    )
    base = {
        "schema": "yolo-det/verify-fingerprints",
        "version": 1,
        "digest": "fingerprint/1",
        "run": _run_to_dict(make_run()),
        "record": {},
    }
    for where, edit in (
        ("args", {"args": {"data": str(hostile)}}),
        ("record", {"record": {"run": {"data": str(hostile)}}}),
    ):
        path = tmp_path / f"{where}.json"
        path.write_text(json.dumps({**base, **edit}))
        code = main(["verify", "--against", str(path), *TINY])
        out, err = capsys.readouterr()
        assert code == 2, (where, err)
        assert len(err.strip().splitlines()) == 1, err
        assert "has a 'download:'" in err, err
        assert f"the verify baseline '{path}'" in err, err
    assert not canary.exists()
    # control: the same baseline naming nothing hostile reads
    path = tmp_path / "plain.json"
    path.write_text(json.dumps({**base, "args": {"data": str(tmp_path / "elsewhere.yaml")}}))
    from yolo_det.tools.verify.crossverify import load_saved

    assert load_saved(path).args == {"data": str(tmp_path / "elsewhere.yaml")}
