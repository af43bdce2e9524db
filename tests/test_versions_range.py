"""What an older torch or Ultralytics in the supported range lacks degrades in one line, never a traceback."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from yolo_det.analysis.optable import versions


@pytest.fixture
def fresh_probe():
    versions.fake_cuda_trace_problem.cache_clear()
    yield versions
    versions.fake_cuda_trace_problem.cache_clear()


def test_a_torch_whose_fake_cuda_convolution_fails_is_named_and_the_audit_says_so(fresh_probe, monkeypatch, capsys):
    from yolo_det.cli import main

    assert fresh_probe.fake_cuda_trace_problem() is None  # this torch traces (control)
    fresh_probe.fake_cuda_trace_problem.cache_clear()
    monkeypatch.setattr(fresh_probe, "FAKE_CUDA_WITHOUT_DEVICE", ">=99")
    monkeypatch.setattr(fresh_probe, "_PROBE", "import os; os.abort()")  # as torch 2.4.1's CUDA build does
    problem = fresh_probe.fake_cuda_trace_problem()
    assert problem is not None
    assert "cannot trace fake-CUDA convolutions on a machine without a usable CUDA device" in problem
    assert main(["audit", "cbam-max.yaml", "--imgsz", "64"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "the audit cannot trace here" in err[0]


def test_a_probe_that_runs_clean_lets_an_unlisted_torch_trace(fresh_probe, monkeypatch):
    monkeypatch.setattr(fresh_probe, "FAKE_CUDA_WITHOUT_DEVICE", ">=99")
    assert fresh_probe.fake_cuda_trace_problem() is None  # the real probe, on this torch, succeeds


def _train_dataset(demo_data: str, **args: Any) -> Any:
    """A real Ultralytics training dataset of the demo data (as a trainer builds it), with its transforms."""
    from ultralytics.cfg import get_cfg
    from ultralytics.data import build_yolo_dataset
    from ultralytics.data.utils import check_det_dataset

    cfg = get_cfg(overrides={"imgsz": 64, **args})
    data = check_det_dataset(demo_data)
    return build_yolo_dataset(cfg, data["train"], 4, data, mode="train"), cfg


def test_a_mosaic_switched_at_resume_is_one_line(demo_data):
    """Read from what Ultralytics really does: the dataset's Mosaic transform, closed by its own ``close_mosaic``."""
    from copy import copy

    from yolo_det.core.compat import mosaic_on
    from yolo_det.integrations.ultralytics.lineage import mosaic_changed

    dataset, cfg = _train_dataset(demo_data)  # close_mosaic left at its default (10)
    assert not hasattr(dataset, "mosaic")  # the attribute an earlier check read: no Ultralytics dataset has it
    assert mosaic_on(dataset) is True

    def trainer(start: int, epochs: int = 2) -> SimpleNamespace:
        return SimpleNamespace(
            train_loader=SimpleNamespace(dataset=dataset), args=cfg, epochs=epochs, start_epoch=start
        )

    saved_on = {"data": {"mosaic": True}}
    assert mosaic_changed(trainer(1), saved_on) is None  # control: on as the uninterrupted run has it
    dataset.close_mosaic(hyp=copy(cfg))  # Ultralytics 8.3 at resume: close_mosaic=10 reaches back before epoch 1
    assert mosaic_on(dataset) is False
    line = mosaic_changed(trainer(1), saved_on)
    assert line is not None
    assert "\n" not in line
    assert "epoch 2 with mosaic off where the uninterrupted run has it on (close_mosaic=10, epochs=2)" in line
    # 8.4 closes at the first epoch >= epochs - close_mosaic: a run of 12 epochs closes at epoch 2, resumed or not
    assert mosaic_changed(trainer(2, epochs=12), saved_on) is None
    assert mosaic_changed(trainer(1), {"data": {"mosaic": False}}) is None  # closed before the checkpoint already
    assert mosaic_changed(trainer(1), {"data": {}}) is None  # an older state without the flag


def test_a_missing_mosaic_transform_is_refused_naming_it(demo_data, monkeypatch):
    import ultralytics.data.augment as augment

    from yolo_det.core.compat import mosaic_on

    dataset, _ = _train_dataset(demo_data)
    monkeypatch.delattr(augment, "Mosaic")
    with pytest.raises(Exception) as e:
        mosaic_on(dataset)
    assert "\n" not in str(e.value)
    assert "Mosaic" in str(e.value)
