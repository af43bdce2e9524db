"""Deterministic interpolate/Upsample equals PyTorch's for every mode, size and scale semantics."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from layer_helpers import check_matches, float_dtypes, make_input, patterns, seeds

from yolo_det.layers import upsample as U

SCALES = st.sampled_from([0.25, 0.3, 0.5, 0.6, 0.77, 1.0, 1.3, 1.5, 2.0, 2.5, 3.0]) | st.floats(0.2, 3.5)
HAS_LANCZOS = "lanczos" in (F.interpolate.__doc__ or "")


@st.composite
def interp_case(draw: st.DrawFn) -> tuple[tuple[int, ...], dict]:
    mode = draw(
        st.sampled_from(["linear", "bilinear", "bicubic", "trilinear", "area"] + (["lanczos"] if HAS_LANCZOS else []))
    )
    nd = {"linear": 1, "bilinear": 2, "bicubic": 2, "trilinear": 3, "lanczos": 2}.get(mode) or draw(st.integers(1, 3))
    top = 7 if nd == 3 else 14
    spatial = tuple(draw(st.integers(1, top)) for _ in range(nd))
    shape = (draw(st.integers(1, 2)), draw(st.integers(1, 3))) + spatial
    kwargs: dict = {"mode": mode}
    if mode == "lanczos":
        kwargs["antialias"] = True
    elif mode in ("bilinear", "bicubic"):
        kwargs["antialias"] = draw(st.booleans())
    if mode not in ("area", "lanczos"):
        kwargs["align_corners"] = draw(st.sampled_from([None, False, True]))
    if draw(st.booleans()):
        sizes = [draw(st.integers(1, 2 * top)) for _ in range(nd)]
        kwargs["size"] = sizes[0] if len(set(sizes)) == 1 and draw(st.booleans()) else sizes
    else:
        scales = [draw(SCALES) for _ in range(nd)]
        # every output length must be at least 1
        scales = [max(s, 1.0 / n + 1e-3) for s, n in zip(scales, spatial)]
        kwargs["scale_factor"] = scales[0] if len(set(scales)) == 1 and draw(st.booleans()) else scales
        kwargs["recompute_scale_factor"] = draw(st.sampled_from([None, False, True]))
    return shape, kwargs


def _references(shape: tuple[int, ...], kwargs: dict):
    """The native op to compare with: ``(forward reference, gradient reference or None)``.

    PyTorch's CPU antialias kernel has two defects that the separable definition (and our maps) do
    not share; each is pinned by a test below:

    * with an output width of 1 the contiguous forward is wrong: the reference then runs on a
      channels_last copy (with the channels doubled, so that layout is unambiguous even for C == 1);
    * the backward ignores a ``scale_factor`` passed to the kernel (it uses ``in/out`` sizes), so its
      gradient is not the derivative of its forward: then no gradient reference is returned and the
      test checks our gradient with ``gradcheck`` (the exact derivative of our forward, which equals
      PyTorch's forward).
    """
    if not kwargs.get("antialias"):

        def native(t: torch.Tensor) -> torch.Tensor:
            return F.interpolate(t, **kwargs)

        # PyTorch's CPU backward can also disagree with its own forward without antialias (a passed
        # scale_factor on an axis of size 1, for bicubic): compare gradients only where PyTorch's are right
        return native, (native if _gradient_is_derivative(native, shape) else None)
    out_w = F.interpolate(torch.zeros(shape, dtype=torch.float64), **kwargs).shape[-1]
    layout = torch.channels_last if out_w == 1 else torch.contiguous_format

    def doubled(t: torch.Tensor) -> torch.Tensor:
        c = t.shape[1]
        return F.interpolate(torch.cat([t, t], 1).contiguous(memory_format=layout), **kwargs)[:, :c]

    scales_passed = "scale_factor" in kwargs and not kwargs.get("recompute_scale_factor")
    return doubled, (None if scales_passed or out_w == 1 else doubled)


def _gradient_is_derivative(fn, shape: tuple[int, ...]) -> bool:
    if torch.Size(shape).numel() > 64:  # gradcheck cost; the defect needs an axis of size 1 anyway
        return True
    probe = torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).requires_grad_()
    return torch.autograd.gradcheck(fn, (probe,), raise_exception=False)


@settings(max_examples=80, deadline=None)
@given(case=interp_case(), pattern=patterns, dtype=float_dtypes, seed=seeds)
def test_interpolate_matches_torch(case, pattern, dtype, seed):
    shape, kwargs = case
    x = make_input(pattern, shape, dtype, seed)
    forward_ref, grad_ref = _references(shape, kwargs)

    def ours(t: torch.Tensor) -> torch.Tensor:
        return U.interpolate(t, **kwargs)

    # float32: PyTorch's kernel computes source coordinates in float32 (error ~ index * eps), ours uses
    # float64 weights rounded once; a few ulps either way
    if grad_ref is not None:
        check_matches(ours, grad_ref, [x], dtype, seed=seed, ulps=8)
        return
    check_matches(ours, forward_ref, [x], dtype, seed=seed, ulps=8, grad_mask=[False])
    if dtype == torch.float64 and x.numel() <= 64:
        assert torch.autograd.gradcheck(ours, (x.clone().requires_grad_(),), raise_exception=False)


def test_bicubic_gradient_is_the_derivative_where_pytorchs_is_not():
    # (1, 2) with scale (1.001, 1.3): PyTorch's CPU bicubic backward is not the derivative of its forward
    x = torch.randn(1, 1, 1, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).requires_grad_()
    kwargs = {"scale_factor": [1.001, 1.3], "mode": "bicubic"}

    def native(t):
        return F.interpolate(t, **kwargs)

    def ours(t):
        return U.interpolate(t, **kwargs)

    assert not torch.autograd.gradcheck(native, (x,), raise_exception=False)
    torch.testing.assert_close(ours(x), native(x), rtol=0, atol=1e-12)
    assert torch.autograd.gradcheck(ours, (x,), raise_exception=False)


def test_antialias_gradient_is_the_derivative_when_a_scale_is_passed():
    # (2, 2) -> (2, 2) with scale 1.25 along W: the forward uses 1/1.25, PyTorch's CPU backward uses 2/2
    x = torch.randn(2, 2, 2, 2, dtype=torch.float64, requires_grad=True)
    kwargs = {"scale_factor": (1.0, 1.25), "mode": "bilinear", "antialias": True}
    torch.testing.assert_close(U.interpolate(x, **kwargs), F.interpolate(x, **kwargs), rtol=0, atol=1e-12)
    assert torch.autograd.gradcheck(lambda t: U.interpolate(t, **kwargs), (x,))
    assert not torch.autograd.gradcheck(lambda t: F.interpolate(t, **kwargs), (x,), raise_exception=False)


def test_width_one_antialias_follows_the_separable_definition():
    # PyTorch's CPU antialias kernel mishandles contiguous input when the output width is 1; the
    # correct value is the height-only resampling (what its channels_last path and our maps give)
    x = torch.randn(2, 3, 5, 3, dtype=torch.float64)
    kwargs = {"scale_factor": 0.5, "mode": "bilinear", "antialias": True}
    expected = F.interpolate(x.contiguous(memory_format=torch.channels_last), **kwargs)
    # the same resampling, one axis at a time, never producing a width-1 output
    rows = F.interpolate(x, scale_factor=(0.5, 1.0), mode="bilinear", antialias=True)
    separable = F.interpolate(rows.transpose(2, 3), scale_factor=(0.5, 1.0), mode="bilinear", antialias=True).transpose(
        2, 3
    )
    torch.testing.assert_close(expected, separable, rtol=0, atol=1e-12)
    torch.testing.assert_close(U.interpolate(x, **kwargs), separable, rtol=0, atol=1e-12)
    assert float((F.interpolate(x, **kwargs) - separable).abs().max()) > 1e-3  # the kernel's bug


@pytest.mark.parametrize("mode", ["nearest", "nearest-exact"])
def test_nearest_modes_pass_through(mode):
    x = torch.randn(2, 3, 5, 7)
    assert torch.equal(U.interpolate(x, scale_factor=2, mode=mode), F.interpolate(x, scale_factor=2, mode=mode))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"scale_factor": 2, "mode": "area", "align_corners": True},
        {"size": 4, "scale_factor": 2, "mode": "bilinear"},
        {"mode": "bilinear"},
        {"size": 4, "mode": "bilinear", "recompute_scale_factor": True},
        {"size": 4, "mode": "linear"},
        {"size": (4, 4, 4), "mode": "bilinear"},
        {"scale_factor": 2, "mode": "trilinear"},
        {"scale_factor": 2, "mode": "bicubic", "antialias": True, "align_corners": True, "size": 3},
    ],
)
def test_invalid_arguments_raise_like_torch(kwargs):
    x = torch.randn(1, 2, 4, 4)
    with pytest.raises((ValueError, NotImplementedError, TypeError, RuntimeError)) as native:
        F.interpolate(x, **kwargs)
    with pytest.raises(type(native.value)):
        U.interpolate(x, **kwargs)


def test_half_precision_is_computed_in_float32():
    x = torch.randn(2, 3, 9, 11, dtype=torch.float64)
    for dtype in (torch.bfloat16, torch.float16):
        xs = x.to(dtype)
        exact = F.interpolate(xs.double(), scale_factor=1.7, mode="bicubic")
        y = U.interpolate(xs, scale_factor=1.7, mode="bicubic")
        assert y.dtype == dtype
        # one rounding of the exact result (float32 accumulation adds nothing visible at 16 bits)
        assert float((y.double() - exact).abs().max()) <= torch.finfo(dtype).eps * float(exact.abs().max())


def test_module_forward_and_bilinear_alias():
    x = torch.randn(2, 3, 6, 5, dtype=torch.float64)
    for det, ref in [
        (
            U.DetUpsample(scale_factor=1.5, mode="bicubic", align_corners=True),
            torch.nn.Upsample(scale_factor=1.5, mode="bicubic", align_corners=True),
        ),
        (U.DetUpsample(size=(4, 9), mode="bilinear"), torch.nn.Upsample(size=(4, 9), mode="bilinear")),
        (U.DetUpsamplingBilinear2d(scale_factor=2), torch.nn.UpsamplingBilinear2d(scale_factor=2)),
    ]:
        torch.testing.assert_close(det(x), ref(x), rtol=0, atol=1e-12)
