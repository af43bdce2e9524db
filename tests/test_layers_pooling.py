"""Deterministic adaptive pooling equals PyTorch's, forward and gradients, ties and NaN included."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from layer_helpers import check_matches, float_dtypes, make_input, patterns, seeds

from yolo_det.layers import pooling as P


@st.composite
def axis_out(draw: st.DrawFn, size: int) -> int | None:
    """An output size for an axis of ``size``: global, keep (None), a divisor, or any size."""
    kind = draw(st.sampled_from(["one", "none", "divisor", "any"]))
    if kind == "one":
        return 1
    if kind == "none":
        return None
    if kind == "divisor":
        return draw(st.sampled_from([d for d in range(1, size + 1) if size % d == 0]))
    return draw(st.integers(1, size + 3))


@st.composite
def pool2d_case(draw: st.DrawFn) -> tuple[tuple[int, ...], object]:
    batched = draw(st.booleans())
    h, w = draw(st.integers(1, 13)), draw(st.integers(1, 13))
    shape = ((draw(st.integers(1, 2)),) if batched else ()) + (draw(st.integers(1, 3)), h, w)
    oh, ow = draw(axis_out(h)), draw(axis_out(w))
    out = oh if oh == ow and oh is not None and draw(st.booleans()) else (oh, ow)
    return shape, out


@settings(max_examples=60, deadline=None)
@given(case=pool2d_case(), pattern=patterns, dtype=float_dtypes, seed=seeds)
def test_adaptive_avg_pool2d_matches_torch(case, pattern, dtype, seed):
    shape, out = case
    x = make_input(pattern, shape, dtype, seed)
    check_matches(lambda t: P.adaptive_avg_pool2d(t, out), lambda t: F.adaptive_avg_pool2d(t, out), [x], dtype,
                  seed=seed)


@settings(max_examples=60, deadline=None)
@given(case=pool2d_case(), pattern=patterns, dtype=float_dtypes, seed=seeds)
def test_adaptive_max_pool2d_matches_torch(case, pattern, dtype, seed):
    shape, out = case
    x = make_input(pattern, shape, dtype, seed)
    check_matches(lambda t: P.adaptive_max_pool2d(t, out), lambda t: F.adaptive_max_pool2d(t, out), [x], dtype,
                  seed=seed)
    # max pooling copies values: forward and indices are bit-identical in every dtype
    y, idx = P.adaptive_max_pool2d(x, out, return_indices=True)
    y_ref, idx_ref = F.adaptive_max_pool2d(x, out, return_indices=True)
    assert torch.equal(y, y_ref)
    assert torch.equal(idx, idx_ref)


@settings(max_examples=40, deadline=None)
@given(length=st.integers(1, 20), data=st.data(), pattern=patterns, dtype=float_dtypes, seed=seeds)
def test_adaptive_pool1d_matches_torch(length, data, pattern, dtype, seed):
    out = data.draw(axis_out(length).filter(lambda o: o is not None))
    x = make_input(pattern, (2, 3, length), dtype, seed)
    check_matches(lambda t: P.adaptive_avg_pool1d(t, out), lambda t: F.adaptive_avg_pool1d(t, out), [x], dtype,
                  seed=seed)
    check_matches(lambda t: P.adaptive_max_pool1d(t, out), lambda t: F.adaptive_max_pool1d(t, out), [x], dtype,
                  seed=seed)
    y, idx = P.adaptive_max_pool1d(x, out, return_indices=True)
    assert torch.equal(idx, F.adaptive_max_pool1d(x, out, return_indices=True)[1])


@settings(max_examples=25, deadline=None)
@given(sizes=st.tuples(st.integers(1, 7), st.integers(1, 7), st.integers(1, 7)), data=st.data(), pattern=patterns,
       dtype=float_dtypes, seed=seeds)
def test_adaptive_avg_pool3d_matches_torch(sizes, data, pattern, dtype, seed):
    out = tuple(data.draw(axis_out(s)) for s in sizes)
    x = make_input(pattern, (2, 2) + sizes, dtype, seed)
    check_matches(lambda t: P.adaptive_avg_pool3d(t, out), lambda t: F.adaptive_avg_pool3d(t, out), [x], dtype,
                  seed=seed)


@pytest.mark.parametrize("out", [1, (2, 2), (3, 3)])
def test_max_pool_sends_tied_gradient_to_first_maximum(out):
    # An all-equal window: the whole gradient of an output goes to the window's first element in
    # row-major order (what the CUDA kernel does), not split like amax would.
    x = torch.zeros(1, 1, 6, 6, dtype=torch.float64, requires_grad=True)
    P.adaptive_max_pool2d(x, out).sum().backward()
    outs = (out, out) if isinstance(out, int) else out
    expected = torch.zeros(6, 6, dtype=torch.float64)
    for i in range(outs[0]):
        for j in range(outs[1]):
            expected[(i * 6) // outs[0], (j * 6) // outs[1]] += 1.0
    assert torch.equal(x.grad[0, 0], expected)
    split = torch.zeros(1, 1, 6, 6, dtype=torch.float64, requires_grad=True)
    split.amax((2, 3)).sum().backward()
    assert int((split.grad != 0).sum()) == 36  # the amax alternative would split it


@pytest.mark.parametrize("out", [1, (2, 3), (4, 4), (5, 3)])
def test_max_pool_nan_like_torch(out):
    # a NaN wins over numbers and, among NaNs, the last one in scan order is selected (CPU and CUDA kernels)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 7, 9, generator=g, dtype=torch.float64)
    x[torch.rand(x.shape, generator=g) < 0.15] = float("nan")
    y, idx = P.adaptive_max_pool2d(x, out, return_indices=True)
    y_ref, idx_ref = F.adaptive_max_pool2d(x, out, return_indices=True)
    assert torch.equal(idx, idx_ref)
    torch.testing.assert_close(y, y_ref, equal_nan=True, rtol=0, atol=0)
    xs = [x.clone().requires_grad_() for _ in range(2)]
    P.adaptive_max_pool2d(xs[0], out).sum().backward()
    F.adaptive_max_pool2d(xs[1], out).sum().backward()
    assert torch.equal(xs[0].grad, xs[1].grad)


def test_half_precision_inputs_are_averaged_in_float32():
    x = torch.randn(2, 3, 11, 13, dtype=torch.float64)
    for dtype in (torch.bfloat16, torch.float16):
        exact = F.adaptive_avg_pool2d(x.to(dtype).double(), (5, 4))
        y = P.adaptive_avg_pool2d(x.to(dtype), (5, 4))
        assert y.dtype == dtype
        # one rounding of the exact average to the 16-bit type: within half an ulp
        assert float((y.double() - exact).abs().max()) <= torch.finfo(dtype).eps * float(exact.abs().max())


def test_invalid_arguments_raise_torch_errors():
    x = torch.randn(2, 3, 4, 4)
    for fn, native in [(P.adaptive_avg_pool2d, F.adaptive_avg_pool2d), (P.adaptive_max_pool2d, F.adaptive_max_pool2d)]:
        for bad in [(1, 2, 3), (-1, 2)]:
            with pytest.raises(RuntimeError):
                native(x, bad)
            with pytest.raises(RuntimeError):
                fn(x, bad)
        assert fn(x, 0).shape == native(x, 0).shape == (2, 3, 0, 0)
