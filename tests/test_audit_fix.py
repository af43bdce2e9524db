"""`yolo-det audit --fix`: the audit and the YAML rewrite together, with a verdict on every finding."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from helpers import MODELS
from yolo_det.cli import main
from yolo_det.fixes.swaps import remedy


@pytest.mark.slow
def test_fix_rewrites_nameable_layers_and_the_copy_audits_clean(tmp_path, capsys):
    out = tmp_path / "fixed.yaml"
    assert main(["audit", str(MODELS / "bicubic-up.yaml"), "--imgsz", "64", "--fix", "-o", str(out), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["unfixed"] == 0
    assert data["remaining"] == 0
    assert [c["layer"] for c in data["rewrite"]["changes"]] == [10, 13]
    assert out.read_text().count("DetUpsample") == 2
    for name, old, new in (
        ("cbam-max", "CBAMMax", "DetCBAMMax"),
        ("gridsample-up", "GridSampleUpsample", "DetGridSampleUpsample"),
    ):
        fixed = tmp_path / f"{name}.yaml"
        assert main(["audit", str(MODELS / f"{name}.yaml"), "--imgsz", "64", "--fix", "-o", str(fixed)]) == 0
        text = capsys.readouterr().out
        assert f"fixed in {fixed} (layer 10: {old} -> {new})" in text
        assert "audits clean" in text
        assert main(["audit", str(fixed), "--imgsz", "64"]) == 0  # the claim holds for the written file


class _UsersCBAM(nn.Module):
    def __init__(self, c1: int, *args: object) -> None:
        super().__init__()
        self.max_pool = nn.AdaptiveMaxPool2d(1)
        self.fc = nn.Conv2d(c1, c1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.fc(self.max_pool(x)))


@pytest.mark.slow
def test_fix_says_what_remains_in_the_copy_and_why(tmp_path, capsys, monkeypatch):
    """A pool inside the user's own block: the copy is unchanged, and the message and exit status say so."""
    from ultralytics.nn import tasks

    monkeypatch.setitem(vars(tasks), "CBAMMax", _UsersCBAM)
    out = tmp_path / "c.yaml"
    assert main(["audit", str(MODELS / "cbam-max.yaml"), "--imgsz", "64", "--fix", "-o", str(out)]) == 1
    text = capsys.readouterr().out
    assert f"wrote {out} (an unchanged copy: no layer could be renamed)" in text
    assert (
        f"layer 10 model.10.max_pool (adaptive_max_pool2d_backward_cuda): remains in {out} (inside the block: a "
        "YAML cannot name it); swapped at training time by the repro profile"
    ) in text
    assert f"verdict: 1 finding(s) remain in {out}; 1 handled at training time" in text
    assert "every finding is fixed" not in text
    assert main(["audit", str(out), "--imgsz", "64"]) == 1


def test_fix_needs_a_yaml_and_an_output(tmp_path, capsys):
    assert main(["audit", str(MODELS / "cbam-max.yaml"), "--fix"]) == 2
    assert "--fix needs -o OUT.yaml" in capsys.readouterr().err
    assert main(["audit", "yolov8n.yaml", "-o", str(tmp_path / "x.yaml")]) == 2
    assert "add --fix" in capsys.readouterr().err
    ckpt = tmp_path / "w.pt"
    ckpt.write_bytes(b"")
    assert main(["audit", str(ckpt), "--fix", "-o", str(tmp_path / "x.yaml")]) == 2
    assert "rewrites model YAMLs" in capsys.readouterr().err
    assert not (tmp_path / "x.yaml").exists()


class _F:
    def __init__(self, module_class: str, call: str | None) -> None:
        self.module_class, self.call = module_class, call


def test_remedy_names_swap_intercept_or_nothing():
    assert remedy(_F("AdaptiveMaxPool2d", "torch.nn.functional.adaptive_max_pool2d")) == "swap"
    assert remedy(_F("MSDeformAttn", "torch.nn.functional.grid_sample")) == "intercept"
    assert remedy(_F("DeformConv2d", "torchvision.ops.deform_conv2d")) is None
    assert remedy(_F("CTCLoss", None)) is None
