"""The geometry of adaptive pooling windows and the adjoint of their average (the average pooling's
backward), deterministic on every device: see :mod:`yolo_det.layers.pooling` for how the layers use it.

Window ``i`` of an axis of length ``L`` pooled to ``O`` is ``[floor(i*L/O), ceil((i+1)*L/O))``
(ATen's); neighbouring windows may share positions. The adjoint spreads each output gradient, divided
by its window size, back over its window: on the CPU as one window-membership matrix product per
axis (:func:`_banded_spread`), elsewhere with gathers and slice adds (:func:`_chunked_spread`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

__all__ = ["DetAdaptiveAvgPoolGrad"]

Windows = tuple[tuple[int, ...], tuple[int, ...]]


@functools.lru_cache(maxsize=1024)
def _windows(in_size: int, out_size: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """ATen's adaptive windows: ``[floor(i*L/O), ceil((i+1)*L/O))`` for ``i < O``."""
    starts = tuple((i * in_size) // out_size for i in range(out_size))
    ends = tuple(-((-(i + 1) * in_size) // out_size) for i in range(out_size))
    return starts, ends


@functools.lru_cache(maxsize=1024)
def _reach(win: Windows) -> int:
    """The largest ``j - i`` such that windows ``i`` and ``j`` share a position (0: no overlap;
    1 whenever the output is not larger than the input)."""
    starts, ends = win
    reach = 0
    for i, e in enumerate(ends):
        j = i + 1
        while j < len(starts) and starts[j] < e:
            j += 1
        reach = max(reach, j - 1 - i)
    return reach


_NATIVE_AVG = {
    1: lambda t, o: torch.adaptive_avg_pool1d(t, o),
    2: lambda t, o: torch._C._nn.adaptive_avg_pool2d(t, o),
    3: lambda t, o: torch._C._nn.adaptive_avg_pool3d(t, o),
}


@functools.lru_cache(maxsize=1024)
def _first_window(win: Windows, in_size: int) -> tuple[int, ...]:
    """For each input position, the first window holding it."""
    starts, ends = win
    first, j = [], 0
    for p in range(in_size):
        while ends[j] <= p:
            j += 1
        first.append(j)
    return tuple(first)


def _window_spread(g: Tensor, dim: int, win: Windows, in_size: int, out: Tensor | None = None) -> Tensor:
    """``out[p] = sum over windows j holding p of g[j]`` along ``dim`` (the window sum's adjoint).

    Every position takes its first window's value with one ``index_select`` (a gather: each output
    element is written once); positions shared with later windows then get those added, one slice
    add per overlapping window, in window order. No scatter, deterministic everywhere."""
    starts, ends = win
    first = torch.tensor(_first_window(win, in_size), dtype=torch.int64, device=g.device)
    out = g.index_select(dim, first) if out is None else torch.index_select(g, dim, first, out=out)
    for j in range(1, len(starts)):
        lo, hi = starts[j], min(ends[j], ends[j - 1])
        if hi > lo:
            out.narrow(dim, lo, hi - lo).add_(g.narrow(dim, j, 1))
    return out


def _inverse_counts(wins: Sequence[Windows], like: Tensor) -> Tensor:
    """``1 / (window size)`` of every output (the product over the axes), shaped for broadcasting."""
    n = len(wins)
    inv = torch.ones((), dtype=torch.float64)
    for a, (starts, ends) in enumerate(wins):
        shape = [1] * n
        shape[a] = len(starts)
        inv = inv * torch.tensor([float(e - s) for s, e in zip(starts, ends)], dtype=torch.float64).view(shape)
    return (1.0 / inv).to(dtype=like.dtype, device=like.device)


#: Output elements per chunk below which the backward does not split the batch.
_CHUNK_MIN = 1 << 18
#: The most chunks the backward splits the batch into.
_CHUNK_MAX = 16
#: Gradient elements per plane chunk below which the matrix-product backward does not split further.
_BANDED_CHUNK_MIN = 1 << 15


def _membership(win: Windows, in_size: int, dtype: torch.dtype) -> Tensor:
    """The ``(O, L)`` 0/1 matrix of an axis's windows: row ``j`` is 1 on window ``j``'s positions."""
    starts, ends = win
    pos = torch.arange(in_size)
    lo = torch.tensor(starts).unsqueeze(1)
    hi = torch.tensor(ends).unsqueeze(1)
    return ((pos >= lo) & (pos < hi)).to(dtype)


@functools.lru_cache(maxsize=256)
def _banded_constants(wins: tuple[Windows, ...], sizes: tuple[int, ...], dtype: torch.dtype) -> list[Tensor]:
    """Per axis, the membership matrix with row ``j`` divided by window ``j``'s length (so the
    products also apply the average's ``1 / window size``). CPU tensors built once: no mode or
    autograd state of the caller is captured, see :func:`_banded_ok`."""
    with torch.inference_mode(False), torch.no_grad():
        mats = []
        for w, s in zip(wins, sizes):
            lengths = torch.tensor([float(e - b) for b, e in zip(*w)], dtype=torch.float64).unsqueeze(1)
            mats.append((_membership(w, s, torch.float64) / lengths).to(dtype))
        return mats


def _banded_ok(g: Tensor, wins: Sequence[Windows]) -> bool:
    """Whether :func:`_banded_spread` applies: on the CPU, for
    one or two axes, float32/float64, every position in at most two windows, a finite gradient (a
    plain tensor: not a FakeTensor or other subclass, whose values cannot be read; no dispatch mode
    active, so the cached constants are plain CPU tensors)."""
    return (
        type(g) is Tensor
        and g.device.type == "cpu"
        and len(wins) <= 2
        and torch._C._len_torch_dispatch_stack() == 0
        and g.dtype in (torch.float32, torch.float64)
        and all(_reach(w) <= 1 for w in wins)
        and math.isfinite(float(g.sum()))
    )  # any inf/NaN makes the sum non-finite (overflow: the safe side)


def _banded_spread(g: Tensor, wins: tuple[Windows, ...], sizes: tuple[int, ...]) -> Tensor:
    """The average's input gradient as one matrix product per axis, ``M_h^T @ g @ M_w`` (the
    membership matrices scaled by ``1 / window length``, :func:`_banded_constants`).

    Every element of each product is a dot product whose only non-zero terms are the (at most two)
    windows holding that position; the other terms are exact zeros (the gradient is finite), so
    whatever summation order or blocking the BLAS kernel picks (thread count included), the result
    is the same bits: the rounded sum of those two terms. Deterministic without relying on the
    kernel's order. (Not used on CUDA, where TF32 matmul settings would round the operands.)"""
    mats = _banded_constants(wins, sizes, g.dtype)
    if len(wins) == 1:
        return torch.matmul(g, mats[0])
    # per plane: the height axis on the small tensor, one GEMM over all planes (``(g^T M_h)``, shape
    # ``(Ow, Lh)``), then the width axis as a batched GEMM with that operand transposed (no copy),
    # writing the full-size gradient; in plane chunks so the ``(Ow, Lh)`` intermediate stays under
    # about a twentieth of the gradient (small gradients in one piece: a chunk costs a few calls)
    oh, ow = g.shape[-2:]
    lh, lw = sizes
    planes = g.reshape(-1, oh, ow)
    count = planes.shape[0]
    chunks = min(count, max(1, -(-20 * ow // lw)), max(1, count * lh * lw // _BANDED_CHUNK_MIN))
    if chunks <= 1:  # the same two products without the chunk bookkeeping
        cols = torch.matmul(planes.transpose(1, 2), mats[0])
        return torch.matmul(cols.transpose(1, 2), mats[1]).view(*g.shape[:-2], lh, lw)
    out = g.new_empty((count, lh, lw))
    step = -(-count // chunks) if count else 1
    for a in range(0, count, step):
        part = planes[a : a + step]
        cols = torch.matmul(part.transpose(1, 2), mats[0])
        torch.bmm(cols.transpose(1, 2), mats[1].expand(part.shape[0], ow, lw), out=out[a : a + step])
    return out.view(*g.shape[:-2], lh, lw)


def _chunked_spread(scaled: Tensor, wins: Sequence[Windows], sizes: Sequence[int]) -> Tensor:
    """The window sum's adjoint by :func:`_window_spread`, one axis at a time (the output's axes
    first), in chunks along the first axis so that the intermediate results exist for one chunk at
    a time and the last axis writes straight into the gradient."""
    n = len(wins)
    first = scaled.dim() - n
    shape = list(scaled.shape[:first]) + list(sizes)
    out = scaled.new_empty(shape)
    total = out.numel()
    if first == 0 or scaled.shape[0] <= 1 or total <= _CHUNK_MIN:
        ranges = [(0, scaled.shape[0])] if first > 0 else [(0, 0)]
    else:
        chunks = min(_CHUNK_MAX, scaled.shape[0], -(-total // _CHUNK_MIN))
        step = -(-scaled.shape[0] // chunks)
        ranges = [(a, min(step, scaled.shape[0] - a)) for a in range(0, scaled.shape[0], step)]
    for a, b in ranges:
        part = scaled if first == 0 else scaled.narrow(0, a, b)
        target = out if first == 0 else out.narrow(0, a, b)
        for axis in reversed(range(1, n)):
            part = _window_spread(part, first + axis, wins[axis], sizes[axis])
        _window_spread(part, first, wins[0], sizes[0], out=target)
    return out


class DetAdaptiveAvgPoolGrad(torch.autograd.Function):
    """The input gradient of adaptive average pooling over the last ``n`` axes.

    Each output gradient is divided by its window size once, then spread back over its window:
    :func:`_banded_spread` (one matrix product per axis) where :func:`_banded_ok` allows it, else
    :func:`_chunked_spread` (gathers and slice adds). Its own backward (the pooling's double
    backward) is the pooling.
    """

    @staticmethod
    def forward(ctx: Any, g: Tensor, wins: tuple[Windows, ...], sizes: tuple[int, ...]) -> Tensor:
        ctx.outs = [len(w[0]) for w in wins]
        if _banded_ok(g, wins):
            return _banded_spread(g, wins, sizes)
        return _chunked_spread(g * _inverse_counts(wins, g), wins, sizes)

    @staticmethod
    def backward(ctx: Any, gg: Tensor) -> tuple[Tensor, None, None]:
        return _NATIVE_AVG[len(ctx.outs)](gg, ctx.outs), None, None
