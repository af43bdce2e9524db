"""Machinery shared by the deterministic layers, by concern:

* :mod:`._axis_maps`: sparse linear maps along tensor axes with their own autograd (the maths);
* :mod:`._torch_internals`: running outside torch's modes, autocast policy, memory format;
* :mod:`._versions`: shims over torch versions.

This module gathers their public names, so a layer imports them from one place.
"""

from __future__ import annotations

from ._axis_maps import AxisMap, apply_axis_map, apply_axis_maps, apply_window_mean
from ._torch_internals import LOW_PRECISION, amp_plan, autocast_off, match_memory_format, outside_modes

__all__ = [
    "LOW_PRECISION",
    "AxisMap",
    "amp_plan",
    "apply_axis_map",
    "apply_axis_maps",
    "apply_window_mean",
    "autocast_off",
    "match_memory_format",
    "outside_modes",
]
