"""Sparse linear maps along tensor axes, with their own autograd: the deterministic layers' maths.

* :class:`AxisMap` is a linear map along one tensor axis stored as a few *taps* per output index
  (``out[i] = sum_k w[i, k] * in[idx[i, k]]``). :func:`apply_axis_map` applies it through an autograd
  :class:`torch.autograd.Function` whose backward is the transposed map, applied the same way. Forward
  and backward are therefore gathers (``index_select``) and element-wise products only: no scatter,
  no atomics, no matrix multiply (so TF32 settings cannot change the result), deterministic on every
  device whether or not ``torch.use_deterministic_algorithms`` is on, and twice differentiable.
* :func:`apply_axis_maps` applies several such maps (one per axis) as one autograd node,
  :class:`DetSeparableMap`, in chunks along a leading axis: the intermediate results and tap scratch
  buffers exist for one chunk at a time and the last map writes into the result, so a resize keeps
  about the memory the native kernel keeps (its output), forward and backward.
* :class:`WindowSum` (through :func:`apply_window_mean`) is the same kind of pair for averages over
  contiguous windows, computed with one slice sum per window and, backward, one slice add per window.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ._torch_internals import _is_plain, outside_modes

__all__ = [
    "AxisMap",
    "DetAxisMap",
    "DetSeparableMap",
    "WindowSum",
    "apply_axis_map",
    "apply_axis_maps",
    "apply_window_mean",
]


# ----------------------------------------------------------------------------------------------------
# Sparse linear maps along one axis
# ----------------------------------------------------------------------------------------------------


def _pack(rows: Tensor, cols: Tensor, vals: Tensor | None, n_rows: int) -> tuple[Tensor, Tensor | None]:
    """Pack (row, col, val) entries, sorted by row then col, into padded ``(n_rows, K)`` tables.

    Empty slots repeat the row's last column with weight 0 (or column 0 for an empty row), so every
    index is valid and padding never changes a sum of finite values.
    """
    counts = torch.bincount(rows, minlength=n_rows)
    k = max(int(counts.max()) if rows.numel() else 0, 1)
    starts = torch.cumsum(counts, 0) - counts
    pos = torch.arange(rows.numel()) - starts[rows]
    idx = torch.zeros(n_rows, k, dtype=torch.int64)
    idx[rows, pos] = cols
    # fill empty slots with the last real column of the row (0 for empty rows)
    last = torch.zeros(n_rows, dtype=torch.int64)
    nonempty = counts > 0
    last[nonempty] = idx[nonempty.nonzero().flatten(), counts[nonempty] - 1]
    slot = torch.arange(k).expand(n_rows, k)
    empty = slot >= counts[:, None]
    idx = torch.where(empty, last[:, None].expand(n_rows, k), idx)
    if vals is None and not bool(empty.any()):
        return idx, None
    w = torch.zeros(n_rows, k, dtype=torch.float64)
    w[rows, pos] = vals.to(torch.float64) if vals is not None else 1.0
    return idx, w


class AxisMap:
    """A linear map from length ``in_size`` to ``out_size`` along one axis, as padded tap tables.

    ``index`` is an ``(out_size, K)`` int64 CPU tensor; ``weight`` is a float64 ``(out_size, K)`` CPU
    tensor or ``None`` for all-ones weights (a pure selection). Device copies of the tables are cached
    per ``(device, dtype)`` on the instance; instances are immutable and shared through the builders'
    caches, so build them only inside :func:`outside_modes`.
    """

    def __init__(self, in_size: int, index: Tensor, weight: Tensor | None) -> None:
        self.in_size = int(in_size)
        self.out_size = int(index.shape[0])
        self.index = index
        self.weight = weight
        self._transpose: AxisMap | None = None
        self._columns: tuple[list[list[int]], list[list[float]] | None] | None = None
        self._device: dict[tuple[torch.device, torch.dtype], _DeviceTaps] = {}
        self._lock = threading.Lock()
        self.identity = (
            self.in_size == self.out_size
            and self.taps == 1
            and torch.equal(index[:, 0], torch.arange(self.out_size))
            and (weight is None or bool((weight == 1).all()))
        )

    @property
    def taps(self) -> int:
        """Number of taps per output index (``K``)."""
        return int(self.index.shape[1])

    @classmethod
    def from_dense(cls, matrix: Tensor) -> AxisMap:
        """Build from a dense ``(in_size, out_size)`` matrix: ``out = matrix.T @ in`` (zeros dropped)."""
        in_size, out_size = matrix.shape
        rows, cols = (matrix.t() != 0).nonzero(as_tuple=True)
        vals = matrix.t()[rows, cols]
        idx, w = _pack(rows, cols, vals, out_size)
        if w is None:
            w = torch.ones(idx.shape, dtype=torch.float64)
        return cls(in_size, idx, w)

    def columns(self) -> tuple[list[list[int]], list[list[float]] | None]:
        """The tables as Python lists, one list per tap (cached; safe to call under any mode)."""
        if self._columns is None:
            with outside_modes():
                index_cols = self.index.t().tolist()
                weight_cols = None if self.weight is None else self.weight.t().tolist()
            self._columns = (index_cols, weight_cols)
        return self._columns

    def is_identity(self) -> bool:
        """Whether the map is the identity (then callers may skip it)."""
        return self.identity

    def transpose(self) -> AxisMap:
        """The transposed (adjoint) map, from ``out_size`` back to ``in_size`` (cached)."""
        with self._lock:
            if self._transpose is None:
                with outside_modes():
                    o, k = self.index.shape
                    rows = torch.arange(o).repeat_interleave(k)
                    cols = self.index.reshape(-1)
                    if self.weight is None:
                        vals = None
                    else:
                        vals = self.weight.reshape(-1)
                        keep = vals != 0
                        rows, cols, vals = rows[keep], cols[keep], vals[keep]
                    order = torch.argsort(cols * o + rows)
                    idx, w = _pack(cols[order], rows[order], None if vals is None else vals[order], self.in_size)
                    t = AxisMap(self.out_size, idx, w)
                    t._transpose = self
                self._transpose = t
            return self._transpose

    def on(self, like: Tensor) -> _DeviceTaps:
        """The tables on ``like``'s device and dtype (cached for ordinary tensors, fresh under modes)."""
        key = (like.device, like.dtype)
        if not _is_plain(like):
            return _DeviceTaps(self, like.device, like.dtype, fresh=True)
        taps = self._device.get(key)
        if taps is None:
            taps = _DeviceTaps(self, like.device, like.dtype, fresh=False)
            self._device[key] = taps
        return taps


class _DeviceTaps:
    """Tap tables of an :class:`AxisMap` on one device and dtype, split per tap for the forward loop."""

    def __init__(self, amap: AxisMap, device: torch.device, dtype: torch.dtype, *, fresh: bool) -> None:
        self.amap = amap
        self.out_size = amap.out_size
        if fresh:  # under a dispatch mode (fake tensors): make the tables through the mode
            index_cols, weight_cols = amap.columns()
            self.index = [torch.tensor(c, dtype=torch.int64, device=device) for c in index_cols]
            self.weight = (
                None if weight_cols is None else [torch.tensor(c, dtype=dtype, device=device) for c in weight_cols]
            )
        else:
            with outside_modes():
                self.index = [c.contiguous().to(device) for c in amap.index.t()]
                self.weight = (
                    None if amap.weight is None else [c.to(dtype).contiguous().to(device) for c in amap.weight.t()]
                )

    def apply(self, x: Tensor, dim: int, out: Tensor | None = None) -> Tensor:
        """``out[..., i, ...] = sum_k w[i, k] * x[..., idx[i, k], ...]`` along ``dim`` (non-negative),
        written into ``out`` (contiguous, of the result's shape) when given."""
        tail = (1,) * (x.dim() - dim - 1)
        last = dim == x.dim() - 1
        out_shape = list(x.shape)
        out_shape[dim] = self.out_size

        buf: Tensor | None = None

        def tap(k: int, out: Tensor | None) -> Tensor:
            # one scratch buffer for all taps after the first: fresh CPU allocations are page faults
            idx = self.index[k]
            if last:
                idx = idx.expand(out_shape)
                return torch.gather(x, dim, idx) if out is None else torch.gather(x, dim, idx, out=out)
            return x.index_select(dim, idx) if out is None else torch.index_select(x, dim, idx, out=out)

        result = tap(0, out)
        if self.weight is not None:
            result.mul_(self.weight[0].view(self.out_size, *tail))
        for k in range(1, len(self.index)):
            buf = tap(k, buf)
            if self.weight is None:
                result.add_(buf)
            else:
                result.addcmul_(buf, self.weight[k].view(self.out_size, *tail))
        return result


class WindowSum:
    """``out[i] = sum(in[starts[i]:ends[i]]) / (ends[i] - starts[i])`` along one axis (or its adjoint).

    Windows are contiguous ranges, so both directions are slicing: the forward reduces one slice per
    window, the adjoint adds each output gradient, divided by its window length, onto its slice of a
    zero tensor (in window order, so overlapping windows add up deterministically). It has the same
    ``apply(x, dim)`` interface as the gather tables and pairs with :class:`DetAxisMap`.
    """

    def __init__(self, in_size: int, starts: Sequence[int], ends: Sequence[int], *, adjoint: bool = False) -> None:
        self.in_size = int(in_size)
        self.starts = tuple(int(v) for v in starts)
        self.ends = tuple(int(v) for v in ends)
        self.adjoint = adjoint
        self.out_size = len(self.starts) if not adjoint else self.in_size

    def transpose(self) -> WindowSum:
        """The adjoint operator (its own transpose is this one)."""
        t = WindowSum(self.in_size, self.starts, self.ends, adjoint=not self.adjoint)
        return t

    def apply(self, x: Tensor, dim: int) -> Tensor:
        """Apply along ``dim`` (non-negative)."""
        if not self.adjoint:
            parts = [x.narrow(dim, s, e - s).sum(dim, keepdim=True).div_(e - s) for s, e in zip(self.starts, self.ends)]
            return torch.cat(parts, dim) if len(parts) > 1 else parts[0]
        shape = list(x.shape)
        shape[dim] = self.in_size
        out = x.new_zeros(shape)
        for i, (s, e) in enumerate(zip(self.starts, self.ends)):
            out.narrow(dim, s, e - s).add_(x.narrow(dim, i, 1).div(e - s))
        return out


def apply_window_mean(x: Tensor, dim: int, starts: Sequence[int], ends: Sequence[int]) -> Tensor:
    """Average ``x`` over the windows ``[starts[i], ends[i])`` along ``dim`` (deterministic, differentiable)."""
    dim = dim % x.dim()
    op = WindowSum(x.shape[dim], starts, ends)
    return DetAxisMap.apply(x, dim, op, op.transpose())


class DetAxisMap(torch.autograd.Function):
    """Apply a linear operator along one axis; the backward applies its transpose the same way.

    ``fwd`` and ``bwd`` have an ``apply(x, dim)`` method (the per-device tables of an :class:`AxisMap`
    and of its transpose, or a :class:`WindowSum` and its adjoint); the backward swaps them, so the
    backward is itself differentiable.
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, dim: int, fwd: Any, bwd: Any) -> Tensor:
        ctx.dim = dim
        ctx.taps = (fwd, bwd)
        return fwd.apply(x, dim)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, None, None, None]:
        fwd, bwd = ctx.taps
        if not ctx.needs_input_grad[0]:
            return None, None, None, None
        return DetAxisMap.apply(grad, ctx.dim, bwd, fwd), None, None, None


#: Output elements per chunk below which :class:`DetSeparableMap` does not split the work.
_CHUNK_MIN = 1 << 18
#: The most chunks :class:`DetSeparableMap` splits the work into (bounds the per-call overhead).
_CHUNK_MAX = 16
#: Elements (of the larger of input and result) above which the work is split into at least
#: :data:`_CHUNK_FLOOR` chunks.
_CHUNK_FLOOR_MIN = 1 << 16
_CHUNK_FLOOR = 8


def _chunk_dim(shape: Sequence[int], dims: Sequence[int]) -> int | None:
    """The leading axis to split the work along: the first one of size > 1 before every mapped axis,
    if all axes before it have size 1 (so each chunk of a contiguous result is contiguous)."""
    for d in range(min(dims)):
        if shape[d] > 1:
            return d
    return None


def _apply_maps(x: Tensor, dims: Sequence[int], maps: Sequence[Any], out_shape: Sequence[int]) -> Tensor:
    """Apply ``maps[i]`` along ``dims[i]`` in turn, in chunks along a leading axis.

    Each chunk goes through all the axes before the next one starts, so the intermediate results and
    the tap scratch buffers exist for one chunk at a time (about 1/16 of the result), and the last map
    writes straight into the (contiguous) result: the peak memory is the result plus a chunk.
    """
    out = x.new_empty(out_shape)
    # the intermediates and tap buffers can be as large as the input (a backward's gradient is the
    # forward's output): chunk by the larger of the two
    total = max(out.numel(), x.numel())
    cdim = _chunk_dim(list(x.shape), dims)
    chunks = 1
    if cdim is not None and total > _CHUNK_FLOOR_MIN:
        # at least _CHUNK_FLOOR chunks: a small call's intermediates would otherwise be a large
        # fraction of its (small) peak
        chunks = min(_CHUNK_MAX, x.shape[cdim], max(_CHUNK_FLOOR, -(-total // _CHUNK_MIN)))
    if cdim is None or chunks <= 1:
        y = x
        for d, m in zip(dims[:-1], maps[:-1]):
            y = m.apply(y, d)
        return maps[-1].apply(y, dims[-1], out=out)
    size = x.shape[cdim]
    step = -(-size // chunks)
    for a in range(0, size, step):
        b = min(step, size - a)
        y = x.narrow(cdim, a, b)
        for d, m in zip(dims[:-1], maps[:-1]):
            y = m.apply(y, d)
        maps[-1].apply(y, dims[-1], out=out.narrow(cdim, a, b))
    return out


class DetSeparableMap(torch.autograd.Function):
    """Apply linear maps along several axes in one autograd node (see :func:`_apply_maps`).

    The backward applies the transposed maps in reverse order the same way. Nothing is saved (the maps
    are linear), and neither pass keeps a full-size intermediate: a resize keeps about what the native
    kernel keeps. Twice differentiable (the backward is this function again).
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, dims: tuple[int, ...], fwd: tuple[Any, ...], bwd: tuple[Any, ...]) -> Tensor:
        ctx.dims = dims
        ctx.maps = (fwd, bwd)
        shape = list(x.shape)
        for d, m in zip(dims, fwd):
            shape[d] = m.out_size
        return _apply_maps(x, dims, fwd, shape)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, None, None, None]:
        if not ctx.needs_input_grad[0]:
            return None, None, None, None
        fwd, bwd = ctx.maps
        dims = tuple(reversed(ctx.dims))
        return DetSeparableMap.apply(grad, dims, tuple(reversed(bwd)), tuple(reversed(fwd))), None, None, None


def apply_axis_maps(x: Tensor, dims: Sequence[int], amaps: Sequence[AxisMap]) -> Tensor:
    """Apply ``amaps[i]`` along ``dims[i]`` of ``x`` (in that order) as one autograd node that keeps no
    full-size intermediate (:class:`DetSeparableMap`); identity maps are skipped."""
    pairs = []
    for d, m in zip(dims, amaps):
        d = d % x.dim()
        if x.shape[d] != m.in_size:
            raise ValueError(f"axis {d} has size {x.shape[d]}, the map expects {m.in_size}")
        if not m.is_identity():
            pairs.append((d, m))
    if not pairs:
        return x.clone()
    return DetSeparableMap.apply(
        x, tuple(d for d, _ in pairs), tuple(m.on(x) for _, m in pairs), tuple(m.transpose().on(x) for _, m in pairs)
    )


def apply_axis_map(x: Tensor, dim: int, amap: AxisMap) -> Tensor:
    """Apply ``amap`` along ``dim`` of ``x`` (any dtype the caller chose; float64 tables are cast to it)."""
    dim = dim % x.dim()
    if x.shape[dim] != amap.in_size:
        raise ValueError(f"axis {dim} has size {x.shape[dim]}, the map expects {amap.in_size}")
    fwd = amap.on(x)
    bwd = amap.transpose().on(x)
    return DetAxisMap.apply(x, dim, fwd, bwd)
