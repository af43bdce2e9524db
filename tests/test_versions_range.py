"""What an older torch or Ultralytics in the supported range lacks degrades in one line, never a traceback."""

from __future__ import annotations

from types import SimpleNamespace

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


def test_a_mosaic_switched_at_resume_is_one_line():
    from yolo_det.integrations.ultralytics.lineage import mosaic_changed

    def trainer(mosaic):
        return SimpleNamespace(
            train_loader=SimpleNamespace(dataset=SimpleNamespace(mosaic=mosaic)),
            args=SimpleNamespace(close_mosaic=10),
            epochs=2,
        )

    state = {"data": {"mosaic": True}}
    assert mosaic_changed(trainer(True), state) is None  # control: as saved
    line = mosaic_changed(trainer(False), state)
    assert line is not None
    assert "\n" not in line
    assert "mosaic off where the uninterrupted run had it on (close_mosaic=10, epochs=2)" in line
    assert mosaic_changed(trainer(False), {"data": {}}) is None  # an older state without the flag
