"""Attention and upsampling blocks of the kind community "improved YOLO" models add, for tests and demos.

Each block is written the way such blocks are usually written, so each reaches a CUDA kernel without a
deterministic backward:

- :class:`CBAMMax`: CBAM with average- *and* max-pooled channel attention (``nn.AdaptiveMaxPool2d(1)``:
  ``adaptive_max_pool2d_backward_cuda``) and a spatial attention over channel mean and max.
- :class:`CoordAtt`: coordinate attention (``nn.AdaptiveAvgPool2d((None, 1))`` and ``((1, None))``:
  ``adaptive_avg_pool2d_backward_cuda``).
- :class:`GridSampleUpsample`: a DySample-like learned upsampler that resamples with ``F.grid_sample``
  (``grid_sampler_2d_backward_cuda``).

All three keep their input channel count, as Ultralytics' ``parse_model`` assumes for modules it does not
know, and take the channels as their first YAML argument. :data:`ZOO_MODULES` maps their YAML names to
the classes; ``yolo_det.layers.registry.registered(ZOO_MODULES)`` makes the example model YAMLs in
``yolo_det/data/models`` buildable (every yolo-det command does it, leaving alone any of these names that the
process already binds to the user's own class).

``DetCBAMMax``, ``DetCoordAtt`` and ``DetGridSampleUpsample`` are the same blocks with yolo-det's
deterministic layers inside (same constructor, parameters, state dict and function): `yolo-det rewrite` names
them in a YAML whose block is the zoo's, so the rewritten YAML audits clean.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..core.errors import ConfigError

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


def _check_channels(name: str, c1: int) -> int:
    if isinstance(c1, bool) or not isinstance(c1, int) or c1 < 1:
        raise ConfigError(f"{name}: channels must be a positive integer, got {c1!r}")
    return c1


class CBAMMax(nn.Module):
    """CBAM: channel attention from average- and max-pooled descriptors, then spatial attention.

    Args:
        c1: Input (and output) channels.
        reduction: Channel reduction of the shared MLP.
        kernel_size: Kernel of the spatial-attention convolution (3 or 7).
    """

    def __init__(self, c1: int, reduction: int = 16, kernel_size: int = 7) -> None:
        super().__init__()
        c1 = _check_channels("CBAMMax", c1)
        if kernel_size not in (3, 7):
            raise ConfigError(f"CBAMMax: kernel_size must be 3 or 7, got {kernel_size!r}")
        hidden = max(c1 // reduction, 4)
        self.avg_pool = nn.AdaptiveAvgPool2d(1)
        self.max_pool = nn.AdaptiveMaxPool2d(1)
        self.mlp = nn.Sequential(
            nn.Conv2d(c1, hidden, 1, bias=False), nn.ReLU(inplace=True), nn.Conv2d(hidden, c1, 1, bias=False)
        )
        self.spatial = nn.Conv2d(2, 1, kernel_size, padding=kernel_size // 2, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply channel, then spatial attention."""
        channel = torch.sigmoid(self.mlp(self.avg_pool(x)) + self.mlp(self.max_pool(x)))
        x = x * channel
        descriptor = torch.cat([x.mean(dim=1, keepdim=True), x.max(dim=1, keepdim=True)[0]], dim=1)
        return x * torch.sigmoid(self.spatial(descriptor))


class CoordAtt(nn.Module):
    """Coordinate attention: attention along height and width from directional average pooling.

    Args:
        c1: Input (and output) channels.
        reduction: Channel reduction of the shared transform.
    """

    def __init__(self, c1: int, reduction: int = 32) -> None:
        super().__init__()
        c1 = _check_channels("CoordAtt", c1)
        mid = max(8, c1 // reduction)
        self.pool_h = nn.AdaptiveAvgPool2d((None, 1))
        self.pool_w = nn.AdaptiveAvgPool2d((1, None))
        self.conv1 = nn.Conv2d(c1, mid, 1)
        self.bn1 = nn.BatchNorm2d(mid)
        self.act = nn.Hardswish()
        self.conv_h = nn.Conv2d(mid, c1, 1)
        self.conv_w = nn.Conv2d(mid, c1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Weight ``x`` by attention maps along H and along W."""
        h, w = x.shape[-2:]
        x_h = self.pool_h(x)  # N, C, H, 1
        x_w = self.pool_w(x).permute(0, 1, 3, 2)  # N, C, W, 1
        y = self.act(self.bn1(self.conv1(torch.cat([x_h, x_w], dim=2))))
        y_h, y_w = torch.split(y, [h, w], dim=2)
        a_h = torch.sigmoid(self.conv_h(y_h))
        a_w = torch.sigmoid(self.conv_w(y_w.permute(0, 1, 3, 2)))
        return x * a_h * a_w


class GridSampleUpsample(nn.Module):
    """A DySample-like upsampler: learned sub-pixel offsets, then bilinear resampling with ``F.grid_sample``.

    Each output pixel samples the input at its nearest-upsampling position plus a learned offset (initialised
    near zero, so the block starts close to bilinear upsampling).

    Args:
        c1: Input (and output) channels.
        scale: Upsampling factor.
        groups: Channel groups sharing one offset field (must divide ``c1``; 1 when it does not divide 4).
    """

    def __init__(self, c1: int, scale: int = 2, groups: int = 4) -> None:
        super().__init__()
        c1 = _check_channels("GridSampleUpsample", c1)
        if isinstance(scale, bool) or not isinstance(scale, int) or scale < 1:
            raise ConfigError(f"GridSampleUpsample: scale must be a positive integer, got {scale!r}")
        self.scale = scale
        self.groups = groups if c1 % groups == 0 else 1
        self.offset = nn.Conv2d(c1, 2 * self.groups * scale * scale, 1)
        nn.init.normal_(self.offset.weight, std=1e-3)
        if self.offset.bias is not None:
            nn.init.zeros_(self.offset.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Upsample ``x`` by ``scale``."""
        n, c, h, w = x.shape
        s, g = self.scale, self.groups
        offset = F.pixel_shuffle(self.offset(x) * 0.25, s)  # N, 2g, sH, sW (in input pixels)
        offset = offset.view(n, g, 2, s * h, s * w)
        # input-pixel coordinates of each output pixel centre (align_corners=False convention)
        ys = (torch.arange(s * h, device=x.device, dtype=x.dtype) + 0.5) / s - 0.5
        xs = (torch.arange(s * w, device=x.device, dtype=x.dtype) + 0.5) / s - 0.5
        px = xs.view(1, 1, 1, -1) + offset[:, :, 0]
        py = ys.view(1, 1, -1, 1) + offset[:, :, 1]
        grid = torch.stack([(2 * px + 1) / w - 1, (2 * py + 1) / h - 1], dim=-1)  # N, g, sH, sW, 2
        out = self._sample(x.reshape(n * g, c // g, h, w), grid.reshape(n * g, s * h, s * w, 2))
        return out.view(n, c, s * h, s * w)

    def _sample(self, x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        return F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)


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
