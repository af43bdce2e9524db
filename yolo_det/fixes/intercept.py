"""Functional interception: route non-deterministic ``torch.nn.functional`` calls to yolo-det's layers.

Modules whose source calls ``F.grid_sample`` or ``F.adaptive_max_pool2d`` directly (RT-DETR's
deformable attention, DySample, a CBAM written with functionals) cannot be fixed by swapping modules.
While :func:`interception` is active, the ``torch.nn.functional`` attributes below are replaced by
routers. A router looks at the call and sends it to the deterministic implementation only when, on the
running torch version, the call would reach a CUDA kernel without a deterministic implementation (the
knowledge table, :mod:`yolo_det.analysis.optable`, decides); every other call goes to PyTorch unchanged.

========================  ============================================================================
function                  routed when
========================  ============================================================================
``adaptive_max_pool1d/2d``  the input requires grad
``adaptive_avg_pool1d/2d/3d``  the input requires grad and the output is not all ones (1x1 is a mean)
``interpolate``           the input requires grad and the mode's backward kernel alerts on this torch
                          (bilinear: only where torch takes no deterministic decomposition)
``grid_sample``           bilinear 4-D sampling with an input or grid that requires grad
``pad``                   reflect/replicate whose backward kernel alerts on this torch
``cross_entropy``, ``nll_loss``  inputs with 3 or more dimensions and a mean/sum reduction (forward alert)
========================  ============================================================================

Routing replaces module attributes, so the cost is one Python call per routed function call and
nothing for any other op. Code that imported a function by name (``from torch.nn.functional import
grid_sample``) before interception started keeps PyTorch's; the audit still reports it. Interception
nests and is reference-counted; the attributes are restored when the outermost scope exits, on error too.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import torch
import torch.nn.functional as F

from ..core.nesting import NestedPatch
from ..layers import _native
from ..layers import grid_sample as det_grid_sample
from ..layers import interpolate as det_interpolate
from ..layers import pad as det_pad
from ..layers import pooling as det_pooling
from ..layers.loss import cross_entropy as det_cross_entropy
from ..layers.loss import nll_loss as det_nll_loss

__all__ = ["ROUTED", "interception", "is_active", "routed_calls", "suspended"]

_lock = threading.RLock()
_calls: Counter[str] = Counter()


def _rule(entry_id: str) -> str | None:
    """``always`` / ``native_path`` / ``never`` / None for a table entry on the running torch."""
    from ..analysis.optable import load_table, torch_version

    return load_table().entry(entry_id).rule(torch_version())


@functools.cache
def _alerts(entry_id: str) -> bool | None:
    """True: the kernel always alerts; None: only on the native path (flag off at forward); False: never."""
    rule = _rule(entry_id)
    if rule == "always":
        return True
    if rule == "native_path":
        return None
    return False


def _reaches(entry_id: str) -> bool:
    alerts = _alerts(entry_id)
    if alerts is None:  # torch decomposes deterministically when the flag is on at forward time
        return not torch.are_deterministic_algorithms_enabled()
    return alerts


def _grad(*tensors: Any) -> bool:
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


def _bind(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    bound = _SIGNATURES[name].bind(*args, **kwargs)
    bound.apply_defaults()
    return bound.arguments


def _all_ones(output_size: Any, input: torch.Tensor, nd: int) -> bool:
    sizes = list(output_size) if isinstance(output_size, (list, tuple)) else [output_size] * nd
    spatial = list(input.shape[-nd:])
    return all((s if s is not None else spatial[i]) == 1 for i, s in enumerate(sizes))


def _route_max_pool(a: dict[str, Any]) -> bool:
    return _grad(a["input"]) and _reaches("adaptive_max_pool2d")


def _route_avg_pool(nd: int) -> Callable[[dict[str, Any]], bool]:
    entry = "adaptive_avg_pool3d" if nd == 3 else "adaptive_avg_pool2d"

    def route(a: dict[str, Any]) -> bool:
        return _grad(a["input"]) and not _all_ones(a["output_size"], a["input"], nd) and _reaches(entry)

    return route


_INTERP_ENTRY = {
    ("linear", False): "upsample_linear1d",
    ("bilinear", False): "upsample_bilinear2d",
    ("bilinear", True): "upsample_bilinear2d_aa",
    ("bicubic", False): "upsample_bicubic2d",
    ("bicubic", True): "upsample_bicubic2d_aa",
    ("trilinear", False): "upsample_trilinear3d",
    ("area", False): "adaptive_avg_pool2d",
}


def _route_interpolate(a: dict[str, Any]) -> bool:
    x = a["input"]
    if not _grad(x) or not isinstance(x, torch.Tensor) or not x.is_floating_point():
        return False
    entry = _INTERP_ENTRY.get((a["mode"], bool(a["antialias"])))
    if entry is None:
        return False
    if a["mode"] == "area" and x.dim() == 5:
        entry = "adaptive_avg_pool3d"
    return _reaches(entry)


def _route_grid_sample(a: dict[str, Any]) -> bool:
    x, grid = a["input"], a["grid"]
    return (
        a["mode"] == "bilinear"
        and isinstance(x, torch.Tensor)
        and x.dim() == 4
        and _grad(x, grid)
        and _reaches("grid_sampler_2d")
    )


def _route_pad(a: dict[str, Any]) -> bool:
    x, mode = a["input"], a["mode"]
    if mode not in ("reflect", "replicate") or not _grad(x):
        return False
    n = len(a["pad"]) // 2
    if mode == "replicate":
        return _reaches("replication_pad")
    return _reaches({1: "reflection_pad1d", 2: "reflection_pad2d"}.get(n, "reflection_pad3d"))


def _route_loss(a: dict[str, Any]) -> bool:
    x = a["input"]
    reduction = a.get("reduction", "mean")
    if a.get("reduce") is False or a.get("size_average") is not None:
        reduction = "legacy"
    return (
        isinstance(x, torch.Tensor)
        and x.dim() > 2
        and reduction in ("mean", "sum", "legacy")
        and _reaches("nll_loss2d")
    )


#: ``torch.nn.functional`` name -> (deterministic implementation, routing rule).
ROUTED: dict[str, tuple[Callable[..., Any], Callable[[dict[str, Any]], bool]]] = {
    "adaptive_max_pool1d": (det_pooling.adaptive_max_pool1d, _route_max_pool),
    "adaptive_max_pool2d": (det_pooling.adaptive_max_pool2d, _route_max_pool),
    "adaptive_avg_pool1d": (det_pooling.adaptive_avg_pool1d, _route_avg_pool(1)),
    "adaptive_avg_pool2d": (det_pooling.adaptive_avg_pool2d, _route_avg_pool(2)),
    "adaptive_avg_pool3d": (det_pooling.adaptive_avg_pool3d, _route_avg_pool(3)),
    "interpolate": (det_interpolate, _route_interpolate),
    "grid_sample": (det_grid_sample, _route_grid_sample),
    "pad": (det_pad, _route_pad),
    "cross_entropy": (det_cross_entropy, _route_loss),
    "nll_loss": (det_nll_loss, _route_loss),
}
# The deterministic implementations mirror PyTorch's signatures (some of PyTorch's own are (*args, **kwargs)).
_SIGNATURES = {name: inspect.signature(fn) for name, (fn, _) in ROUTED.items()}


def _router(name: str) -> Callable[..., Any]:
    original = _native.original(name)
    deterministic, rule = ROUTED[name]

    @functools.wraps(original)
    def router(*args: Any, **kwargs: Any) -> Any:
        try:
            route = rule(_bind(name, args, kwargs))
        except TypeError:  # a call PyTorch itself will reject: let it say so
            route = False
        if route:
            _calls[name] += 1
            return deterministic(*args, **kwargs)
        return original(*args, **kwargs)

    router._yolo_det_router = True  # type: ignore[attr-defined]
    return router


def is_active() -> bool:
    """Whether interception is in force."""
    return _routing.depth > 0


def routed_calls() -> dict[str, int]:
    """How many calls each function routed to its deterministic implementation, in this process."""
    return dict(_calls)


@contextmanager
def suspended() -> Iterator[None]:
    """PyTorch's own functions for the block, even inside :func:`interception` (the audit traces the model as
    it is, not as interception would run it)."""
    with _lock:
        active = {name: getattr(F, name) for name in ROUTED if getattr(getattr(F, name), "_yolo_det_router", False)}
        for name in active:
            setattr(F, name, _native.original(name))
    try:
        yield
    finally:
        with _lock:
            for name, fn in active.items():
                setattr(F, name, fn)


def _route() -> dict[str, Any]:
    saved: dict[str, Any] = {}
    for name in ROUTED:
        saved[name] = getattr(F, name)
        setattr(F, name, _router(name))
    return saved


def _unroute(saved: dict[str, Any]) -> None:
    for name, fn in saved.items():
        setattr(F, name, fn)


_routing = NestedPatch(_route, _unroute, lock=_lock)


def interception() -> AbstractContextManager[None]:
    """Route non-deterministic ``torch.nn.functional`` calls to deterministic implementations in the block."""
    return _routing.scope()
