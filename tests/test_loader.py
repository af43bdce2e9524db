"""Loading a model to inspect it: YAML (with layer lines), checkpoint, factory; one-line errors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch import nn

from yolo_det.analysis.loader import layer_lines, load_model
from yolo_det.core.errors import ModelError


def test_layer_lines() -> None:
    text = (
        "nc: 3\nbackbone:\n  # c\n  - [-1, 1, Conv, [16, 3, 2]]\n  - [-1, 1, Conv, [32, 3, 2]]\nhead:\n\n"
        "  - [-1, 1, nn.Upsample, [None, 2]]\n"
    )
    assert layer_lines(text) == {0: 4, 1: 5, 2: 8}
    assert layer_lines("not: [valid") == {}


def test_ultralytics_names_resolve_with_their_scale() -> None:
    loaded = load_model("yolov8n.yaml")
    assert loaded.kind == "yaml"
    assert loaded.yaml_path is not None
    assert loaded.yaml_path.name == "yolov8.yaml"
    assert loaded.stride == 32
    assert loaded.channels == 3
    assert len(loaded.layer_lines) == len(loaded.model.model)
    assert loaded.model.yaml["scale"] == "n"


def test_rtdetr_gets_its_own_model_class() -> None:
    assert type(load_model("rtdetr-l.yaml").model).__name__ == "RTDETRDetectionModel"


def test_module_and_state_dict_checkpoints(tmp_path: Path) -> None:
    from yolo_det.core.untrusted.safeload import trusted_checkpoints

    module = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU())
    torch.save(module, tmp_path / "m.pt")
    # a pickled module stores no model YAML: it is unpickled only when the user trusts the file
    with pytest.raises(ModelError, match="stores no model YAML.*--trust-checkpoint"):
        load_model(tmp_path / "m.pt")
    with trusted_checkpoints():
        loaded = load_model(tmp_path / "m.pt")
    assert loaded.kind == "checkpoint"
    assert loaded.channels == 1
    assert loaded.stride is None
    torch.save(module.state_dict(), tmp_path / "sd.pt")
    with trusted_checkpoints(), pytest.raises(ModelError, match="holds no model"):
        load_model(tmp_path / "sd.pt")
    with pytest.raises(ModelError, match="stores no model YAML"):
        load_model(tmp_path / "sd.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ModelError, match="is not a PyTorch checkpoint"):
        load_model(tmp_path / "junk.pt")


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("- 1\n- 2\n", r"must be a mapping"),
        ("nc: 1\nbackbone: []\n", r"needs a 'head' list"),
        (
            "nc: 1\nbackbone:\n  - [-1, 1, Conv]\nhead: []\n",
            r"t\.yaml:3: layer 0 must be \[from, repeats, module, args\]",
        ),
        (
            "nc: 1\nbackbone:\n  - [-1, 1, nn.Conv9d, [1]]\nhead: []\n",
            r"t\.yaml:3: unknown module 'nn\.Conv9d'.*torch\.nn has no",
        ),
        (
            "nc: 1\nbackbone:\n  - [-1, 1, Cnv, [8, 3]]\nhead: []\n",
            r"t\.yaml:3: unknown module 'Cnv' in layer 0.*Did you mean 'Conv'\?",
        ),
        (
            "nc: 1\nbackbone:\n  - [-1, 1, Conv, [8, 3, 2]]\nhead:\n  - [[-1, 7], 1, Concat, [1]]\n",
            r"the model does not build",
        ),
    ],
)
def test_bad_yamls(tmp_path: Path, text: str, pattern: str) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ModelError) as err:
        load_model(path)
    assert re.search(pattern, str(err.value)), str(err.value)
    assert "\n" not in str(err.value), str(err.value)


def test_factory_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "ydt_factories.py").write_text(
        "def broken():\n    raise ValueError('no weights')\n\ndef not_a_model():\n    return 42\n", encoding="utf-8"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModelError, match="factory 'ydt_factories:broken' failed: ValueError: no weights"):
        load_model("ydt_factories:broken")
    with pytest.raises(ModelError, match="expected a torch.nn.Module"):
        load_model("ydt_factories:not_a_model")
    with pytest.raises(ModelError, match="Did you mean 'broken'"):
        load_model("ydt_factories:brokn")


def test_other_inputs_are_rejected() -> None:
    with pytest.raises(ModelError, match="not found"):
        load_model("yolov8n")
    with pytest.raises(ModelError, match="got int"):
        load_model(3)
