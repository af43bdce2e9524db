"""`yolo-det audit --fix`: the audit and the YAML rewrite together, with a verdict on every finding."""

from __future__ import annotations

import json
from pathlib import Path

from yolo_det.cli import main
from yolo_det.fixes.swaps import remedy

MODELS = Path(__file__).resolve().parent.parent / "data" / "models"


def test_fix_rewrites_nameable_layers_and_explains_the_rest(tmp_path, capsys):
    out = tmp_path / "fixed.yaml"
    assert main(["audit", str(MODELS / "bicubic-up.yaml"), "--imgsz", "64", "--fix", "-o", str(out), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["unfixed"] == 0 and [c["layer"] for c in data["rewrite"]["changes"]] == [10, 13]
    assert out.read_text().count("DetUpsample") == 2
    assert main(["audit", str(MODELS / "cbam-max.yaml"), "--imgsz", "64", "--fix", "-o", str(tmp_path / "c.yaml")]) == 0
    text = capsys.readouterr().out
    assert "layer 10 model.10.max_pool (adaptive_max_pool2d_backward_cuda): swapped at training time" in text
    assert main(["audit", str(MODELS / "gridsample-up.yaml"), "--imgsz", "64", "--fix", "-o",
                 str(tmp_path / "g.yaml")]) == 0
    assert "intercepted at training time by the repro profile" in capsys.readouterr().out


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
