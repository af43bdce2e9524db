"""Deterministic ``interpolate`` and ``Upsample`` for the linear-family modes and ``area``.

PyTorch's CUDA backward kernels of ``linear``, ``bilinear``, ``bicubic``, ``trilinear`` and the
antialiased modes accumulate with atomics (bilinear/trilinear only switch to a slow index-based
decomposition when the deterministic flag is on at forward time). All these modes are separable: the
output is a fixed 1-D linear map applied along each spatial axis. The map of an axis depends only on
``(mode, input length, output length or scale, align_corners, antialias)``, so it is read off PyTorch's
own CPU kernel: an identity basis is pushed through ``F.interpolate`` in float64 (the other axes kept at
length 2 with scale 1, where every mode is the identity) and the non-zero weights of each output index
are kept as a few taps. Border clamping, cubic ``A = -0.75``, antialias filters and the
``scale_factor`` semantics (``1/scale_factor`` is used when a scale is given and not recomputed) are
therefore PyTorch's by construction. The maps are cached per configuration and applied one axis at a
time with :func:`~yolo_det.layers._common.apply_axis_maps` (one autograd node, batch chunks):
gathers and multiply-adds, forward and backward (the transposed map), no atomics, no matrix multiply
(TF32 settings have no effect).

``area`` is adaptive average pooling (as in PyTorch) and uses :mod:`yolo_det.layers.pooling`.
``nearest`` and ``nearest-exact`` are already deterministic and pass through to PyTorch.

Differences: float32 results differ from the native kernel by a few ulps (weights computed in float64,
another summation order); a tap whose weight is exactly zero is dropped, so a non-finite input value
there does not spread (PyTorch multiplies it by zero, giving NaN).
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Sequence
from typing import Union

import torch
from torch import Tensor, nn

from . import _native
from ._common import AxisMap, amp_plan, apply_axis_maps, autocast_off, match_memory_format, outside_modes
from .pooling import adaptive_avg_pool1d, adaptive_avg_pool2d, adaptive_avg_pool3d

__all__ = ["DetUpsample", "DetUpsamplingBilinear2d", "interpolate"]

#: (input dim, mode) pairs computed here; others pass through to PyTorch.
_LINEAR_MODES = {(3, "linear"), (4, "bilinear"), (4, "bicubic"), (5, "trilinear"), (4, "lanczos")}

#: Basis vectors probed per call of the native kernel (bounds the probe's memory).
_PROBE_CHUNK = 256

Number = Union[int, float]


@functools.lru_cache(maxsize=1024)
def _interp_map(
    mode: str,
    nd: int,
    axis: int,
    in_size: int,
    out_size: int,
    scale: float | None,
    align_corners: bool,
    antialias: bool,
) -> AxisMap:
    """The 1-D map PyTorch's CPU kernel applies along ``axis`` for this configuration."""
    with outside_modes():
        parts = []
        for start in range(0, in_size, _PROBE_CHUNK):
            n = min(_PROBE_CHUNK, in_size - start)
            basis = torch.zeros(n, in_size, dtype=torch.float64)
            basis[torch.arange(n), torch.arange(start, start + n)] = 1.0
            # two channels and length-2 side axes: an unambiguous contiguous layout (a length-1 axis
            # can make a tensor look channels_last to the antialias kernel)
            view = [n, 1] + [in_size if d == axis else 1 for d in range(nd)]
            shape = [n, 2] + [in_size if d == axis else 2 for d in range(nd)]
            probe = basis.view(view).expand(shape).contiguous()
            if scale is None:
                kwargs: dict = {"size": [out_size if d == axis else 2 for d in range(nd)]}
            else:
                kwargs = {"scale_factor": [scale if d == axis else 1.0 for d in range(nd)]}
            q = _native.interpolate(probe, mode=mode, align_corners=align_corners, antialias=antialias, **kwargs)
            index = (slice(None), 0) + tuple(slice(None) if d == axis else 0 for d in range(nd))
            parts.append(q[index])
        matrix = torch.cat(parts, 0)
        if matrix.shape != (in_size, out_size):
            raise RuntimeError(
                f"interpolation probe returned shape {tuple(matrix.shape)}, expected {(in_size, out_size)}"
            )
        return AxisMap.from_dense(matrix)


def _as_list(value: Number | Sequence[Number], nd: int) -> list | None:
    if isinstance(value, (list, tuple)):
        return list(value) if len(value) == nd else None
    return [value] * nd


def _resolve(
    x: Tensor, size: object, scale_factor: object, recompute_scale_factor: bool | None, mode: str
) -> tuple[list[int], list[float] | None] | None:
    """Output sizes and the scales passed to the kernel, as ``F.interpolate`` computes them.

    Returns ``None`` for arguments PyTorch rejects (the caller then lets PyTorch raise).
    """
    nd = x.dim() - 2
    if (size is None) == (scale_factor is None):
        return None
    if size is not None:
        if recompute_scale_factor:
            return None
        outs = _as_list(size, nd)  # type: ignore[arg-type]
        if outs is None or not all(isinstance(o, int) and not isinstance(o, bool) for o in outs):
            return None
        scales = None
    else:
        sf = _as_list(scale_factor, nd)  # type: ignore[arg-type]
        if sf is None or not all(isinstance(s, numbers.Real) and not isinstance(s, bool) for s in sf):
            return None
        sf = [float(s) for s in sf]
        outs = [math.floor(float(x.shape[2 + i]) * sf[i]) for i in range(nd)]
        scales = None if (recompute_scale_factor or mode == "area") else sf
    if any(o <= 0 for o in outs) or any(s <= 0 for s in x.shape[2:]):
        return None
    return outs, scales


def interpolate(
    input: Tensor,
    size: int | Sequence[int] | None = None,
    scale_factor: float | Sequence[float] | None = None,
    mode: str = "nearest",
    align_corners: bool | None = None,
    recompute_scale_factor: bool | None = None,
    antialias: bool = False,
) -> Tensor:
    """Deterministic ``torch.nn.functional.interpolate`` (same signature, same result).

    ``linear`` (3-D), ``bilinear``/``bicubic`` (4-D, with or without ``antialias``), ``trilinear``
    (5-D), ``lanczos`` (where PyTorch has it) and ``area`` are computed with deterministic gathers;
    ``nearest``/``nearest-exact`` and invalid arguments go to PyTorch (which raises its usual errors).

    Args:
        input: ``(N, C, *spatial)`` floating tensor.
        size: Output spatial size (int or one per axis).
        scale_factor: Multiplier per spatial axis (output size ``floor(in * scale)``); unless
            ``recompute_scale_factor`` is True, the kernel maps coordinates with ``1 / scale_factor``.
        mode: ``nearest``, ``linear``, ``bilinear``, ``bicubic``, ``trilinear``, ``area``,
            ``nearest-exact`` or ``lanczos``.
        align_corners: As in PyTorch (``None`` means False for the interpolating modes).
        recompute_scale_factor: As in PyTorch.
        antialias: Antialiasing filter for ``bilinear``/``bicubic`` on 4-D input.

    Returns:
        The resized tensor; float16/bfloat16 are computed in float32, and under autocast the dtype is
        the one the native op would return.
    """

    def native() -> Tensor:
        return _native.interpolate(
            input,
            size=size,
            scale_factor=scale_factor,
            mode=mode,
            align_corners=align_corners,
            recompute_scale_factor=recompute_scale_factor,
            antialias=antialias,
        )

    nd = input.dim() - 2
    if mode == "area":
        if nd not in (1, 2, 3) or align_corners is not None or antialias:
            return native()
    elif (input.dim(), mode) not in _LINEAR_MODES:
        return native()
    elif mode == "lanczos" and (not antialias or align_corners):
        return native()
    elif antialias and mode not in ("bilinear", "bicubic", "lanczos"):
        return native()
    if not input.is_floating_point():
        return native()
    spec = _resolve(input, size, scale_factor, recompute_scale_factor, mode)
    if spec is None:
        return native()
    outs, scales = spec
    if mode == "area":
        pool = {1: adaptive_avg_pool1d, 2: adaptive_avg_pool2d, 3: adaptive_avg_pool3d}[nd]
        return pool(input, outs)

    corners = bool(align_corners) if align_corners is not None else False
    maps = [
        _interp_map(
            mode,
            nd,
            a,
            int(input.shape[2 + a]),
            outs[a],
            None if scales is None else scales[a],
            corners,
            bool(antialias),
        )
        for a in range(nd)
    ]

    def probe(device: str) -> Tensor:
        t = torch.zeros((1, 1) + (4,) * nd, dtype=input.dtype, device=device)
        return _native.interpolate(t, size=[5] * nd, mode=mode, align_corners=corners, antialias=antialias)

    compute, out_dtype, active = amp_plan(f"interpolate:{mode}:{bool(antialias)}", probe, [input])
    with autocast_off(input.device.type, active):
        order = list(reversed(range(nd)))
        y = apply_axis_maps(input.to(compute), [2 + a for a in order], [maps[a] for a in order])
        y = y.to(out_dtype)
    return match_memory_format(y, input)


class DetUpsample(nn.Upsample):
    """Deterministic drop-in for :class:`torch.nn.Upsample` (same arguments, attributes, repr, state)."""

    def forward(self, input: Tensor) -> Tensor:
        return interpolate(
            input,
            self.size,
            self.scale_factor,
            self.mode,
            self.align_corners,
            recompute_scale_factor=self.recompute_scale_factor,
        )


class DetUpsamplingBilinear2d(nn.UpsamplingBilinear2d):
    """Deterministic drop-in for :class:`torch.nn.UpsamplingBilinear2d` (bilinear, ``align_corners=True``)."""

    forward = DetUpsample.forward
