"""Deterministic reflection and replication padding (drop-ins for ``nn.ReflectionPad*``/``ReplicationPad*``).

PyTorch's CUDA backward kernels of ``reflection_pad1d/3d`` (2d too before ~2.6) and
``replication_pad1d/2d/3d`` accumulate with atomics (replicate switches to an index-based
decomposition when the deterministic flag is on at forward time, on recent releases). Padding is a
fixed linear map that copies input elements, so it is computed here by a small autograd function:

* forward: ATen's own padding kernel (bit-exact by construction; every output element reads one
  input element, so it is deterministic on every device: only ATen's *backward* accumulates);
* backward (the adjoint): the centre of the gradient is copied once and the border gradients are
  added onto the elements they came from, outermost axis first: border slabs of the outer axes are
  folded along the inner axes first, and the innermost axis folds straight from views of the gradient,
  the left and right border rows of the same depth in one strided slice add (``reflect``: onto the
  mirrored rows, ``replicate``: onto the edge row).

The backward is slicing, copies and additions only (no atomics, no scatter) and is itself
differentiable (its adjoint is the forward); it agrees with PyTorch up to the order of the at most
three additions per element (``reflect``) or of the border sum (``replicate``). Negative pads crop, as in PyTorch.
``constant`` and ``circular`` padding are already deterministic and pass through to PyTorch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from . import _native
from ._common import amp_plan, autocast_off

__all__ = [
    "DetReflectionPad1d",
    "DetReflectionPad2d",
    "DetReflectionPad3d",
    "DetReplicationPad1d",
    "DetReplicationPad2d",
    "DetReplicationPad3d",
    "pad",
]

Pads = tuple[tuple[int, int, int], ...]  # (dim, left, right) per padded axis, last axis first


def _memory_format(x: Tensor) -> torch.memory_format:
    if x.is_contiguous():
        return torch.contiguous_format
    if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    if x.dim() == 5 and x.is_contiguous(memory_format=torch.channels_last_3d):
        return torch.channels_last_3d
    return torch.contiguous_format


_ATEN: Any = torch._C._nn  # the padding kernels (not in torch's type stubs)
_NATIVE_PAD = {
    ("reflect", 1): _ATEN.reflection_pad1d,
    ("reflect", 2): _ATEN.reflection_pad2d,
    ("reflect", 3): _ATEN.reflection_pad3d,
    ("replicate", 1): _ATEN.replication_pad1d,
    ("replicate", 2): _ATEN.replication_pad2d,
    ("replicate", 3): _ATEN.replication_pad3d,
}

#: Border widths up to which the adjoint adds one slice per border row instead of a flipped copy.
_SLICE_ADDS_MAX = 4


def _pad_forward(x: Tensor, pads: Pads, mode: str, n: int) -> Tensor:
    """ATen's own padding kernel (a gather: every output element reads one input element, on every
    device), with the non-negative pads of the ``n`` trailing axes."""
    widths = [0] * (2 * n)
    for d, left, right in pads:
        i = x.dim() - 1 - d
        widths[2 * i], widths[2 * i + 1] = left, right
    out: Tensor = _NATIVE_PAD[(mode, n)](x, widths)
    return out


def _fold_border(out: Tensor, border: Tensor, d: int, left: bool, mode: str) -> None:
    """Add a left (or right) border's gradient along ``d`` onto the elements it was copied from: for
    ``reflect`` border row ``k`` onto ``out[w - k]`` (right: ``out[L - 2 - k]``), for ``replicate``
    every row onto the edge. One slice add per border row (no flipped copy, no reduction over a
    short strided axis) up to :data:`_SLICE_ADDS_MAX` rows."""
    width, size = border.shape[d], out.shape[d]
    if mode == "replicate":
        target = out.narrow(d, 0 if left else size - 1, 1)
        for k in range(width):
            target.add_(border.narrow(d, k, 1))
    elif width <= _SLICE_ADDS_MAX:
        for k in range(width):
            out.narrow(d, width - k if left else size - 2 - k, 1).add_(border.narrow(d, k, 1))
    else:
        out.narrow(d, 1 if left else size - 1 - width, width).add_(border.flip(d))


def _pair(t: Tensor, d: int, first: int, second: int) -> Tensor:
    """The view of ``t`` holding positions ``first < second`` along ``d`` (one strided slice)."""
    return t[(slice(None),) * d + (slice(first, second + 1, second - first),)]


def _fold_innermost(out: Tensor, g: Tensor, d: int, left: int, right: int, mode: str) -> None:
    """Add the border rows of ``g`` along ``d`` onto ``out`` (the centre), reading them from ``g``
    itself: border row ``k`` of the left side and of the right side go in one slice add where their
    targets are distinct (a strided two-element view: the innermost axis is usually the last, where
    every border element of every row is a separate cache line, so one pass instead of two halves
    the traffic); the rest one row at a time."""
    size = out.shape[d]
    for k in range(max(left, right)):
        src = (k, left + size + k)
        dst = (0, size - 1) if mode == "replicate" else (left - k, size - 2 - k)
        if k < left and k < right and dst[0] < dst[1]:
            _pair(out, d, *dst).add_(_pair(g, d, *src))
            continue
        if k < left:
            out.narrow(d, dst[0], 1).add_(g.narrow(d, src[0], 1))
        if k < right:
            out.narrow(d, dst[1], 1).add_(g.narrow(d, src[1], 1))


def _pad_adjoint(g: Tensor, pads: Pads, mode: str) -> Tensor:
    """Fold the border gradients back onto the elements they were copied from.

    Recursive over the padded axes, outermost first, so the large centre is copied once, the
    innermost (usually the last, strided) axis folds straight from ``g`` (:func:`_fold_innermost`),
    and only border slabs of the outer axes are copied and folded along the inner axes first."""
    (d, left, right), rest = pads[0], pads[1:]
    size = g.shape[d] - left - right
    centre = g.narrow(d, left, size)
    if not rest:
        out = centre.clone(memory_format=torch.contiguous_format)
        _fold_innermost(out, g, d, left, right, mode)
        return out
    out = _pad_adjoint(centre, rest, mode)
    if left:
        _fold_border(out, _pad_adjoint(g.narrow(d, 0, left), rest, mode), d, True, mode)
    if right:
        _fold_border(out, _pad_adjoint(g.narrow(d, left + size, right), rest, mode), d, False, mode)
    return out


class DetPad(torch.autograd.Function):
    """Reflection/replication padding (or its adjoint); the backward is the other one of the pair."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, pads: Pads, mode: str, adjoint: bool, n: int) -> Tensor:
        ctx.args = (pads, mode, adjoint, n)
        if adjoint:
            return _pad_adjoint(x, tuple(sorted(pads)), mode)
        return _pad_forward(x, pads, mode, n)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, None, None, None, None]:
        pads, mode, adjoint, n = ctx.args
        return DetPad.apply(grad, pads, mode, not adjoint, n), None, None, None, None


def _split(x: Tensor, pad: Sequence[int], mode: str) -> tuple[Pads, list[tuple[int, int, int]]] | None:
    """Positive pads and crops per axis, or ``None`` when PyTorch would reject the arguments."""
    n = len(pad) // 2
    if len(pad) % 2 or n not in (1, 2, 3) or x.dim() not in (n + 1, n + 2):
        return None
    pads: list[tuple[int, int, int]] = []
    crops: list[tuple[int, int, int]] = []
    for i in range(n):
        left, right = int(pad[2 * i]), int(pad[2 * i + 1])
        d = x.dim() - 1 - i
        size = x.shape[d]
        if size + left + right < 1 or size < 1:
            return None
        if mode == "reflect" and (left >= size or right >= size):
            return None
        if left > 0 or right > 0:
            pads.append((d, max(left, 0), max(right, 0)))
        if left < 0 or right < 0:
            crops.append((d, max(-left, 0), max(-right, 0)))
    return tuple(pads), crops


def pad(input: Tensor, pad: Sequence[int], mode: str = "constant", value: float | None = None) -> Tensor:
    """Deterministic ``torch.nn.functional.pad`` for ``reflect`` and ``replicate`` (same signature and result).

    ``constant`` and ``circular`` (already deterministic) and arguments PyTorch rejects go to
    ``torch.nn.functional.pad``.

    Args:
        input: Tensor with 1-3 padded trailing axes (``(N, C, *spatial)`` or ``(C, *spatial)``).
        pad: ``(left, right[, top, bottom[, front, back]])``, last axis first; negative values crop.
        mode: ``constant``, ``reflect``, ``replicate`` or ``circular``.
        value: Fill value for ``constant`` padding.

    Returns:
        The padded tensor (channels_last input gives channels_last output, like PyTorch on the CPU).
    """
    if mode not in ("reflect", "replicate") or value is not None:
        return _native.pad(input, pad, mode=mode, value=value)
    split = _split(input, pad, mode)
    if split is None:
        return _native.pad(input, pad, mode=mode, value=value)
    pads, crops = split
    n = len(pad) // 2

    def probe(device: str) -> Tensor:
        return _native.pad(torch.zeros((1, 1) + (3,) * n, dtype=input.dtype, device=device), [1] * (2 * n), mode=mode)

    _, out_dtype, active = amp_plan(f"pad:{mode}:{n}", probe, [input])
    with autocast_off(input.device.type, active):
        # padding copies values: it is exact in any dtype, so no float32 round trip
        y = input.to(out_dtype)
        if pads:
            y = DetPad.apply(y, pads, mode, False, n)
        elif not crops:
            y = y.clone()
        for d, left, right in crops:
            y = y.narrow(d, left, y.shape[d] - left - right)
        if crops:
            y = y.contiguous(memory_format=_memory_format(input))
    return y


class _PadModule:
    _mode = "reflect"  # the replication pads say "replicate"

    def forward(self, input: Tensor) -> Tensor:
        return pad(input, self.padding, self._mode)  # type: ignore[attr-defined]


class DetReflectionPad1d(_PadModule, nn.ReflectionPad1d):
    """Deterministic drop-in for :class:`torch.nn.ReflectionPad1d` (same arguments, repr, state)."""


class DetReflectionPad2d(_PadModule, nn.ReflectionPad2d):
    """Deterministic drop-in for :class:`torch.nn.ReflectionPad2d` (same arguments, repr, state)."""


class DetReflectionPad3d(_PadModule, nn.ReflectionPad3d):
    """Deterministic drop-in for :class:`torch.nn.ReflectionPad3d` (same arguments, repr, state)."""


class DetReplicationPad1d(_PadModule, nn.ReplicationPad1d):
    """Deterministic drop-in for :class:`torch.nn.ReplicationPad1d` (same arguments, repr, state)."""

    _mode = "replicate"


class DetReplicationPad2d(_PadModule, nn.ReplicationPad2d):
    """Deterministic drop-in for :class:`torch.nn.ReplicationPad2d` (same arguments, repr, state)."""

    _mode = "replicate"


class DetReplicationPad3d(_PadModule, nn.ReplicationPad3d):
    """Deterministic drop-in for :class:`torch.nn.ReplicationPad3d` (same arguments, repr, state)."""

    _mode = "replicate"
