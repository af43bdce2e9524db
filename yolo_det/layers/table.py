"""The swap table: PyTorch class -> yolo-det class, one entry per deterministic layer.

:mod:`yolo_det.fixes.swaps` swaps by it (and ``register_swap`` adds to it); :mod:`yolo_det.layers.registry`
makes the yolo-det class names resolvable in model YAMLs from it. Each yolo-det class pickles as its PyTorch
class (:func:`yolo_det.layers._pickling.pickles_as`), whichever of these modules is imported.
"""

from __future__ import annotations

from torch import nn

from . import (
    DetAdaptiveAvgPool1d,
    DetAdaptiveAvgPool2d,
    DetAdaptiveAvgPool3d,
    DetAdaptiveMaxPool1d,
    DetAdaptiveMaxPool2d,
    DetCrossEntropyLoss,
    DetNLLLoss,
    DetReflectionPad1d,
    DetReflectionPad2d,
    DetReflectionPad3d,
    DetReplicationPad1d,
    DetReplicationPad2d,
    DetReplicationPad3d,
    DetUpsample,
    DetUpsamplingBilinear2d,
)
from ._pickling import pickles_as

__all__ = ["SWAPS"]

#: PyTorch class -> yolo-det class (a subclass that only overrides ``forward``).
SWAPS: dict[type[nn.Module], type[nn.Module]] = {
    nn.AdaptiveAvgPool1d: DetAdaptiveAvgPool1d,
    nn.AdaptiveAvgPool2d: DetAdaptiveAvgPool2d,
    nn.AdaptiveAvgPool3d: DetAdaptiveAvgPool3d,
    nn.AdaptiveMaxPool1d: DetAdaptiveMaxPool1d,
    nn.AdaptiveMaxPool2d: DetAdaptiveMaxPool2d,
    nn.Upsample: DetUpsample,
    nn.UpsamplingBilinear2d: DetUpsamplingBilinear2d,
    nn.ReflectionPad1d: DetReflectionPad1d,
    nn.ReflectionPad2d: DetReflectionPad2d,
    nn.ReflectionPad3d: DetReflectionPad3d,
    nn.ReplicationPad1d: DetReplicationPad1d,
    nn.ReplicationPad2d: DetReplicationPad2d,
    nn.ReplicationPad3d: DetReplicationPad3d,
    nn.CrossEntropyLoss: DetCrossEntropyLoss,
    nn.NLLLoss: DetNLLLoss,
}

for _source, _target in SWAPS.items():
    pickles_as(_target, _source)  # a checkpoint holding yolo-det's layers loads where yolo-det is not imported
