"""Channel declarations for the user's own blocks, and model-build errors that name the layer.

Ultralytics' ``parse_model`` knows the channel rules of its own modules only: a block it does not know
gets the YAML arguments verbatim and is assumed to keep the channels of its single input. A block may
declare its rule instead, with no fork of Ultralytics:

* a class attribute ``yolo_det_channels = staticmethod(rule)``, or
* :func:`declare_block` ``(cls, channels=rule)`` (for a class you cannot edit).

``rule(c_in, *args)`` receives the input channels (an ``int``; a ``list`` of ints, one per source, when the
row's ``from`` is a list) and the YAML arguments, and returns ``(c_out, args_to_pass)``: the block's output
channels and the arguments its constructor receives. For example a BiFPN-style weighted add of two maps
(``[[-1, 6], 1, BiFPN_Add2, []]``) declares ``lambda c_in: (c_in[0], [c_in[0]])``.

While a yolo-det command (or :func:`yolo_det.custom_modules`) is active, ``ultralytics.nn.tasks.parse_model``
is wrapped (:func:`declared_channels`): a model whose rows name no declared block is built by Ultralytics'
own ``parse_model`` untouched. Otherwise the wrapper learns the input channels of each declared row from
Ultralytics itself (the rows before it, built on the ``meta`` device, followed by ``nn.BatchNorm2d`` rows
that read the channels of its sources), has ``parse_model`` build the model with a parameter-free
placeholder of the declared output channels in the declared rows, and puts the user's block in each
placeholder's place with the real ``from`` (and the save list Ultralytics keeps for multi-input rows).
Nothing of Ultralytics is edited; on leaving, the original ``parse_model`` is bound again.

:func:`build_error` names the layer of any exception raised while a model is built (in ``parse_model`` or
in the first forward pass Ultralytics runs to find the strides): index, module, ``from`` and YAML line.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from ..core.errors import ConfigError, ModelError
from ..core.untrusted import safe_yaml

__all__ = [
    "ATTRIBUTE",
    "CHECKPOINT_KEY",
    "build_error",
    "channel_rule",
    "layer_lines",
    "declare_block",
    "declared_channels",
    "naming_build_errors",
    "own_config",
    "portable_config",
    "undeclare_block",
]

#: The class attribute a block declares its channel rule with.
ATTRIBUTE = "yolo_det_channels"

#: The key of a model YAML dict (and so of every checkpoint's stored YAML) where yolo-det keeps what plain
#: Ultralytics does not need: ``imports`` (the user's modules of the run) and ``layers`` (``{index: name}`` of
#: the rows that named yolo-det's deterministic layers and are stored with torch's own names).
CHECKPOINT_KEY = "yolo_det"

ChannelRule = Callable[..., Any]

_lock = threading.RLock()
_rules: dict[type, ChannelRule] = {}
_depth = 0
_original: Any = None


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


def _tasks() -> Any:
    from ..core.compat import tasks

    return tasks


def _resolve(name: str, namespace: Mapping[str, Any]) -> Any:
    import torch

    if name.startswith("nn."):
        return getattr(torch.nn, name[3:], None)
    if name.startswith("torchvision.ops."):
        return None
    return namespace.get(name)


def _yaml_lines(d: Mapping[str, Any]) -> dict[int, int]:
    source = d.get("yaml_file")
    if not isinstance(source, str) or not source:
        return {}
    try:
        text = Path(source).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return layer_lines(text)


def layer_lines(text: str) -> dict[int, int]:
    """``{layer index: 1-based line}`` of the ``backbone`` + ``head`` rows of a model YAML (counted as
    ``parse_model`` counts them)."""
    try:
        node = safe_yaml.compose(text)
    except yaml.YAMLError:
        return {}
    if not isinstance(node, yaml.MappingNode):
        return {}
    sections = {k.value: v for k, v in node.value if isinstance(k, yaml.ScalarNode)}
    lines: dict[int, int] = {}
    i = 0
    for name in ("backbone", "head"):
        seq = sections.get(name)
        if isinstance(seq, yaml.SequenceNode):
            for item in seq.value:
                lines[i] = item.start_mark.line + 1
                i += 1
    return lines


def _where(d: Mapping[str, Any], index: int, name: str, source: Any) -> str:
    line = _yaml_lines(d).get(index)
    place = f"{d.get('yaml_file')}:{line}: " if line else ""
    return f"{place}layer {index} ({name}, from {source})"


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:300] or type(e).__name__


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


def _native_names() -> dict[Any, str]:
    """yolo-det's deterministic layer class -> the ``nn.X`` YAML name of the torch class it stands for."""
    import torch

    from ..layers.table import SWAPS

    return {
        det: f"nn.{native.__name__}"
        for native, det in SWAPS.items()
        if getattr(torch.nn, native.__name__, None) is native
    }


def portable_config(cfg: Mapping[str, Any], imports: list[dict[str, str]]) -> dict[str, Any]:
    """A copy of the model YAML dict ``cfg`` that plain Ultralytics rebuilds: rows naming yolo-det's deterministic
    layers (``DetUpsample``) name torch's (``nn.Upsample``); yolo-det's names and the run's ``imports`` are kept
    under :data:`CHECKPOINT_KEY`, which ``parse_model`` ignores and yolo-det reads back when it rebuilds."""
    namespace = vars(_tasks())
    natives = _native_names()
    out = copy.deepcopy({k: v for k, v in cfg.items() if k != CHECKPOINT_KEY})
    before = cfg.get(CHECKPOINT_KEY)
    layers: dict[str, str] = {}
    if isinstance(before, Mapping) and isinstance(before.get("layers"), Mapping):
        layers.update({str(k): v for k, v in before["layers"].items() if isinstance(v, str)})
    i = 0
    for section in ("backbone", "head"):
        rows = out.get(section)
        for row in rows if isinstance(rows, list) else []:
            if isinstance(row, list) and len(row) == 4 and isinstance(row[2], str):
                native = natives.get(namespace.get(row[2]))
                if native is not None:
                    layers[str(i)] = row[2]
                    row[2] = native
            i += 1
    out[CHECKPOINT_KEY] = {"imports": [dict(e) for e in imports], "layers": layers}
    return out


def own_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The model YAML dict the run was built from: :func:`portable_config` undone (yolo-det's layer names back in
    their rows, without the :data:`CHECKPOINT_KEY` key). A dict that was never made portable comes back as is."""
    out = dict(cfg)
    if CHECKPOINT_KEY in out and isinstance(out.get("backbone"), list) and isinstance(out.get("head"), list):
        out = _restore_layers(out, {det.__name__: det for det in _native_names()})
    out.pop(CHECKPOINT_KEY, None)
    return out


def _restore_layers(d: dict[str, Any], namespace: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``d`` with the rows :func:`portable_config` stored under torch's names named yolo-det's again (when the
    name still resolves to yolo-det's layer and the row still names that layer's torch class)."""
    extra = d.get(CHECKPOINT_KEY)
    layers = extra.get("layers") if isinstance(extra, Mapping) else None
    if not isinstance(layers, Mapping) or not layers:
        return d
    namespace = vars(_tasks()) if namespace is None else namespace
    natives = _native_names()
    out = dict(d)
    n_backbone = len(d["backbone"])
    rows = copy.deepcopy(d["backbone"] + d["head"])
    for key, name in layers.items():
        i = int(key) if isinstance(key, (int, str)) and str(key).isdigit() else -1
        if (
            0 <= i < len(rows)
            and isinstance(rows[i], list)
            and len(rows[i]) == 4
            and isinstance(name, str)
            and natives.get(namespace.get(name)) == rows[i][2]
        ):
            rows[i][2] = name
    out["backbone"], out["head"] = rows[:n_backbone], rows[n_backbone:]
    return out


def _parse_model(d: dict[str, Any], ch: Any, verbose: bool = True) -> Any:
    """``parse_model`` with the user's declared blocks (see the module docstring)."""
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
        seq[row.index] = module
        sources = row.source if isinstance(row.source, list) else [row.source]
        save.extend(x % row.index for x in sources if x != -1)
        if verbose:
            tasks.LOGGER.info(
                f"{row.index:>3}{row.source!s:>20}{n:>3}{module.np:10.0f}  {kind:<45}"
                f"{passed!s:<30} (declared channels: {c_in} -> {c_out})"
            )
    return seq, sorted(save)


@contextlib.contextmanager
def declared_channels() -> Iterator[None]:
    """Build declared blocks with their channel rules in every ``parse_model`` call inside the block.

    Re-entrant: nested blocks share one wrapper, and the ``parse_model`` bound before the outermost block is
    bound again after it (unless something else rebound it meanwhile, which is then left alone).
    """
    global _depth, _original
    tasks = _tasks()
    with _lock:
        if _depth == 0:
            _original = tasks.parse_model
            tasks.parse_model = _parse_model
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                if tasks.parse_model is _parse_model:
                    tasks.parse_model = _original
                _original = None


def _frames(tb: TracebackType | None) -> Iterator[Any]:
    while tb is not None:
        yield tb.tb_frame
        tb = tb.tb_next


def build_error(e: BaseException, d: Mapping[str, Any] | None = None) -> str | None:
    """One line naming the layer ``e`` was raised in while a model was built, or None when no layer is known.

    The layer is read from the traceback: the row ``parse_model`` was building, or the layer the model's
    forward pass was running (Ultralytics' first forward, which finds the strides).
    """
    tasks = _tasks()
    codes = {getattr(f, "__code__", None) for f in (tasks.parse_model, _original)} - {None, _parse_model.__code__}
    found: tuple[int, Any, str] | None = None
    for frame in _frames(e.__traceback__):
        local = frame.f_locals
        if frame.f_code in codes and isinstance(local.get("i"), int):
            m = local.get("m")
            name = getattr(m, "__name__", None) or str(m)
            found = (local["i"], local.get("f"), name)
        elif frame.f_code.co_name == "_predict_once":
            m = local.get("m")
            if isinstance(getattr(m, "i", None), int):
                found = (m.i, getattr(m, "f", None), str(getattr(m, "type", type(m).__name__)).rsplit(".", 1)[-1])
    if found is None:
        return None
    index, source, name = found
    cfg: Mapping[str, Any] = d or {}
    hint = ""
    if isinstance(source, list) and isinstance(e, TypeError) and "list indices" in str(e):
        hint = (
            f"; {name} takes {len(source)} inputs and Ultralytics cannot tell its output channels: declare them "
            f"({ATTRIBUTE} = staticmethod(lambda c_in, *args: (c_out, args)) or yolo_det.declare_block)"
        )
    elif isinstance(e, RuntimeError) and ("shape" in str(e) or "channels" in str(e)):
        hint = "; check the channel arguments of this layer (or the channel rule it declares)"
    return f"{_where(cfg, index, name, source)}: {type(e).__name__}: {_one_line(e)}{hint}"


@contextlib.contextmanager
def naming_build_errors(model_yaml: str | Path | None = None) -> Iterator[None]:
    """Turn an exception raised while a model is built into a one-line :class:`ModelError` naming the layer
    (:func:`build_error`); an exception with no layer to name passes through unchanged.

    Args:
        model_yaml: The model YAML being built (for its line numbers), when there is one.
    """
    from ..core.errors import YoloDetError

    try:
        yield
    except YoloDetError:
        raise
    except Exception as e:
        named = build_error(e, {"yaml_file": str(model_yaml)} if model_yaml else None)
        if named is None:
            raise
        raise ModelError(f"the model does not build: {named}") from None
