"""The record and the resume state tell the truth at every moment: a record from the first second, rewritten at
each checkpoint; a (checkpoint, resume state) pair that is always consistent, whatever interrupts the run."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from helpers import ROOT, small_train_tokens
from yolo_det.cli import main
from yolo_det.core.record import RECORD_NAME, checkpoint_digest
from yolo_det.core.resume import load_state, previous_state_path, read_checkpoint, state_path
from yolo_det.core.testpoints import hooked
from yolo_det.tools.prepare import prepare

pytestmark = pytest.mark.slow

TINY = small_train_tokens(epochs=None, imgsz=32, batch=8, nbs=8, fraction=0.25, val=False)


def _train(tokens: list[str], *, hook: Any = None, on_model_save: Any = None) -> Any:
    """Train as ``yolo-det train --profile repro TOKENS`` does, with a test point hook and a user callback."""
    from ultralytics import YOLO

    from yolo_det.analysis.models import model_names
    from yolo_det.integrations.ultralytics import attach

    profile, args = prepare("repro", tokens)
    args = dict(args)
    with model_names():
        model = YOLO(args.pop("model"))
        attach(model, profile)
        if on_model_save is not None:
            model.add_callback("on_model_save", on_model_save)
        with hooked(hook or (lambda point: None)):
            return model.train(**args)


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], str, Path]:
    root = tmp_path_factory.mktemp("straight")
    common = [*TINY, "epochs=3", f"project={root}"]
    _train([*common, "name=s"])
    return common, checkpoint_digest(root / "s" / "weights" / "last.pt"), root / "s"


def _at_second_save(point: str) -> Any:
    saves = {"n": 0}

    def hook(reached: str) -> None:
        if reached == "resume-state-written":
            saves["n"] += 1
        if reached == point and saves["n"] == 2:
            raise KeyboardInterrupt

    return hook


def _user_callback_interrupts(trainer: Any) -> None:
    if trainer.epoch == 1:
        raise KeyboardInterrupt


@pytest.mark.parametrize("where", ["resume-state-written", "checkpoint-written", "user on_model_save"])
def test_an_interruption_around_the_checkpoint_leaves_a_consistent_pair(
    where: str, straight: tuple[list[str], str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    common, digest, twin = straight
    tokens = [*[t for t in common if not t.startswith("project=")], f"project={tmp_path}", "name=r"]
    with pytest.raises(KeyboardInterrupt):
        if where.startswith("user"):
            _train(tokens, on_model_save=_user_callback_interrupts)
        else:
            _train(tokens, hook=_at_second_save(where))
    last = tmp_path / "r" / "weights" / "last.pt"
    epoch = read_checkpoint(last).epoch
    assert epoch == (0 if where == "resume-state-written" else 1)
    states = [load_state(p)["epoch"] for p in (state_path(last), previous_state_path(last)) if p.is_file()]
    assert epoch in states  # the state matching the checkpoint on disk is there
    record = json.loads((tmp_path / "r" / RECORD_NAME).read_text())
    assert record["status"] == "interrupted"
    assert record["epochs_completed"] == epoch + 1
    assert checkpoint_digest(last) != digest  # the resumed part has weights to change

    assert main(["train", "--profile", "repro", f"resume={last}"]) == 0
    out = capsys.readouterr()
    assert "no resume state" not in out.err
    assert checkpoint_digest(last) == digest, "the resumed run ends bit for bit as the uninterrupted one"
    resumed = json.loads((tmp_path / "r" / RECORD_NAME).read_text())
    assert resumed["resume"]["bitwise_expected"] is True
    assert resumed["epochs_completed"] == 3
    assert [s["status"] for s in resumed["segments"]] == ["interrupted"]

    # diff knows the lineage: the resumed run and its uninterrupted twin are equivalent
    assert main(["diff", str(twin), str(tmp_path / "r")]) == 0
    verdict = capsys.readouterr().out.splitlines()[-1]
    assert verdict == (
        f"verdict: equivalent: run B resumed after epoch {epoch + 1}, and the weights are bitwise identical"
    )


_KILLED = """
import os, signal, sys
sys.path.insert(0, {tests!r})
from test_record_lifecycle import _train
def hook(point):
    if point == "record-updated":
        os.kill(os.getpid(), signal.SIGKILL)
_train({tokens!r}, hook=hook)
"""


def test_a_killed_run_in_a_reused_folder_never_leaves_the_previous_runs_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = [*TINY, f"project={tmp_path}", "name=f"]
    _train([*folder, "epochs=1", "seed=0"])
    record_a = json.loads((tmp_path / "f" / RECORD_NAME).read_text())
    assert record_a["status"] == "completed"
    shutil.copytree(tmp_path / "f", tmp_path / "a-copy")

    tokens = [*folder, "epochs=2", "seed=1"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-c", _KILLED.format(tests=str(ROOT / "tests"), tokens=tokens)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]

    record_b = json.loads((tmp_path / "f" / RECORD_NAME).read_text())
    assert record_b["status"] == "running"
    assert record_b["seeds"]["seed"] == 1
    assert record_b["epochs_completed"] == 1
    assert record_b["run"]["epochs"] == 2
    last = tmp_path / "f" / "weights" / "last.pt"
    assert read_checkpoint(last).epoch == 0
    files = {Path(f["file"]).name: f for f in record_b["weights"]["files"]}
    assert files["last.pt"]["written_by_this_run"]
    assert files["last.pt"]["sha256"] == checkpoint_digest(last)

    code = main(["diff", str(tmp_path / "a-copy"), str(tmp_path / "f")])
    out = capsys.readouterr().out
    assert code == 1
    assert "and are" not in out.splitlines()[-1]


_KILLED_AT_FINAL_CHECKPOINT = """
import os, signal, sys
sys.path.insert(0, {tests!r})
from test_record_lifecycle import _train
saves = [0]
def hook(point):
    if point == "checkpoint-written":
        saves[0] += 1
        if saves[0] == 3:  # the final epoch's checkpoint is on disk, the record not yet updated
            os.kill(os.getpid(), signal.SIGKILL)
_train({tokens!r}, hook=hook)
"""


def test_a_kill_after_the_final_checkpoint_lists_nothing_stale_and_says_finished(
    straight: tuple[list[str], str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    common, digest, _ = straight
    tokens = [*[t for t in common if not t.startswith("project=")], f"project={tmp_path}", "name=k"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-c", _KILLED_AT_FINAL_CHECKPOINT.format(tests=str(ROOT / "tests"), tokens=tokens)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    last = tmp_path / "k" / "weights" / "last.pt"
    assert read_checkpoint(last).epoch == 2  # the final epoch, optimizer kept: Ultralytics had not stripped it
    record = json.loads((tmp_path / "k" / RECORD_NAME).read_text())
    assert record["status"] == "running"
    for entry in record["weights"]["files"]:  # never a size or digest that is not the file on disk
        path = Path(entry["file"])
        if entry.get("bytes") is not None:
            assert entry["bytes"] == path.stat().st_size, entry
        if entry.get("sha256") is not None:
            assert entry["sha256"] == checkpoint_digest(path), entry
    assert any(e["sha256"] is None for e in record["weights"]["files"])  # the files being replaced, unlisted
    # the weights on disk are the uninterrupted run's final ones (control: the straight run's file differs
    # from this one as a file, it is stripped)
    assert last.read_bytes() != (straight[2] / "weights" / "last.pt").read_bytes()
    assert checkpoint_digest(last) == digest
    before = last.read_bytes()
    assert main(["train", "--profile", "repro", f"resume={last}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "finished training (all 3 epochs are in it), nothing to resume" in err
    assert last.read_bytes() == before  # nothing written


_KILLED_IN_FINAL_REWRITE = """
import os, signal, sys
sys.path.insert(0, {tests!r})
from test_record_lifecycle import _train
def hook(point):
    if point == "weights-file-saving":  # Ultralytics' strip_optimizer rewriting last.pt at the end of training
        os.kill(os.getpid(), signal.SIGKILL)
_train({tokens!r}, hook=hook)
"""


def test_a_kill_during_the_final_rewrite_of_last_pt_leaves_the_final_checkpoint(
    straight: tuple[list[str], str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    common, digest, twin = straight
    tokens = [*[t for t in common if not t.startswith("project=")], f"project={tmp_path}", "name=w"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-c", _KILLED_IN_FINAL_REWRITE.format(tests=str(ROOT / "tests"), tokens=tokens)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    last = tmp_path / "w" / "weights" / "last.pt"
    info = read_checkpoint(last)  # not cut short: the final checkpoint, as it was before the rewrite
    assert (info.epoch, info.has_optimizer) == (2, True)
    assert checkpoint_digest(last) == digest  # the uninterrupted run's final weights
    assert last.read_bytes() != (twin / "weights" / "last.pt").read_bytes()  # control: the twin's was stripped
    record = json.loads((tmp_path / "w" / RECORD_NAME).read_text())
    for entry in record["weights"]["files"]:
        path = Path(entry["file"])
        assert entry.get("bytes") in (None, path.stat().st_size), entry
        assert entry.get("sha256") in (None, checkpoint_digest(path)), entry
    assert main(["train", "--profile", "repro", f"resume={last}"]) == 2
    assert "nothing to resume" in capsys.readouterr().err


def _no_space_at(point: str, *, after_checkpoints: int, nth: int = 1) -> Any:
    """A hook raising a full disk's ``OSError(ENOSPC)`` the ``nth`` time ``point`` is reached once
    ``after_checkpoints`` checkpoints are written, once (the disk has room again afterwards)."""
    seen = {"checkpoints": 0, "reached": 0}

    def hook(reached: str) -> None:
        if reached == "checkpoint-written":
            seen["checkpoints"] += 1
        if reached == point and seen["checkpoints"] == after_checkpoints:
            seen["reached"] += 1
            if seen["reached"] == nth:
                raise OSError(errno.ENOSPC, "No space left on device")

    return hook


def _files_true(record: dict[str, Any]) -> None:
    for entry in record["weights"]["files"]:  # never a size or digest that is not the file on disk
        path = Path(entry["file"])
        assert entry.get("bytes") in (None, path.stat().st_size), entry
        assert entry.get("sha256") in (None, checkpoint_digest(path)), entry


@pytest.mark.parametrize("nth", [1, 2], ids=["record-after-checkpoint", "record-before-checkpoint"])
def test_a_full_disk_at_the_record_write_fails_naming_it_and_resumes_bitwise(
    nth: int, straight: tuple[list[str], str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    common, digest, _ = straight
    tokens = [*[t for t in common if not t.startswith("project=")], f"project={tmp_path}", "name=d"]
    with pytest.raises(OSError, match="No space left on device"):
        _train(tokens, hook=_no_space_at("record-writing", after_checkpoints=1, nth=nth))
    last = tmp_path / "d" / "weights" / "last.pt"
    assert read_checkpoint(last).epoch == 0  # the second checkpoint was never written
    record = json.loads((tmp_path / "d" / RECORD_NAME).read_text())
    assert record["status"] == "failed"
    assert record["error"]["type"] == "OSError"
    assert "No space left on device" in record["error"]["message"]
    _files_true(record)
    assert checkpoint_digest(last) != digest  # control: one epoch fewer differs

    assert main(["train", "--profile", "repro", f"resume={last}"]) == 0
    capsys.readouterr()
    assert checkpoint_digest(last) == digest, "the resumed run ends bit for bit as the uninterrupted one"
    resumed = json.loads((tmp_path / "d" / RECORD_NAME).read_text())
    assert resumed["resume"]["bitwise_expected"] is True
    part = resumed["segments"][0]
    assert part["status"] == "failed"  # not "killed (SIGKILL, power loss)"
    assert "No space left on device" in json.dumps(part)


def test_a_full_disk_at_the_final_weights_write_keeps_the_final_checkpoint_and_says_finished(
    straight: tuple[list[str], str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    common, digest, twin = straight
    tokens = [*[t for t in common if not t.startswith("project=")], f"project={tmp_path}", "name=s"]
    with pytest.raises(OSError, match="No space left on device"):
        _train(tokens, hook=_no_space_at("weights-file-saving", after_checkpoints=3))
    last = tmp_path / "s" / "weights" / "last.pt"
    info = read_checkpoint(last)
    assert (info.epoch, info.has_optimizer) == (2, True)  # the final checkpoint, not a file cut short
    assert checkpoint_digest(last) == digest
    assert last.read_bytes() != (twin / "weights" / "last.pt").read_bytes()  # control: the twin's was stripped
    assert not list(last.parent.glob("*.tmp*"))
    record = json.loads((tmp_path / "s" / RECORD_NAME).read_text())
    assert record["status"] == "failed"
    assert "No space left on device" in record["error"]["message"]
    _files_true(record)
    before = last.read_bytes()
    assert main(["train", "--profile", "repro", f"resume={last}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "nothing to resume" in err
    assert last.read_bytes() == before


def test_a_full_disk_at_a_checkpoints_weights_write_keeps_the_previous_one_and_resumes_bitwise(
    straight: tuple[list[str], str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ultralytics writes last.pt in place; under yolo-det the write is atomic, so a full disk half way through
    the second checkpoint leaves the first one (and the state matching it), not a file cut short."""
    common, digest, _ = straight
    tokens = [*[t for t in common if not t.startswith("project=")], f"project={tmp_path}", "name=c"]
    with pytest.raises(OSError, match="No space left on device"):
        _train(tokens, hook=_no_space_at("weights-file-writing", after_checkpoints=1))
    last = tmp_path / "c" / "weights" / "last.pt"
    assert read_checkpoint(last).epoch == 0  # the first checkpoint, whole
    assert not [p.name for p in last.parent.iterdir() if p.name.startswith(".") or "incomplete" in p.name]
    record = json.loads((tmp_path / "c" / RECORD_NAME).read_text())
    assert record["status"] == "failed"
    assert "No space left on device" in record["error"]["message"]
    _files_true(record)
    assert checkpoint_digest(last) != digest  # control: one epoch fewer differs

    assert main(["train", "--profile", "repro", f"resume={last}"]) == 0
    out = capsys.readouterr()
    assert "no resume state" not in out.err
    assert checkpoint_digest(last) == digest
    assert json.loads((tmp_path / "c" / RECORD_NAME).read_text())["segments"][0]["status"] == "failed"
