"""What a run was made from: the identity taken from a trainer, without training."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from helpers import DEMO, MODELS
from yolo_det.core.record import state_dict_digest
from yolo_det.integrations.identity import model_fingerprint, run_identity


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("YOLO_DET_CACHE", str(tmp_path / "cache"))


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.yaml = {"nc": 3, "backbone": [[-1, 1, "Conv", [4, 3]]]}


def fake_trainer(root: Path, model: torch.nn.Module, source: str) -> SimpleNamespace:
    train = sorted(str(p) for p in (root / "images" / "train").glob("*.png"))[:4]
    val = sorted(str(p) for p in (root / "images" / "val").glob("*.png"))[:3]
    return SimpleNamespace(
        args=SimpleNamespace(model=source, data=str(root / "x.yaml"), imgsz=64, split="val", save_dir=Path("/tmp/r")),
        data={"path": str(root), "names": {0: "circle", 1: "square", 2: "triangle"}},
        train_loader=SimpleNamespace(dataset=SimpleNamespace(im_files=train)),
        test_loader=SimpleNamespace(dataset=SimpleNamespace(samples=[[f, k % 3] for k, f in enumerate(val)])),
        model=model,
    )


def test_run_identity_covers_data_model_and_arguments(tmp_path):
    root = tmp_path / "demo"
    shutil.copytree(DEMO, root)
    net = Net()
    ident = run_identity(fake_trainer(root, net, "my.pt"))
    data = ident["data"]
    assert data["splits"]["train"]["images"] == 4
    assert data["splits"]["val"]["images"] == 3
    assert data["hashed"] == 7
    assert data["root"] == str(root)
    model = ident["model"]
    assert model["kind"] == "checkpoint"
    assert model["start_weights_sha256"] == state_dict_digest(net)
    assert model["parameters"] == sum(p.numel() for p in net.parameters())
    assert "architecture_sha256" in model
    assert ident["ultralytics_args"] == {
        "data": str(root / "x.yaml"),
        "imgsz": 64,
        "model": "my.pt",
        "save_dir": "/tmp/r",
        "split": "val",
    }


def test_other_weights_or_architecture_change_the_model_fingerprint():
    a, b = Net(), Net()
    with torch.no_grad():
        b.conv.weight.copy_(a.conv.weight)
        b.conv.bias.copy_(a.conv.bias)
    fa, fb = model_fingerprint(a, "x.pt"), model_fingerprint(b, "x.pt")
    assert fa == fb
    with torch.no_grad():
        b.conv.bias[0] += 1
    assert model_fingerprint(b, "x.pt")["start_weights_sha256"] != fa["start_weights_sha256"]
    b.yaml = {**b.yaml, "nc": 4}
    assert model_fingerprint(b, "x.pt")["architecture_sha256"] != fa["architecture_sha256"]


def test_yaml_start_hashes_the_yaml_text(tmp_path):
    text = (MODELS / "cbam-max.yaml").read_text()
    one, two = tmp_path / "one.yaml", tmp_path / "two.yaml"
    one.write_text(text)
    two.write_text(text + "\n# a comment\n")
    fa, fb = model_fingerprint(Net(), str(one)), model_fingerprint(Net(), str(two))
    assert fa["kind"] == "yaml"
    assert fa["yaml_sha256"] != fb["yaml_sha256"]


def test_a_part_that_fails_is_recorded_as_an_error_not_raised(tmp_path):
    trainer = SimpleNamespace(
        args=SimpleNamespace(model="m.yaml", split="val"),
        data={},
        train_loader=SimpleNamespace(dataset=SimpleNamespace(im_files=[str(tmp_path / "gone.png")])),
        test_loader=None,
        model=None,
    )
    ident = run_identity(trainer)
    assert "FileNotFoundError" in ident["data"]["error"]
    assert ident["model"]["kind"] == "yaml"
    assert "start_weights_sha256" not in ident["model"]
    assert ident["ultralytics_args"]["model"] == "m.yaml"
