"""Deterministic adaptive pooling equals PyTorch's, forward and gradients, ties and NaN included."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from layer_helpers import check_matches, float_dtypes, make_input, patterns, seeds

from yolo_det.layers import _window_adjoint as W
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
    check_matches(
        lambda t: P.adaptive_avg_pool2d(t, out), lambda t: F.adaptive_avg_pool2d(t, out), [x], dtype, seed=seed
    )


@settings(max_examples=60, deadline=None)
@given(case=pool2d_case(), pattern=patterns, dtype=float_dtypes, seed=seeds)
def test_adaptive_max_pool2d_matches_torch(case, pattern, dtype, seed):
    shape, out = case
    x = make_input(pattern, shape, dtype, seed)
    check_matches(
        lambda t: P.adaptive_max_pool2d(t, out), lambda t: F.adaptive_max_pool2d(t, out), [x], dtype, seed=seed
    )
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
    check_matches(
        lambda t: P.adaptive_avg_pool1d(t, out), lambda t: F.adaptive_avg_pool1d(t, out), [x], dtype, seed=seed
    )
    check_matches(
        lambda t: P.adaptive_max_pool1d(t, out), lambda t: F.adaptive_max_pool1d(t, out), [x], dtype, seed=seed
    )
    y, idx = P.adaptive_max_pool1d(x, out, return_indices=True)
    assert torch.equal(idx, F.adaptive_max_pool1d(x, out, return_indices=True)[1])


@settings(max_examples=25, deadline=None)
@given(
    sizes=st.tuples(st.integers(1, 7), st.integers(1, 7), st.integers(1, 7)),
    data=st.data(),
    pattern=patterns,
    dtype=float_dtypes,
    seed=seeds,
)
def test_adaptive_avg_pool3d_matches_torch(sizes, data, pattern, dtype, seed):
    out = tuple(data.draw(axis_out(s)) for s in sizes)
    x = make_input(pattern, (2, 2) + sizes, dtype, seed)
    check_matches(
        lambda t: P.adaptive_avg_pool3d(t, out), lambda t: F.adaptive_avg_pool3d(t, out), [x], dtype, seed=seed
    )


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


# ----------------------------------------------------------------------------------------------------
# General windows: the native forward, the replaced backward
# ----------------------------------------------------------------------------------------------------

GENERAL = [
    ((2, 3, 20, 20), (3, 3)),
    ((2, 3, 40, 40), (5, 7)),
    ((1, 2, 7, 9), (4, 4)),
    ((2, 2, 5, 6), (9, 11)),
    ((2, 2, 13, 3), (6, 2)),
    ((3, 11, 10), (4, 3)),
]


def _max_grad(x: torch.Tensor, out, g: torch.Tensor, combine: bool) -> torch.Tensor:
    """The input gradient of yolo-det's max pooling through one backward path."""
    y, index = P.adaptive_max_pool2d(x, out, return_indices=True)
    h, w = x.shape[-2:]
    reach = (P._reach(P._windows(h, y.shape[-2])), P._reach(P._windows(w, y.shape[-1])))
    return P._max_input_grad(g, index, x.shape, reach, combine)


@pytest.mark.parametrize(("shape", "out"), GENERAL)
@pytest.mark.parametrize("pattern", ["normal", "ints", "relu", "const", "nan"])
@pytest.mark.parametrize("combine", [False, True])
def test_max_pool_general_windows_gradient_is_bit_identical(shape, out, pattern, combine):
    # Both backward paths (CPU scatter_add_; elsewhere duplicates summed then a plain scatter_) give
    # PyTorch's CPU gradient bit for bit in float64, ties (first maximum) and NaN (last NaN) included.
    if pattern == "nan":
        x = make_input("normal", shape, torch.float64, 1)
        x[torch.rand(shape, generator=torch.Generator().manual_seed(2)) < 0.1] = float("nan")
    else:
        x = make_input(pattern, shape, torch.float64, 1)
    ref = x.clone().requires_grad_()
    y = F.adaptive_max_pool2d(ref, out)
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    y.backward(g)
    assert torch.equal(_max_grad(x, out, g, combine), ref.grad)


def test_duplicate_totals_are_identical_within_each_group():
    # Outputs whose windows selected the same element carry bit-identical totals, so a plain scatter
    # writes the same value whichever write lands last (the construct behind CUDA determinism).
    x = torch.zeros(4, 3, 20, 20, dtype=torch.float32)  # one big tie: neighbouring windows share elements
    x[..., ::3, ::4] = 1.0
    _, index = P.adaptive_max_pool2d(x, (7, 9), return_indices=True)
    reach = (P._reach(P._windows(20, 7)), P._reach(P._windows(20, 9)))
    assert reach == (1, 1)
    g = torch.randn(index.shape, generator=torch.Generator().manual_seed(0))
    total = P._add_duplicates(g, index, reach)
    shared = 0
    for flat_i, flat_t in zip(index.reshape(-1, 63), total.reshape(-1, 63)):
        for v in flat_i.unique():
            group = flat_t[flat_i == v]
            assert torch.equal(group, group[:1].expand_as(group))
            shared += int(group.numel() > 1)
    assert shared > 0  # the input does make windows share their selected element
    # and the totals are the group sums, added in output order (what the CPU kernel accumulates)
    ref = torch.zeros(4 * 3, 400).scatter_add_(1, index.reshape(12, -1), g.reshape(12, -1))
    assert torch.equal(ref.gather(1, index.reshape(12, -1)), total.reshape(12, -1))


def test_reach_counts_overlapping_neighbours():
    assert P._reach(P._windows(20, 4)) == 0  # divisible: no overlap
    assert P._reach(P._windows(20, 3)) == 1
    assert P._reach(P._windows(5, 9)) == 2  # output larger than input: a position is in up to 3 windows
    assert P._reach(P._windows(1, 4)) == 3


@pytest.mark.parametrize(
    ("shape", "out"),
    [
        ((1, 2, 7, 9), (4, 4)),
        pytest.param((2, 1, 5, 6), (9, 11), marks=pytest.mark.slow),  # 99 outputs: more than 2 s
        ((1, 2, 10, 7), (3, 5)),
        ((2, 11, 10), (4, 3)),
    ],
)
def test_general_window_gradients_pass_gradcheck(shape, out):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(shape, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: P.adaptive_avg_pool2d(t, out), (x,))
    assert torch.autograd.gradgradcheck(lambda t: P.adaptive_avg_pool2d(t, out), (x,))
    assert torch.autograd.gradcheck(lambda t: P.adaptive_max_pool2d(t, out), (x,))
    assert torch.autograd.gradgradcheck(lambda t: P.adaptive_max_pool2d(t, out), (x,))


@pytest.mark.parametrize(("shape", "out"), GENERAL)
def test_general_window_average_matches_torch_exactly_forward(shape, out):
    # the forward is ATen's own kernel: bit-identical; the gradient agrees to float64 rounding
    x = make_input("normal", shape, torch.float32, 4)
    assert torch.equal(P.adaptive_avg_pool2d(x, out), F.adaptive_avg_pool2d(x, out))
    xd = x.double()
    check_matches(
        lambda t: P.adaptive_avg_pool2d(t, out), lambda t: F.adaptive_avg_pool2d(t, out), [xd], torch.float64, seed=0
    )


def test_average_gradient_works_in_batch_chunks():
    # large enough to be split into chunks: the same gradient as one piece (and as PyTorch)
    g = torch.Generator().manual_seed(6)
    x = torch.randn(16, 64, 40, 40, generator=g, dtype=torch.float64)
    grad = torch.randn(16, 64, 6, 6, generator=g, dtype=torch.float64)
    wins = (P._windows(40, 6), P._windows(40, 6))
    chunked = W._chunked_spread(grad * W._inverse_counts(wins, grad), wins, (40, 40))
    ref = x.clone().requires_grad_()
    F.adaptive_avg_pool2d(ref, 6).backward(grad)
    torch.testing.assert_close(chunked, ref.grad, rtol=0, atol=1e-15)
    assert chunked.numel() > W._CHUNK_MIN  # large enough to be split


@pytest.mark.parametrize(
    ("shape", "out", "n"),
    [((2, 16, 40, 40), 6, 2), ((1, 32, 20, 20), (3, 7), 2), ((2, 8, 13), 5, 1), ((3, 9, 11), (4, 4), 2)],
)
def test_banded_average_gradient_equals_window_spread_and_torch(shape, out, n):
    # the matrix-product backward (CPU, overlapping windows): PyTorch's gradient to float64 rounding,
    # and the gather/slice-add formulation's
    g = torch.Generator().manual_seed(7)
    x = torch.randn(shape, generator=g, dtype=torch.float64, requires_grad=True)
    pool = P.adaptive_avg_pool1d if n == 1 else P.adaptive_avg_pool2d
    native = F.adaptive_avg_pool1d if n == 1 else F.adaptive_avg_pool2d
    y = pool(x, out)
    grad = torch.randn(y.shape, generator=g, dtype=torch.float64)
    sizes = shape[-n:]
    wins = tuple(P._windows(s, o) for s, o in zip(sizes, y.shape[-n:]))
    scaled = grad * W._inverse_counts(wins, grad)
    assert W._banded_ok(grad, wins)
    banded = W._banded_spread(grad, wins, sizes)
    torch.testing.assert_close(banded, W._chunked_spread(scaled, wins, sizes), rtol=0, atol=1e-15)
    (ours,) = torch.autograd.grad(y, x, grad)
    ref = x.detach().clone().requires_grad_()
    native(ref, out).backward(grad)
    assert torch.equal(y, native(x, out))
    torch.testing.assert_close(ours, ref.grad, rtol=0, atol=1e-14)


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_non_finite_average_gradient_stays_in_its_windows(bad):
    # a matrix product would turn 0 * inf into NaN everywhere; a non-finite gradient takes the
    # gather path and reaches only the positions its window covers, like PyTorch's
    x = torch.randn(2, 3, 13, 11, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(2, 3, 4, 4, dtype=torch.float64)
    grad[1, 2, 1, 3] = bad
    wins = (P._windows(13, 4), P._windows(11, 4))
    assert not W._banded_ok(grad, wins)
    (ours,) = torch.autograd.grad(P.adaptive_avg_pool2d(x, 4), x, grad)
    ref = x.detach().clone().requires_grad_()
    F.adaptive_avg_pool2d(ref, 4).backward(grad)
    torch.testing.assert_close(ours, ref.grad, rtol=0, atol=1e-14, equal_nan=True)
    assert torch.isfinite(ours[0]).all()
    assert not torch.isfinite(ours[1, 2]).all()
