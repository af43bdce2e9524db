"""The test blocks of yolo_det.analysis.zoo, the model YAMLs that use them, and what CUDA would do to their training."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import yolo_det
from helpers import MODELS
from yolo_det.analysis.emulator import alert_message, emulate_cuda_alerts
from yolo_det.analysis.loader import load_model
from yolo_det.analysis.zoo import ZOO_MODULES, CBAMMax, CoordAtt, GridSampleUpsample
from yolo_det.integrations.fonts import ensure_local_font
from yolo_det.layers.registry import registered
from yolo_det.tools.demo import demo_data_yaml

YAMLS = ("cbam-max", "coordatt", "gridsample-up", "bicubic-up", "attention-mix")
# The first kernel each model reaches in its backward pass (the deepest offending layer runs first).
FIRST_KERNEL = {
    "cbam-max": "adaptive_max_pool2d_backward_cuda",
    "coordatt": "adaptive_avg_pool2d_backward_cuda",
    "gridsample-up": "grid_sampler_2d_backward_cuda",
    "bicubic-up": "upsample_bicubic2d_backward_out_cuda",
    "attention-mix": "adaptive_avg_pool2d_backward_cuda",
}


@pytest.fixture(autouse=True)
def _restore_flags() -> Iterator[None]:
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    yield
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])


@pytest.mark.parametrize("block", [CBAMMax(32), CoordAtt(32), GridSampleUpsample(32)])
def test_blocks_keep_channels_and_train(block: torch.nn.Module) -> None:
    x = torch.randn(2, 32, 8, 12, requires_grad=True)
    y = block(x)
    scale = 2 if isinstance(block, GridSampleUpsample) else 1
    assert y.shape == (2, 32, 8 * scale, 12 * scale)
    y.square().mean().backward()
    assert x.grad is not None
    assert torch.isfinite(x.grad).all()
    assert all(p.grad is not None for p in block.parameters())


def test_grid_sample_upsample_starts_as_bilinear_upsampling() -> None:
    block = GridSampleUpsample(8)
    torch.nn.init.zeros_(block.offset.weight)
    x = torch.randn(2, 8, 5, 7)
    expected = F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)
    torch.testing.assert_close(block(x), expected, atol=1e-5, rtol=1e-5)


def test_blocks_use_the_ops_they_are_meant_to_exercise() -> None:
    cbam, coord = CBAMMax(16), CoordAtt(16)
    assert isinstance(cbam.max_pool, torch.nn.AdaptiveMaxPool2d)
    assert cbam.max_pool.output_size == 1
    assert coord.pool_h.output_size == (None, 1)
    assert coord.pool_w.output_size == (1, None)


@pytest.mark.parametrize(
    ("cls", "args"),
    [
        (CBAMMax, (0,)),
        (CBAMMax, (16, 16, 5)),
        (CoordAtt, (-1,)),
        (GridSampleUpsample, (16, 0)),
        (GridSampleUpsample, (True,)),
    ],
)
def test_bad_arguments(cls: type, args: tuple) -> None:
    with pytest.raises(ValueError, match=cls.__name__):
        cls(*args)


@pytest.mark.parametrize("name", YAMLS)
def test_model_yamls_build_and_run(name: str) -> None:
    with registered(ZOO_MODULES):
        loaded = load_model(MODELS / f"{name}.yaml")
    model = loaded.model.train()
    assert loaded.stride == 32
    assert model.yaml["nc"] == 3
    out = model(torch.zeros(2, 3, 64, 64))
    assert {"boxes", "scores", "feats"} <= set(out)
    assert sum(p.numel() for p in model.parameters()) < 2_000_000  # small enough to train on a CPU in seconds


def test_zoo_names_are_unknown_outside_the_registration() -> None:
    from ultralytics.nn import tasks

    assert not set(ZOO_MODULES) & set(vars(tasks))


# ---------------------------------------------------------------------------------------------------------
# training under the emulator


def _profile(tmp_path: Path, mode: str) -> Path:
    """Strict (or warn) determinism without swaps or interception: the crash CUDA users see."""
    path = tmp_path / f"{mode}-noswap.yaml"
    path.write_text(
        f"name: {mode}-noswap\nextends: repro\ndefaults:\n  deterministic_algorithms: {mode}\n"
        "  swaps: none\n  intercept: false\n",
        encoding="utf-8",
    )
    return path


def _train(name: str, profile: Path, project: Path) -> yolo_det.UltralyticsPlugin:
    from ultralytics import YOLO

    ensure_local_font()
    with registered(ZOO_MODULES):
        model = YOLO(str(MODELS / f"{name}.yaml"))
        plugin = yolo_det.attach(model, str(profile))
        model.train(
            data=str(demo_data_yaml()),
            epochs=1,
            imgsz=64,
            batch=16,
            fraction=0.34,
            device="cpu",
            workers=0,
            project=str(project),
            name=name,
            exist_ok=True,
            plots=False,
            val=False,
            verbose=False,
        )
    return plugin


@pytest.mark.slow
@pytest.mark.parametrize("name", YAMLS)
def test_strict_training_fails_with_the_cuda_message(name: str, tmp_path: Path) -> None:
    with emulate_cuda_alerts() as log, pytest.raises(RuntimeError) as err:
        _train(name, _profile(tmp_path, "strict"), tmp_path)
    assert str(err.value) == alert_message(FIRST_KERNEL[name])
    assert log.by_action("raised")[0].kernel == FIRST_KERNEL[name]
    assert not torch.are_deterministic_algorithms_enabled()  # the plugin restored the state after the crash


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:.*does not have a deterministic implementation")
@pytest.mark.parametrize("name", YAMLS)
def test_warn_only_training_warns_and_completes(name: str, tmp_path: Path) -> None:
    with emulate_cuda_alerts() as log:
        plugin = _train(name, _profile(tmp_path, "warn"), tmp_path)
    assert log.by_action("warned")
    assert not log.by_action("raised")
    record = json.loads(Path(plugin.record_path).read_text(encoding="utf-8"))
    assert record["status"] == "completed"
    messages = [w["message"] for w in record["nondeterminism_warnings"]]
    assert any(
        m.startswith(alert_message(FIRST_KERNEL[name], warn_only=True).split(" (Triggered")[0]) for m in messages
    )
