"""Under the CUDA alert emulator, `repro` trains the test models that plain strict training cannot."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import MODELS, small_train
from yolo_det import attach
from yolo_det.analysis.emulator import emulate_cuda_alerts
from yolo_det.analysis.zoo import ZOO_MODULES
from yolo_det.core.record import RECORD_NAME
from yolo_det.layers.registry import registered, registered_layers

pytestmark = pytest.mark.slow

SMALL = small_train(val=False)
# model -> (kernel CUDA raises on, what repro does about it)
CASES = {
    "cbam-max.yaml": ("adaptive_max_pool2d_backward_cuda", "swap"),
    "coordatt.yaml": ("adaptive_avg_pool2d_backward_cuda", "swap"),
    "gridsample-up.yaml": ("grid_sampler_2d_backward_cuda", "intercept"),
    "bicubic-up.yaml": ("upsample_bicubic2d_backward_out_cuda", "swap"),
}


@pytest.fixture(autouse=True)
def _names():
    with registered(ZOO_MODULES), registered_layers():
        yield


def strict_plain(trainer) -> None:
    """What YOLOv5 does, done to plain Ultralytics: strict deterministic algorithms for the whole run."""
    torch.use_deterministic_algorithms(True)


@pytest.mark.parametrize("name", sorted(CASES))
def test_repro_trains_what_plain_strict_training_cannot(name, tmp_path, demo_data):
    from ultralytics import YOLO

    kernel, fix = CASES[name]
    plain = YOLO(str(MODELS / name))
    plain.add_callback("on_train_start", strict_plain)
    with emulate_cuda_alerts(), pytest.raises(RuntimeError) as e:
        plain.train(data=demo_data, project=str(tmp_path), name="plain", deterministic=False, **SMALL)
    assert str(e.value).startswith(
        f"{kernel} does not have a deterministic implementation, but you set 'torch.use_deterministic_algorithms(True)'"
    )

    model = YOLO(str(MODELS / name))
    plugin = attach(model, "repro")
    with emulate_cuda_alerts() as log:
        model.train(data=demo_data, project=str(tmp_path), name="repro", **SMALL)
    assert [ev for ev in log.events if ev.action != "silent"] == []
    record = json.loads((tmp_path / "repro" / RECORD_NAME).read_text())
    assert record["state_at_train_start"]["deterministic_algorithms"] == "strict"
    if fix == "swap":
        assert record["swaps"]
        assert all(s["reason"] == kernel for s in record["swaps"])
    else:
        assert record["swaps"] == []
        assert record["routed_calls"].get("grid_sample", 0) > 0
    assert plugin.weights_digest == record["weights"]["sha256"]


def onnx_outputs(path: Path, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


def torch_outputs(model, x: np.ndarray) -> np.ndarray:
    net = model.model.float().eval()
    with torch.no_grad():
        out = net(torch.from_numpy(x))
    return (out[0] if isinstance(out, (list, tuple)) else out).numpy()


@pytest.mark.parametrize("name", ["cbam-max.yaml", "bicubic-up.yaml"])
def test_onnx_export_of_a_model_trained_with_swaps(name, tmp_path, demo_data):
    from ultralytics import YOLO

    model = YOLO(str(MODELS / name))
    attach(model, "repro")
    with emulate_cuda_alerts():
        model.train(data=demo_data, project=str(tmp_path), name="run", **SMALL)
    record = json.loads((tmp_path / "run" / RECORD_NAME).read_text())
    assert record["swaps"]
    trained = YOLO(str(tmp_path / "run" / "weights" / "last.pt"))  # the checkpoint holds PyTorch's classes
    assert not any(type(m).__module__.startswith("yolo_det.layers") for m in trained.model.modules())
    onnx_path = Path(trained.export(format="onnx", imgsz=64, device="cpu", simplify=False, dynamic=False))
    x = np.random.default_rng(0).random((1, 3, 64, 64), dtype=np.float32)
    np.testing.assert_allclose(onnx_outputs(onnx_path, x), torch_outputs(trained, x), rtol=1e-3, atol=1e-4)


def test_onnx_export_of_a_model_built_with_yolo_det_layers(tmp_path, monkeypatch):
    """A model from a rewritten YAML holds yolo-det layers; export goes through standard modules and back."""
    from ultralytics import YOLO

    from yolo_det.fixes.yaml_rewrite import rewrite_yaml

    monkeypatch.chdir(tmp_path)  # a model built from a YAML exports into the working folder
    rewrite_yaml(MODELS / "bicubic-up.yaml", tmp_path / "det.yaml")
    model = YOLO(str(tmp_path / "det.yaml"))
    assert sum(type(m).__name__ == "DetUpsample" for m in model.model.modules()) == 2
    attach(model, "repro")
    onnx_path = Path(model.export(format="onnx", imgsz=64, device="cpu", simplify=False))
    assert sum(type(m).__name__ == "DetUpsample" for m in model.model.modules()) == 2  # put back after export
    x = np.random.default_rng(1).random((1, 3, 64, 64), dtype=np.float32)
    np.testing.assert_allclose(onnx_outputs(onnx_path, x), torch_outputs(model, x), rtol=1e-3, atol=1e-4)
