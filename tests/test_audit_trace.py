"""The audit's trace on torch's fake CUDA tensors (``FakeTensorMode``): CUDA's code paths, no GPU, nothing
computed, nothing left behind."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor
from torch.overrides import _get_current_function_mode_stack
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from helpers import MODELS
from yolo_det.analysis.audit import entry
from yolo_det.analysis.audit import trace as trace_mod
from yolo_det.analysis.optable import load_table


@pytest.fixture(autouse=True)
def _clean_state() -> Iterator[None]:
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    yield
    after = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    assert after == before
    assert not _get_current_dispatch_mode_stack()
    assert not _get_current_function_mode_stack()
    assert torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is None


def _ops(monkeypatch: pytest.MonkeyPatch, model: Any, *, imgsz: int) -> tuple[list[tuple[str, Any]], Any]:
    """(every aten op the trace ran with what it returned, the trace)."""
    seen: list[tuple[str, Any]] = []
    dispatch = trace_mod._Trace.dispatch

    def on_op(self: Any, func: Any, args: Any, kwargs: Any) -> Any:
        out = dispatch(self, func, args, kwargs)
        seen.append((str(func), out))
        return out

    monkeypatch.setattr(trace_mod._Trace, "dispatch", on_op)
    trace = trace_mod._fake_trace(entry._load(model), load_table(None), imgsz=imgsz, batch=2, forward_det=True)
    return seen, trace


class _Layouts(nn.Module):
    """CUDA-only paths: cuDNN's batch norm, a channels-last convolution."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(self.bn(self.conv(x.to(memory_format=torch.channels_last)))).sum()


def test_the_trace_takes_cudas_paths_on_fake_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    seen, trace = _ops(monkeypatch, _Layouts(), imgsz=16)
    names = [name for name, _ in seen]
    # cuDNN's batch norm, forward and backward: the code path of a CUDA tensor (a CPU trace runs native_batch_norm)
    assert "aten.cudnn_batch_norm.default" in names
    assert "aten.cudnn_batch_norm_backward.default" in names
    assert not any("native_batch_norm" in n for n in names)
    outs = [out for _, out in seen if isinstance(out, torch.Tensor)]
    assert len(outs) > 10
    assert all(isinstance(t, FakeTensor) and t.device == torch.device("cuda", 0) for t in outs)
    silu = next(out for name, out in seen if name == "aten.silu.default")
    assert silu.is_contiguous(memory_format=torch.channels_last)  # the layout cuDNN gives a channels-last input
    assert trace.counts["backward_nodes"] > 0
    assert not torch.cuda.is_initialized()


@pytest.mark.slow
def test_the_trace_finds_what_strict_cuda_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    seen, trace = _ops(monkeypatch, MODELS / "cbam-max.yaml", imgsz=64)
    assert len(seen) > 2000  # forward and backward of a whole detector
    assert {(o.name, o.pass_, o.module) for o in trace.occurrences if "adaptive_max_pool2d" in o.name} == {
        ("aten::adaptive_max_pool2d_backward", "backward", "model.10.max_pool")
    }
    report = entry.audit(MODELS / "cbam-max.yaml", imgsz=64)  # through the public path
    assert {f.kernel for f in report.findings if f.breaks_determinism} == {"adaptive_max_pool2d_backward_cuda"}
    assert report.device == "fake-cuda"


def test_the_model_is_built_on_one_thread_and_the_count_put_back(monkeypatch: pytest.MonkeyPatch) -> None:
    before = torch.get_num_threads()

    def build(model: Any) -> Any:
        raise ValueError("boom")

    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)  # as on this 2-core machine
    calls: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    monkeypatch.setattr(entry, "load_model", build)
    with pytest.raises(ValueError, match="boom"):
        entry._load("yolov8n.yaml")
    assert calls == [1, 2]  # one thread for the build, the count put back on error too
    monkeypatch.undo()
    assert torch.get_num_threads() == before
