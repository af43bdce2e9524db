"""``key=value`` arguments passed through to Ultralytics, parsed safely and checked before any run starts.

Values are parsed as bounded YAML (:mod:`yolo_det.core.untrusted.safe_yaml`, never ``eval``): ``epochs=3`` is an int,
``amp=false`` a bool, ``lr0=1e-3`` a float (as Ultralytics' own command line reads it; YAML 1.1 alone would
read a string), ``imgsz=[96,128]`` a list, ``name=exp`` a string; ``none``/``None``/``null`` is None.
Alias bombs and deep nesting are refused in one line. Keys are
checked against Ultralytics' argument names (unknown keys get a close-match hint) as they are parsed, before
torch or Ultralytics is imported: the names are read from the installed package's ``cfg/default.yaml``, found
without importing it (:func:`argument_names`). Values are checked against Ultralytics' type rules later
(:func:`check_ultralytics_args`), still before a model is built.
"""

from __future__ import annotations

import functools
import importlib.util
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from ..core.errors import ConfigError, ModelError, did_you_mean
from ..core.text import short
from ..core.untrusted import safe_yaml

__all__ = [
    "MAX_IMGSZ",
    "argument_names",
    "check_ultralytics_args",
    "parse_overrides",
    "resolve_data",
    "resolve_data_cfg",
    "resolve_model",
    "resolve_model_task",
]

_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@functools.lru_cache(maxsize=1)
def argument_names() -> frozenset[str]:
    """The names of Ultralytics' arguments (the keys of its ``cfg/default.yaml``), read without importing
    Ultralytics (nor torch): the file is found through the package's import location. When it cannot be found
    that way (a zipped install), Ultralytics' own ``DEFAULT_CFG_DICT`` is imported instead."""
    spec = importlib.util.find_spec("ultralytics")
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(folder) / "cfg" / "default.yaml"
        if path.is_file():
            loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the installed package's own file
            data = yaml.load(path.read_text(encoding="utf-8"), Loader=loader)  # noqa: S506 - a safe loader
            if isinstance(data, dict) and data:
                return frozenset(str(k) for k in data)
    from ..core.compat import DEFAULT_CFG_DICT

    return frozenset(DEFAULT_CFG_DICT)


def _check_name(key: str) -> None:
    names = argument_names()
    if key not in names:
        raise ConfigError(
            f"unknown Ultralytics argument '{key}'.{did_you_mean(key, names)} See `yolo cfg` for the list"
        )


def parse_overrides(tokens: Iterable[str]) -> dict[str, Any]:
    """Parse ``key=value`` tokens into a dict; every key must be one of Ultralytics' :func:`argument_names`.

    Raises:
        ConfigError: A token is not ``key=value``, a key is malformed, unknown or repeated, or a value is not YAML.
    """
    out: dict[str, Any] = {}
    for token in tokens:
        if "=" not in token:
            raise ConfigError(f"expected key=value, got {short(token)} (for example epochs=3)")
        key, _, raw = token.partition("=")
        key = key.strip()
        if not _KEY.match(key):
            raise ConfigError(f"invalid key {short(key)} in {short(token)}; keys are names like epochs or imgsz")
        if raw.strip() == "":
            raise ConfigError(f"'{key}=' has no value; write {key}=VALUE")
        _check_name(key)
        if key in out:
            raise ConfigError(f"'{key}' is given twice")
        if raw.strip().lower() in {"none", "null", "~"}:
            out[key] = None
            continue
        try:
            value = safe_yaml.load(raw, numbers=True)
        except yaml.YAMLError as e:
            problem = getattr(e, "problem", None) or "not valid YAML"
            raise ConfigError(f"cannot parse the value of '{key}': {short(raw)} ({problem})") from None
        if isinstance(value, (dict,)) or value is None and raw.strip():
            value = raw  # 'a: b' style strings stay strings
        out[key] = value
    return out


def check_ultralytics_args(args: Mapping[str, Any], *, reserved: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Check ``args`` against Ultralytics' configuration keys and types; return them normalised.

    Args:
        args: Parsed overrides.
        reserved: Keys yolo-det decides itself, with the reason shown when a user passes one.

    Raises:
        ConfigError: An unknown or reserved key, or a value of the wrong type or range.
    """
    from ..core.compat import check_cfg

    reserved = reserved or {}
    for key in args:
        if key in reserved:
            raise ConfigError(f"'{key}=' cannot be passed here: {reserved[key]}")
        _check_name(key)
    checked = dict(args)
    try:
        check_cfg(checked, hard=True)
    except (TypeError, ValueError) as e:
        message = " ".join(str(e).split())
        raise ConfigError(message if len(message) <= 300 else message[:300] + " ...") from None
    if "imgsz" in checked:
        _check_imgsz(checked["imgsz"])
    return checked


#: Largest image side accepted (a 16384 x 16384 batch of 2 already takes 6 GB as float32).
MAX_IMGSZ = 16384


def _check_imgsz(value: Any) -> None:
    sizes = value if isinstance(value, (list, tuple)) else [value]
    if not (1 <= len(sizes) <= 2 and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in sizes)):
        raise ConfigError(f"'imgsz={short(value)}' is not an image size; give a positive integer (imgsz=640) or [h, w]")
    if max(sizes) > MAX_IMGSZ:
        raise ConfigError(
            f"'imgsz={short(value)}' is beyond {MAX_IMGSZ} pixels a side; give a smaller image size (imgsz=640)"
        )


def resolve_model(model: str) -> str:
    """Return ``model`` if it is a model YAML Ultralytics can find or an existing checkpoint.

    Raises:
        ModelError: The YAML does not exist, or the checkpoint is not on disk (yolo-det never downloads weights).
    """
    return resolve_model_task(model, need_model=False)[0]


def resolve_model_task(model: str, *, need_model: bool = True) -> tuple[str, str | None]:
    """:func:`resolve_model`, and the model's task when the YAML or the checkpoint's model class tells it.

    ``need_model``: a checkpoint must hold a model to start a training from (a resume reads its own checkpoint).
    """
    from ..analysis.models import is_example, model_task, resolve_model_yaml

    path = Path(model).expanduser()
    if path.suffix in {".yaml", ".yml"}:
        found = resolve_model_yaml(model)
        if found is None:
            raise ModelError(
                f"model YAML '{model}' not found; give a path, an Ultralytics name such as yolov8n.yaml "
                "or a yolo-det example such as cbam-max.yaml"
            )
        resolved = str(found) if is_example(found) else model  # Ultralytics finds its own names (and their scale)
        from .prechecks import check_model_yaml

        check_model_yaml(resolved)  # bounded YAML, every module name known: one line now, not a traceback later
        return resolved, model_task(resolved)
    if path.is_file():
        from ..core.untrusted.safeload import check_checkpoint, checkpoint_globals

        if path.suffix.lower() != ".pt":
            raise ModelError(
                f"model={short(model)} is neither a model YAML (.yaml) nor a PyTorch checkpoint (.pt); "
                "Ultralytics trains from these two only"
            )
        check_checkpoint(path)  # the allow-list, before any work (no-op under --trust-checkpoint)
        if not need_model:
            return str(path), None
        from .prechecks import check_checkpoint_model

        task = check_checkpoint_model(str(path), checkpoint_globals(path))  # no model in it: one line
        return str(path), task
    raise ModelError(
        f"model '{model}' is not a local file; yolo-det does not download weights: pass a model YAML "
        "(e.g. model=yolov8n.yaml) or the path of a local checkpoint"
    )


def resolve_data(data: str, task: str | None = None) -> str:
    """The path :func:`resolve_data_cfg` returns."""
    return resolve_data_cfg(data, task)[0]


def resolve_data_cfg(data: str, task: str | None = None) -> tuple[str, dict[str, Any] | None]:
    """Return the absolute path of a data YAML or a dataset folder (classification), or the name if Ultralytics
    ships it; the data must suit the model's ``task`` when it is known.

    Returns:
        The path (or shipped name) and the data YAML's content, read once (None for a folder).

    Raises:
        ConfigError: Neither a file, a folder nor a dataset name Ultralytics knows, or data of another task.
    """
    from .prechecks import check_classify_data, check_data

    path = Path(data).expanduser()
    if path.is_dir():  # classification data: a folder with train/ and val/
        check_classify_data(str(path), task)
        return str(path.resolve()), None
    if path.is_file():
        cfg = check_data(str(path), task)
        return str(path.resolve()), cfg
    if path.suffix in {".yaml", ".yml"} and not path.parent.parts:
        from ..core.compat import check_yaml

        try:
            found = check_yaml(data, hard=False)
        except Exception:  # check_yaml may try the network for URLs
            found = None
        if found:
            return data, check_data(data, task)
    raise ConfigError(
        f"data '{data}' does not exist; pass the path of a dataset YAML (data=path/to/data.yaml) or, "
        "for classification, of a folder with train/ and val/ (data=path/to/images)"
    )
