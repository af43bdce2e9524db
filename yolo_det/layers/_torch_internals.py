"""How the deterministic layers sit inside torch: modes, autocast, memory format.

* :func:`outside_modes` runs code (the probes and table builders) outside any torch-function mode (the
  functional interception) and any dispatch mode (fake tensors), so probing PyTorch's own kernels never
  recurses into the layers and always sees real CPU tensors.
* :func:`amp_plan` and :func:`autocast_off` reproduce what autocast would do to the native op: the layer
  computes in float32 for float16/bfloat16 and returns the dtype the native op would have returned in
  the same autocast state (found once by running the native op on a tiny, fake when needed, tensor).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor

from ._versions import _autocast_dtype, _autocast_enabled, _set_autocast_enabled

__all__ = ["LOW_PRECISION", "amp_plan", "autocast_off", "match_memory_format", "outside_modes"]

#: Floating dtypes the layers never accumulate in (they compute in float32 and cast back).
LOW_PRECISION = (torch.float16, torch.bfloat16)


# ----------------------------------------------------------------------------------------------------
# Running outside modes
# ----------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def outside_modes() -> Iterator[None]:
    """Run a block with no torch-function mode, no dispatch mode, no grad and no inference mode.

    Used to probe PyTorch's CPU kernels and to build index tables: the tensors made inside are real
    CPU tensors even when the caller traces with fake tensors, and an active interception mode cannot
    route the probe back into the deterministic layers.
    """
    from torch.utils._python_dispatch import _disable_current_modes

    with torch._C.DisableTorchFunction(), _disable_current_modes(), torch.inference_mode(False), torch.no_grad():
        yield


def _is_plain(x: Tensor) -> bool:
    """Whether ``x`` is an ordinary tensor outside any dispatch mode (so tables can be cached on its device)."""
    return type(x) in (torch.Tensor, torch.nn.Parameter) and torch._C._len_torch_dispatch_stack() == 0


@contextlib.contextmanager
def autocast_off(device_type: str, active: bool) -> Iterator[None]:
    """Disable autocast for ``device_type`` inside the block when ``active`` (restored on exit, errors too)."""
    if not active:
        yield
        return
    _set_autocast_enabled(device_type, False)
    try:
        yield
    finally:
        _set_autocast_enabled(device_type, True)


_NATIVE_DTYPES: dict[tuple[Any, ...], torch.dtype | None] = {}
_NATIVE_DTYPES_LOCK = threading.Lock()


def _native_autocast_dtype(
    key: str, probe: Callable[[str], Tensor], device_type: str, dtypes: tuple[torch.dtype, ...]
) -> torch.dtype | None:
    """The output dtype of the native op under the current autocast state, or ``None`` if unknown.

    ``probe(device)`` runs the native op on tiny tensors of ``dtypes`` made on ``device``. CUDA and
    other accelerators are probed with fake tensors, so no kernel runs and no device is needed. The
    answer is cached per op, device type, autocast dtype, input dtypes and deterministic flag (the
    flag changes which implementation some native ops pick, and so their autocast policy).
    """
    cache_key = (key, device_type, _autocast_dtype(device_type), dtypes, torch.are_deterministic_algorithms_enabled())
    with _NATIVE_DTYPES_LOCK:
        if cache_key in _NATIVE_DTYPES:
            return _NATIVE_DTYPES[cache_key]
    result: torch.dtype | None
    try:
        with outside_modes():
            if device_type == "cpu":
                result = probe("cpu").dtype
            else:
                from torch._subclasses.fake_tensor import FakeTensorMode

                with FakeTensorMode():
                    result = probe(device_type).dtype
    except Exception:  # a build that cannot fake this device: keep the input dtype
        result = None
    with _NATIVE_DTYPES_LOCK:
        _NATIVE_DTYPES[cache_key] = result
    return result


def amp_plan(
    key: str, probe: Callable[[str], Tensor], inputs: Sequence[Tensor]
) -> tuple[torch.dtype, torch.dtype, bool]:
    """Decide the compute dtype and output dtype of a layer for its floating inputs.

    Args:
        key: Name of the native op (cache key of the autocast probe).
        probe: ``probe(device) -> Tensor`` running the native op on tiny tensors with the dtypes of
            ``inputs`` (called only while autocast is enabled for the inputs' device type).
        inputs: The floating tensors the native op would receive.

    Returns:
        ``(compute_dtype, output_dtype, autocast_active)``. ``compute_dtype`` is float32 whenever the
        inputs or the output are float16/bfloat16 (PyTorch's kernels accumulate in float32 too);
        ``output_dtype`` is the dtype the native op returns in the current autocast state;
        ``autocast_active`` tells the caller to run its body under :func:`autocast_off`.
    """
    first = inputs[0]
    device_type = first.device.type
    dtypes = tuple(t.dtype for t in inputs)
    out_dtype = dtypes[0]
    for dt in dtypes[1:]:
        out_dtype = torch.promote_types(out_dtype, dt)
    active = _autocast_enabled(device_type)
    if active:
        native = _native_autocast_dtype(key, probe, device_type, dtypes)
        if native is not None:
            out_dtype = native
    low = out_dtype in LOW_PRECISION or any(dt in LOW_PRECISION for dt in dtypes)
    compute = torch.float32 if low else out_dtype
    return compute, out_dtype, active


def match_memory_format(out: Tensor, like: Tensor) -> Tensor:
    """Give a 4-D ``out`` the channels_last layout when ``like`` has it (as PyTorch's CPU kernels do)."""
    if (
        out.dim() == 4
        and like.dim() == 4
        and not like.is_contiguous()
        and like.is_contiguous(memory_format=torch.channels_last)
    ):
        return out.contiguous(memory_format=torch.channels_last)
    return out
