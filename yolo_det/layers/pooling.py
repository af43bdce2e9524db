"""Deterministic adaptive average and max pooling (drop-ins for ``nn.AdaptiveAvgPool*d``/``MaxPool*d``).

PyTorch's CUDA *backward* kernels of adaptive pooling accumulate with atomics (``adaptive_avg_pool2d``
for any output other than 1x1, ``adaptive_max_pool2d`` for every output size); their forward kernels
are deterministic (one thread computes one output from its window). These versions keep a native
forward and replace every backward with one that uses no atomics:

* **Windows that tile the input** (global pooling, or ``O`` dividing ``L`` on every axis): ``mean``,
  ``avg_pool2d`` and ``max_pool2d`` with ``kernel = stride = L/O``: the same windows, scan order, NaN
  rule and indices, and backward kernels that gather (deterministic).
* **General windows** (window ``i`` of an axis of length ``L`` pooled to ``O`` is
  ``[floor(i*L/O), ceil((i+1)*L/O))``; neighbouring windows may share positions): a custom autograd
  function runs ATen's own ``adaptive_{avg,max}_pool`` forward (so values, ties and NaN handling are
  PyTorch's bit for bit, ``return_indices`` included) and saves only what the native op saves:

  - *average*: nothing. Backward (:class:`DetAdaptiveAvgPoolGrad`, in :mod:`._window_adjoint` with the
    window geometry): each output gradient divided by its
    window size, then spread back one axis at a time, output axes first (the tensor is small there).
    On the CPU (1-D and 2-D, float32/float64, each position in at most two windows, finite gradient)
    as one 0/1 window-membership matrix product per axis, ``M_h^T @ g @ M_w``: a dot product with at
    most two non-zero terms has one possible result whatever the BLAS summation order. Otherwise:
    every input position takes the value of the first window holding it with one ``index_select``,
    positions shared with the next window get that window's value added with one slice add per window.
    Gathers and slice adds only; done in batch chunks so no full-size intermediate exists.
  - *max*: the ``int64`` indices. Backward (:class:`DetMaxPoolRouteGrad`): on the CPU ``scatter_add_``
    in output order (deterministic there, and PyTorch's own summation order). On CUDA and other devices
    no accumulation kernel runs at all: overlapping windows can select the same element only when they
    are at most ``reach`` windows apart (1 unless the output is larger than the input), so for every
    output the gradients of the outputs within reach that selected the same element are added first, in
    increasing output order (every member of a group adds the same terms in the same order: bit-identical
    totals), and a plain ``scatter_`` writes them; duplicates write the same bits, so the write order
    cannot change the result. Ties therefore send the gradient to the element ATen selects (first maximum
    in row-major order, last NaN), like the CUDA kernel. Its double backward is a gather.

float16/bfloat16 inputs are pooled in float32 and cast back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._common import amp_plan, autocast_off, match_memory_format
from ._window_adjoint import (
    _NATIVE_AVG,
    DetAdaptiveAvgPoolGrad,
    Windows,
    _reach,
    _windows,
)

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
    wins = tuple(_windows(s, o) for s, o in zip(sizes, outs))
    return DetAdaptiveAvgPool.apply(y, wins)


class DetAdaptiveAvgPool(torch.autograd.Function):
    """Adaptive average pooling whose windows overlap or do not tile the input.

    Forward: ATen's own ``adaptive_avg_pool{1,2,3}d`` kernel (deterministic on every device: each
    output is one thread's sum over its window), so the result is PyTorch's bit for bit. Backward:
    :class:`DetAdaptiveAvgPoolGrad` instead of the CUDA kernel that accumulates with atomics. Saves
    nothing but the sizes (the native op keeps no tensor either)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, wins: tuple[Windows, ...]) -> Tensor:
        n = len(wins)
        ctx.wins = wins
        ctx.sizes = tuple(int(s) for s in x.shape[-n:])
        return _NATIVE_AVG[n](x, [len(w[0]) for w in wins])

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor, None]:
        return DetAdaptiveAvgPoolGrad.apply(g, ctx.wins, ctx.sizes), None


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


def _add_duplicates(grad: Tensor, index: Tensor, reach: tuple[int, int]) -> Tensor:
    """For every output, the sum of the gradients of all outputs that select the same element.

    Only outputs whose windows overlap can select the same element: those at most ``reach`` apart
    along each axis. The neighbours are visited in increasing row-major position, so every output
    of a group adds the same terms in the same order and gets bit-identical totals (starting from
    +0, like the CPU kernel's accumulation into a zeroed gradient)."""
    dh, dw = reach
    oh, ow = index.shape[-2], index.shape[-1]
    f = F.pad(index, (dw, dw, dh, dh), value=-1)
    g = F.pad(grad, (dw, dw, dh, dh))
    zero = torch.zeros((), dtype=grad.dtype, device=grad.device)
    total = torch.zeros_like(grad)
    for di in range(2 * dh + 1):
        for dj in range(2 * dw + 1):
            same = f[..., di : di + oh, dj : dj + ow] == index
            total = total + torch.where(same, g[..., di : di + oh, dj : dj + ow], zero)
    return total


class DetMaxPoolRouteGrad(torch.autograd.Function):
    """The input gradient of adaptive max pooling: each output gradient goes to the element its
    window selected, gradients of outputs that selected the same element add up.

    On the CPU this is ``scatter_add_`` (serial, in output order: the CPU kernel's own order). On
    other devices no accumulation kernel is used: the gradients of outputs that share an element
    are added first (:func:`_add_duplicates`, fixed order), then written with a plain ``scatter_``;
    outputs that share an element write the same bits, so the write order cannot matter. The
    backward (double backward of the pooling) is a gather."""

    @staticmethod
    def forward(
        ctx: Any, grad: Tensor, index: Tensor, shape: torch.Size, reach: tuple[int, int], combine: bool
    ) -> Tensor:
        ctx.save_for_backward(index)
        lead = grad.numel() // max(1, index.shape[-2] * index.shape[-1]) if grad.numel() else 0
        plane = int(shape[-2]) * int(shape[-1])
        flat_index = index.reshape(lead, -1)
        out = grad.new_zeros(lead, plane)
        if combine:
            src = _add_duplicates(grad, index, reach) if any(reach) else grad
            out.scatter_(1, flat_index, src.reshape(lead, -1))
        else:
            out.scatter_add_(1, flat_index, grad.reshape(lead, -1))
        return out.view(shape)

    @staticmethod
    def backward(ctx: Any, gg: Tensor) -> tuple[Tensor, None, None, None, None]:
        (index,) = ctx.saved_tensors
        lead = index.numel() // max(1, index.shape[-2] * index.shape[-1]) if index.numel() else 0
        picked = gg.reshape(lead, -1).gather(1, index.reshape(lead, -1))
        return picked.view(index.shape), None, None, None, None


def _max_input_grad(
    grad: Tensor, index: Tensor, shape: torch.Size, reach: tuple[int, int], combine: bool | None = None
) -> Tensor:
    """Route each output gradient to its selected element (see :class:`DetMaxPoolRouteGrad`);
    ``combine`` defaults to the accumulation-free path everywhere but on the CPU."""
    if combine is None:
        combine = grad.device.type != "cpu"
    return DetMaxPoolRouteGrad.apply(grad.contiguous(), index.contiguous(), shape, reach, combine)


class DetAdaptiveMaxPool(torch.autograd.Function):
    """Adaptive max pooling over the last two axes; the backward sends each output gradient to the
    element ATen's kernels select (first maximum in row-major order, last NaN). Saves only the
    indices (as the native op does)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, hwin: Windows, wwin: Windows):
        out, index = torch._C._nn.adaptive_max_pool2d(x, [len(hwin[0]), len(wwin[0])])
        ctx.mark_non_differentiable(index)
        ctx.set_materialize_grads(False)  # no zero-filled gradient for the indices (an int64 output-size tensor)
        ctx.save_for_backward(index)
        ctx.shape = x.shape
        ctx.reach = (_reach(hwin), _reach(wwin))
        return out, index

    @staticmethod
    def backward(ctx: Any, grad: Tensor | None, _grad_index: Tensor | None):
        if grad is None:
            return None, None, None
        (index,) = ctx.saved_tensors
        return _max_input_grad(grad, index, ctx.shape, ctx.reach), None, None


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


def adaptive_max_pool2d(
    input: Tensor, output_size: SizeArg, return_indices: bool = False
) -> Tensor | tuple[Tensor, Tensor]:
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


def _torch_adaptive_max(
    native: Any, input: Tensor, output_size: SizeArg, return_indices: bool
) -> Tensor | tuple[Tensor, Tensor]:
    """PyTorch's own adaptive max pooling: the arguments as given, so that PyTorch accepts or rejects them itself
    (its stubs leave out ``None`` entries in ``output_size``, which it accepts)."""
    result: Tensor | tuple[Tensor, Tensor] = native(input, output_size, return_indices)
    return result


def adaptive_max_pool1d(
    input: Tensor, output_size: SizeArg, return_indices: bool = False
) -> Tensor | tuple[Tensor, Tensor]:
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
