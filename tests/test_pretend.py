"""The audit's pretend CUDA device: the same trace as torch's FakeTensorMode, without torch._dynamo.

The audit traced on ``FakeTensorMode`` until it moved to :mod:`yolo_det.analysis.pretend`; the old engine stays
reachable (``_fake_trace(..., engine="torch-fake")``) so that these tests compare the two op by op: every aten
op the trace sees, forward and backward, with its module, its autograd node and the shape, strides, dtype and
device of what it returned, and then the findings.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from helpers import MODELS, subprocess_env
from yolo_det.analysis import pretend, pretend_shapes
from yolo_det.analysis.audit import entry
from yolo_det.analysis.audit import trace as trace_mod
from yolo_det.analysis.audit.match import _match
from yolo_det.analysis.optable import load_table, torch_version
from yolo_det.analysis.pretend import PretendDevice, PretendTensor
from yolo_det.analysis.tracing import any_fake, tensors
from yolo_det.core.profiles import load_profile


def _meta(out: Any) -> list[Any]:
    """What an op returned, as the trace's next ops see it."""
    found = [out] if isinstance(out, torch.Tensor) else tensors(out)
    facts: list[Any] = [
        (tuple(t.shape), t.stride(), t.storage_offset(), t.dtype, str(t.device), t.requires_grad) for t in found
    ]
    if not isinstance(out, (torch.Tensor, tuple, list)):
        facts.append(repr(out))
    return facts


def _arguments(args: Any) -> Any:
    if args is None:
        return None
    return {k: (tuple(v.shape), v.dtype, str(v.device)) if isinstance(v, torch.Tensor) else v for k, v in args.items()}


def _trace(
    monkeypatch: pytest.MonkeyPatch, model: Any, engine: str, *, imgsz: int, det: bool = True
) -> tuple[list[Any], list[Any], list[Any]]:
    """(every op and torch function the trace saw, its occurrences, its findings) under ``engine``."""
    seen: list[Any] = []
    dispatch, call = trace_mod._Trace.dispatch, trace_mod._Trace.call_function

    def on_op(self: Any, func: Any, args: Any, kwargs: Any) -> Any:
        out = dispatch(self, func, args, kwargs)
        module = self.module() if self.pass_ == "forward" else (self.node_meta or {}).get("module")
        seen.append(("op", self.pass_, str(func), module, self.node_name, _meta(out)))
        return out

    def on_call(self: Any, func: Any, args: Any, kwargs: Any) -> Any:
        out = call(self, func, args, kwargs)
        seen.append(("call", self.pass_, trace_mod.function_name(func), self.module()))
        return out

    loaded = entry._load(model)
    table = load_table(None)
    settings = load_profile("repro").train
    with monkeypatch.context() as patch:
        patch.setattr(trace_mod._Trace, "dispatch", on_op)
        patch.setattr(trace_mod._Trace, "call_function", on_call)
        trace = trace_mod._fake_trace(loaded, table, imgsz=imgsz, batch=2, forward_det=det, engine=engine)
    occurrences = [
        (o.kind, o.name, o.overload, o.pass_, o.module, o.node, o.call, o.native, o.forward_det, _arguments(o.args))
        for o in trace.occurrences
    ]
    findings = [f.to_dict() for f in _match(trace, table, torch_version(), loaded, settings)]
    return seen, occurrences + [("notes", trace.notes), ("counts", dict(trace.counts))], findings


# ---------------------------------------------------------------------------------------------------------
# old against new, op by op


@pytest.mark.parametrize(
    ("name", "det"),
    [
        ("cbam-max", True),
        ("attention-mix", True),
        ("attention-mix", False),
        ("gridsample-up", True),
        ("coordatt", True),
        ("bicubic-up", True),
    ],
)
def test_the_trace_is_fake_cudas_op_by_op(monkeypatch: pytest.MonkeyPatch, name: str, det: bool) -> None:
    old = _trace(monkeypatch, MODELS / f"{name}.yaml", "torch-fake", imgsz=64, det=det)
    new = _trace(monkeypatch, MODELS / f"{name}.yaml", "pretend", imgsz=64, det=det)
    assert len(new[0]) > 2000  # forward and backward of a whole detector
    assert new[0] == old[0]
    assert new[1] == old[1]
    assert new[2] == old[2]


def test_the_non_deterministic_layers_are_still_found(monkeypatch: pytest.MonkeyPatch) -> None:
    _ops, _occurrences, findings = _trace(monkeypatch, MODELS / "cbam-max.yaml", "pretend", imgsz=64)
    assert {f["kernel"] for f in findings if f["breaks_determinism"]} == {"adaptive_max_pool2d_backward_cuda"}
    _ops, _occurrences, findings = _trace(monkeypatch, MODELS / "attention-mix.yaml", "pretend", imgsz=64)
    assert {f["layer_class"] for f in findings if f["breaks_determinism"]} == {"CBAMMax", "CoordAtt"}
    report = entry.audit(MODELS / "cbam-max.yaml", imgsz=64)  # the default engine, through the public path
    assert not report.ok
    assert report.device == "fake-cuda"


class _Layouts(nn.Module):
    """Device-dependent layouts: cuDNN picks channels-last outputs for channels-last inputs (the meta kernel
    does not), a transposed convolution, a 1-D one, batch norm, views with size-1 dimensions, a CPU index,
    a scalar made from a Python number and read back with ``.item()``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.up = nn.ConvTranspose2d(8, 4, 2, stride=2)
        self.conv1d = nn.Conv1d(4, 4, 3, padding=1)
        self.norm = nn.LayerNorm(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.silu(self.bn(self.conv(x.to(memory_format=torch.channels_last))))
        z = self.up(y)
        k = int((torch.tensor(2.0) * 3).item())
        w = self.conv1d(z.flatten(2)).view(z.shape[0], 4, -1, 1)
        picked = z.flatten(2)[:, :, torch.tensor([0, 2, 5])]
        t = self.norm(z.permute(0, 2, 3, 1))
        return torch.cat([z, z * k], 1).sum() + w.sum() + picked.sum() + t.sum()


@pytest.mark.parametrize("det", [True, False])
def test_device_dependent_layouts_match(monkeypatch: pytest.MonkeyPatch, det: bool) -> None:
    old = _trace(monkeypatch, _Layouts(), "torch-fake", imgsz=16, det=det)
    new = _trace(monkeypatch, _Layouts(), "pretend", imgsz=16, det=det)
    assert new == old


def test_the_comparison_sees_a_layout_difference(monkeypatch: pytest.MonkeyPatch) -> None:
    """Control: without the convolution backend's layout the pretend trace differs, and the comparison says so."""
    old = _trace(monkeypatch, _Layouts(), "torch-fake", imgsz=16)
    monkeypatch.setattr(pretend, "conv_memory_format", lambda func, args, kwargs: None)
    new = _trace(monkeypatch, _Layouts(), "pretend", imgsz=16)
    assert [op[2] for op in new[0]][:5] == [op[2] for op in old[0]][:5]
    assert new[0] != old[0]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "imgsz"),
    [("yolov8n.yaml", 64), ("yolov8n-obb.yaml", 64), ("rtdetr-l.yaml", 320), ("yolov8s-world.yaml", 320)],
)
def test_stock_models_trace_the_same(monkeypatch: pytest.MonkeyPatch, name: str, imgsz: int) -> None:
    old = _trace(monkeypatch, name, "torch-fake", imgsz=imgsz)
    new = _trace(monkeypatch, name, "pretend", imgsz=imgsz)
    assert new == old


# ---------------------------------------------------------------------------------------------------------
# the stand-ins against torch's own kernels


def _ops_under(factory: Any) -> list[Any]:
    with PretendDevice():
        return [_meta(out) for out in factory()]


def _stand_in_cases() -> list[Any]:
    cuda = "cuda"
    x = torch.empty(2, 8, 5, 6, device=cuda)
    last = x.contiguous(memory_format=torch.channels_last)
    half = torch.empty(2, 8, 5, 6, device=cuda, dtype=torch.float16)
    sliced = torch.empty(2, 16, 5, 6, device=cuda)[:, :8]
    w = torch.empty(8, device=cuda)
    out = []
    for a in (x, last, half, sliced, x.permute(0, 2, 3, 1)):
        b = a[:, :1] if a.dim() == 4 else a
        out += [a + b, a * 2.5, torch.sigmoid(a), F.silu(a), a - 1, 1 - a, a / b, a**2, torch.rsqrt(a)]
        out += [F.hardswish(a), F.gelu(a), F.leaky_relu(a), torch.relu(a), a.clone(), torch.cat([a, a], 1)]
    out += [torch.cat([x, last], 1), torch.cat([x, x.flatten(2).unsqueeze(-1).view(2, 8, 5, 6)], 2)]
    out += [x.clone(memory_format=torch.channels_last), x.new_empty(3).copy_(torch.empty(3, device=cuda))]
    for a, train in ((x, True), (x, False), (last, True), (half, True)):
        mean, var = torch.empty(8, device=cuda), torch.empty(8, device=cuda)
        weight = w if a.dtype == torch.float32 else w.float()
        bn = torch.ops.aten.cudnn_batch_norm(a, weight, weight, mean, var, train, 0.1, 1e-5)
        out.append(bn)
        if train:  # autograd runs cuDNN's backward after a training forward only
            grads = torch.ops.aten.cudnn_batch_norm_backward(a, a.clone(), weight, mean, var, bn[1], bn[2], 1e-5, bn[3])
            out.append(grads)
    return out


def test_the_stand_ins_give_what_torchs_kernels_give(monkeypatch: pytest.MonkeyPatch) -> None:
    with_stand_ins = _ops_under(_stand_in_cases)
    monkeypatch.setattr(pretend, "stand_in", lambda func, args, kwargs: None)  # every op through torch's kernels
    without = _ops_under(_stand_in_cases)
    assert len(with_stand_ins) > 80
    assert with_stand_ins == without


def test_the_stand_in_comparison_sees_a_wrong_stand_in(monkeypatch: pytest.MonkeyPatch) -> None:
    """Control: a stand-in that returns contiguous strides for every elementwise op is caught."""
    reference = _ops_under(_stand_in_cases)

    def contiguous(args: Any, kwargs: Any) -> Any:
        t = next(a for a in args if isinstance(a, torch.Tensor))
        return torch.empty(t.shape, dtype=t.dtype, device="meta")

    monkeypatch.setattr(pretend_shapes, "_pointwise", contiguous)
    assert _ops_under(_stand_in_cases) != reference


# ---------------------------------------------------------------------------------------------------------
# the tensors and the mode


def test_pretend_tensors_say_cuda_and_hold_no_data() -> None:
    before = torch._C._only_lift_cpu_tensors()
    with PretendDevice():
        x = torch.empty(2, 3, device="cuda", requires_grad=True)
        y = (x * 2).sum()
        scalar = torch.tensor(2.0)
        index = torch.tensor([0, 1])
        assert isinstance(x, PretendTensor)
        assert isinstance(y, PretendTensor)
        assert (x.device, x.is_cuda, y.device) == (torch.device("cuda", 0), True, torch.device("cuda", 0))
        assert y.grad_fn is not None
        assert (scalar * 3).item() == 6.0  # a number's value is kept, as for real
        assert x[:, index].shape == (2, 2)  # CPU indices into a CUDA tensor, as CUDA allows
        assert any_fake((y,), {})
        with pytest.raises(RuntimeError, match="same device"):
            x + torch.empty(2, 3)  # a CPU tensor that is no scalar, as CUDA refuses it
        with pytest.raises(RuntimeError):
            y.item()  # a computed value is not known
    assert torch._C._only_lift_cpu_tensors() == before
    assert not torch.cuda.is_initialized()
    assert not any_fake((torch.empty(1),), {})


def test_the_mode_puts_torchs_switch_back_on_error() -> None:
    before = torch._C._only_lift_cpu_tensors()
    with pytest.raises(ValueError, match="boom"), PretendDevice():
        assert torch._C._only_lift_cpu_tensors()
        raise ValueError("boom")
    assert torch._C._only_lift_cpu_tensors() == before


@pytest.mark.slow
def test_an_audit_imports_neither_dynamo_nor_inductor() -> None:
    """What made a fresh audit slow: torch._dynamo (FakeTensorMode, the dispatch hooks, the flag's setter)."""
    code = (
        "import sys\n"
        "from yolo_det.analysis.audit import entry, trace\n"
        "trace._fake_trace.__kwdefaults__['engine'] = sys.argv[1]\n"
        "report = entry.audit('yolov8n.yaml', imgsz=64)\n"
        "assert report.ok and report.stats['ops'] > 2000, report.stats\n"
        "print(sorted(m for m in ('torch._dynamo', 'torch._inductor.config') if m in sys.modules))\n"
    )
    found = {}
    for engine in ("pretend", "torch-fake"):
        done = subprocess.run(
            [sys.executable, "-c", code, engine], env=subprocess_env(), capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, done.stderr[-2000:]
        found[engine] = done.stdout.strip().splitlines()[-1]
    assert found["pretend"] == "[]"
    assert "torch._dynamo" in found["torch-fake"]  # control: the old engine imports it


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


def test_an_unknown_engine_is_refused() -> None:
    with pytest.raises(ValueError, match="engine must be 'pretend' or 'torch-fake'"):
        trace_mod._device_mode("gpu")
