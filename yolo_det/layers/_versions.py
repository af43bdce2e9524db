"""Version shims for the deterministic layers: one spelling of torch's autocast switches across versions.

torch 2.4 made the autocast functions take a device type; older versions have one function per device.
"""

from __future__ import annotations

import torch

__all__: list[str] = []


def _autocast_enabled(device_type: str) -> bool:
    try:
        return bool(torch.is_autocast_enabled(device_type))
    except TypeError:  # torch < 2.4
        if device_type == "cpu":
            return bool(torch.is_autocast_cpu_enabled())
        return device_type == "cuda" and bool(torch.is_autocast_enabled())
    except RuntimeError:  # a device type without autocast (meta)
        return False


def _autocast_dtype(device_type: str) -> torch.dtype:
    try:
        return torch.get_autocast_dtype(device_type)
    except (AttributeError, TypeError):  # torch < 2.4
        return torch.get_autocast_cpu_dtype() if device_type == "cpu" else torch.get_autocast_gpu_dtype()


def _set_autocast_enabled(device_type: str, enabled: bool) -> None:
    try:
        torch.set_autocast_enabled(device_type, enabled)
    except TypeError:  # torch < 2.4
        if device_type == "cpu":
            torch.set_autocast_cpu_enabled(enabled)
        else:
            torch.set_autocast_enabled(enabled)
