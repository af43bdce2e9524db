"""A module a checkpoint or record names is imported only on the user's word (``--import``): never because the
checkpoint stores its path and digest and an unchanged file of that name lies in the current folder."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest
import torch

from yolo_det.analysis.names import checkpoint_imports, recorded_imports
from yolo_det.cli import main
from yolo_det.core.errors import ConfigError

NAME = "blocks_beside_i45"


def _code(canary: Path) -> str:
    return (
        f"import pathlib\npathlib.Path({str(canary)!r}).write_text('ran')\n"
        "from torch import nn\n\nclass Gate(nn.Module):\n    pass\n"
    )


def _entry(path: Path, name: str) -> dict[str, str]:
    return {"name": name, "path": str(path), "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


@pytest.fixture
def received(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A received folder: a checkpoint whose stored model YAML records ``NAME`` (path and digest of the file beside
    it, unchanged), as a run with ``--import`` would have written it; the current folder."""
    folder = tmp_path / "received"
    folder.mkdir()
    (folder / f"{NAME}.py").write_text(_code(tmp_path / "ran"))
    from ultralytics.nn.tasks import DetectionModel

    model = DetectionModel("yolov8n.yaml", nc=3, verbose=False)
    model.yaml["yolo_det"] = {"imports": [_entry(folder / f"{NAME}.py", NAME)]}
    torch.save({"epoch": 0, "model": None, "ema": model, "train_args": {}}, folder / "model.pt")
    monkeypatch.chdir(folder)
    yield folder
    sys.modules.pop(NAME, None)


def test_a_py_beside_a_received_checkpoint_is_never_imported(received: Path, tmp_path: Path, capsys) -> None:
    assert main(["train", "model=model.pt", "epochs=1", "imgsz=32", "device=cpu", f"project={tmp_path}/runs"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"add --import {NAME} " in err, err
    assert main(["audit", "model.pt"]) == 2
    assert f"add --import {NAME} " in capsys.readouterr().err
    assert not (tmp_path / "ran").exists()  # nothing ran
    assert NAME not in sys.modules
    assert not (tmp_path / "runs").exists()  # nothing written
    with pytest.raises(ConfigError, match=rf"add --import {NAME} "):
        recorded_imports([_entry(received / f"{NAME}.py", NAME)], "checkpoint 'x'")


def test_the_users_import_still_imports(received: Path, tmp_path: Path) -> None:
    # the harmless twin: on the user's word the same module is imported, and the check passes
    checkpoint_imports(received / "model.pt", given=[f"{NAME}.py"])
    from yolo_det.analysis.models import model_names

    with model_names([f"{NAME}.py"]):
        assert (tmp_path / "ran").read_text() == "ran"
        checkpoint_imports(received / "model.pt")  # imported in this block: nothing to add


def test_a_hostile_module_name_is_shown_escaped() -> None:
    entry = {"name": "x\x1b]8;;evil\x07", "path": "/x.py", "sha256": "0" * 64}
    with pytest.raises(ConfigError) as info:
        recorded_imports([entry], "checkpoint 'x'")
    assert "\x1b" not in str(info.value)
    assert "\x07" not in str(info.value)
    assert "--import with the module it was trained with" in str(info.value)
