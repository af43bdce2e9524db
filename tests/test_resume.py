"""Resume: an Ultralytics run interrupted after an epoch and resumed through ``yolo-det train resume=...`` ends
with the uninterrupted run's weights, bit for bit; the command line resumes with the checkpoint's own
arguments; the record tells the story; ``verify --resume-at`` proves it or names the divergence.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from helpers import train_stopped_after
from yolo_det.cli import main
from yolo_det.core.errors import ConfigError, ModelError
from yolo_det.core.record import RECORD_NAME, checkpoint_digest
from yolo_det.core.resume import get_rng_state, load_state, read_checkpoint, set_rng_state, state_files, state_path
from yolo_det.tools.prepare import prepare

REPO = Path(__file__).resolve().parent.parent
MODELS = REPO / "data" / "models"


def _train_interrupted(tokens: list[str], after: int) -> Path:
    """Train as ``yolo-det train --profile repro TOKENS`` does, stopping cleanly once epoch ``after`` is saved."""
    return train_stopped_after(tokens, after)


def _cli(tokens: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["train", "--profile", "repro", *tokens])
    out = capsys.readouterr()
    return code, out.out, out.err


CASES = {
    # a detection model with a swapped layer, resumed after epoch 2 (the state of epoch 1 went with its checkpoint);
    # yolov8n itself resumes in the next case, and after epoch 1 in test_verify_resume_at
    "cbam-max-2of4": ([f"model={MODELS / 'cbam-max.yaml'}", "epochs=4"], 2),
    # close_mosaic=1 closes mosaic in epoch 3, inside the resumed part; nbs=32 without warmup accumulates two
    # batches per step, so the gradients of epoch 1's last batch are applied in epoch 2's first step.
    "detect-1of3-close-mosaic": (["epochs=3", "close_mosaic=1", "nbs=32", "warmup_epochs=0"], 1),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_interrupted_and_resumed_through_the_cli_ends_bit_for_bit(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    extra, after = CASES[case]
    common = [*extra, "imgsz=64", "batch=16", f"project={tmp_path}", "plots=false", "exist_ok=true"]
    code, _, _ = _cli([*common, "name=straight"], capsys)
    assert code == 0
    straight = checkpoint_digest(tmp_path / "straight" / "weights" / "last.pt")
    straight_record = json.loads((tmp_path / "straight" / RECORD_NAME).read_text())
    assert straight_record["resume_states_written"] >= 2  # states were written, and the finished run keeps none
    assert state_files(tmp_path / "straight" / "weights" / "last.pt") == []

    last = _train_interrupted([*common, "name=part"], after)
    state = state_path(last)
    assert state_files(last) == [state]  # the one matching last.pt; the previous one went with its checkpoint
    assert load_state(state)["epoch"] == after - 1
    first = json.loads((tmp_path / "part" / RECORD_NAME).read_text())
    assert first["status"] == "interrupted"
    assert first["epochs_completed"] == after
    assert read_checkpoint(last).resumable

    code, out, err = _cli([f"resume={last}"], capsys)
    assert code == 0
    assert f"weights digest: {straight}" in out
    assert checkpoint_digest(last) == straight
    assert state_files(last) == []
    record = json.loads((tmp_path / "part" / RECORD_NAME).read_text())
    assert record["status"] == "completed"
    assert record["weights"]["ema_fp32_sha256"] == straight_record["weights"]["ema_fp32_sha256"]
    resume = record["resume"]
    assert resume["resumed"]
    assert resume["state_found"]
    assert resume["bitwise_expected"]
    assert resume["epoch"] == after
    assert resume["checkpoint"] == str(last)
    assert len(resume["checkpoint_sha256"]) == 64
    assert len(resume["checkpoint_weights_sha256"]) == 64
    assert [s["status"] for s in record["segments"]] == ["interrupted"]
    assert record["segments"][0]["epochs_completed"] == after
    assert record["run"]["data"] == straight_record["run"]["data"]
    if case.startswith("cbam"):
        assert record["swaps"], "the CBAM block's max pooling is swapped under repro"


@pytest.mark.slow
def test_resume_on_the_users_dataset_trains_on_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without data= on the resume command line, the run continues on the checkpoint's dataset (2 classes),
    never on the demo data (3 classes)."""
    demo = REPO / "data" / "demo"
    data = tmp_path / "shapes2"
    for split, count in (("train", 8), ("val", 4)):
        (data / "images" / split).mkdir(parents=True)
        (data / "labels" / split).mkdir(parents=True)
        for image in sorted((demo / "images" / split).iterdir())[:count]:
            shutil.copy(image, data / "images" / split / image.name)
            label = demo / "labels" / split / (image.stem + ".txt")
            lines = [ln.split() for ln in label.read_text().splitlines() if ln.strip()]
            (data / "labels" / split / label.name).write_text(
                "".join(" ".join([str(min(int(p[0]), 1)), *p[1:]]) + "\n" for p in lines)
            )
    data_yaml = tmp_path / "shapes2.yaml"
    data_yaml.write_text(
        yaml.safe_dump(
            {"path": str(data), "train": "images/train", "val": "images/val", "names": {0: "round", 1: "angular"}}
        )
    )
    common = [
        f"data={data_yaml}",
        "epochs=2",
        "imgsz=64",
        "batch=4",
        f"project={tmp_path}",
        "name=mine",
        "plots=false",
        "workers=0",
        "device=cpu",
    ]
    last = _train_interrupted(common, 1)
    profile, args = prepare("repro", [f"resume={last}"])
    assert "data" not in args
    assert "imgsz" not in args
    assert "batch" not in args
    code, _, _ = _cli([f"resume={last}"], capsys)
    assert code == 0
    record = json.loads((tmp_path / "mine" / RECORD_NAME).read_text())
    assert record["run"]["data"] == str(data_yaml)
    assert record["resume"]["state_found"]
    ckpt = torch.load(last, map_location="cpu", weights_only=False)
    assert ckpt["model"].nc == 2
    assert ckpt["train_args"]["data"] == str(data_yaml)


# ---------------------------------------------------------------------------------------------------------
# the command line, without training


def _fake_checkpoint(path: Path, *, epoch: int = 1, optimizer: bool = True, **train_args: Any) -> Path:
    torch.save(
        {
            "epoch": epoch,
            "optimizer": {"state": {}, "param_groups": []} if optimizer else None,
            "updates": 7,
            "train_args": {"model": "yolov8n.yaml", "data": "mine.yaml", "epochs": 4, "lr0": 0.01, **train_args},
        },
        path,
    )
    return path


def test_resume_keeps_the_checkpoints_arguments_and_lists_what_it_ignores(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "run" / "weights").mkdir(parents=True)
    ckpt = _fake_checkpoint(tmp_path / "run" / "weights" / "last.pt")
    _, args = prepare("repro", [f"resume={ckpt}", "lr0=0.5", "epochs=4", "batch=4", "device=cpu"])
    err = capsys.readouterr().err
    assert args == {
        "model": str(ckpt),
        "resume": str(ckpt),
        "lr0": 0.5,
        "epochs": 4,
        "batch": 4,
        "device": "cpu",
        "save_dir": str(tmp_path / "run"),
    }
    assert err.count("\n") == 1
    assert "resuming ignores lr0=0.5:" in err
    assert "batch" not in err
    assert "device" not in err
    _, args = prepare("repro", ["resume=true", f"model={ckpt}"])
    assert args == {"model": str(ckpt), "resume": True, "save_dir": str(tmp_path / "run")}
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    ("tokens", "message"),
    [
        (["resume=true"], "resume=True needs the checkpoint"),
        (["resume=missing.pt"], "does not exist"),
        (["resume=FINISHED"], "cannot be resumed: its training finished"),
    ],
)
def test_resume_errors_are_one_line_and_exit_2(
    tokens: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    finished = _fake_checkpoint(tmp_path / "finished.pt", epoch=-1, optimizer=False)
    tokens = [t.replace("FINISHED", str(finished)).replace("missing.pt", str(tmp_path / "missing.pt")) for t in tokens]
    assert main(["train", *tokens, f"project={tmp_path}"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err
    assert "\n" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["finished.pt"]  # nothing written


class _Evil:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, ("touch PWNED",))


def test_reading_a_checkpoint_runs_none_of_its_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "evil.pt"
    torch.save(
        {
            "epoch": 2,
            "optimizer": {"x": torch.ones(2)},
            "ema": _Evil(),
            "updates": 3,
            "train_args": {"data": "d.yaml", "save_dir": Path("runs/x")},
        },
        path,
    )
    with pytest.raises(ModelError, match=r"system, which is not on yolo-det's allow-list"):
        read_checkpoint(path)  # refused in one line, before anything it names is called
    assert not (tmp_path / "PWNED").exists()
    clean = tmp_path / "clean.pt"
    torch.save(
        {
            "epoch": 2,
            "optimizer": {"x": torch.ones(2)},
            "ema": None,
            "updates": 3,
            "train_args": {"data": "d.yaml", "save_dir": Path("runs/x")},
        },
        clean,
    )
    info = read_checkpoint(clean)
    assert info.epoch == 2
    assert info.updates == 3
    assert info.resumable
    assert info.train_args == {"data": "d.yaml", "save_dir": "runs/x"}
    with pytest.raises(ModelError, match="not a training checkpoint"):
        torch.save({"weights": torch.ones(1)}, tmp_path / "plain.pt")
        read_checkpoint(tmp_path / "plain.pt")


def test_rng_state_round_trip() -> None:
    import random

    import numpy as np

    state = get_rng_state()
    first = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    set_rng_state(state)
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == first


def test_state_files_never_match_ultralytics_latest_run_glob(tmp_path: Path) -> None:
    """``resume=True`` without a path resumes the newest ``last*.pt``: a state file must never be taken for it."""
    for rank in (0, 1):
        name = state_path(tmp_path / "weights" / "last.pt", rank).name
        assert not name.startswith("last")
        assert name.endswith(".pt")
    assert state_path(tmp_path / "last.pt", 1) != state_path(tmp_path / "last.pt", 0)


# ---------------------------------------------------------------------------------------------------------
# verify --resume-at


@pytest.mark.slow
def test_verify_resume_at(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    common = ["epochs=2", "imgsz=64", "plots=false"]
    # one model state, one digest: train and verify with the same arguments print the same (last.pt's EMA)
    assert main(["train", "--profile", "repro", *common, f"project={tmp_path}", "name=t"]) == 0
    digest = capsys.readouterr().out.split("weights digest: ")[1].split()[0]
    assert digest == checkpoint_digest(tmp_path / "t" / "weights" / "last.pt")
    assert main(["verify", "--profile", "repro", "--resume-at", "1", *common, f"project={tmp_path / 'a'}"]) == 0
    out = capsys.readouterr().out
    assert out.count(f"weights digest {digest}") == 2, out  # the straight run and the resumed one
    assert "bitwise identical" in out
    assert "interrupted after epoch 1 and resumed" in out
    assert "weights moved from the initial ones" in out  # the equality rests on weights that trained

    code = main(
        [
            "verify",
            "--profile",
            "repro",
            "--resume-at",
            "1",
            "--drop-resume-state",
            "--json",
            *common,
            f"project={tmp_path / 'b'}",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 1
    report = json.loads(out)
    assert report["weights"][0]["sha256"] == digest  # the straight run, named as train and the record name it
    assert report["weights"][0]["model"] != digest  # control: the live model's digest (printed before) is another
    first = report["first_divergence"]
    assert first["run"] == 2
    assert first["epoch"] == 1
    assert first["kind"] in {"data", "loss", "gradients"}
    assert "no resume state for" in err
    record = json.loads((tmp_path / "b" / "verify-resumed" / RECORD_NAME).read_text())
    assert record["resume"]["state_found"] is False
    assert record["resume"]["bitwise_expected"] is False


@pytest.mark.parametrize(
    ("tokens", "message"),
    [
        (["--resume-at", "3", "epochs=3"], "leaves nothing to resume"),
        (["--resume-at", "0", "epochs=3"], "--resume-at must be an epoch number"),
        (["--resume-at", "1", "--steps", "2", "epochs=3"], "drop --runs, --steps, --save and --against"),
        (["--drop-resume-state", "epochs=3"], "--drop-resume-state goes with --resume-at"),
    ],
)
def test_verify_resume_at_bad_input(tokens: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", *tokens]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err
    assert "\n" not in err


def test_resume_errors_raise_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        prepare("repro", ["resume=true"])


def test_state_writer_writes_what_was_there_when_it_was_copied(tmp_path: Path) -> None:
    from yolo_det.core.resume import StateWriter

    live = torch.zeros(1000)
    writer = StateWriter()
    writer.submit(tmp_path / "s.pt", {"epoch": 1, "x": live, "nested": {"y": [live]}})
    writer.wait_copied()  # what an optimizer step pre-hook does before changing parameters
    live.add_(1)
    writer.close()
    state = load_state(tmp_path / "s.pt")
    assert state["epoch"] == 1
    assert torch.equal(state["x"], torch.zeros(1000))
    assert torch.equal(state["nested"]["y"][0], torch.zeros(1000))
    assert not list(tmp_path.glob(".*tmp"))  # the temporary file was renamed into place

    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    writer = StateWriter()
    writer.submit(blocked / "s.pt", {"epoch": 1})
    with pytest.raises(OSError):
        writer.close()


@pytest.mark.slow
def test_verify_resume_at_over_weights_that_never_move_is_nothing_compared(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    frozen = ["epochs=2", "imgsz=64", "plots=false", "optimizer=SGD", "lr0=0.0", "warmup_bias_lr=0.0"]
    code = main(["verify", "--profile", "repro", "--resume-at", "1", "--json", *frozen, f"project={tmp_path}"])
    out, err = capsys.readouterr()
    assert code == 3, err
    report = json.loads(out)
    assert report["verdict"] == "nothing compared"
    assert report["evidence"]["weights_changed"] is False
    assert report["evidence"]["optimizer_steps"][0] > 0
    assert "equal the initial ones" in report["nothing_compared"][0]


@pytest.mark.slow
def test_the_model_in_training_carries_no_hook_of_yolo_det_and_copies_without_the_trainer(
    tmp_path: Path, demo_data: str
) -> None:
    """The resume bookkeeping is one of the trainer seam's observers: nothing of it hangs on the model, which
    Ultralytics and users deep-copy while training (TensorBoard's graph, their own EMA or export)."""
    import copy

    from ultralytics import YOLO

    from helpers import small_train
    from yolo_det import trainer_class
    from yolo_det.integrations.trainer_state import state_of
    from yolo_det.integrations.ultralytics.resume import UltralyticsResume

    seen: dict[str, Any] = {}

    def on_train_batch_end(trainer: Any) -> None:
        if seen:
            return
        model = trainer.model
        seen["hooks"] = [h for h in model._forward_pre_hooks.values() if "yolo_det" in getattr(h, "__module__", "")]
        seen["observers"] = [type(o) for o in state_of(trainer).observers]
        copied = copy.deepcopy(model)  # raised with the trainer (and its hash objects) reachable from a hook
        seen["same"] = all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), copied.state_dict().values()))

    model = YOLO("yolov8n.yaml")
    model.add_callback("on_train_batch_end", on_train_batch_end)
    model.train(
        trainer=trainer_class("repro"), data=demo_data, project=str(tmp_path), name="copy", **small_train(imgsz=32)
    )
    assert seen["hooks"] == []
    assert UltralyticsResume in seen["observers"]  # the steps and the state copies are watched through the seam
    assert seen["same"]
