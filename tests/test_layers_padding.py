"""Deterministic reflection/replication padding equals PyTorch's, forward, backward and double backward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from layer_helpers import check_matches, float_dtypes, make_input, patterns, seeds

from yolo_det.layers import padding as P


@st.composite
def pad_case(draw: st.DrawFn) -> tuple[tuple[int, ...], list[int], str]:
    mode = draw(st.sampled_from(["reflect", "replicate"]))
    n = draw(st.integers(1, 3))
    spatial = [draw(st.integers(1, 7 if n < 3 else 5)) for _ in range(n)]
    lead = [draw(st.integers(1, 2)), draw(st.integers(1, 3))] if draw(st.booleans()) else [draw(st.integers(1, 3))]
    pads: list[int] = []
    for size in reversed(spatial):  # PyTorch lists the last axis first
        top = size - 1 if mode == "reflect" else 6
        left = draw(st.integers(-(size - 1) // 2, top))
        right = draw(st.integers(0, top))
        pads += [left, right]
    return tuple(lead + spatial), pads, mode


@settings(max_examples=80, deadline=None)
@given(case=pad_case(), pattern=patterns, dtype=float_dtypes, seed=seeds)
def test_pad_matches_torch(case, pattern, dtype, seed):
    shape, pads, mode = case
    x = make_input(pattern, shape, dtype, seed)
    # float32: the forward copies values (bit-exact); the backward adds at most a few border gradients
    # per element (replicate: one sum per border) in another order
    check_matches(lambda t: P.pad(t, pads, mode), lambda t: F.pad(t, pads, mode=mode), [x], dtype, seed=seed)
    assert torch.equal(P.pad(x, pads, mode), F.pad(x, pads, mode=mode))


@pytest.mark.parametrize("mode", ["reflect", "replicate"])
def test_double_backward(mode):
    x = torch.randn(2, 2, 4, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda t: P.pad(t, (3, 1, 2, 3), mode), (x,))


@pytest.mark.parametrize("mode", ["reflect", "replicate"])
def test_channels_last_layout_is_kept_like_torch(mode):
    x = torch.randn(2, 3, 5, 6).contiguous(memory_format=torch.channels_last)
    y, ref = P.pad(x, (1, 2, 3, 1), mode), F.pad(x, (1, 2, 3, 1), mode=mode)
    assert torch.equal(y, ref)
    assert y.stride() == ref.stride()


@pytest.mark.parametrize(("mode", "value"), [("constant", 2.5), ("circular", None)])
def test_other_modes_pass_through(mode, value):
    x = torch.randn(2, 3, 5, 6)
    assert torch.equal(P.pad(x, (1, 2, 1, 1), mode, value), F.pad(x, (1, 2, 1, 1), mode=mode, value=value))


@pytest.mark.parametrize(
    "args",
    [
        ((5, 0), "reflect", None),  # pad >= size
        ((1, 1, 1), "reflect", None),  # odd length
        ((1, 1), "reflect", 0.0),  # value with a non-constant mode
        ((1, 1, 1, 1, 1, 1, 1, 1), "replicate", None),  # 4 padded axes
    ],
)
def test_invalid_arguments_raise_like_torch(args):
    x = torch.randn(2, 3, 4, 5)
    pads, mode, value = args
    with pytest.raises((RuntimeError, ValueError, NotImplementedError)) as native:
        F.pad(x, pads, mode=mode, value=value)
    with pytest.raises(type(native.value)):
        P.pad(x, pads, mode, value)


@pytest.mark.parametrize(
    ("cls", "ref", "arg"),
    [
        (P.DetReflectionPad1d, torch.nn.ReflectionPad1d, 2),
        (P.DetReflectionPad2d, torch.nn.ReflectionPad2d, (1, 2, 0, 3)),
        (P.DetReflectionPad3d, torch.nn.ReflectionPad3d, 1),
        (P.DetReplicationPad1d, torch.nn.ReplicationPad1d, (0, 3)),
        (P.DetReplicationPad2d, torch.nn.ReplicationPad2d, 2),
        (P.DetReplicationPad3d, torch.nn.ReplicationPad3d, (1, 0, 2, 1, 0, 1)),
    ],
)
def test_modules_match_torch_modules(cls, ref, arg):
    det, native = cls(arg), ref(arg)
    nd = int(cls.__name__[-2])
    x = torch.randn((2, 3) + (4,) * nd, dtype=torch.float64)
    assert det.padding == native.padding
    assert torch.equal(det(x), native(x))


@pytest.mark.parametrize("mode", ["reflect", "replicate"])
@pytest.mark.parametrize("pads", [(2, 2, 1, 1), (3, 1, 0, 2), (6, 6, 5, 5), (1, 1, 1, 1, 1, 1)])
def test_adjoint_on_planes_of_realistic_size(mode, pads):
    # both sides of the innermost axis in one strided add, wide borders of outer axes, 3-D padding
    shape = (2, 3, 7, 12, 13) if len(pads) == 6 else (2, 3, 12, 13)
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    y, ref = P.pad(x, pads, mode), F.pad(x, pads, mode=mode)
    assert torch.equal(y, ref)
    g = torch.randn(ref.shape, dtype=torch.float64)
    (got,) = torch.autograd.grad(y, x, g)
    (want,) = torch.autograd.grad(ref, x, g)
    assert torch.allclose(got, want, rtol=0, atol=1e-13)
    assert not torch.allclose(got, F.pad(g, [-p for p in pads]))  # the borders were folded in
