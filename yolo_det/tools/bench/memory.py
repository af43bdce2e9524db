"""Peak memory of a block: CUDA allocator peak, or the process's peak RSS on Linux."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from typing import Any

import torch


class _Memory:
    """Peak memory of a block: CUDA allocator peak, or the process's peak RSS on Linux."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._libc: Any = None
        if device.type == "cuda":
            self.method = "torch.cuda.max_memory_allocated during the measured steps (reset before each block)"
            self.available = True
        elif sys.platform.startswith("linux") and os.path.exists("/proc/self/clear_refs"):
            name = ctypes.util.find_library("c")
            try:
                self._libc = ctypes.CDLL(name) if name else None
            except OSError:
                self._libc = None
            self.method = (
                "process peak resident set size (VmHWM) over one untimed step per configuration, after "
                "malloc_trim(0) and a reset of the high-water mark (/proc/self/clear_refs); includes "
                "libraries and the model, so compare differences between rows"
            )
            self.available = self._reset_hwm()
        else:
            self.method = "not measured on this platform"
            self.available = False
        self.start = 0

    def _reset_hwm(self) -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return True
        except OSError:
            return False

    @staticmethod
    def _status(key: str) -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
        return 0

    def begin(self) -> None:
        if not self.available:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.start = torch.cuda.memory_allocated(self.device)
        else:
            if self._libc is not None and hasattr(self._libc, "malloc_trim"):
                self._libc.malloc_trim(0)
            self._reset_hwm()
            self.start = self._status("VmRSS")

    def end(self) -> tuple[int, int] | None:
        """``(peak, peak - level at begin)`` in bytes, or None when not measured."""
        if not self.available:
            return None
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
        else:
            peak = self._status("VmHWM")
        return peak, max(peak - self.start, 0)
