"""Deterministic adaptive average and max pooling (drop-ins for ``nn.AdaptiveAvgPool*d``/``MaxPool*d``).

PyTorch's CUDA backward kernels of adaptive pooling accumulate with atomics (``adaptive_avg_pool2d``
for any output other than 1x1, ``adaptive_max_pool2d`` for every output size). These versions compute
the same function with kernels whose backward is deterministic:

* **Average.** Adaptive pooling is separable: window ``i`` along an axis of length ``L`` pooled to
  ``O`` is ``[floor(i*L/O), ceil((i+1)*L/O))``. Global pooling is a ``mean`` (what ATen does for 1x1
  itself); when ``O`` divides ``L`` on both axes the windows are those of ``avg_pool2d`` with
  ``kernel = stride = L/O``; otherwise each axis with overlapping windows is reduced by a sparse
  average map (:class:`~yolo_det.layers._common.AxisMap`) whose forward and backward are gathers.
* **Max.** Each axis whose windows do not tile it is first *unfolded* by a gather into blocks of
  ``K`` (largest window) entries, a window's own elements in order followed by repeats of its last
  element; then ``max_pool2d`` with ``kernel = stride`` scans every block. A first-maximum scan (and
  the last-NaN rule of the CUDA and CPU kernels) over such a block picks the same input element as a
  row-major scan over the original window, so values, ``return_indices`` and the gradient (sent to
  the *first* maximum, not split among ties like ``amax``) are those of the native op, NaN included.
  ``max_pool2d``'s backward is gather-style on CUDA, the unfold's backward is a gather.

Summation order differs from the native kernels (separable means), so float32 results agree to a
few ulps, float64 to ~1e-16. float16/bfloat16 inputs are averaged in float32 and cast back.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._common import AxisMap, amp_plan, apply_axis_map, autocast_off, match_memory_format, outside_modes

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


def _windows(in_size: int, out_size: int) -> tuple[list[int], list[int]]:
    """ATen's adaptive windows: ``[floor(i*L/O), ceil((i+1)*L/O))`` for ``i < O``."""
    starts = [(i * in_size) // out_size for i in range(out_size)]
    ends = [-((-(i + 1) * in_size) // out_size) for i in range(out_size)]
    return starts, ends


@functools.lru_cache(maxsize=512)
def _avg_map(in_size: int, out_size: int) -> AxisMap:
    with outside_modes():
        starts, ends = _windows(in_size, out_size)
        return AxisMap.from_windows(in_size, starts, ends, average=True)


@functools.lru_cache(maxsize=512)
def _unfold_map(in_size: int, out_size: int) -> AxisMap:
    with outside_modes():
        starts, ends = _windows(in_size, out_size)
        return AxisMap.from_windows(in_size, starts, ends, average=False)


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
            y = apply_axis_map(y, d, _avg_map(s, o))
            changed = True
    return y if changed else y.clone()


def _adaptive_avg(x: Tensor, outs: list[int], key: str, native: object) -> Tensor:
    n = len(outs)

    def probe(device: str) -> Tensor:
        return native(torch.zeros((1, 1) + (4,) * n, dtype=x.dtype, device=device), [3] * n)  # type: ignore[operator]

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


def _adaptive_max2d(x: Tensor, outs: Sequence[int], return_indices: bool) -> Tensor | tuple[Tensor, Tensor]:
    sizes = list(x.shape[-2:])
    y = x
    kernel = []
    maps: list[AxisMap | None] = []
    for i, (s, o) in enumerate(zip(sizes, outs)):
        if s % o == 0:
            kernel.append(s // o)
            maps.append(None)
        else:
            amap = _unfold_map(s, o)
            y = apply_axis_map(y, x.dim() - 2 + i, amap)
            kernel.append(amap.out_size // o)
            maps.append(amap)
    k = (kernel[0], kernel[1])
    if not return_indices:
        return match_memory_format(F.max_pool2d(y, kernel_size=k, stride=k), x)
    out, ind = F.max_pool2d(y, kernel_size=k, stride=k, return_indices=True)
    if maps[0] is not None or maps[1] is not None:
        wg = y.shape[-1]
        rows, cols = ind // wg, ind % wg
        if maps[0] is not None:
            rows = maps[0].on(ind).index[0][rows]
        if maps[1] is not None:
            cols = maps[1].on(ind).index[0][cols]
        ind = rows * sizes[1] + cols
    return match_memory_format(out, x), match_memory_format(ind, x)


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
        return F.adaptive_max_pool2d(input, output_size, return_indices)  # type: ignore[arg-type]
    return _adaptive_max2d(input, outs, return_indices)


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
        return F.adaptive_max_pool1d(input, output_size, return_indices)  # type: ignore[arg-type]
    result = _adaptive_max2d(input.unsqueeze(-2), [1, outs[0]], return_indices)
    if return_indices:
        out, ind = result
        return out.squeeze(-2), ind.squeeze(-2)
    return result.squeeze(-2)  # type: ignore[union-attr]


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

    def forward(self, input: Tensor):  # type: ignore[override]
        return adaptive_max_pool1d(input, self.output_size, self.return_indices)


class DetAdaptiveMaxPool2d(nn.AdaptiveMaxPool2d):
    """Deterministic drop-in for :class:`torch.nn.AdaptiveMaxPool2d` (same arguments, repr, state)."""

    def forward(self, input: Tensor):  # type: ignore[override]
        return adaptive_max_pool2d(input, self.output_size, self.return_indices)
