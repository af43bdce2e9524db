"""Hostile surroundings and input beyond the bad-input table: weights files cut short, a run stopped by a full
disk, output escaping, a saved verify file whose device type was edited, --import after key=value."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from helpers import ROOT
from yolo_det.cli import main
from yolo_det.core.endings import weights_files, weights_stats
from yolo_det.core.partial import INCOMPLETE_SUFFIX, is_complete_checkpoint, set_aside_incomplete
from yolo_det.core.text import printable


def _checkpoint(path: Path) -> None:
    torch.save({"model": torch.nn.Conv2d(3, 4, 3), "epoch": 1}, path)


def test_a_weights_file_cut_short_is_set_aside(tmp_path: Path) -> None:
    weights = tmp_path / "weights"
    weights.mkdir()
    _checkpoint(weights / "best.pt")  # from before the run, and unreadable: not this run's to rename
    (weights / "best.pt").write_bytes((weights / "best.pt").read_bytes()[:100])
    before = weights_stats(weights)
    _checkpoint(weights / "last.pt")
    _checkpoint(weights / "epoch1.pt")
    whole = (weights / "last.pt").read_bytes()
    (weights / "last.pt").write_bytes(whole[: len(whole) // 2])  # the write the full disk cut short
    assert is_complete_checkpoint(weights / "epoch1.pt")
    assert not is_complete_checkpoint(weights / "last.pt")
    files = set_aside_incomplete(weights_files(weights, before))
    by_name = {Path(f.get("renamed_from", f["file"])).name: f for f in files}
    assert by_name["last.pt"]["incomplete"] is True
    assert by_name["last.pt"]["sha256"] is None
    assert by_name["last.pt"]["file"] == str(weights / ("last.pt" + INCOMPLETE_SUFFIX))
    assert not (weights / "last.pt").exists()  # nothing named like a checkpoint holds half of one
    assert (weights / ("last.pt" + INCOMPLETE_SUFFIX)).read_bytes() == whole[: len(whole) // 2]
    assert "incomplete" not in by_name["epoch1.pt"]
    assert by_name["epoch1.pt"]["sha256"]
    assert "incomplete" not in by_name["best.pt"]
    assert (weights / "best.pt").exists()
    # a second cut-short file of the same name does not replace the first one set aside
    (weights / "last.pt").write_bytes(b"PK\x03\x04 cut")
    again = set_aside_incomplete(weights_files(weights, before))
    assert any(f["file"].endswith("last.pt" + INCOMPLETE_SUFFIX + "2") for f in again)


def test_the_failure_line_names_the_record_or_why_there_is_none() -> None:
    from yolo_det.commands.train import _failure

    error = OSError(28, "No space left on device")
    ok = SimpleNamespace(record_error=None, record_path=Path("/runs/r/determinism.json"))
    assert _failure(error, ok).endswith("record (status 'failed'): /runs/r/determinism.json")
    lost = SimpleNamespace(
        record_error="could not write determinism.json in '/runs/r': OSError: full", record_path=None
    )
    assert "could not write determinism.json in '/runs/r'" in _failure(error, lost)
    assert _failure(error, None).startswith("training stopped: OSError: [Errno 28]")


@pytest.mark.slow
def test_a_full_disk_stops_the_run_with_one_line_and_a_true_record(tmp_path: Path) -> None:
    """RLIMIT_FSIZE makes every write past 1 MB fail (as a full disk does) in a child process: the write of
    last.pt fails half way."""
    script = tmp_path / "full.py"
    script.write_text(
        "import resource, signal, sys\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (1_000_000, 1_000_000))\n"
        "from yolo_det.cli import main\n"
        f"sys.exit(main(['train', 'epochs=1', 'batch=8', 'imgsz=64', 'plots=false', 'project={tmp_path / 'runs'}',"
        " 'name=r']))\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "YOLO_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
    }
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600
    )
    run = tmp_path / "runs" / "r"
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("yolo-det: error:")]
    assert done.returncode == 1, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert len(lines) == 1
    assert "File too large" in lines[0]
    assert str(run / "determinism.json") in lines[0]
    record = json.loads((run / "determinism.json").read_text())
    assert record["status"] == "failed"
    assert record["error"]["type"] == "OSError"
    # last.pt is written atomically under yolo-det: the write cut short leaves no file, only the error
    assert not (run / "weights" / "last.pt").exists()
    assert not (run / "weights" / ("last.pt" + INCOMPLETE_SUFFIX)).exists()
    assert [p.name for p in (run / "weights").iterdir() if p.name.startswith(".")] == []
    for entry in record["weights"]["files"]:  # nothing listed that is not on disk as listed
        assert Path(entry["file"]).stat().st_size == entry.get("bytes", Path(entry["file"]).stat().st_size)


def test_printable_escapes_what_acts_on_a_terminal() -> None:
    forged = "Intel\n\x1b[1A\x1b[2Kverdict: bitwise identical\r\u202eevil"
    assert printable(forged, newlines=False) == "Intel\\n\\x1b[1A\\x1b[2Kverdict: bitwise identical\\r\\u202eevil"
    assert printable("a\tb\nc é") == "a\tb\nc é"  # lines, tabs and letters stay


def test_a_forged_environment_value_cannot_add_or_hide_a_line() -> None:
    from yolo_det.tools.verify.crossverify import AgainstReport

    cause = SimpleNamespace(name="cpu_model", a="Xeon\n\x1b[1A\x1b[2Kverdict: bitwise identical", b="Xeon")
    report = AgainstReport(saved="s.json", divergence=None, steps=[3, 3], environment=SimpleNamespace(causes=[cause]))  # type: ignore[arg-type]
    shown = printable(report.summary())
    assert "\x1b" not in shown
    assert not any(line.startswith("verdict") for line in shown.splitlines())
    assert len(shown.splitlines()) == 3


def test_an_edited_device_type_never_turns_a_comparison_into_a_pass() -> None:
    from test_crossverify import as_saved, make_run

    saved = as_saved(make_run(device="cpu"))
    here = make_run(device="cpu")
    for s in here.steps:
        s.grads = ["other"] * 3  # the gradients differ
    from yolo_det.tools.verify.crossverify import compare_against

    assert not compare_against(saved, here).verified
    saved.run.device_type = "cuda"  # the file edited: "trained on another device type"
    report = compare_against(saved, here)
    assert report.identical
    assert not report.verified
    assert report.to_dict()["identical"] is False


def test_key_value_arguments_after_an_option_are_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    from yolo_det.tools import prepare as prepare_module  # the command imports prepare from here when it runs

    seen: dict[str, Any] = {}

    def fake_prepare(profile: Any, tokens: list[str], **kwargs: Any) -> Any:
        seen["tokens"] = tokens
        raise SystemExit(0)

    monkeypatch.setattr(prepare_module, "prepare", fake_prepare)
    with pytest.raises(SystemExit):
        main(["train", "epochs=1", "--profile", "fast", "imgsz=64", "--trust-checkpoint", "batch=2"])
    assert seen["tokens"] == ["epochs=1", "imgsz=64", "batch=2"]


def test_a_relative_project_and_the_name_stay_inside_the_runs_folder(tmp_path: Path) -> None:
    from ultralytics.utils import SETTINGS

    from yolo_det.tools.prechecks import run_dir

    where = run_dir({"project": "mine", "name": "exp"}, "detect")
    assert where.parent.name == "mine"
    assert where.name.startswith("exp")
    assert Path(SETTINGS["runs_dir"]).name in where.parts or "tmp" in where.parts
    assert run_dir({"project": str(tmp_path), "name": "exp"}, "detect") == (tmp_path / "exp").resolve()


def test_sys_exit_during_training_is_never_a_success(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from yolo_det.commands import train as train_command

    def exits(*args: Any, **kwargs: Any) -> Any:
        raise SystemExit(0)  # as a user's block calling sys.exit(0) in forward() would

    monkeypatch.setattr(train_command, "train", exits)
    assert main(["train", "epochs=1"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "sys.exit(0) was called during the run" in err
