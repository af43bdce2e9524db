"""yolo-det's example blocks, standalone: this package needs torch only and never imports ``yolo_det``.

The attention and upsampling blocks of the example model YAMLs (``CBAMMax``, ``CoordAtt``,
``GridSampleUpsample``; see ``yolo_det/data/models``) live here, apart from ``yolo_det``, so that a checkpoint
holding them loads, fine-tunes, validates, predicts and exports in a process where yolo-det is not imported:
the checkpoint's pickle names ``yolo_det_zoo.CBAMMax``, and loading it imports this package only.

Ultralytics resolves a model YAML's layer names in the globals of ``ultralytics.nn.tasks``. Imported in a process
without yolo-det (``"yolo_det" not in sys.modules``), for instance by the pickle of a checkpoint that
``ultralytics.YOLO`` loads, this package binds its block names there (:func:`register`; a name the process
already binds is left alone), so fine-tuning rebuilds the model from the checkpoint's YAML. Where yolo-det is
imported it binds nothing: yolo-det binds these names itself for the time of a command
(``yolo_det.analysis.zoo``).

Each block keeps its input channel count and takes the channels as its first YAML argument, as Ultralytics'
``parse_model`` assumes for modules it does not know. A bad argument raises ``ValueError`` with one line.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["BLOCKS", "CBAMMax", "CoordAtt", "GridSampleUpsample", "register"]


def _check_channels(name: str, c1: int) -> int:
    if isinstance(c1, bool) or not isinstance(c1, int) or c1 < 1:
        raise ValueError(f"{name}: channels must be a positive integer, got {c1!r}")
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
            raise ValueError(f"CBAMMax: kernel_size must be 3 or 7, got {kernel_size!r}")
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
            raise ValueError(f"GridSampleUpsample: scale must be a positive integer, got {scale!r}")
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


#: Model-YAML name -> block class.
BLOCKS: dict[str, type[nn.Module]] = {
    "CBAMMax": CBAMMax,
    "CoordAtt": CoordAtt,
    "GridSampleUpsample": GridSampleUpsample,
}


def register() -> list[str]:
    """Bind the block names in ``ultralytics.nn.tasks`` (importing it) where the process does not bind them yet,
    as adding them to that module's imports would; return the names bound. Plain Ultralytics then builds model
    YAMLs (and fine-tunes checkpoints) naming these blocks."""
    import importlib

    tasks = importlib.import_module("ultralytics.nn.tasks")
    bound = []
    for name, cls in BLOCKS.items():
        if name not in vars(tasks):
            setattr(tasks, name, cls)
            bound.append(name)
    return bound


if "yolo_det" not in sys.modules and "ultralytics.nn.tasks" in sys.modules:
    register()  # plain Ultralytics loading a checkpoint: its YAML names these blocks
