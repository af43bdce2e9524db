"""Torch's Python-level decompositions: which ops decompose, and the names and arguments of calls."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["decomposable_op", "function_name", "op_arguments"]

_SIGNATURES: dict[str, Any] = {}


def _bind(function: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any] | None:
    import inspect

    import torch.nn.functional as F

    sig = _SIGNATURES.get(function)
    if sig is None:
        fn = getattr(F, function.rsplit(".", 1)[-1], None)
        if fn is None:
            return None
        sig = _SIGNATURES[function] = inspect.signature(fn)
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError:
        return None
    bound.apply_defaults()
    return dict(bound.arguments)


def decomposable_op(function: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str | None:
    """The aten op that ``function(*args, **kwargs)`` would route through a deterministic decomposition.

    Since torch 2.1, ``F.interpolate`` (4-D bilinear without antialias; 5-D trilinear on recent torch),
    ``F.pad`` (``replicate``) and ``F.max_pool3d_with_indices`` take a decomposition on CUDA when
    deterministic algorithms are on, instead of calling the aten op whose CUDA backward alerts. This returns
    that aten op (``"aten::upsample_bilinear2d"``), or None when the call has no such branch. Whether the
    branch exists on a given torch version is the table's business (``when: native_path``).

    Args:
        function: The qualified name, e.g. ``"torch.nn.functional.interpolate"``.
        args: Positional arguments of the call.
        kwargs: Keyword arguments of the call.
    """
    if function not in (
        "torch.nn.functional.interpolate",
        "torch.nn.functional.pad",
        "torch.nn.functional.max_pool3d_with_indices",
    ):
        return None
    bound = _bind(function, args, kwargs)
    if bound is None:
        return None
    tensor = bound.get("input")
    dim = getattr(tensor, "dim", None)
    if dim is None:
        return None
    ndim = dim()
    if function.endswith("interpolate"):
        mode = bound.get("mode")
        if mode == "bilinear" and ndim == 4 and not bound.get("antialias"):
            return "aten::upsample_bilinear2d"
        if mode == "trilinear" and ndim == 5:
            return "aten::upsample_trilinear3d"
        return None
    if function.endswith(".pad"):
        pad = bound.get("pad")
        if bound.get("mode") == "replicate" and isinstance(pad, (list, tuple)) and len(pad) in (2, 4, 6):
            return f"aten::replication_pad{len(pad) // 2}d"
        return None
    return "aten::max_pool3d_with_indices"


def function_name(func: Any) -> str:
    """A stable qualified name for a torch function seen by a ``TorchFunctionMode``.

    Functions of ``torch.nn.functional`` (including builtins re-exported there, such as
    ``scaled_dot_product_attention``) are named ``torch.nn.functional.<name>``.
    """
    import torch.nn.functional as F

    name = getattr(func, "__name__", None) or type(func).__name__
    if getattr(F, name, None) is func:
        return f"torch.nn.functional.{name}"
    module = getattr(func, "__module__", None)
    if module:
        return f"{module}.{name}"
    qual = getattr(func, "__qualname__", name)
    return f"torch.{qual}"


def op_arguments(func: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments of an aten op call by schema name (defaults filled in), for an entry's ``args`` check."""
    out: dict[str, Any] = {}
    for i, a in enumerate(func._schema.arguments):
        if a.name in kwargs:
            out[a.name] = kwargs[a.name]
        elif i < len(args):
            out[a.name] = args[i]
        elif a.has_default_value():
            out[a.name] = a.default_value
    return out
