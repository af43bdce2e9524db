"""Deterministic drop-in layers: the same function as PyTorch's op, forward and gradients, built only
from kernels whose CUDA backward is deterministic.

One module per family; each offers functional forms with ``torch.nn.functional``'s signature and
module classes that subclass the PyTorch module they replace (same constructor, attributes,
``extra_repr`` and state dict), so swapping one for the other never touches weights:

=======================================  ===============================================
PyTorch                                  yolo-det
=======================================  ===============================================
``nn.AdaptiveAvgPool1d/2d/3d``           :class:`DetAdaptiveAvgPool1d` / ``2d`` / ``3d``
``nn.AdaptiveMaxPool1d/2d``              :class:`DetAdaptiveMaxPool1d` / ``2d``
``nn.Upsample``                          :class:`DetUpsample`
``nn.UpsamplingBilinear2d``              :class:`DetUpsamplingBilinear2d`
``nn.ReflectionPad1d/2d/3d``             :class:`DetReflectionPad1d` / ``2d`` / ``3d``
``nn.ReplicationPad1d/2d/3d``            :class:`DetReplicationPad1d` / ``2d`` / ``3d``
``nn.CrossEntropyLoss``, ``nn.NLLLoss``  :class:`DetCrossEntropyLoss`, :class:`DetNLLLoss`
``F.adaptive_avg_pool1d/2d/3d``          :func:`adaptive_avg_pool1d` / ``2d`` / ``3d``
``F.adaptive_max_pool1d/2d``             :func:`adaptive_max_pool1d` / ``2d``
``F.interpolate``                        :func:`interpolate`
``F.grid_sample``                        :func:`grid_sample` (bilinear, 4-D)
``F.pad``                                :func:`pad` (reflect, replicate)
``F.cross_entropy``, ``F.nll_loss``      :func:`cross_entropy`, :func:`nll_loss`
=======================================  ===============================================
"""

from __future__ import annotations

from .grid_sample import grid_sample
from .loss import DetCrossEntropyLoss, DetNLLLoss, cross_entropy, nll_loss
from .padding import (
    DetReflectionPad1d,
    DetReflectionPad2d,
    DetReflectionPad3d,
    DetReplicationPad1d,
    DetReplicationPad2d,
    DetReplicationPad3d,
    pad,
)
from .pooling import (
    DetAdaptiveAvgPool1d,
    DetAdaptiveAvgPool2d,
    DetAdaptiveAvgPool3d,
    DetAdaptiveMaxPool1d,
    DetAdaptiveMaxPool2d,
    adaptive_avg_pool1d,
    adaptive_avg_pool2d,
    adaptive_avg_pool3d,
    adaptive_max_pool1d,
    adaptive_max_pool2d,
)
from .upsample import DetUpsample, DetUpsamplingBilinear2d, interpolate

__all__ = [
    "DetAdaptiveAvgPool1d",
    "DetAdaptiveAvgPool2d",
    "DetAdaptiveAvgPool3d",
    "DetAdaptiveMaxPool1d",
    "DetAdaptiveMaxPool2d",
    "DetCrossEntropyLoss",
    "DetNLLLoss",
    "DetReflectionPad1d",
    "DetReflectionPad2d",
    "DetReflectionPad3d",
    "DetReplicationPad1d",
    "DetReplicationPad2d",
    "DetReplicationPad3d",
    "DetUpsample",
    "DetUpsamplingBilinear2d",
    "adaptive_avg_pool1d",
    "adaptive_avg_pool2d",
    "adaptive_avg_pool3d",
    "adaptive_max_pool1d",
    "adaptive_max_pool2d",
    "cross_entropy",
    "grid_sample",
    "interpolate",
    "nll_loss",
    "pad",
]
