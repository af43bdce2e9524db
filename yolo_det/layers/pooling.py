"""Deterministic adaptive average and max pooling (drop-ins for ``nn.AdaptiveAvgPool*d``/``MaxPool*d``).

PyTorch's CUDA backward kernels of adaptive pooling accumulate with atomics (``adaptive_avg_pool2d``
for any output other than 1x1, ``adaptive_max_pool2d`` for every output size). These versions compute
the same function with kernels whose backward is deterministic:

* **Average.** Adaptive pooling is separable: window ``i`` along an axis of length ``L`` pooled to
  ``O`` is ``[floor(i*L/O), ceil((i+1)*L/O))``. Global pooling is a ``mean`` (what ATen does for 1x1
  itself); when ``O`` divides ``L`` on both axes the windows are those of ``avg_pool2d`` with
  ``kernel = stride = L/O``; otherwise each axis whose windows do not tile it is reduced by a
  window mean (:func:`~yolo_det.layers._common.apply_window_mean`: one slice sum per window forward,
  one slice add per window backward).
* **Max.** When the windows tile the plane (global pooling, or ``O`` dividing ``L`` on both axes)
  the op is ``max_pool2d`` with ``kernel = stride = L/O``: same windows, same scan order, same NaN
  rule and indices, and a gather-style CUDA backward. Otherwise a small autograd function takes the
  NaN-propagating ``amax`` over each column window (on slices: no copy of the input), then, on those
  small row maxima, the maximum over each row window with the position of the first maximum (last
  NaN), and from one gathered window row per output the column; that is the element ATen's kernels
  select (first maximum in row-major order, or last NaN). The backward routes each gradient there
  with ``index_put_(accumulate=True)`` (sorted, deterministic on CUDA with or without the flag).
  Ties therefore send the gradient to the first maximum, like the CUDA kernel, not split among
  them like ``amax``'s own backward; ``return_indices`` gives ATen's flat indices.

Summation order differs from the native kernels (separable means), so float32 results agree to a
few ulps, float64 to ~1e-16. float16/bfloat16 inputs are averaged in float32 and cast back.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._common import amp_plan, apply_window_mean, autocast_off, match_memory_format

__all__ = [
    "DetAdaptiveAvgPool1d",
    "DetAdaptiveAvgPool2d",
    "DetAdaptiveAvgPool3d",
    "DetAdaptiveMaxPool1d",
    "DetAdaptiveMaxPool2d",
    "adaptive_avg_pool1d",
    "adaptive_avg_pool2d",
    "adaptive_avg_pool3d",
    "adaptive_max_pool1d",
    "adaptive_max_pool2d",
]

SizeArg = Union[int, None, Sequence[Optional[int]]]


@functools.lru_cache(maxsize=1024)
def _windows(in_size: int, out_size: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """ATen's adaptive windows: ``[floor(i*L/O), ceil((i+1)*L/O))`` for ``i < O``."""
    starts = tuple((i * in_size) // out_size for i in range(out_size))
    ends = tuple(-((-(i + 1) * in_size) // out_size) for i in range(out_size))
    return starts, ends


def _output_sizes(output_size: SizeArg, sizes: Sequence[int], n: int) -> list[int] | None:
    """Resolve ``output_size`` like PyTorch (an int for all axes, ``None`` keeps the input size)."""
    if isinstance(output_size, int):
        return [output_size] * n
    if output_size is None:
        return None
    try:
        values = list(output_size)
    except TypeError:
        return None
    if len(values) == 1 and n > 1:
        values = values * n
    if len(values) != n:
        return None
    out = []
    for v, s in zip(values, sizes):
        if v is None:
            out.append(int(s))
        elif isinstance(v, int) or (isinstance(v, torch.Tensor) and v.numel() == 1):
            out.append(int(v))
        else:
            return None
    return out


def _plan(x: Tensor, output_size: SizeArg, n: int) -> list[int] | None:
    """Output sizes when the deterministic path applies, else ``None`` (the native op then decides,
    and raises its own error for bad input)."""
    if x.dim() not in (n + 1, n + 2) or not x.is_floating_point():
        return None
    sizes = list(x.shape[-n:])
    outs = _output_sizes(output_size, sizes, n)
    if outs is None or any(s <= 0 for s in sizes) or any(o <= 0 for o in outs):
        return None
    return outs


# ----------------------------------------------------------------------------------------------------
# Average
# ----------------------------------------------------------------------------------------------------


def _avg(y: Tensor, outs: Sequence[int]) -> Tensor:
    n = len(outs)
    sizes = list(y.shape[-n:])
    dims = [y.dim() - n + i for i in range(n)]
    if all(o == 1 for o in outs):
        return y.mean(dim=tuple(dims), keepdim=True)
    divisible = [s % o == 0 for s, o in zip(sizes, outs)]
    if n == 2 and all(divisible):
        kernel = (sizes[0] // outs[0], sizes[1] // outs[1])
        if kernel == (1, 1):
            return y.clone()
        if kernel[0] == 1 and outs[1] == 1:
            return y.mean(dim=dims[1], keepdim=True)
        if kernel[1] == 1 and outs[0] == 1:
            return y.mean(dim=dims[0], keepdim=True)
        return F.avg_pool2d(y, kernel_size=kernel, stride=kernel)
    changed = False
    # tiling axes first (they shrink the tensor), then the overlapping ones
    for d, s, o, div in zip(dims, sizes, outs, divisible):
        if div and s != o:
            y = y.mean(dim=d, keepdim=True) if o == 1 else y.unflatten(d, (o, s // o)).mean(dim=d + 1)
            changed = True
    for d, s, o, div in zip(dims, sizes, outs, divisible):
        if not div:
            y = apply_window_mean(y, d, *_windows(s, o))
            changed = True
    return y if changed else y.clone()


def _adaptive_avg(x: Tensor, outs: list[int], key: str, native: Callable[..., Tensor]) -> Tensor:
    n = len(outs)

    def probe(device: str) -> Tensor:
        return native(torch.zeros((1, 1) + (4,) * n, dtype=x.dtype, device=device), [3] * n)

    compute, out_dtype, active = amp_plan(key, probe, [x])
    with autocast_off(x.device.type, active):
        y = _avg(x.to(compute), outs)
        y = y.to(out_dtype)
    return match_memory_format(y, x)


def adaptive_avg_pool1d(input: Tensor, output_size: SizeArg) -> Tensor:
    """Deterministic ``torch.nn.functional.adaptive_avg_pool1d`` (same signature and result).

    Args:
        input: ``(N, C, L)`` or ``(C, L)`` floating tensor.
        output_size: Target length ``O`` (an int or a one-element tuple).

    Returns:
        ``(N, C, O)`` or ``(C, O)``.
    """
    outs = _plan(input, output_size, 1)
    if outs is None:
        return F.adaptive_avg_pool1d(input, output_size)  # type: ignore[arg-type]
    return _adaptive_avg(input, outs, "adaptive_avg_pool1d", F.adaptive_avg_pool1d)


def adaptive_avg_pool2d(input: Tensor, output_size: SizeArg) -> Tensor:
    """Deterministic ``torch.nn.functional.adaptive_avg_pool2d`` (same signature and result).

    Args:
        input: ``(N, C, H, W)`` or ``(C, H, W)`` floating tensor (any memory format).
        output_size: ``O`` or ``(Oh, Ow)``; ``None`` in a tuple keeps that input size.

    Returns:
        The pooled tensor, in the input's dtype (float32 accumulation for float16/bfloat16) and,
        for channels_last input, in channels_last.
    """
    outs = _plan(input, output_size, 2)
    if outs is None:
        return F.adaptive_avg_pool2d(input, output_size)  # type: ignore[arg-type]
    return _adaptive_avg(input, outs, "adaptive_avg_pool2d", F.adaptive_avg_pool2d)


def adaptive_avg_pool3d(input: Tensor, output_size: SizeArg) -> Tensor:
    """Deterministic ``torch.nn.functional.adaptive_avg_pool3d`` (same signature and result).

    Args:
        input: ``(N, C, D, H, W)`` or ``(C, D, H, W)`` floating tensor.
        output_size: ``O`` or ``(Od, Oh, Ow)``; ``None`` in a tuple keeps that input size.

    Returns:
        The pooled tensor.
    """
    outs = _plan(input, output_size, 3)
    if outs is None:
        return F.adaptive_avg_pool3d(input, output_size)  # type: ignore[arg-type]
    return _adaptive_avg(input, outs, "adaptive_avg_pool3d", F.adaptive_avg_pool3d)


# ----------------------------------------------------------------------------------------------------
# Max
# ----------------------------------------------------------------------------------------------------


Windows = tuple[tuple[int, ...], tuple[int, ...]]


def _window_max(t: Tensor, dim: int, win: Windows) -> Tensor:
    """Max (NaN-propagating ``amax``) over each window along ``dim``, keeping the axis."""
    starts, ends = win
    size, count = t.shape[dim], len(starts)
    if count == 1 and starts[0] == 0 and ends[0] == size:
        return t.amax(dim, keepdim=True)
    if size % count == 0:  # windows tile the axis
        return t.unflatten(dim, (count, size // count)).amax(dim + 1)
    parts = [t.narrow(dim, s, e - s).amax(dim, keepdim=True) for s, e in zip(starts, ends)]
    return torch.cat(parts, dim)


def _select(cand: Tensor, dim: int) -> tuple[Tensor, Tensor]:
    """Maximum along ``dim`` and the position ATen's kernels select: the first maximum (``max(dim)``
    returns the first one), or the last NaN when there is a NaN (the largest NaN position)."""
    values, first = cand.max(dim, keepdim=True)
    shape = [1] * cand.dim()
    shape[dim] = cand.shape[dim]
    pos = torch.arange(cand.shape[dim], dtype=torch.int32, device=cand.device).view(shape)
    none = torch.full((), -1, dtype=torch.int32, device=cand.device)
    last_nan = torch.where(torch.isnan(cand), pos, none).amax(dim, keepdim=True)
    return values, torch.where(last_nan >= 0, last_nan.to(torch.int64), first)


def _taps(win: Windows, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    """``(table, starts, lasts)``: each window's positions padded to the longest by repeating its last
    position (``table`` is ``(O, K)``), and the first and last position of each window (``(O, 1)``)."""
    starts, ends = win
    k = max(e - s for s, e in zip(starts, ends))
    table = [[min(s + t, e - 1) for t in range(k)] for s, e in zip(starts, ends)]
    return (torch.tensor(table, dtype=torch.int64, device=device),
            torch.tensor(starts, dtype=torch.int64, device=device).view(-1, 1),
            torch.tensor([e - 1 for e in ends], dtype=torch.int64, device=device).view(-1, 1))


def _max_with_index(x: Tensor, hwin: Windows, wwin: Windows) -> tuple[Tensor, Tensor]:
    """Adaptive max over the last two axes and ATen's flat ``h * W + w`` argmax (row-major scan).

    Column windows are reduced first with ``amax`` on slices (no copy of the input); the row windows
    of those row maxima (a small tensor) give the output and, per output, the first row (last NaN
    row) holding it; one gathered window row per output then gives the column. Together that is the
    first maximum (or last NaN) in row-major order, the element ATen's kernels select.
    """
    w = x.shape[-1]
    oh, ow = len(hwin[0]), len(wwin[0])
    rows_max = _window_max(x, x.dim() - 1, wwin)  # (..., H, Ow)
    tab_h, hs, hl = _taps(hwin, x.device)
    cand = rows_max.index_select(-2, tab_h.reshape(-1)).unflatten(-2, (oh, tab_h.shape[1]))  # (..., Oh, Kh, Ow)
    out, local = _select(cand, -2)
    out = out.squeeze(-2)
    rows = torch.minimum(hs + local.squeeze(-2), hl)  # (..., Oh, Ow); a padded repeat maps to the last row
    tab_w, ws, wl = _taps(wwin, x.device)
    kw = tab_w.shape[1]
    lead = rows.shape[:-2]
    if x.stride(-2) == w * x.stride(-1):  # the plane flattens to a view: gather each window's row
        flat = (rows.unsqueeze(-1) * w + tab_w).reshape(*lead, oh * ow * kw)
        cand = torch.gather(x.flatten(-2), -1, flat).view(*lead, oh, ow, kw)
    else:  # e.g. channels_last: gather whole rows, then the window's columns
        xrows = torch.gather(x, -2, rows.reshape(*lead, oh * ow, 1).expand(*lead, oh * ow, w))
        cand = torch.gather(xrows.view(*lead, oh, ow, w), -1, tab_w.expand(*lead, oh, ow, kw))
    _, local = _select(cand, -1)
    cols = torch.minimum(ws.view(-1) + local.squeeze(-1), wl.view(-1))
    return out, rows * w + cols


def _max_input_grad(grad: Tensor, index: Tensor, shape: torch.Size) -> Tensor:
    """Route each output gradient to its selected element; overlapping windows may select the same
    element, so contributions are accumulated with ``index_put_(accumulate=True)``, which sorts the
    indices (deterministic on CUDA with or without the flag). Differentiable in ``grad``."""
    lead = 1
    for s in shape[:-2]:
        lead *= int(s)
    plane = int(shape[-2]) * int(shape[-1])
    flat = index.reshape(lead, -1) + torch.arange(lead, device=index.device).unsqueeze(1) * plane
    out = grad.new_zeros(lead * plane)
    out.index_put_((flat.reshape(-1),), grad.reshape(-1), accumulate=True)
    return out.view(shape)


class DetAdaptiveMaxPool(torch.autograd.Function):
    """Adaptive max pooling over the last two axes; the backward sends each output gradient to the
    element ATen's kernels select (first maximum in row-major order, last NaN)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, hwin: Windows, wwin: Windows) -> tuple[Tensor, Tensor]:
        out, index = _max_with_index(x, hwin, wwin)
        ctx.mark_non_differentiable(index)
        ctx.save_for_backward(index)
        ctx.shape = x.shape
        return out, index

    @staticmethod
    def backward(ctx: Any, grad: Tensor, _grad_index: Tensor) -> tuple[Tensor, None, None]:
        (index,) = ctx.saved_tensors
        return _max_input_grad(grad, index, ctx.shape), None, None


def _adaptive_max2d(x: Tensor, outs: Sequence[int], return_indices: bool) -> Tensor | tuple[Tensor, Tensor]:
    sizes = list(x.shape[-2:])
    if all(s % o == 0 for s, o in zip(sizes, outs)):
        # windows tile the plane: exactly max_pool2d's (same scan order, NaN rule and indices)
        k = (sizes[0] // outs[0], sizes[1] // outs[1])
        if return_indices:
            out, index = F.max_pool2d(x, kernel_size=k, stride=k, return_indices=True)
            return match_memory_format(out, x), match_memory_format(index, x)
        return match_memory_format(F.max_pool2d(x, kernel_size=k, stride=k), x)
    out, index = DetAdaptiveMaxPool.apply(x, _windows(sizes[0], outs[0]), _windows(sizes[1], outs[1]))
    if return_indices:
        return match_memory_format(out, x), match_memory_format(index, x)
    return match_memory_format(out, x)


def adaptive_max_pool2d(input: Tensor, output_size: SizeArg,
                        return_indices: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """Deterministic ``torch.nn.functional.adaptive_max_pool2d`` (same signature and result).

    Ties send the gradient to the first maximum in row-major scan order and a NaN wins over numbers
    (the last NaN in scan order), exactly like PyTorch's CPU and CUDA kernels; ``return_indices``
    gives the same flat ``h * W + w`` indices.

    Args:
        input: ``(N, C, H, W)`` or ``(C, H, W)`` tensor (any memory format).
        output_size: ``O`` or ``(Oh, Ow)``; ``None`` in a tuple keeps that input size.
        return_indices: Also return the argmax indices.

    Returns:
        The pooled tensor, or ``(pooled, indices)``.
    """
    outs = _plan(input, output_size, 2)
    if outs is None:
        return _torch_adaptive_max(F.adaptive_max_pool2d, input, output_size, return_indices)
    return _adaptive_max2d(input, outs, return_indices)


def _torch_adaptive_max(native: Any, input: Tensor, output_size: SizeArg,
                        return_indices: bool) -> Tensor | tuple[Tensor, Tensor]:
    """PyTorch's own adaptive max pooling: the arguments as given, so that PyTorch accepts or rejects them itself
    (its stubs leave out ``None`` entries in ``output_size``, which it accepts)."""
    result: Tensor | tuple[Tensor, Tensor] = native(input, output_size, return_indices)
    return result


def adaptive_max_pool1d(input: Tensor, output_size: SizeArg,
                        return_indices: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """Deterministic ``torch.nn.functional.adaptive_max_pool1d`` (same signature and result).

    Args:
        input: ``(N, C, L)`` or ``(C, L)`` tensor.
        output_size: Target length (an int or a one-element tuple).
        return_indices: Also return the argmax indices (positions along ``L``).

    Returns:
        The pooled tensor, or ``(pooled, indices)``.
    """
    outs = _plan(input, output_size, 1)
    if outs is None:
        return _torch_adaptive_max(F.adaptive_max_pool1d, input, output_size, return_indices)
    result = _adaptive_max2d(input.unsqueeze(-2), [1, outs[0]], return_indices)
    if isinstance(result, tuple):
        out, ind = result
        return out.squeeze(-2), ind.squeeze(-2)
    return result.squeeze(-2)


# ----------------------------------------------------------------------------------------------------
# Modules
# ----------------------------------------------------------------------------------------------------


class DetAdaptiveAvgPool1d(nn.AdaptiveAvgPool1d):
    """Deterministic drop-in for :class:`torch.nn.AdaptiveAvgPool1d` (same arguments, repr, state)."""

    def forward(self, input: Tensor) -> Tensor:
        return adaptive_avg_pool1d(input, self.output_size)


class DetAdaptiveAvgPool2d(nn.AdaptiveAvgPool2d):
    """Deterministic drop-in for :class:`torch.nn.AdaptiveAvgPool2d` (same arguments, repr, state)."""

    def forward(self, input: Tensor) -> Tensor:
        return adaptive_avg_pool2d(input, self.output_size)


class DetAdaptiveAvgPool3d(nn.AdaptiveAvgPool3d):
    """Deterministic drop-in for :class:`torch.nn.AdaptiveAvgPool3d` (same arguments, repr, state)."""

    def forward(self, input: Tensor) -> Tensor:
        return adaptive_avg_pool3d(input, self.output_size)


class DetAdaptiveMaxPool1d(nn.AdaptiveMaxPool1d):
    """Deterministic drop-in for :class:`torch.nn.AdaptiveMaxPool1d` (same arguments, repr, state)."""

    def forward(self, input: Tensor) -> Tensor | tuple[Tensor, Tensor]:
        return adaptive_max_pool1d(input, self.output_size, self.return_indices)


class DetAdaptiveMaxPool2d(nn.AdaptiveMaxPool2d):
    """Deterministic drop-in for :class:`torch.nn.AdaptiveMaxPool2d` (same arguments, repr, state)."""

    def forward(self, input: Tensor) -> Tensor | tuple[Tensor, Tensor]:
        return adaptive_max_pool2d(input, self.output_size, self.return_indices)
