"""``yolo-det reproduce``: a recorded run trained again here, compared epoch by epoch, with one verdict.

One real run (2 epochs of the demo data at 64 px, its first step op-traced, made in its own folder and copied
elsewhere, as a received run would be) is reproduced: the same weights, traced the same way; the first epoch only,
without its trace; a seed edited into a copy of its record (parted at epoch 1, naming the seed and the first op); a
changed, added or removed data file (that file named). Hostile records and checkpoints are refused in one line before
anything trains.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from helpers import DEMO, small_train_tokens
from yolo_det.cli import main
from yolo_det.commands.reproduce import rebuilt_tokens, recorded_epochs
from yolo_det.core.profiles import load_profile
from yolo_det.core.record import RECORD_NAME
from yolo_det.tools.trace import trace_path

#: The recorded run: 2 epochs, validated once at the end (the comparison needs no per-epoch validation).
RUN_TOKENS = small_train_tokens(epochs=2, val=False, exist_ok=None)


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["reproduce", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _verdict(out: str) -> str:
    return next(line for line in out.splitlines() if line.startswith("verdict: "))


@pytest.fixture(scope="module")
def received(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 2-epoch run, its first step traced, made in one folder, then moved to another (a run received
    from elsewhere)."""
    made = tmp_path_factory.mktemp("made")
    assert main(["train", "--profile", "repro", "--trace-ops", "1", *RUN_TOKENS, f"project={made}", "name=run"]) == 0
    elsewhere = tmp_path_factory.mktemp("received") / "run"
    shutil.copytree(made / "run", elsewhere)
    shutil.rmtree(made)
    return elsewhere


def _record(run: Path) -> dict[str, Any]:
    return json.loads((run / RECORD_NAME).read_text(encoding="utf-8"))


def _edited(run: Path, folder: Path, edit: Any) -> Path:
    """A copy of ``run``'s record in ``folder``, changed by ``edit(record)``."""
    record = _record(run)
    edit(record)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / RECORD_NAME).write_text(json.dumps(record), encoding="utf-8")
    return folder


@pytest.mark.slow
def test_a_received_run_reproduces_with_the_same_weights_epoch_by_epoch(
    received: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = {p: p.read_bytes() for p in received.rglob("*") if p.is_file()}
    epochs = recorded_epochs(_record(received))
    assert sorted(epochs) == [1, 2]
    assert epochs[1] != epochs[2]
    code, out, _ = _run(capsys, str(received), "--project", str(tmp_path))
    assert code == 0, out
    lines = out.splitlines()
    assert lines[1].startswith("machine: will agree")  # the prediction comes first
    assert any(line.startswith("data: the same") for line in lines)
    assert f"epoch 1: weights {epochs[1][:16]} (same)" in lines
    assert f"epoch 2: weights {epochs[2][:16]} (same)" in lines
    assert _verdict(out) == "verdict: same weights (2 epoch(s) compared: 1-2)"
    assert "first op" not in out  # nothing parted: no op named
    new = _record(tmp_path / "run")  # a new folder, named as the run
    assert recorded_epochs(new) == epochs
    assert new["op_trace"]["asked"] == _record(received)["op_trace"]["asked"] == "1"  # traced the same way
    assert trace_path(tmp_path / "run").is_file()
    assert {p: p.read_bytes() for p in received.rglob("*") if p.is_file()} == before  # the source is untouched


@pytest.mark.slow
def test_epochs_1_of_a_checkpoint_checks_the_first_epoch_only(
    received: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy = tmp_path / "copy"  # without its op trace: reproduced untraced, and said so
    shutil.copytree(received, copy, ignore=shutil.ignore_patterns(trace_path(".").name))
    last = str(copy / "weights" / "last.pt")  # a checkpoint beside its record: the run up to its epoch, 2
    code, out, _ = _run(capsys, last, "--epochs", "1", "--project", str(tmp_path), "--name", "first")
    assert code == 0, out
    assert _verdict(out) == "verdict: same weights (1 epoch(s) compared: 1-1)"
    assert f"note: the run was traced (--trace-ops); its op trace is not beside {copy / RECORD_NAME}" in out
    assert not trace_path(tmp_path / "first").exists()
    new = _record(tmp_path / "first")
    assert [e["epoch"] for e in new["epoch_weights"]] == [1]  # stopped after epoch 1, on the run's 2-epoch schedule
    assert new["status"] == "interrupted"
    assert new["ultralytics_args"]["epochs"] == 2


@pytest.mark.slow
def test_a_changed_seed_parts_at_epoch_1_and_is_named_after_the_machine_prediction(
    received: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    threads = _record(received)["environment"]["host"]["intra_op_threads"]

    def seed_1(record: dict[str, Any]) -> None:
        record["ultralytics_args"]["seed"] = 1  # the command says seed 1; the run's seeds and digests are seed 0's
        record["environment"]["host"]["intra_op_threads"] = threads + 4  # and it trained on more threads

    source = _edited(received, tmp_path / "edited", seed_1)
    shutil.copy(trace_path(received), trace_path(source))  # its op trace beside it
    png = tmp_path / "curves.png"
    code, out, err = _run(capsys, str(source), "--project", str(tmp_path / "out"), "--png", str(png))
    assert code == 1, out
    lines = out.splitlines()
    assert lines[1].startswith("machine: will differ")  # said before training
    assert f"intra-op threads: recorded {threads + 4} | here {threads}" in lines[2]
    assert "epoch 1: weights" in out
    assert "(DIFFERENT)" in out
    assert _verdict(out).startswith("verdict: parted at epoch 1: seed (0 vs 1)")
    assert _verdict(out).endswith("; first op: model.0.conv.weight (state, step 1)")  # the seed made other weights
    assert "epoch 2:" not in out  # it stops at the first epoch that parts
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # the new run's curves, epoch 1 marked
    assert "run A:" in err  # the edited copy holds no results.csv
    assert "only the other run's curves are drawn" in err


@pytest.mark.slow
@pytest.mark.parametrize("edit", ["changed", "added", "removed"])
def test_a_changed_added_or_removed_data_file_is_named(
    received: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: str
) -> None:
    data = tmp_path / "data"
    shutil.copytree(DEMO, data / "demo", ignore=shutil.ignore_patterns("*.cache"))
    shutil.copy(DEMO.parent / "demo.yaml", data / "demo.yaml")
    label = sorted((data / "demo" / "labels" / "train").glob("*.txt"))[5]
    name = f"demo/labels/train/{label.name}"
    if edit == "changed":
        label.write_text(label.read_text(encoding="utf-8") + "0 0.5 0.5 0.9 0.9\n", encoding="utf-8")
    elif edit == "removed":
        label.unlink()  # its image trains as a background
    else:
        shutil.copy(data / "demo" / "images" / "val" / "val_000.png", data / "demo" / "images" / "train" / "a.png")
        name = "demo/images/train/a.png"
    code, out, _ = _run(capsys, str(received), "--data", str(data / "demo.yaml"), "--project", str(tmp_path / "o"))
    assert code == 1, out
    line = next(line for line in out.splitlines() if line.startswith("data: "))
    assert line.startswith(f"data: DIFFERENT: first file that differs: {name} (")
    assert ("(absent vs " in line) == (edit == "added")
    assert (" vs absent)" in line) == (edit == "removed")
    assert f": data: first file that differs: {name} (" in _verdict(out)
    assert _verdict(out).endswith("; first op: batch (data, step 1)")  # the traced step read other data


# -- refused before anything trains: a synthetic record ------------------------------------------------------------


def _synthetic(folder: Path, **changes: Any) -> Path:
    """A record of a 2-epoch demo run as yolo-det writes it, never trained (enough for what is refused first)."""
    from yolo_det.tools.demo import demo_data_yaml

    record: dict[str, Any] = {
        "schema": 3,
        "status": "completed",
        "framework": "ultralytics",
        "profile": load_profile("repro").to_dict(),
        "environment": {},
        "seeds": {"seed": 0, "world_size": 1},
        "ultralytics_args": {"model": "yolov8n.yaml", "data": str(demo_data_yaml()), "epochs": 2, "imgsz": 64},
        "weights": {"sha256": "a" * 64},
        "epochs_completed": 2,
        "epoch_weights": [{"epoch": 1, "sha256": "b" * 64}, {"epoch": 2, "sha256": "a" * 64}],
        **changes,
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / RECORD_NAME).write_text(json.dumps(record), encoding="utf-8")
    return folder


def _refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code, out, err = _run(capsys, *argv)
    assert code == 2, out + err
    assert "epoch 1" not in out  # nothing trained
    lines = err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("yolo-det: error: ")
    return lines[0]


def test_a_profile_file_the_record_names_is_never_opened(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profile = load_profile("repro").to_dict()
    local = tmp_path / "mine.yaml"  # a file here; the record's word is not enough to read it
    for name, source in ((str(local), str(local)), (str(local), f"builtin:{local}")):
        run = _synthetic(tmp_path / "run", profile={**profile, "name": name, "source": source})
        line = _refused(capsys, str(run), "--project", str(tmp_path / "out"))
        assert "pass --profile FILE" in line


def test_a_hostile_checkpoint_as_source_or_in_the_arguments_is_refused_unrun(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hostile.make_corpus import build

    marker = tmp_path / "ran"
    hostile = next(iter(build(tmp_path / "corpus", marker).values()))
    run = _synthetic(tmp_path / "run")
    (run / "weights").mkdir()
    shutil.copy(hostile, run / "weights" / "last.pt")
    _refused(capsys, str(run / "weights" / "last.pt"), "--project", str(tmp_path / "out"))
    args = {"model": str(hostile), "data": "x.yaml", "epochs": 2}
    _refused(capsys, str(_synthetic(tmp_path / "run2", ultralytics_args=args)), "--project", str(tmp_path / "out"))
    assert not marker.exists()


def test_what_a_record_cannot_make_it_do(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _synthetic(tmp_path / "run")
    assert "inside the run" in _refused(capsys, str(run), "--project", str(run))  # never into the source's folder
    args = {"model": "yolov8n.yaml", "data": "/etc/passwd", "epochs": 2}
    assert "data=" in _refused(capsys, str(_synthetic(tmp_path / "r2", ultralytics_args=args)), "--project", "x")
    needs = _synthetic(tmp_path / "r3", imports=[{"name": "theirpkg.blocks"}])
    assert "--import theirpkg.blocks" in _refused(capsys, str(needs), "--project", str(tmp_path / "out"))
    assert "--epochs" in _refused(capsys, str(run), "--epochs", "3", "--project", str(tmp_path / "out"))
    traced = _synthetic(tmp_path / "r4", op_trace={"asked": "every step\x1b[2J", "steps_run": 9, "traced": []})
    assert "--trace-ops: cannot read" in _refused(capsys, str(traced), "--project", str(tmp_path / "out"))


def test_a_record_without_weights_digests_compares_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _synthetic(tmp_path / "run", status="running", weights={}, epochs_completed=0, epoch_weights=[])
    code, out, _ = _run(capsys, str(run), "--project", str(tmp_path / "out"))
    assert code == 3
    assert _verdict(out).startswith("verdict: nothing compared")
    assert not (tmp_path / "out").exists()


def test_the_command_is_rebuilt_as_asked_never_where_the_record_wrote() -> None:
    record = {
        "ultralytics_args": {
            "model": "yolov8n.yaml",
            "epochs": 2,
            "optimizer": "AdamW",
            "lr0": 0.001429,
            "seed": 3,
            "project": "/",
            "save_dir": "/etc",
            "name": "x",
            "deterministic": True,
            "a_newer_argument": 1,
        },
        "adjusted_args": {"optimizer": {"asked": "auto", "used": "AdamW"}, "lr0": {"asked": 0.01, "used": 0.001429}},
    }
    tokens, unknown = rebuilt_tokens(record, data="here.yaml", model=None)
    assert tokens == ['data="here.yaml"', "epochs=2", 'model="yolov8n.yaml"', "seed=3"]  # auto again, defaults left
    assert unknown == ["a_newer_argument"]


def test_a_resumed_run_never_opens_a_profile_file_its_record_names(tmp_path: Path) -> None:
    from yolo_det.commands.train import _resumed_profile

    checkpoint = tmp_path / "run" / "weights" / "last.pt"
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_bytes(b"")
    local = tmp_path / "mine.yaml"
    local.write_text(load_profile("fast").to_yaml(), encoding="utf-8")  # a valid profile file: loadable if opened
    for source, found in ((f"builtin:{local}", None), ("builtin:balanced", "balanced")):
        (checkpoint.parent.parent / RECORD_NAME).write_text(json.dumps({"profile": {"source": source}}), "utf-8")
        profile = _resumed_profile({"resume": True, "model": str(checkpoint)})
        assert (profile.name if profile is not None else None) == found


@pytest.mark.slow
def test_a_thread_count_is_named_before_the_reviewers_own_folder_and_packages(
    received: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A reviewer's folder is not the author's git tree and has other packages installed; the threads, which the
    profile leaves to the machine, are what changes the bits: named first, and the verdict is the machine's."""
    from yolo_det.commands.reproduce import _verdict as verdict

    record = _record(received)
    here = json.loads(json.dumps(record))
    here["environment"]["host"]["intra_op_threads"] += 3
    here["project"] = {"commit": "f" * 40, "branch": "review", "dirty": False}
    here["packages"] = {**(record.get("packages") or {}), "someones-tool": "0.1"}
    new = tmp_path / "here"
    new.mkdir()
    (new / RECORD_NAME).write_text(json.dumps(here), encoding="utf-8")
    epochs = recorded_epochs(record)
    assert verdict(record, received, new, {1: "0" * 64}, epochs) == 1
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("verdict: cannot be the same here: intra-op threads"), line
    assert "project commit" in line  # still named, after the machine's cause
    assert line.index("intra-op threads") < line.index("project commit")
