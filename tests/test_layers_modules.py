"""The yolo-det modules are drop-ins: same constructor, attributes, repr and state as the torch module,
same outputs, channels_last and autocast behaviour."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import yolo_det.layers as L

# (yolo-det class, torch class, constructor args, constructor kwargs, input shape)
CASES = [
    (L.DetAdaptiveAvgPool1d, nn.AdaptiveAvgPool1d, (5,), {}, (2, 3, 13)),
    (L.DetAdaptiveAvgPool2d, nn.AdaptiveAvgPool2d, ((None, 1),), {}, (2, 3, 9, 11)),
    (L.DetAdaptiveAvgPool2d, nn.AdaptiveAvgPool2d, (3,), {}, (2, 3, 10, 11)),
    (L.DetAdaptiveAvgPool3d, nn.AdaptiveAvgPool3d, ((2, None, 3),), {}, (2, 3, 5, 6, 7)),
    (L.DetAdaptiveMaxPool1d, nn.AdaptiveMaxPool1d, (4,), {}, (2, 3, 13)),
    (L.DetAdaptiveMaxPool2d, nn.AdaptiveMaxPool2d, (3,), {}, (2, 3, 10, 11)),
    (L.DetAdaptiveMaxPool2d, nn.AdaptiveMaxPool2d, ((2, 5),), {"return_indices": True}, (2, 3, 7, 11)),
    (L.DetUpsample, nn.Upsample, (), {"scale_factor": 2, "mode": "bilinear", "align_corners": False}, (2, 3, 7, 9)),
    (L.DetUpsample, nn.Upsample, (), {"size": (5, 13), "mode": "bicubic", "align_corners": True}, (2, 3, 7, 9)),
    (L.DetUpsample, nn.Upsample, (), {"scale_factor": 1.5, "mode": "linear"}, (2, 3, 7)),
    (L.DetUpsamplingBilinear2d, nn.UpsamplingBilinear2d, (), {"scale_factor": 2}, (2, 3, 7, 9)),
    (L.DetReflectionPad1d, nn.ReflectionPad1d, (3,), {}, (2, 3, 7)),
    (L.DetReflectionPad2d, nn.ReflectionPad2d, ((1, 2, 3, 0),), {}, (2, 3, 7, 9)),
    (L.DetReflectionPad3d, nn.ReflectionPad3d, (1,), {}, (2, 3, 4, 5, 6)),
    (L.DetReplicationPad1d, nn.ReplicationPad1d, ((2, 0),), {}, (2, 3, 7)),
    (L.DetReplicationPad2d, nn.ReplicationPad2d, (2,), {}, (2, 3, 7, 9)),
    (L.DetReplicationPad3d, nn.ReplicationPad3d, ((1, 0, 2, 1, 0, 1),), {}, (2, 3, 4, 5, 6)),
]
IDS = [f"{c[0].__name__}-{i}" for i, c in enumerate(CASES)]


def _pair(case):
    det_cls, ref_cls, args, kwargs, shape = case
    return det_cls(*args, **kwargs), ref_cls(*args, **kwargs), shape


def _first(out):
    return out[0] if isinstance(out, tuple) else out


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_same_constructor_attributes_repr_and_state(case):
    det, ref, _ = _pair(case)
    assert isinstance(det, type(ref))  # a subclass: code that checks isinstance keeps working
    assert repr(det) == repr(ref).replace(type(ref).__name__, type(det).__name__, 1)
    public = {k: v for k, v in vars(ref).items() if not k.startswith("_")}
    if "name" in public:  # nn.Upsample records its own class name
        public["name"] = type(det).__name__
    assert {k: v for k, v in vars(det).items() if not k.startswith("_")} == public
    assert det.state_dict() == {} == ref.state_dict()
    det.load_state_dict(ref.state_dict(), strict=True)
    clone = copy.deepcopy(det)
    assert type(clone) is type(det)
    assert repr(clone) == repr(det)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_same_outputs_and_gradients(case):
    det, ref, shape = _pair(case)
    x = torch.randn(shape, dtype=torch.float64)
    xs = [x.clone().requires_grad_() for _ in range(2)]
    y, y_ref = det(xs[0]), ref(xs[1])
    if isinstance(y, tuple):
        assert torch.equal(y[1], y_ref[1])
    y, y_ref = _first(y), _first(y_ref)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=1e-10)
    g = torch.randn_like(y_ref)
    y.backward(g)
    y_ref.backward(g)
    torch.testing.assert_close(xs[0].grad, xs[1].grad, rtol=0, atol=1e-10)


@pytest.mark.parametrize(
    "case", [c for c in CASES if len(c[4]) == 4], ids=[i for i, c in zip(IDS, CASES) if len(c[4]) == 4]
)
def test_channels_last_input(case):
    det, ref, shape = _pair(case)
    x = torch.randn(shape, dtype=torch.float64)
    x_cl = x.contiguous(memory_format=torch.channels_last)
    y, y_ref = _first(det(x_cl)), _first(ref(x_cl))
    torch.testing.assert_close(y, _first(ref(x)), rtol=0, atol=1e-10)
    assert y.is_contiguous(memory_format=torch.channels_last) == y_ref.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("in_dtype", [torch.float32, torch.bfloat16])
def test_under_cpu_autocast(case, in_dtype):
    det, ref, shape = _pair(case)
    x = torch.randn(shape).to(in_dtype)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, y_ref = _first(det(x)), _first(ref(x))
    # the dtype the native op returns under autocast (float32 for ops on the CPU fp32 list, e.g. padding)
    assert y.dtype == y_ref.dtype
    torch.testing.assert_close(y.float(), y_ref.float(), rtol=1e-2, atol=1e-2)


def test_loss_modules_are_drop_ins():
    w = torch.rand(4)
    for det_cls, ref_cls, kwargs in [
        (L.DetCrossEntropyLoss, nn.CrossEntropyLoss, {"label_smoothing": 0.1}),
        (L.DetNLLLoss, nn.NLLLoss, {}),
    ]:
        det, ref = (
            det_cls(weight=w, ignore_index=2, reduction="sum", **kwargs),
            ref_cls(weight=w, ignore_index=2, reduction="sum", **kwargs),
        )
        assert isinstance(det, ref_cls)
        assert repr(det) == repr(ref).replace(ref_cls.__name__, det_cls.__name__, 1)
        assert det.state_dict().keys() == ref.state_dict().keys()
        x, t = torch.randn(2, 4, 5, 6), torch.randint(0, 4, (2, 5, 6))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y, y_ref = det(x.bfloat16(), t), ref(x.bfloat16(), t)
        assert y.dtype == y_ref.dtype
        torch.testing.assert_close(y, y_ref, rtol=1e-4, atol=1e-4)
