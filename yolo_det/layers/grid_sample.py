"""Deterministic bilinear ``grid_sample`` (a drop-in for ``torch.nn.functional.grid_sample``).

PyTorch's CUDA backward kernel of ``grid_sampler_2d`` adds into the input gradient with atomics (and
raises under the deterministic flag even when only the grid needs a gradient). This version computes
the same function with a small autograd function:

* forward: PyTorch's coordinate pipeline (unnormalize for ``align_corners`` both ways, then ``border``
  clipping or ``reflection``) gives each output point four corner taps; their flat indices and
  bilinear weights (zero for a corner outside the image) come from the same formulas as ATen's, the
  four corners are gathered and multiply-added in ATen's order (nw, ne, sw, se);
* backward, input: the weighted output gradient is accumulated onto the four corners. On CUDA (and
  any accelerator) this is ``index_put_(accumulate=True)`` over rows of ``C`` values, which PyTorch
  implements by sorting the indices (deterministic with or without the flag, and it sorts ``N*4*P``
  indices, not ``N*C*4*P``); on the CPU it is ``scatter_add_``, deterministic there;
* backward, grid: the corners are gathered again (nothing of size ``C`` is kept between forward and
  backward) and combined with the weight derivatives, times the coordinate derivatives, which are zero
  where ``border``/``reflection`` clipped a coordinate, exactly like ATen's ``clip_coordinates_set_grad``
  (a coordinate on the border counts as clipped).

Non-finite or huge grid values follow the CUDA kernel: a NaN clips to 0 under ``border``/``reflection``,
and a non-finite coordinate samples nothing (``safe_downgrade_to_int_range``); PyTorch's CPU kernel
returns NaN there for ``zeros``. Gradients at such points are zero.

Only ``mode='bilinear'`` on 4-D input is implemented; other modes raise :class:`YoloDetError`.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import Tensor

from ..core.errors import YoloDetError
from . import _native
from ._common import amp_plan, autocast_off

__all__ = ["grid_sample"]

_PADDING_MODES = ("zeros", "border", "reflection")
_INT_MAX = 2**31 - 1


def _clip(c: Tensor, size: int) -> tuple[Tensor, Tensor]:
    """Clip to ``[0, size-1]`` (NaN -> 0); the derivative is 1 strictly inside, 0 elsewhere."""
    hi = float(size - 1)
    inside = (c > 0) & (c < hi)
    clipped = torch.where(torch.isnan(c), torch.zeros_like(c), c).clamp(0.0, hi)
    return clipped, inside.to(c.dtype)


def _reflect(c: Tensor, twice_low: int, twice_high: int) -> tuple[Tensor, Tensor]:
    """ATen's ``reflect_coordinates`` with its derivative (+1 or -1, 0 for a degenerate span)."""
    if twice_low == twice_high:
        return torch.zeros_like(c), torch.zeros_like(c)
    low = twice_low / 2
    span = (twice_high - twice_low) / 2
    d = c - low
    neg = d < 0
    a = torch.where(neg, -d, d)
    extra = torch.fmod(a, span)
    flips = torch.floor(a / span)
    even = torch.remainder(flips, 2) == 0
    out = torch.where(even, extra + low, span - extra + low)
    sign = torch.where(neg, -torch.ones_like(c), torch.ones_like(c))
    return out, torch.where(even, sign, -sign)


def _source(g: Tensor, size: int, padding_mode: str, align_corners: bool) -> tuple[Tensor, Tensor]:
    """Source coordinate of a normalised grid value and its derivative (ATen's compute_source_index)."""
    if align_corners:
        c = ((g + 1) / 2) * (size - 1)
        mult = torch.full_like(g, (size - 1) / 2)
    else:
        c = ((g + 1) * size - 1) / 2
        mult = torch.full_like(g, size / 2)
    if padding_mode == "border":
        c, dclip = _clip(c, size)
        mult = mult * dclip
    elif padding_mode == "reflection":
        if align_corners:
            c, drefl = _reflect(c, 0, 2 * (size - 1))
        else:
            c, drefl = _reflect(c, -1, 2 * size - 1)
        c, dclip = _clip(c, size)
        mult = mult * drefl * dclip
    bad = ~torch.isfinite(c) | (c > _INT_MAX - 1) | (c < -_INT_MAX - 1)
    c = torch.where(bad, torch.full_like(c, -100.0), c)
    mult = torch.where(bad, torch.zeros_like(mult), mult)
    return c, mult


class _Taps:
    """Corner indices, weights and the pieces the backward needs, for one call."""

    def __init__(self, grid: Tensor, h: int, w: int, padding_mode: str, align_corners: bool) -> None:
        n = grid.shape[0]
        ix, self.mx = _source(grid[..., 0].reshape(n, -1), w, padding_mode, align_corners)
        iy, self.my = _source(grid[..., 1].reshape(n, -1), h, padding_mode, align_corners)
        x0 = torch.floor(ix)
        y0 = torch.floor(iy)
        x1 = x0 + 1
        y1 = y0 + 1
        # ATen's weight expressions and corner order: nw, ne, sw, se
        self.dx = (x1 - ix, ix - x0)  # weight factors of the west and east columns
        self.dy = (y1 - iy, iy - y0)  # of the north and south rows
        xs = (x0, x1)
        ys = (y0, y1)
        self.index: list[Tensor] = []
        self.valid: list[Tensor] = []
        self.weight: list[Tensor] = []
        for r in (0, 1):
            for s in (0, 1):
                cx, cy = xs[s], ys[r]
                ok = (cx >= 0) & (cx < w) & (cy >= 0) & (cy < h)
                flat = cy.clamp(0, h - 1).to(torch.int64) * w + cx.clamp(0, w - 1).to(torch.int64)
                self.index.append(flat)
                self.valid.append(ok)
                self.weight.append(torch.where(ok, self.dx[s] * self.dy[r], torch.zeros_like(ix)))


def _gather(flat: Tensor, index: Tensor, out: Tensor | None = None) -> Tensor:
    """``flat[n, c, index[n, p]]`` as ``(N, C, P)``, written into ``out`` when given (a scratch buffer:
    fresh CPU allocations cost page faults)."""
    n, c, _ = flat.shape
    idx = index.unsqueeze(1).expand(n, c, index.shape[1])
    return torch.gather(flat, 2, idx) if out is None else torch.gather(flat, 2, idx, out=out)


#: Output elements per batch chunk (the scratch buffer and ``scatter_add_``'s expanded int64 index
#: are about three chunks' worth of output: a quarter of the output at 2**19 elements).
_CHUNK_MIN = 1 << 17
#: The most chunks the work is split into.
_CHUNK_MAX = 16
#: Output elements above which the work is split into at least :data:`_CHUNK_FLOOR` chunks (a small
#: call's scratch buffers would otherwise be a large fraction of its small peak).
_CHUNK_FLOOR_MIN = 1 << 16
_CHUNK_FLOOR = 8


def _chunks(n: int, c: int, p: int, split_channels: bool) -> list[tuple[int, int, list[tuple[int, int]]]]:
    """``(start, length, channel ranges)`` over the batch: work whose temporaries have the size of the
    output (one scratch buffer, weighted gradients) is done one range at a time, so they stay a
    fraction of the output. The batch is split by :data:`_CHUNK_MIN` (each batch chunk computes its
    corner taps again, a fixed cost); single-sample chunks are split along the channels too
    (``split_channels``; the taps are shared) up to :data:`_CHUNK_FLOOR` pieces in all, so a small
    call's scratch stays a small part of its small peak."""
    total = n * c * p
    want = max(1, min(_CHUNK_MAX, -(-total // _CHUNK_MIN)))
    chunks = max(1, min(want, n))
    step = -(-n // chunks)
    pieces = 1
    if split_channels and step == 1:
        floor = _CHUNK_FLOOR if total > _CHUNK_FLOOR_MIN else 1
        pieces = -(-max(want, floor) // chunks)
    cstep = -(-c // max(1, min(pieces, c))) if c else 1
    crange = [(c0, min(cstep, c - c0)) for c0 in range(0, c, cstep)] or [(0, c)]
    return [(a, min(step, n - a), crange) for a in range(0, n, step)]


def _scatter_taps(acc: Tensor, grad: Tensor, taps: _Taps, buf: Tensor) -> None:
    """CPU input gradient: each corner's weighted output gradient ``scatter_add_``-ed onto ``acc``
    (``(B, C, H*W)``), corner after corner (deterministic on the CPU: a serial loop in index order)."""
    b, c, p = grad.shape
    for idx, wk in zip(taps.index, taps.weight):
        torch.mul(grad, wk.unsqueeze(1), out=buf)
        acc.scatter_add_(2, idx.unsqueeze(1).expand(b, c, p), buf)


def _grid_grad(taps: _Taps, sums: list[Tensor | None]) -> Tensor:
    """The grid gradient ``(B, P, 2)`` from each corner's sum over channels of input times gradient."""
    gix = torch.zeros_like(taps.mx)
    giy = torch.zeros_like(taps.my)
    k = 0
    for r in (0, 1):
        for s in (0, 1):
            v = sums[k]
            if v is None:  # no channels
                v = torch.zeros_like(taps.mx)
            v = torch.where(taps.valid[k], v, torch.zeros_like(v))
            # d(dx[s])/dix = -1 for the west column, +1 for the east; likewise for rows
            gix = gix + v * taps.dy[r] if s else gix - v * taps.dy[r]
            giy = giy + v * taps.dx[s] if r else giy - v * taps.dx[s]
            k += 1
    return torch.stack((gix * taps.mx, giy * taps.my), -1)


class DetGridSample(torch.autograd.Function):
    """Bilinear grid sampling with a deterministic backward (see the module docstring).

    Saves the input and the grid, as the native op does. Every pass runs over the batch in chunks
    (:func:`_chunks`; single samples in channel ranges), and the corner taps of a chunk are computed
    for that chunk (again in the backward: they cost ``O(N * P)``, the sampling ``O(N * C * P)``),
    so no temporary has the size of the output or of the whole batch's taps.
    """

    @staticmethod
    def forward(
        ctx: Any, input: Tensor, grid: Tensor, padding_mode: str, align_corners: bool, rows_backward: bool
    ) -> Tensor:
        n, c, h, w = input.shape
        ho, wo = grid.shape[1], grid.shape[2]
        flat = input.reshape(n, c, h * w)
        out = flat.new_empty(n, c, ho * wo)
        for a, b, crange in _chunks(n, c, ho * wo, True):
            taps = _Taps(grid.narrow(0, a, b), h, w, padding_mode, align_corners)
            buf = None
            for c0, cb in crange:
                o = out.narrow(0, a, b).narrow(1, c0, cb)
                f = flat.narrow(0, a, b).narrow(1, c0, cb)
                _gather(f, taps.index[0], o).mul_(taps.weight[0].unsqueeze(1))
                for k in range(1, 4):
                    buf = _gather(f, taps.index[k], buf if buf is not None and buf.shape == o.shape else None)
                    o.addcmul_(buf, taps.weight[k].unsqueeze(1))
        ctx.options = (padding_mode, align_corners)
        ctx.rows_backward = rows_backward
        ctx.save_for_backward(input, grid)
        return out.view(n, c, ho, wo)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None, None, None, None]:
        input, grid = ctx.saved_tensors
        n, c, h, w = input.shape
        g = grad.reshape(n, c, -1)
        p = g.shape[2]
        need_input, need_grid = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        flat = input.reshape(n, c, h * w)
        grad_input: Tensor | None = None
        grad_grid: Tensor | None = None
        if need_input:
            if ctx.rows_backward:  # rows of C values, accumulated with index_put_(accumulate=True): sorted
                acc = torch.zeros(n * h * w, c, dtype=g.dtype, device=g.device)
            else:
                acc = torch.zeros(n, c, h * w, dtype=g.dtype, device=g.device)
        if need_grid:
            grad_grid = g.new_empty(n, p, 2)
        buf: Tensor | None = None  # one scratch buffer of a chunk's size, shared by both gradients
        for a, b, crange in _chunks(n, c, p, not ctx.rows_backward):
            taps = _Taps(grid.narrow(0, a, b), h, w, *ctx.options)
            gc = g.narrow(0, a, b)
            if need_input and ctx.rows_backward:
                # one tap at a time, in a fixed order; each index_put_ is deterministic
                base = (torch.arange(a, a + b, device=g.device) * (h * w)).unsqueeze(1)
                for idx, wk in zip(taps.index, taps.weight):
                    src = (gc * wk.unsqueeze(1)).transpose(1, 2).reshape(-1, c)
                    acc.index_put_(((idx + base).reshape(-1),), src, accumulate=True)
            sums: list[Tensor | None] = [None] * 4  # per corner: sum over channels of input(corner) * grad
            for c0, cb in crange:
                gcc = gc.narrow(1, c0, cb)
                if buf is None or buf.shape != gcc.shape:
                    buf = torch.empty_like(gcc)
                if need_input and not ctx.rows_backward:
                    _scatter_taps(acc.narrow(0, a, b).narrow(1, c0, cb), gcc, taps, buf)
                if need_grid:
                    fc = flat.narrow(0, a, b).narrow(1, c0, cb)
                    for k in range(4):
                        v = _gather(fc, taps.index[k], buf).mul_(gcc).sum(1)
                        prev = sums[k]
                        sums[k] = v if prev is None else prev.add_(v)  # channel ranges in order
            if grad_grid is not None:
                grad_grid.narrow(0, a, b).copy_(_grid_grad(taps, sums))
        if need_input:
            grad_input = acc.view(n, h, w, c).permute(0, 3, 1, 2) if ctx.rows_backward else acc.view(n, c, h, w)
        if grad_grid is not None:
            grad_grid = grad_grid.view(n, grad.shape[2], grad.shape[3], 2)
        return grad_input, grad_grid, None, None, None


def grid_sample(
    input: Tensor, grid: Tensor, mode: str = "bilinear", padding_mode: str = "zeros", align_corners: bool | None = None
) -> Tensor:
    """Deterministic ``torch.nn.functional.grid_sample`` for bilinear sampling of 4-D input.

    Args:
        input: ``(N, C, H, W)`` floating tensor (any memory format).
        grid: ``(N, Ho, Wo, 2)`` normalised ``(x, y)`` sampling locations, same dtype as ``input``.
        mode: Only ``'bilinear'``.
        padding_mode: ``'zeros'``, ``'border'`` or ``'reflection'``.
        align_corners: As in PyTorch (``None`` warns and means False).

    Returns:
        ``(N, C, Ho, Wo)``; gradients flow to ``input`` and ``grid`` as in PyTorch.

    Raises:
        YoloDetError: For ``mode`` other than bilinear or input that is not 4-D.
    """
    if mode != "bilinear" or input.dim() != 4:
        raise YoloDetError(
            f"yolo-det's deterministic grid_sample supports mode='bilinear' on 4-D input only, got mode={mode!r} on "
            f"{input.dim()}-D input; use torch.nn.functional.grid_sample and leave this layer out of strict "
            "determinism"
        )
    if padding_mode not in _PADDING_MODES:
        return _native.grid_sample(input, grid, mode=mode, padding_mode=padding_mode, align_corners=align_corners)
    if (
        grid.dim() != 4
        or grid.shape[-1] != 2
        or grid.shape[0] != input.shape[0]
        or input.dtype != grid.dtype
        or input.device != grid.device
        or not input.is_floating_point()
        or input.shape[0] == 0
        or any(s == 0 for s in input.shape[2:])
    ):
        # let PyTorch raise its own error for bad arguments (and handle empty tensors)
        return _native.grid_sample(input, grid, mode=mode, padding_mode=padding_mode, align_corners=align_corners)
    if align_corners is None:
        warnings.warn(
            "Default grid_sample and affine_grid behavior has changed to align_corners=False since 1.3.0. Please "
            "specify align_corners=True if the old behavior is desired. See the documentation of grid_sample for "
            "details.",
            stacklevel=2,
        )
        align_corners = False

    def probe(device: str) -> Tensor:
        return _native.grid_sample(
            torch.zeros(1, 1, 2, 2, dtype=input.dtype, device=device),
            torch.zeros(1, 1, 1, 2, dtype=grid.dtype, device=device),
            align_corners=False,
        )

    compute, out_dtype, active = amp_plan("grid_sampler", probe, [input, grid])
    with autocast_off(input.device.type, active):
        out = DetGridSample.apply(
            input.to(compute), grid.to(compute), padding_mode, bool(align_corners), input.device.type != "cpu"
        )
        return out.to(out_dtype)
