"""Inspection imports and downloads nothing: a checkpoint's class names never import a module, and
``audit`` of a model YAML with a ``TorchVision`` layer fetches no weights and creates no cache."""

from __future__ import annotations

import importlib
import importlib.abc
import sys
from pathlib import Path

import pytest
import torch
import torch.hub

from yolo_det.cli import main
from yolo_det.core.errors import ModelError
from yolo_det.core.untrusted.safeload import load_checkpoint


def _no_download(*_a: object, **_k: object) -> None:
    raise AssertionError("a download was attempted")


def test_audit_of_a_torchvision_layer_downloads_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("TORCH_HOME", str(home / "torch"))
    monkeypatch.setattr(torch.hub, "download_url_to_file", _no_download)
    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", _no_download)
    yaml_file = tmp_path / "tv.yaml"
    yaml_file.write_text(
        "nc: 3\nbackbone:\n  - [-1, 1, TorchVision, [512, resnet18, DEFAULT, True, 2]]\n"
        "head:\n  - [-1, 1, Classify, [3]]\n"
    )
    code = main(["audit", str(yaml_file)])
    out = capsys.readouterr()
    assert "download was attempted" not in out.out + out.err
    assert code == 0, out.err
    assert list(home.iterdir()) == []  # no ~/.cache/torch/hub/checkpoints, nothing at all
    # control: the same layer built by Ultralytics as written does ask for its weights
    from ultralytics.nn.modules.block import TorchVision

    with pytest.raises(AssertionError, match="download was attempted"):
        TorchVision("resnet18", "DEFAULT")


TEXT_MODEL = "ultralytics.nn.text_model"  # imported, it installs a package from a URL


class _Blocker(importlib.abc.MetaPathFinder):
    """First on ``sys.meta_path``: records and refuses every attempt to import one of ``names``."""

    def __init__(self, names: set[str]) -> None:
        self.names = names
        self.attempts: list[str] = []

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> None:
        if fullname in self.names:
            self.attempts.append(fullname)
            raise ImportError(f"import of {fullname} attempted")
        return None


@pytest.fixture
def blocker(monkeypatch: pytest.MonkeyPatch) -> _Blocker:
    """Any import of the canary module or of Ultralytics' text model is recorded (and fails)."""
    found = _Blocker({"ultralytics.nn.yd_canary_block", TEXT_MODEL})
    monkeypatch.delitem(sys.modules, TEXT_MODEL, raising=False)
    monkeypatch.setattr(sys, "meta_path", [found, *sys.meta_path])
    return found


def _canary_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:
    """A module inside ``ultralytics.nn`` (an allowed package) that is not imported yet and writes a file
    when it is."""
    import ultralytics.nn

    pkg = tmp_path / "extra"
    pkg.mkdir()
    canary = tmp_path / "imported.txt"
    (pkg / "yd_canary_block.py").write_text(
        f"from pathlib import Path\nPath({str(canary)!r}).write_text('ran')\n"
        "import torch\nclass Block(torch.nn.Module):\n    pass\n"
    )
    monkeypatch.setattr(ultralytics.nn, "__path__", [*ultralytics.nn.__path__, str(pkg)])
    name = "ultralytics.nn.yd_canary_block"
    monkeypatch.delitem(sys.modules, name, raising=False)
    return name, canary


def _naming(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str, name: str) -> Path:
    """A checkpoint whose pickle names ``module.name`` (written with a stand-in, then forgotten)."""
    block = type(name, (torch.nn.Module,), {"__module__": module, "__qualname__": name})
    stand_in = type(sys)(module)
    setattr(stand_in, name, block)
    monkeypatch.setitem(sys.modules, module, stand_in)
    ckpt = tmp_path / f"{name}.pt"
    torch.save({"model": block(), "epoch": 1}, ckpt)
    del sys.modules[module]
    return ckpt


def test_digest_of_a_checkpoint_naming_an_unimported_module_imports_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], blocker: _Blocker
) -> None:
    module, canary = _canary_module(tmp_path, monkeypatch)
    ckpts = [_naming(tmp_path, monkeypatch, module, "Block"), _naming(tmp_path, monkeypatch, TEXT_MODEL, "MobileCLIP")]
    assert module not in sys.modules
    for ckpt in ckpts:
        main(["digest", str(ckpt)])  # a digest reads the file's bytes and its names; the result is not the point
        main(["audit", str(ckpt)])
        with pytest.raises(ModelError, match="not on yolo-det's allow-list"):
            load_checkpoint(ckpt)
    capsys.readouterr()
    assert blocker.attempts == []  # not one import was even tried
    assert not canary.exists()
    assert module not in sys.modules
    assert TEXT_MODEL not in sys.modules
    # control: the blocker sees an import, and importing the module does run it
    with pytest.raises(ImportError, match="attempted"):
        importlib.import_module(TEXT_MODEL)
    assert blocker.attempts == [TEXT_MODEL]
    sys.meta_path.remove(blocker)
    importlib.import_module(module)
    assert canary.exists()
    del sys.modules[module]


def test_loading_a_checkpoint_naming_an_unimported_module_refuses_without_importing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, blocker: _Blocker
) -> None:
    from yolo_det.core.untrusted.allow import model_class

    module, canary = _canary_module(tmp_path, monkeypatch)
    assert model_class(module, "Block") is None
    assert model_class(TEXT_MODEL, "MobileCLIP") is None
    assert blocker.attempts == []
    assert not canary.exists()
    assert module not in sys.modules
    # control: a class of an allowed module that is imported resolves
    assert model_class("ultralytics.nn.modules.conv", "Conv") is not None
