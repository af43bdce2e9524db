"""Export parity: a record beside every export under yolo-det; preprocessing mismatches named as the cause."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import pytest
import torch

from helpers import DEMO, MODELS
from yolo_det import attach
from yolo_det.cli import main
from yolo_det.core.record import state_dict_digest
from yolo_det.integrations.export_parity import export_digest, export_parity, export_record_path
from yolo_det.tools.deploy.records import compare_export_records, compare_record_files

pytestmark = pytest.mark.slow


def _images(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for i, p in enumerate(sorted((DEMO / "images" / "val").glob("*.*"))[:3]):
        size = [(96, 200), (220, 96), None][i]
        im = cv2.imread(str(p))
        out.append(folder / f"im{i}.png")
        cv2.imwrite(str(out[-1]), im if size is None else cv2.resize(im, size))
    return out


def _stock():
    from ultralytics import YOLO

    torch.manual_seed(0)
    return YOLO("yolov8n.yaml")


def _swapped():
    from ultralytics import YOLO

    from yolo_det.analysis.swap_plan import decide_swaps
    from yolo_det.fixes.swaps import swap_modules

    torch.manual_seed(0)
    model = YOLO(str(MODELS / "cbam-max.yaml"))
    assert swap_modules(model.model, decide_swaps(model.model, "auto", imgsz=64))
    return model


def _export(model, fmt: str) -> Path:
    extra = {"simplify": False} if fmt == "onnx" else {}
    return Path(model.export(format=fmt, imgsz=64, device="cpu", **extra))


@pytest.mark.parametrize("build", [_stock, _swapped], ids=["stock", "swapped"])
def test_every_export_gets_a_parity_record(build, tmp_path, monkeypatch, capsys) -> None:
    from yolo_det.analysis.zoo import ZOO_MODULES
    from yolo_det.layers.registry import registered, registered_layers

    monkeypatch.chdir(tmp_path)  # a model built from a YAML exports into the working folder
    with registered(ZOO_MODULES), registered_layers():
        model = build()
        swapped = sorted(type(m).__name__ for m in model.model.modules() if type(m).__module__.startswith("yolo_det"))
        plugin = attach(model, "repro")
        records = {}
        for fmt in ("torchscript", "onnx"):
            exported = _export(model, fmt)
            assert plugin.export_record_path == export_record_path(exported)
            records[fmt] = json.loads(plugin.export_record_path.read_text())
            rec = records[fmt]
            assert rec["kind"] == "export"
            assert rec["error"] is None
            assert rec["export"]["sha256"] == export_digest(exported)
            assert rec["export"]["format"] == fmt
            assert rec["weights"]["state_sha256"] == state_dict_digest(model.model)
            assert rec["profile"]["name"] == "repro"
            assert rec["deploy_settings"]["batch_invariant"] is True
            numerics = rec["parity"]["numerics"]
            assert 0 <= numerics["raw_mean_abs_diff"] <= numerics["raw_max_abs_diff"] < 1e-3
            # a default export (the .pt predicts with a rectangular letterbox): the export's verdict is its numerics'
            assert numerics["verdict"] != "differs"
            assert rec["parity"]["verdict"] in {numerics["verdict"], "nothing compared"}
            assert rec["parity"]["summary"].startswith(f"numerics {rec['parity']['verdict']} (raw outputs")
            assert rec["parity"]["preprocessing"]["export"] == {
                "imgsz": [64, 64],
                "dynamic": False,
                "letterbox": "square",
                "batch": 1,
            }
        assert (
            sorted(type(m).__name__ for m in model.model.modules() if type(m).__module__.startswith("yolo_det"))
            == swapped
        )  # swaps put back after export
        # the exported models on the same inputs as the PyTorch model, with boxes to compare
        images = _images(tmp_path / "images")
        ts = export_parity(
            model, tmp_path / records["torchscript"]["export"]["file"], images=images, pt_rect=False, conf=0.0
        )
        assert ts["numerics"]["images"][0]["count"][0] > 0
        assert ts["numerics"]["detections_match"]
        assert ts["preprocessing"]["mismatches"] == []
        assert ts["cause"] is None

    same = compare_export_records(records["onnx"], records["onnx"])
    assert same.verdict == "same"
    assert same.exit_code == 0
    other = compare_export_records(records["torchscript"], records["onnx"])
    keys = {k for _, k, _, _ in other.differences}
    assert other.verdict == "same weights, other export"
    assert {"export.sha256", "export.format"} <= keys
    changed = json.loads(json.dumps(records["onnx"]))
    changed["deploy_settings"]["batch_invariant"] = False
    assert ("deploy", "deploy_settings.batch_invariant", True, False) in compare_export_records(
        records["onnx"], changed
    ).differences
    a, b = (export_record_path(tmp_path / records[f]["export"]["file"]) for f in ("torchscript", "onnx"))
    assert compare_record_files(a, b).verdict == other.verdict
    capsys.readouterr()
    assert main(["check-deploy", "--compare", str(a), str(b)]) == 1
    assert "verdict: same weights, other export" in capsys.readouterr().out
    assert main(["check-deploy", "--compare", str(a), str(a)]) == 0


def test_a_mismatched_preprocessing_is_reported_as_the_cause(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    model = _stock()
    exported = _export(model, "torchscript")  # not attached: no record, the parity is measured here
    assert not export_record_path(exported).exists()
    images = _images(tmp_path / "images")
    matched = export_parity(model, exported, images=images, pt_rect=False, conf=0.0)
    assert matched["cause"] is None
    assert matched["preprocessing"]["detections"] != "differs"
    rect = export_parity(model, exported, images=images, pt_rect=True, conf=0.0)
    # the export computes what the model computes; only what predict feeds each differs, and says so
    assert rect["verdict"] in {"bitwise", "within tolerance"}
    assert rect["numerics"]["verdict"] == rect["verdict"]
    assert rect["preprocessing"]["verdict"] == "differs"
    assert rect["summary"].startswith(f"numerics {rect['verdict']} (raw outputs 0.0001 + 7.6e-06 x |value|")
    assert "preprocessing differs: letterbox: rectangular" in rect["summary"]
    assert rect["tolerances"]["atol"] == 1e-4
    assert rect["numerics"]["detections_match"]
    assert rect["cause"].startswith("preprocessing: letterbox: rectangular")
    assert "dynamic=True" in rect["cause"]
    sized = export_parity(model, exported, images=images, pt_imgsz=96, pt_rect=False, conf=0.0)
    assert sized["cause"].startswith(
        "preprocessing: imgsz: the PyTorch model predicts at 96x96, the export takes 64x64"
    )


def test_a_parity_over_no_detection_says_nothing_compared(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    model = _stock()
    exported = _export(model, "torchscript")
    images = _images(tmp_path / "images")
    empty = export_parity(model, exported, images=images, pt_rect=False, conf=0.99)  # untrained: no score that high
    assert empty["evidence"]["detections"] == 0
    assert empty["evidence"]["raw_elements"] > 0
    assert empty["verdict"] == "nothing compared"
    assert empty["numerics"]["detections_match"] is None
    assert "lower conf" in empty["nothing_compared"][0]
    found = export_parity(model, exported, images=images, pt_rect=False, conf=0.0)  # control: detections compared
    assert found["evidence"]["detections"] > 0
    assert found["verdict"] != "nothing compared"
    assert found["numerics"]["detections_match"] is True
    assert found["nothing_compared"] == []
