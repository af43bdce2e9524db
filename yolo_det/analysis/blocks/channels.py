"""Channel declarations for the user's own blocks, and the ``parse_model`` wrapper that builds them
(see :mod:`yolo_det.analysis.blocks`)."""

from __future__ import annotations

import ast
import contextlib
import copy
import threading
import weakref
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from ...core.errors import ConfigError, ModelError
from ...core.nesting import NestedPatch
from .portable import _restore_layers
from .rows import _one_line, _tasks, _where

#: The class attribute a block declares its channel rule with.
ATTRIBUTE = "yolo_det_channels"

ChannelRule = Callable[..., Any]

_lock = threading.RLock()
_rules: dict[type, ChannelRule] = {}
_original: Any = None
#: Each declared block built here -> (input channels, output channels, constructor arguments).
_built: weakref.WeakKeyDictionary[Any, tuple[Any, int, list[Any]]] = weakref.WeakKeyDictionary()


def declared_call(module: Any) -> tuple[Any, int, list[Any]] | None:
    """``(c_in, c_out, args)`` of a layer the ``parse_model`` wrapper built from a declared row: its input and
    output channels and the arguments its constructor received (its YAML arguments after the channel rule);
    None for any other module (a copy of such a layer included)."""
    try:
        return _built.get(module)
    except TypeError:
        return None


def declare_block(cls: type, channels: ChannelRule) -> type:
    """Declare how the output channels (and constructor arguments) of ``cls`` follow from its input channels.

    Args:
        cls: An ``nn.Module`` subclass named in model YAMLs.
        channels: ``rule(c_in, *yaml_args) -> (c_out, args_to_pass)``; ``c_in`` is an ``int`` for a
            single-input row and a ``list`` of ints for a row whose ``from`` is a list.

    Returns:
        ``cls`` (so the call can follow the class definition).

    Raises:
        ConfigError: ``cls`` is not an ``nn.Module`` subclass or ``channels`` is not callable.

    A declaration made here wins over the class attribute ``yolo_det_channels``; it lasts for the process
    (:func:`undeclare_block` removes it).
    """
    from torch import nn

    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise ConfigError(f"declare_block needs an nn.Module subclass, got {cls!r}")
    if not callable(channels):
        raise ConfigError(
            f"declare_block({cls.__name__}, channels=...) needs a callable rule(c_in, *args) -> (c_out, args_to_pass)"
        )
    with _lock:
        _rules[cls] = channels
    return cls


def undeclare_block(cls: type) -> None:
    """Remove the declaration :func:`declare_block` made for ``cls`` (its class attribute, if any, stays)."""
    with _lock:
        _rules.pop(cls, None)


def channel_rule(obj: Any) -> ChannelRule | None:
    """The channel rule declared for ``obj`` (:func:`declare_block` first, then the class attribute), or None."""
    if not isinstance(obj, type):
        return None
    with _lock:
        rule = _rules.get(obj)
    if rule is None:
        rule = getattr(obj, ATTRIBUTE, None)
    return rule if callable(rule) else None


@dataclass
class _Row:
    index: int
    name: str
    cls: type
    rule: ChannelRule
    source: Any
    repeats: Any
    args: list[Any]


def _resolve(name: str, namespace: Mapping[str, Any]) -> Any:
    import torch

    if name.startswith("nn."):
        return getattr(torch.nn, name[3:], None)
    if name.startswith("torchvision.ops."):
        return None
    return namespace.get(name)


def _declared_rows(rows: list[Any], namespace: Mapping[str, Any]) -> list[_Row]:
    found = []
    for i, row in enumerate(rows):
        if not (isinstance(row, (list, tuple)) and len(row) == 4 and isinstance(row[2], str)):
            continue
        cls = _resolve(row[2], namespace)
        rule = channel_rule(cls)
        if rule is not None and isinstance(cls, type):
            args = list(row[3]) if isinstance(row[3], (list, tuple)) else []
            found.append(_Row(i, row[2], cls, rule, row[0], row[1], args))
    return found


def _scale(d: Mapping[str, Any]) -> tuple[float, str | None]:
    depth = d.get("depth_multiple", 1.0)
    scales, scale = d.get("scales"), d.get("scale")
    if isinstance(scales, Mapping) and scales:
        scale = scale if scale in scales else next(iter(scales))
        depth = scales[scale][0]
    return float(depth), scale


def _sources(row: _Row, d: Mapping[str, Any]) -> list[int]:
    raw = row.source if isinstance(row.source, list) else [row.source]
    out = []
    for x in raw:
        if isinstance(x, bool) or not isinstance(x, int) or not (-row.index <= x < row.index or x == -1):
            raise ModelError(
                f"{_where(d, row.index, row.name, row.source)}: 'from' must name earlier layers "
                f"(-1 or 0..{row.index - 1}), got {x!r}"
            )
        out.append(x if x >= 0 else row.index + x)
    return out


def _call_args(row: _Row, d: Mapping[str, Any]) -> list[Any]:
    out = []
    for a in row.args:
        if isinstance(a, str):
            if a == "nc":
                a = d.get("nc")
            else:
                with contextlib.suppress(ValueError, SyntaxError):
                    a = ast.literal_eval(a)
        out.append(a)
    return out


def _placeholder(c_out: int, namespace: Mapping[str, Any]) -> list[Any]:
    """A row ``parse_model`` builds with exactly ``c_out`` output channels (a cheap module, replaced afterwards)."""
    if "Index" in namespace:  # c2 = args[0], Index(0): no parameters
        return [-1, 1, "Index", [c_out, 0]]
    return [-1, 1, "ResNetLayer", [1, c_out, 1, True, 1]]  # c2 = args[1] when is_first


def _with_rows(d: Mapping[str, Any], rows: list[Any], n_backbone: int) -> dict[str, Any]:
    out = {k: v for k, v in d.items() if k not in ("backbone", "head")}
    out["backbone"], out["head"] = copy.deepcopy(rows[:n_backbone]), copy.deepcopy(rows[n_backbone:])
    return out


def _run_original(d: dict[str, Any], ch: Any, verbose: bool, *, meta: bool = False) -> Any:
    import torch

    tasks = _tasks()
    act = tasks.Conv.default_act  # parse_model sets it for 'activation:' and restores it only on success
    try:
        if meta:
            with torch.device("meta"):
                return _original(d, ch, verbose=verbose)
        return _original(d, ch, verbose=verbose)
    finally:
        tasks.Conv.default_act = act


def _input_channels(d: Mapping[str, Any], rows: list[Any], row: _Row, sources: list[int], ch: Any) -> list[int]:
    if row.index == 0:
        return [int(ch)] * len(sources)
    probe = list(rows[: row.index]) + [[s, 1, "nn.BatchNorm2d", []] for s in sources]
    cfg = _with_rows(d, probe, len(probe))
    if cfg.get("scales") and not cfg.get("scale"):
        cfg["scale"] = _scale(d)[1]
    try:
        seq, _ = _run_original(cfg, ch, False, meta=True)
    except Exception:  # a module that cannot be built on the meta device: build the prefix for real
        seq, _ = _run_original(_with_rows(d, probe, len(probe)) | {"scale": cfg.get("scale")}, ch, False)
    return [int(seq[row.index + k].num_features) for k in range(len(sources))]


def _apply_rule(row: _Row, c_in: Any, args: list[Any], d: Mapping[str, Any]) -> tuple[int, list[Any]]:
    where = _where(d, row.index, row.name, row.source)
    try:
        result = row.rule(c_in, *args)
    except Exception as e:
        raise ModelError(
            f"{where}: its channel rule raised {type(e).__name__}: {_one_line(e)} "
            f"(input channels {c_in}, YAML arguments {args})"
        ) from None
    ok = isinstance(result, (tuple, list)) and len(result) == 2
    c_out, passed = result if ok else (None, None)
    if (
        not ok
        or isinstance(c_out, bool)
        or not isinstance(c_out, int)
        or c_out <= 0
        or not isinstance(passed, (list, tuple))
    ):
        raise ModelError(
            f"{where}: its channel rule must return (c_out, args_to_pass) with c_out a positive int "
            f"and args_to_pass a list, got {result!r}"
        )
    return c_out, list(passed)


def _parse_model(d: dict[str, Any], ch: Any, verbose: bool = True) -> Any:
    """``parse_model`` with the user's declared blocks (see :mod:`yolo_det.analysis.blocks`)."""
    import torch

    tasks = _tasks()
    if isinstance(d.get("backbone"), list) and isinstance(d.get("head"), list):
        d = _restore_layers(d)
    backbone, head = d.get("backbone"), d.get("head")
    if not isinstance(backbone, list) or not isinstance(head, list):
        return _original(d, ch, verbose=verbose)
    rows = backbone + head
    declared = _declared_rows(rows, vars(tasks))
    if not declared:
        return _original(d, ch, verbose=verbose)
    depth, _ = _scale(d)
    shadow = list(rows)
    plans = []
    for row in declared:  # in order: a declared row's channels may depend on an earlier one's
        sources = _sources(row, d)
        c_in_list = _input_channels(d, shadow, row, sources, ch)
        c_in = c_in_list if isinstance(row.source, list) else c_in_list[0]
        args = _call_args(row, d)
        c_out, passed = _apply_rule(row, c_in, args, d)
        shadow[row.index] = _placeholder(c_out, vars(tasks))
        plans.append((row, c_in, c_out, passed))
    seq, save = _run_original(_with_rows(d, shadow, len(backbone)), ch, verbose)
    for row, c_in, c_out, passed in plans:
        n = row.repeats if isinstance(row.repeats, int) and not isinstance(row.repeats, bool) else 1
        n = max(round(n * depth), 1) if n > 1 else max(n, 1)
        try:
            built = [row.cls(*passed) for _ in range(n)]
        except Exception as e:
            raise ModelError(
                f"{_where(d, row.index, row.name, row.source)}: {row.name}{tuple(passed)} raised "
                f"{type(e).__name__}: {_one_line(e)}; check its channel rule "
                f"(input channels {c_in} -> {c_out})"
            ) from None
        module: Any = torch.nn.Sequential(*built) if n > 1 else built[0]
        module.np = sum(p.numel() for p in module.parameters())
        kind = f"{row.cls.__module__}.{row.cls.__qualname__}".replace("__main__.", "")
        module.i, module.f, module.type = row.index, row.source, kind  # as parse_model marks its layers
        _built[module] = (c_in, c_out, list(passed))
        seq[row.index] = module
        sources = row.source if isinstance(row.source, list) else [row.source]
        save.extend(x % row.index for x in sources if x != -1)
        if verbose:
            tasks.LOGGER.info(
                f"{row.index:>3}{row.source!s:>20}{n:>3}{module.np:10.0f}  {kind:<45}"
                f"{passed!s:<30} (declared channels: {c_in} -> {c_out})"
            )
    return seq, sorted(save)


def _wrap_parse_model() -> Any:
    global _original
    tasks = _tasks()
    _original = tasks.parse_model
    tasks.parse_model = _parse_model
    return tasks


def _unwrap_parse_model(tasks: Any) -> None:
    global _original
    if tasks.parse_model is _parse_model:
        tasks.parse_model = _original
    _original = None


_wrapped = NestedPatch(_wrap_parse_model, _unwrap_parse_model, lock=_lock)


def declared_channels() -> AbstractContextManager[None]:
    """Build declared blocks with their channel rules in every ``parse_model`` call inside the block.

    Re-entrant: nested blocks share one wrapper, and the ``parse_model`` bound before the outermost block is
    bound again after it (unless something else rebound it meanwhile, which is then left alone).
    """
    _tasks()  # Ultralytics is there (raises as before when not), nested or not
    return _wrapped.scope()
