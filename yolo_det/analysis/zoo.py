"""Attention and upsampling blocks of the kind community "improved YOLO" models add, for tests and demos.

Each block is written the way such blocks are usually written, so each reaches a CUDA kernel without a
deterministic backward:

- :class:`CBAMMax`: CBAM with average- *and* max-pooled channel attention (``nn.AdaptiveMaxPool2d(1)``:
  ``adaptive_max_pool2d_backward_cuda``) and a spatial attention over channel mean and max.
- :class:`CoordAtt`: coordinate attention (``nn.AdaptiveAvgPool2d((None, 1))`` and ``((1, None))``:
  ``adaptive_avg_pool2d_backward_cuda``).
- :class:`GridSampleUpsample`: a DySample-like learned upsampler that resamples with ``F.grid_sample``
  (``grid_sampler_2d_backward_cuda``).

The three blocks are defined in the standalone package :mod:`yolo_det_zoo` (torch only, no ``yolo_det``), so a
checkpoint holding them loads and fine-tunes in plain Ultralytics; this module re-exports them. All three keep
their input channel count, as Ultralytics' ``parse_model`` assumes for modules it does not know, and take the
channels as their first YAML argument. :data:`ZOO_MODULES` maps their YAML names to
the classes; ``yolo_det.layers.registry.registered(ZOO_MODULES)`` makes the example model YAMLs in
``yolo_det/data/models`` buildable (every yolo-det command does it, leaving alone any of these names that the
process already binds to the user's own class).

``DetCBAMMax``, ``DetCoordAtt`` and ``DetGridSampleUpsample`` are the same blocks with yolo-det's
deterministic layers inside (same constructor, parameters, state dict and function): `yolo-det rewrite` names
them in a YAML whose block is the zoo's, so the rewritten YAML audits clean. A variant pickles as its block
(``yolo_det_zoo.CBAMMax``) and a checkpoint's YAML names the block (see
:mod:`yolo_det.analysis.blocks.portable`): the checkpoint needs no yolo-det.
"""

from __future__ import annotations

import torch
from torch import nn

from yolo_det_zoo import CBAMMax, CoordAtt, GridSampleUpsample

from ..layers._pickling import pickles_as

__all__ = [
    "DET_VARIANTS",
    "ZOO_MODULES",
    "CBAMMax",
    "CoordAtt",
    "DetCBAMMax",
    "DetCoordAtt",
    "DetGridSampleUpsample",
    "GridSampleUpsample",
]


# ---------------------------------------------------------------------------------------------------------
# deterministic variants: what `yolo-det rewrite` (and `audit --fix`) name in a YAML instead of the blocks above


def _swap_inside(block: nn.Module) -> None:
    from ..layers.table import SWAPS

    for m in list(block.modules()):
        target = SWAPS.get(type(m))
        if target is not None:
            m.__class__ = target


class DetCBAMMax(CBAMMax):
    """:class:`CBAMMax` with yolo-det's deterministic pools inside: the same function, weights and state dict."""

    def __init__(self, c1: int, reduction: int = 16, kernel_size: int = 7) -> None:
        super().__init__(c1, reduction, kernel_size)
        _swap_inside(self)


class DetCoordAtt(CoordAtt):
    """:class:`CoordAtt` with yolo-det's deterministic pools inside: the same function, weights and state dict."""

    def __init__(self, c1: int, reduction: int = 32) -> None:
        super().__init__(c1, reduction)
        _swap_inside(self)


class DetGridSampleUpsample(GridSampleUpsample):
    """:class:`GridSampleUpsample` sampling with yolo-det's deterministic ``grid_sample``: the same function."""

    def _sample(self, x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        from ..layers import grid_sample

        return grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)


for _det, _block in ((DetCBAMMax, CBAMMax), (DetCoordAtt, CoordAtt), (DetGridSampleUpsample, GridSampleUpsample)):
    pickles_as(_det, _block)

#: Model-YAML names of the zoo blocks.
ZOO_MODULES: dict[str, type[nn.Module]] = {
    "CBAMMax": CBAMMax,
    "CoordAtt": CoordAtt,
    "GridSampleUpsample": GridSampleUpsample,
    "DetCBAMMax": DetCBAMMax,
    "DetCoordAtt": DetCoordAtt,
    "DetGridSampleUpsample": DetGridSampleUpsample,
}

#: Zoo block -> its deterministic variant (the rename `yolo-det rewrite` makes when the YAML name is the zoo's block).
DET_VARIANTS: dict[str, str] = {
    "CBAMMax": "DetCBAMMax",
    "CoordAtt": "DetCoordAtt",
    "GridSampleUpsample": "DetGridSampleUpsample",
}
