"""A resumed run writes only into the folder that holds its checkpoint: copied, moved and renamed run folders,
a completed run's folder, and a save_dir= elsewhere. Every file of the other run is hashed before and after."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from helpers import small_train_tokens, train_stopped_after
from yolo_det.cli import main
from yolo_det.core.errors import ConfigError
from yolo_det.core.record import RECORD_NAME
from yolo_det.core.resume import read_checkpoint, resume_folder

TINY = small_train_tokens(epochs=2, imgsz=32, batch=8, nbs=8, fraction=0.25, val=False)


def train_interrupted(tokens: list[str], after: int = 1) -> Path:
    """Train as ``yolo-det train --profile repro TOKENS`` does, stopping cleanly once epoch ``after`` is saved."""
    return train_stopped_after(tokens, after)


def hashes(folder: Path) -> dict[str, str]:
    """SHA-256 of every file under ``folder`` (relative path -> digest)."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run folder interrupted after epoch 1 of 2 (its last.pt resumable)."""
    root = tmp_path_factory.mktemp("runs")
    last = train_interrupted([*TINY, f"project={root}", "name=a"])
    assert read_checkpoint(last).resumable
    return last.parent.parent


def _resume(ckpt: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str]:
    code = main(["train", "--profile", "repro", f"resume={ckpt}", *extra])
    return code, capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("how", ["copy", "move", "rename"])
def test_resuming_a_copied_moved_or_renamed_run_writes_only_into_its_own_folder(
    how: str, interrupted: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    original = tmp_path / "runs" / "a"
    shutil.copytree(interrupted, original)
    shutil.copytree(interrupted, tmp_path / "witness")  # the stored save_dir names the fixture's folder
    witness = hashes(interrupted)
    if how == "copy":
        target = tmp_path / "elsewhere" / "a-copy"
        shutil.copytree(original, target)
    elif how == "move":
        target = tmp_path / "moved" / "a"
        target.parent.mkdir()
        shutil.move(str(original), str(target))
    else:
        target = original.with_name("b")
        original.rename(target)
    before_original = hashes(original) if original.exists() else None
    before_target = hashes(target)
    assert read_checkpoint(target / "weights" / "last.pt").train_args["save_dir"] == str(interrupted)

    code, err = _resume(target / "weights" / "last.pt", capsys)

    assert code == 0, err
    assert hashes(interrupted) == witness  # the folder stored in the checkpoint: not one byte changed
    if before_original is not None:
        assert hashes(original) == before_original
    else:
        assert not original.exists()  # a moved run is not recreated where it was
    after = hashes(target)
    assert after["weights/last.pt"] != before_target["weights/last.pt"]  # the resumed run wrote here
    record = json.loads((target / RECORD_NAME).read_text())
    assert record["status"] == "completed"
    assert record["run"]["save_dir"] == str(target)
    assert read_checkpoint(target / "weights" / "last.pt").epoch == -1  # finished and stripped, in place


@pytest.mark.slow
def test_a_completed_runs_files_never_change_by_resuming(
    interrupted: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A completed run's folder holding a resumable checkpoint (an epochN.pt, a file put there) is refused."""
    done = tmp_path / "done"
    shutil.copytree(interrupted, done)
    code, err = _resume(done / "weights" / "last.pt", capsys)
    assert code == 0, err
    assert json.loads((done / RECORD_NAME).read_text())["status"] == "completed"
    shutil.copy(interrupted / "weights" / "last.pt", done / "weights" / "epoch0.pt")
    before = hashes(done)
    code, err = _resume(done / "weights" / "epoch0.pt", capsys)
    assert code == 2
    assert err.count("\n") == 1
    assert f"'{done}' holds a completed run" in err
    assert hashes(done) == before


def test_resume_into_another_folder_is_refused_in_one_line_naming_both(tmp_path: Path) -> None:
    import torch

    run = tmp_path / "run"
    (run / "weights").mkdir(parents=True)
    ckpt = run / "weights" / "last.pt"
    torch.save({"epoch": 1, "optimizer": {"state": {}}, "train_args": {"save_dir": str(tmp_path / "old")}}, ckpt)
    assert resume_folder(ckpt) == run
    with pytest.raises(ConfigError) as e:
        resume_folder(ckpt, requested=tmp_path / "other")
    assert str(tmp_path / "other") in str(e.value)
    assert f"('{run}')" in str(e.value)
    assert "\n" not in str(e.value)
    loose = tmp_path / "last.pt"
    shutil.copy(ckpt, loose)
    with pytest.raises(ConfigError, match="not in a run's weights/ folder"):
        resume_folder(loose, stored=str(tmp_path / "old"))


def test_the_cli_refuses_a_checkpoint_outside_a_weights_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    ckpt = tmp_path / "last.pt"
    torch.save(
        {
            "epoch": 1,
            "optimizer": {"state": {}},
            "updates": 3,
            "train_args": {"model": "yolov8n.yaml", "data": "x.yaml", "save_dir": str(tmp_path / "a")},
        },
        ckpt,
    )
    code, err = _resume(ckpt, capsys)
    assert code == 2
    assert err.count("\n") == 1
    assert "not in a run's weights/ folder" in err
    assert str(tmp_path / "a") in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]


def test_overrides_and_a_profile_change_on_resume_are_reasons_not_to_expect_bitwise(tmp_path: Path) -> None:
    from types import SimpleNamespace

    import torch

    from yolo_det.core.profiles import load_profile
    from yolo_det.integrations.ultralytics.lineage import changed_overrides
    from yolo_det.integrations.ultralytics.resume import UltralyticsResume

    ckpt = tmp_path / "run" / "weights" / "last.pt"
    ckpt.parent.mkdir(parents=True)
    torch.save(
        {
            "epoch": 1,
            "optimizer": {"state": {}},
            "train_args": {"imgsz": 64, "batch": 16, "close_mosaic": 10, "plots": True},
        },
        ckpt,
    )
    trainer = SimpleNamespace(args=SimpleNamespace(imgsz=96, batch=4, close_mosaic=10, plots=False))
    assert changed_overrides(ckpt, trainer) == {"imgsz": [64, 96], "batch": [16, 4]}  # plots= is output only
    resume = UltralyticsResume(0)
    resume.info = {"state_found": True, "overrides": {"imgsz": [64, 96]}}
    repro = load_profile("repro")
    previous = {"profile": load_profile("fast").to_dict()}
    reasons = resume._reasons(repro, previous)
    assert reasons == [
        "the earlier part trained under the profile 'fast', this part under 'repro'",
        "imgsz=96 differs from the checkpoint's imgsz=64",
    ]
    resume.info = {"state_found": True, "overrides": {}}
    assert resume._reasons(repro, {"profile": repro.to_dict()}) == []


def test_a_part_killed_before_its_record_caught_up_is_a_killed_segment_with_its_checkpointed_epochs() -> None:
    from yolo_det.core.resume.lineage import segments_of

    earlier = {"status": "interrupted", "epochs_completed": 1}
    killed = {"status": "running", "epochs_completed": 1, "segments": [earlier], "profile": {"name": "repro"}}
    parts = segments_of(killed, resumed_at=2)  # killed after epoch 2's checkpoint, before its record update
    assert [p["status"] for p in parts] == ["interrupted", "killed"]
    assert parts[1]["epochs_completed"] == 2
    assert "killed" in parts[1]["ending"]
    assert "full disk" in parts[1]["ending"]  # a run whose last record write failed for lack of space is one too
    assert "segments" not in parts[1]
    assert segments_of({"status": "interrupted", "epochs_completed": 2}, resumed_at=2)[0]["status"] == "interrupted"


@pytest.mark.parametrize("form", ["resume={run}", "resume={run}/weights", "resume=True model={run}"])
def test_resume_of_a_folder_names_the_checkpoint_to_pass(form: str, tmp_path: Path, capsys) -> None:
    run = tmp_path / "train"
    (run / "weights").mkdir(parents=True)
    (run / "weights" / "last.pt").write_bytes(b"not read: the folder is refused first")
    before = hashes(tmp_path)
    code = main(["train", *form.format(run=run).split()])
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert "is a folder, not a checkpoint" in err
    assert str(run / "weights" / "last.pt") in err
    assert "does not exist" not in err
    assert hashes(tmp_path) == before


def test_resume_of_a_folder_without_weights_says_what_to_pass(tmp_path: Path, capsys) -> None:
    code = main(["train", f"resume={tmp_path}"])
    err = capsys.readouterr().err
    assert code == 2
    assert "is a folder, not a checkpoint, and holds no weights/last.pt" in err
