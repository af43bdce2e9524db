"""Load a model for inspection: an Ultralytics model YAML, a checkpoint, or a factory ``package.module:function``.

Commands that look at a model without training it (``yolo-det audit``) take the same ``MODEL``
argument; this module turns it into an ``nn.Module`` plus what is known about where each layer came
from (the YAML file and the line of each layer). Every failure a user can cause (missing file,
malformed YAML, unknown module name, a factory that does not import) is a one-line
:class:`~yolo_det.core.errors.ModelError`. Nothing is downloaded: ``.pt`` names that are not files are
rejected rather than fetched, and a ``TorchVision`` layer is built without its pretrained weights.
"""

from __future__ import annotations

import importlib
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..core.errors import ModelError, did_you_mean
from ..core.quiet import quiet_ultralytics
from ..core.text import short
from ..core.untrusted import safe_yaml
from .blocks import layer_lines
from .model_yaml import check_activation
from .models import is_example, model_names, resolve_model_yaml

__all__ = [
    "LoadedModel",
    "check_checkpoint_yaml",
    "check_model_file",
    "check_yaml_modules",
    "layer_lines",
    "load_model",
]

_FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_YAML_SUFFIXES = {".yaml", ".yml"}
_CKPT_SUFFIXES = {".pt", ".pth", ".ckpt", ".bin"}
# Heads whose model class differs from the task's default one.
_HEAD_CLASSES = {
    "RTDETRDecoder": "RTDETRDetectionModel",
    "WorldDetect": "WorldModel",
    "YOLOEDetect": "YOLOEModel",
    "YOLOESegment": "YOLOESegModel",
    "YOLOESegment26": "YOLOESegModel",
}
_TASK_CLASSES = {
    "detect": "DetectionModel",
    "segment": "SegmentationModel",
    "pose": "PoseModel",
    "obb": "OBBModel",
    "classify": "ClassificationModel",
}


@dataclass
class LoadedModel:
    """A model ready to inspect, and where it came from.

    Attributes:
        model: The ``nn.Module`` (an Ultralytics ``BaseModel`` for YAMLs and Ultralytics checkpoints).
        source: The ``MODEL`` argument as given (or the class name for a module object).
        kind: ``yaml``, ``checkpoint``, ``factory`` or ``module``.
        yaml_path: The model YAML the layers were built from, when known.
        layer_lines: ``{layer index: line}`` of each layer in ``yaml_path``.
        channels: Input channels.
        stride: The largest stride of an Ultralytics model (input sizes must be multiples), else None.
    """

    model: Any
    source: str
    kind: str
    yaml_path: Path | None = None
    layer_lines: dict[int, int] = field(default_factory=dict)
    channels: int = 3
    stride: int | None = None


def _row_lines(text: str) -> list[int]:
    lines = layer_lines(text)
    return [lines[i] for i in sorted(lines)]


def check_yaml_modules(data: Mapping[str, Any], text: str, origin: str, namespace: Mapping[str, Any]) -> None:
    """Check the shape of a model YAML and that every module name resolves the way ``parse_model`` resolves it.

    Raises:
        ModelError: A section is missing, a row is not ``[from, repeats, module, args]``, or a module name is unknown
            (with the file, the line and a close match).
    """
    import torch

    rows_lines = _row_lines(text)
    for section in ("backbone", "head"):
        if not isinstance(data.get(section), list):
            raise ModelError(f"{origin}: a model YAML needs a '{section}' list of [from, repeats, module, args] rows")
    known = sorted(k for k, v in namespace.items() if isinstance(v, type) and issubclass(v, torch.nn.Module))
    for i, row in enumerate(data["backbone"] + data["head"]):
        where = f"{origin}:{rows_lines[i]}" if i < len(rows_lines) else f"{origin} (layer {i})"
        if not isinstance(row, list) or len(row) != 4:
            raise ModelError(f"{where}: layer {i} must be [from, repeats, module, args], got {short(row)}")
        name = row[2]
        if not isinstance(name, str):
            raise ModelError(f"{where}: layer {i} module must be a name, got {short(name)}")
        name = name[:200]
        if name.startswith("nn."):
            if not isinstance(getattr(torch.nn, name[3:], None), type):
                nn_names = [f"nn.{n}" for n in dir(torch.nn) if isinstance(getattr(torch.nn, n), type)]
                raise ModelError(
                    f"{where}: unknown module '{name}' in layer {i}: torch.nn has no '{name[3:]}'."
                    f"{did_you_mean(name, nn_names)}"
                )
        elif name.startswith("torchvision.ops."):
            import torchvision

            if getattr(torchvision.ops, name[16:], None) is None:
                raise ModelError(f"{where}: unknown module '{name}' in layer {i}: torchvision.ops has no '{name[16:]}'")
        elif name in namespace and not (
            isinstance(namespace[name], type) and issubclass(namespace[name], torch.nn.Module)
        ):
            raise ModelError(
                f"{where}: layer {i} names '{name}', which is not a module class (a model YAML builds "
                "from nn.Module classes only: torch.nn, Ultralytics' modules, yolo-det's layers and "
                "the modules you --import)"
            )
        elif name not in namespace:
            raise ModelError(
                f"{where}: unknown module '{name}' in layer {i}; Ultralytics knows nn.X, torchvision.ops.X and its own "
                "modules; for your own, import the module that defines it (--import MODULE, or modules=[...] in "
                f"Python).{did_you_mean(name, known)}"
            )


def _read_yaml(path: Path) -> tuple[str, dict[str, Any]]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ModelError(f"cannot read model YAML '{path}': {e}") from None
    try:
        data = safe_yaml.load(text)
    except yaml.YAMLError as e:
        raise ModelError(safe_yaml.error_line(str(path), e)) from None
    if not isinstance(data, dict):
        raise ModelError(
            f"{path}: a model YAML must be a mapping with 'backbone' and 'head', got {type(data).__name__}"
        )
    return text, data


def check_model_file(spec: str) -> Path:
    """Check the model YAML Ultralytics will build for ``spec`` (P6 names resolved as Ultralytics resolves them):
    every layer an allowed module class, every ``activation:`` an allowed call. Returns the file checked.

    Raises:
        ModelError: Not found, malformed, or naming what is not allowed (file, line, what to do).
    """
    from ..core.compat import tasks

    path = resolve_model_yaml(spec)
    if path is None:
        raise ModelError(f"model YAML '{spec}' not found: give a path or an Ultralytics name such as yolov8n.yaml")
    text, data = _read_yaml(path)
    with model_names():
        check_yaml_modules(data, text, str(path), vars(tasks))
    check_activation(data, str(path))
    return path


def check_checkpoint_yaml(path: str | Path) -> None:
    """Check the model YAML a checkpoint stores (Ultralytics builds the model from it when training), as
    :func:`check_model_file` checks a file; nothing when it stores none.

    Raises:
        ModelError: The stored YAML names what is not allowed.
    """
    from ..core.compat import tasks
    from ..core.untrusted.safeload import checkpoint_model_yaml, trust_checkpoints

    if trust_checkpoints():
        return
    found = checkpoint_model_yaml(path)
    if found is None:
        return
    origin = f"{path} (its stored model YAML)"
    with model_names():
        check_yaml_modules(found[0], "", origin, vars(tasks))
    check_activation(found[0], origin)


def _without_weights(cfg: dict[str, Any]) -> dict[str, Any]:
    """``cfg`` with each ``TorchVision`` row's pretrained weights set to none: building downloads nothing."""
    for row in [r for part in ("backbone", "head") if isinstance(cfg.get(part), list) for r in cfg[part]]:
        if isinstance(row, list) and len(row) >= 4 and row[2] == "TorchVision" and isinstance(row[3], list):
            row[3] = [*row[3][:2], None, *row[3][3:]] if len(row[3]) >= 2 else row[3]  # [c2, model, weights, ...]
    return cfg


def _model_class(cfg: Mapping[str, Any]) -> Any:
    from ..core.compat import tasks

    head = cfg["head"][-1][2] if cfg.get("head") else ""
    name = _HEAD_CLASSES.get(head)
    if name is None:
        try:
            task = tasks.guess_model_task(dict(cfg))
        except Exception:  # Ultralytics raises a SyntaxError-like error for unknown heads
            task = "detect"
        name = _TASK_CLASSES.get(task, "DetectionModel")
    return getattr(tasks, name)


def _ultralytics_info(model: Any) -> tuple[int, int | None]:
    channels = 3
    yaml_cfg = getattr(model, "yaml", None)
    if isinstance(yaml_cfg, dict):
        channels = int(yaml_cfg.get("channels", yaml_cfg.get("ch", 3)) or 3)
    stride: Any = getattr(model, "stride", None)
    try:
        s = int(max(stride)) if stride is not None else None
    except (TypeError, ValueError):
        s = None
    return channels, (s if s and s > 0 else None)


def _first_conv_channels(model: Any) -> int:
    import torch

    for m in model.modules():
        if isinstance(m, (torch.nn.Conv2d, torch.nn.Conv1d, torch.nn.Conv3d)):
            return int(m.in_channels)
    return 3


def _is_ultralytics_wrapper(obj: Any) -> bool:
    from ..core.compat import Model

    return isinstance(obj, Model)


def _from_module(model: Any, source: str, kind: str) -> LoadedModel:
    import torch

    if _is_ultralytics_wrapper(model):
        model = model.model  # an ultralytics YOLO/RTDETR wrapper around the BaseModel
    if not isinstance(model, torch.nn.Module):
        raise ModelError(f"{source}: expected a torch.nn.Module (or an ultralytics YOLO), got {type(model).__name__}")
    loaded = LoadedModel(model=model, source=source, kind=kind)
    yaml_cfg = getattr(model, "yaml", None)
    if isinstance(yaml_cfg, dict):
        loaded.channels, loaded.stride = _ultralytics_info(model)
        yaml_file = yaml_cfg.get("yaml_file")
        if yaml_file:
            path = resolve_model_yaml(yaml_file)
            if path is not None:
                try:
                    text = path.read_text(encoding="utf-8")
                    lines = layer_lines(text)
                except (OSError, UnicodeDecodeError):
                    lines = {}
                layers = getattr(model, "model", None)
                n_layers = len(layers) if isinstance(layers, torch.nn.Sequential) else -1
                if lines and len(lines) == n_layers:
                    loaded.yaml_path, loaded.layer_lines = path, lines
    else:
        loaded.channels = _first_conv_channels(model)
    return loaded


def _load_yaml(spec: str) -> LoadedModel:
    from ..core.compat import tasks

    path = resolve_model_yaml(spec)
    if path is None:
        raise ModelError(f"model YAML '{spec}' not found: give a path or an Ultralytics name such as yolov8n.yaml")
    text, data = _read_yaml(path)
    check_yaml_modules(data, text, str(path), vars(tasks))
    check_activation(data, str(path))
    p = Path(spec)
    # Ultralytics names carry the scale (yolov8n -> n)
    cfg_source = str(path) if p.is_file() or is_example(path) else spec
    try:
        with quiet_ultralytics(level=logging.ERROR, drop_stdout=True):
            cfg = _without_weights(tasks.yaml_model_load(cfg_source))
            cls = _model_class(cfg)
            model = cls(cfg, verbose=False)
    except ModelError:
        raise
    except Exception as e:  # parse_model raises anything for a wrong row
        from .blocks import build_error

        msg = " ".join(str(e).split()) or type(e).__name__
        named = build_error(e, {"yaml_file": str(path)})
        raise ModelError(
            f"the model does not build: {named}"
            if named
            else f"{path}: the model does not build: {type(e).__name__}: {msg}"
        ) from None
    channels, stride = _ultralytics_info(model)
    return LoadedModel(
        model=model,
        source=spec,
        kind="yaml",
        yaml_path=path,
        layer_lines=layer_lines(text),
        channels=channels,
        stride=stride,
    )


def _load_checkpoint(path: Path, source: str) -> LoadedModel:
    """A checkpoint's model: rebuilt from the model YAML it stores (nothing in the file runs), or, with
    ``--trust-checkpoint``, unpickled by torch."""
    from ..core.untrusted.safeload import trust_checkpoints

    if trust_checkpoints():
        return _unpickle_checkpoint(path, source)
    return _rebuild_checkpoint(path, source)


def _rebuild_checkpoint(path: Path, source: str) -> LoadedModel:
    import copy

    from ..core.compat import tasks
    from ..core.untrusted.safeload import checkpoint_model_yaml, trust_hint

    found = checkpoint_model_yaml(path)
    if found is None:
        raise ModelError(
            f"checkpoint '{path}' stores no model YAML to rebuild its model from, and yolo-det does not "
            f"unpickle checkpoints by default; {trust_hint()}"
        )
    cfg, weights = found
    origin = f"{path} (its stored model YAML)"
    from .blocks import CHECKPOINT_KEY
    from .names import recorded_imports

    extra = cfg.get(CHECKPOINT_KEY)
    recorded_imports(extra.get("imports") if isinstance(extra, dict) else None, f"checkpoint '{path}'")
    with model_names():  # yolo-det's layer names and example blocks, as `yolo-det train` (the user's: --import)
        try:
            check_yaml_modules(cfg, "", origin, vars(tasks))
            check_activation(cfg, origin)
        except ModelError as e:
            raise ModelError(f"{' '.join(str(e).split())}; to load the pickled model instead, {trust_hint()}") from None
        channels = cfg.get("channels", cfg.get("ch", 3))
        valid = isinstance(channels, int) and not isinstance(channels, bool) and 0 < channels <= 64
        channels = channels if valid else 3
        try:
            with quiet_ultralytics(level=logging.ERROR, drop_stdout=True):
                model = _model_class(cfg)(_without_weights(copy.deepcopy(cfg)), ch=channels, verbose=False)
                model.load_state_dict(weights, strict=True)
        except Exception as e:  # parse_model and load_state_dict raise anything for a foreign YAML
            msg = " ".join(str(e).split())[:200] or type(e).__name__
            raise ModelError(
                f"cannot rebuild the model of checkpoint '{path}' from its stored YAML "
                f"({type(e).__name__}: {msg}); {trust_hint()}"
            ) from None
    return _from_module(model.float(), source, "checkpoint")


def _unpickle_checkpoint(path: Path, source: str) -> LoadedModel:
    import torch

    from .names import checkpoint_imports

    checkpoint_imports(path)  # one line naming the --import to add, never an import
    try:
        with model_names(), quiet_ultralytics(level=logging.ERROR, drop_stdout=True):
            ckpt = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # pickle errors come in many types
        msg = " ".join(str(e).split()) or type(e).__name__
        raise ModelError(f"cannot load checkpoint '{path}': {type(e).__name__}: {msg}") from None
    model = ckpt
    if isinstance(ckpt, dict):
        model = ckpt.get("ema") if ckpt.get("ema") is not None else ckpt.get("model")
        if model is None:
            raise ModelError(
                f"checkpoint '{path}' holds no model ('ema' or 'model' key); a state_dict alone cannot be audited"
            )
    if not isinstance(model, torch.nn.Module):
        raise ModelError(f"checkpoint '{path}' holds a {type(model).__name__}, not a torch.nn.Module")
    model = model.float()
    loaded = _from_module(model, source, "checkpoint")
    return loaded


def _load_factory(spec: str) -> LoadedModel:
    module_name, func_name = spec.split(":", 1)
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ModelError(f"cannot import '{module_name}' for factory '{spec}': {e}") from None
    func = getattr(module, func_name, None)
    if func is None or not callable(func):
        names = [n for n in dir(module) if not n.startswith("_")]
        raise ModelError(f"'{module_name}' has no callable '{func_name}'.{did_you_mean(func_name, names)}")
    try:
        model = func()
    except Exception as e:  # user code
        msg = " ".join(str(e).split()) or type(e).__name__
        raise ModelError(f"factory '{spec}' failed: {type(e).__name__}: {msg}") from None
    return _from_module(model, spec, "factory")


def load_model(spec: Any) -> LoadedModel:
    """Load ``spec`` for inspection.

    Args:
        spec: A model YAML (path or Ultralytics name such as ``yolov8n.yaml``), a checkpoint path (``.pt``),
            an importable factory ``package.module:function`` returning an ``nn.Module`` or ``ultralytics.YOLO``,
            or a module object.

    Raises:
        ModelError: The model cannot be found, parsed, imported or built (one line, with file and line when known).
    """
    import torch

    if isinstance(spec, torch.nn.Module) or _is_ultralytics_wrapper(spec):
        return _from_module(spec, type(spec).__name__, "module")
    if not isinstance(spec, (str, Path)):
        raise ModelError(
            "a model must be a YAML, a checkpoint, a factory 'package.module:function' or a module, "
            f"got {type(spec).__name__}"
        )
    text = str(spec)
    path = Path(text).expanduser()
    if path.suffix.lower() in _YAML_SUFFIXES:
        return _load_yaml(text)
    if path.is_file():
        return _load_checkpoint(path, text)
    if _FACTORY.match(text):
        return _load_factory(text)
    if path.suffix.lower() in _CKPT_SUFFIXES:
        raise ModelError(
            f"checkpoint '{text}' not found (yolo-det does not download weights); give a local file or a model YAML"
        )
    raise ModelError(
        f"model '{text}' not found: give a model YAML (path or Ultralytics name), a checkpoint file or a "
        "factory package.module:function"
    )
