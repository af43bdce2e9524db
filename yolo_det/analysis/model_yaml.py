"""What a model YAML may say before yolo-det's inspection tools hand it to Ultralytics.

Ultralytics' ``parse_model`` passes a model YAML's ``activation:`` to ``eval()``. ``yolo-det audit`` and
``yolo-det rewrite`` inspect YAMLs that may come from anyone, so they accept only the forms Ultralytics'
own YAMLs use: a call of an activation class of ``torch.nn`` named as ``nn.X`` or ``torch.nn.X``, with
literal arguments (``nn.SiLU()``, ``torch.nn.ReLU()``, ``nn.LeakyReLU(0.1)``,
``nn.Hardtanh(min_val=-1.0, max_val=1.0)``). Anything else is a one-line error before any model is built.
(``yolo-det train`` builds the user's own model with Ultralytics, which evaluates ``activation:`` as
Ultralytics always does.)
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from typing import Any

from ..core.errors import ModelError
from ..core.text import short

__all__ = ["check_activation"]

_LARGEST_INT = 2**16  # no activation takes a bigger integer (PReLU's num_parameters would allocate it)
_NOT_ACTIVATIONS = {"MultiheadAttention"}


def _chain(node: ast.expr) -> list[str] | None:
    names: list[str] = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    names.append(node.id)
    return names[::-1]


def _literal(node: ast.expr) -> bool:
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    if isinstance(value, bool) or value is None or isinstance(value, float):
        return True
    if isinstance(value, int):
        return abs(value) <= _LARGEST_INT
    return isinstance(value, str) and len(value) <= 32


def check_activation(cfg: Mapping[str, Any], origin: str) -> None:
    """Refuse a model YAML with an ``activation:`` (at any level) that is not a plain ``torch.nn`` activation call (see
    the module docstring).

    Raises:
        ModelError: One line naming the file and the accepted forms.
    """
    for act in _activations(cfg, 0):
        _check_one(act, origin)


def _activations(value: Any, depth: int) -> list[Any]:
    """Every ``activation:`` value at any level of a model YAML (top level, layer arguments, nested mappings)."""
    if depth > 64:
        return []
    found: list[Any] = []
    if isinstance(value, Mapping):
        for key, item in value.items():
            if key == "activation" and item is not None:
                found.append(item)
            else:
                found.extend(_activations(item, depth + 1))
    elif isinstance(value, (list, tuple)):
        for item in value:
            found.extend(_activations(item, depth + 1))
    return found


def _check_one(act: Any, origin: str) -> None:
    import torch

    hint = "write it as Ultralytics' YAMLs do, e.g. nn.SiLU(), torch.nn.ReLU() or nn.LeakyReLU(0.1)"
    if not isinstance(act, str) or len(act) > 200:
        raise ModelError(f"{origin}: 'activation' must be a torch.nn activation call, got {short(act)}; {hint}")
    try:
        tree = ast.parse(act.strip(), mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        raise ModelError(f"{origin}: 'activation: {short(act)}' is not a torch.nn activation call; {hint}") from None
    call = tree.body
    chain = _chain(call.func) if isinstance(call, ast.Call) else None
    ok = (
        isinstance(call, ast.Call)
        and chain is not None
        and (chain[:-1] == ["nn"] or chain[:-1] == ["torch", "nn"])
        and all(_literal(a) for a in call.args)
        and all(k.arg is not None and _literal(k.value) for k in call.keywords)
    )
    if ok and chain is not None:
        cls = getattr(torch.nn, chain[-1], None)
        ok = (
            isinstance(cls, type)
            and issubclass(cls, torch.nn.Module)
            and chain[-1] not in _NOT_ACTIVATIONS
            and (cls.__module__ == "torch.nn.modules.activation" or cls is torch.nn.Identity)
        )
    if not ok:
        raise ModelError(
            f"{origin}: 'activation: {short(act)}' is not accepted: yolo-det inspects model YAMLs "
            f"without running code, so only a torch.nn activation class called with literal arguments "
            f"is; {hint}"
        )
