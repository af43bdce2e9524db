"""Deterministic bilinear grid_sample equals PyTorch's, with gradients for input and grid."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from layer_helpers import check_matches, float_dtypes, make_input, patterns, seeds

from yolo_det.core.errors import YoloDetError
from yolo_det.layers.grid_sample import DetGridSample, grid_sample


@st.composite
def grid_case(draw: st.DrawFn) -> tuple[tuple[int, ...], torch.Tensor]:
    n, c = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    h, w = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    ho, wo = draw(st.integers(1, 6)), draw(st.integers(1, 6))
    seed = draw(seeds)
    gen = torch.Generator().manual_seed(seed)
    grid = torch.rand(n, ho, wo, 2, generator=gen, dtype=torch.float64) * 3.2 - 1.6
    # some points exactly on the edges, on pixel centres and on the image border of either convention
    special = torch.tensor([-1.0, 1.0, 0.0, -1.0 + 1.0 / w, 1.0 - 1.0 / h, -1.0 - 2.0 / w, 3.0])
    mask = torch.rand(grid.shape, generator=gen) < draw(st.sampled_from([0.0, 0.3]))
    picks = special[torch.randint(0, len(special), grid.shape, generator=gen)].to(torch.float64)
    grid = torch.where(mask, picks, grid)
    return (n, c, h, w), grid


@settings(max_examples=80, deadline=None)
@given(
    case=grid_case(),
    padding_mode=st.sampled_from(["zeros", "border", "reflection"]),
    align_corners=st.booleans(),
    pattern=patterns,
    dtype=float_dtypes,
    seed=seeds,
)
def test_grid_sample_matches_torch(case, padding_mode, align_corners, pattern, dtype, seed):
    shape, grid = case
    x = make_input(pattern, shape, dtype, seed)

    def native(t: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        return F.grid_sample(t, g, padding_mode=padding_mode, align_corners=align_corners)

    def ours(t: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        return grid_sample(t, g, padding_mode=padding_mode, align_corners=align_corners)

    def ours_rows(t: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        # the accelerator backward (index_put over rows), which CPU tensors do not take by default
        return DetGridSample.apply(t, g, padding_mode, align_corners, True)

    # float32: the grid gradient multiplies coordinate derivatives up to W/2 by products of sampled
    # values, and both implementations round the source coordinates; a few ulps of the largest value
    check_matches(ours, native, [x, grid.to(dtype)], dtype, seed=seed, ulps=16)
    check_matches(ours_rows, native, [x, grid.to(dtype)], dtype, seed=seed, ulps=16)


def test_border_points_get_no_grid_gradient_like_aten():
    # a coordinate exactly on the border counts as clipped: zero grid gradient, as in ATen
    x = torch.randn(1, 2, 4, 5, dtype=torch.float64)
    grid = torch.tensor([[[[-1.0, 0.3], [1.0, -0.2], [1.4, 1.0], [-1.7, -1.0]]]], dtype=torch.float64)
    for padding_mode in ("border", "reflection"):
        g1 = grid.clone().requires_grad_()
        g2 = grid.clone().requires_grad_()
        grid_sample(x, g1, padding_mode=padding_mode, align_corners=True).sum().backward()
        F.grid_sample(x, g2, padding_mode=padding_mode, align_corners=True).sum().backward()
        torch.testing.assert_close(g1.grad, g2.grad, rtol=0, atol=1e-12)
        # x = -1 and x = 1 (and y = +-1) land on the border in both modes; 1.4 and -1.7 only under border
        zero = g1.grad[0, 0] == 0
        assert zero[:2, 0].all()
        assert zero[2:, 1].all()
        assert bool(zero[2:, 0].all()) == (padding_mode == "border")


def test_only_grid_requires_grad():
    x = torch.randn(2, 3, 6, 7, dtype=torch.float64)
    grid = (torch.rand(2, 4, 4, 2, dtype=torch.float64) * 2 - 1).requires_grad_()
    grid_sample(x, grid, align_corners=False).sum().backward()
    ref = grid.detach().clone().requires_grad_()
    F.grid_sample(x, ref, align_corners=False).sum().backward()
    torch.testing.assert_close(grid.grad, ref.grad, rtol=0, atol=1e-12)


def test_channels_last_input():
    x = torch.randn(2, 3, 6, 7, dtype=torch.float64)
    grid = torch.rand(2, 5, 4, 2, dtype=torch.float64) * 2 - 1
    y = grid_sample(x.contiguous(memory_format=torch.channels_last), grid, align_corners=False)
    torch.testing.assert_close(y, F.grid_sample(x, grid, align_corners=False), rtol=0, atol=1e-12)


@pytest.mark.parametrize("mode", ["nearest", "bicubic"])
def test_other_modes_raise_a_clear_error(mode):
    x = torch.randn(1, 1, 4, 4)
    grid = torch.zeros(1, 2, 2, 2)
    with pytest.raises(YoloDetError, match="bilinear"):
        grid_sample(x, grid, mode=mode, align_corners=False)
    with pytest.raises(YoloDetError, match="4-D"):
        grid_sample(torch.randn(1, 1, 2, 4, 4), torch.zeros(1, 2, 2, 2, 3), align_corners=False)


def test_bad_arguments_raise_torch_errors_and_default_warns():
    x = torch.randn(1, 1, 4, 4)
    with pytest.raises(RuntimeError):
        grid_sample(x, torch.zeros(1, 2, 2, 2, dtype=torch.float64), align_corners=False)  # dtype mismatch
    with pytest.raises(ValueError):
        grid_sample(x, torch.zeros(1, 2, 2, 2), padding_mode="wrap", align_corners=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        grid_sample(x, torch.zeros(1, 2, 2, 2))
    assert any("align_corners" in str(w.message) for w in caught)


def test_non_finite_grid_samples_nothing_in_zeros_mode():
    # the CUDA kernel treats a non-finite coordinate as outside the image (safe_downgrade_to_int_range)
    x = torch.ones(1, 1, 3, 3)
    grid = torch.tensor([[[[float("nan"), 0.0], [float("inf"), 0.0], [0.0, 0.0]]]])
    y = grid_sample(x, grid, padding_mode="zeros", align_corners=False)
    assert y.flatten().tolist() == [0.0, 0.0, 1.0]
    y = grid_sample(x, grid, padding_mode="border", align_corners=False)
    assert y.flatten().tolist() == [1.0, 1.0, 1.0]  # NaN clips to 0, inf to the border


def test_half_precision_is_computed_in_float32():
    x = torch.randn(2, 3, 6, 7, dtype=torch.float64)
    grid = torch.rand(2, 5, 4, 2, dtype=torch.float64) * 2 - 1
    for dtype in (torch.bfloat16, torch.float16):
        xs, gs = x.to(dtype), grid.to(dtype)
        exact = F.grid_sample(xs.double(), gs.double(), align_corners=False)
        y = grid_sample(xs, gs, align_corners=False)
        assert y.dtype == dtype
        assert float((y.double() - exact).abs().max()) <= torch.finfo(dtype).eps * float(exact.abs().max())


@pytest.mark.parametrize(("n", "rows_backward"), [(1, False), (1, True), (20, False)])
def test_chunks_along_the_batch_and_the_channels_give_the_same_function(n, rows_backward):
    # a single sample over 2**16 output elements: channel ranges on the CPU path (its taps shared);
    # a batch over 2**18: batch chunks of several samples; the result and both gradients stay the
    # native ones in float64
    from yolo_det.layers.grid_sample import _chunks

    chunks = _chunks(n, 32, 48 * 48, not rows_backward)
    if n == 1:
        assert len(chunks) == 1
        assert (len(chunks[0][2]) > 1) == (not rows_backward)
    else:
        assert 1 < len(chunks) < n
        assert all(crange == [(0, 32)] for _, _, crange in chunks)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(n, 32, 9, 11, dtype=torch.float64, generator=gen, requires_grad=True)
    grid = (torch.rand(n, 48, 48, 2, dtype=torch.float64, generator=gen) * 2.4 - 1.2).requires_grad_()
    out = DetGridSample.apply(x, grid, "zeros", False, rows_backward)
    ref = F.grid_sample(x, grid, padding_mode="zeros", align_corners=False)
    g = torch.randn(ref.shape, dtype=torch.float64, generator=gen)
    got = torch.autograd.grad(out, (x, grid), g)
    want = torch.autograd.grad(ref, (x, grid), g)
    assert torch.allclose(out, ref, rtol=0, atol=1e-12)
    for a, b in zip(got, want):
        assert torch.allclose(a, b, rtol=0, atol=1e-11)
