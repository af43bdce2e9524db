"""``key=value`` arguments passed through to Ultralytics, parsed safely and checked before any run starts.

Values are parsed as bounded YAML (:mod:`yolo_det.core.safe_yaml`, never ``eval``): ``epochs=3`` is an int,
``amp=false`` a bool, ``lr0=1e-3`` a float (as Ultralytics' own command line reads it; YAML 1.1 alone would
read a string), ``imgsz=[96,128]`` a list, ``name=exp`` a string; ``none``/``None``/``null`` is None.
Alias bombs and deep nesting are refused in one line. Keys are
checked against Ultralytics' configuration (unknown keys get a close-match hint) and values against
its type rules, so a typo fails in a second with one line instead of after the model is built.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from ..core import safe_yaml
from ..core.errors import ConfigError, ModelError, did_you_mean
from ..core.safe_yaml import short

__all__ = ["check_ultralytics_args", "parse_overrides", "resolve_data", "resolve_model"]

_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_overrides(tokens: Iterable[str]) -> dict[str, Any]:
    """Parse ``key=value`` tokens into a dict.

    Raises:
        ConfigError: A token is not ``key=value``, a key is malformed or repeated, or a value is not YAML.
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
    from ..core.compat import DEFAULT_CFG_DICT, check_cfg

    reserved = reserved or {}
    for key in args:
        if key in reserved:
            raise ConfigError(f"'{key}=' cannot be passed here: {reserved[key]}")
        if key not in DEFAULT_CFG_DICT:
            raise ConfigError(f"unknown Ultralytics argument '{key}'.{did_you_mean(key, DEFAULT_CFG_DICT)} "
                              "See `yolo cfg` for the list")
    checked = dict(args)
    try:
        check_cfg(checked, hard=True)
    except (TypeError, ValueError) as e:
        message = " ".join(str(e).split())
        raise ConfigError(message if len(message) <= 300 else message[:300] + " ...") from None
    if "imgsz" in checked:
        _check_imgsz(checked["imgsz"])
    return checked


def _check_imgsz(value: Any) -> None:
    sizes = value if isinstance(value, (list, tuple)) else [value]
    if not (1 <= len(sizes) <= 2 and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in sizes)):
        raise ConfigError(f"'imgsz={value}' is not an image size; give a positive integer (imgsz=640) or [h, w]")


def resolve_model(model: str) -> str:
    """Return ``model`` if it is a model YAML Ultralytics can find or an existing checkpoint.

    Raises:
        ModelError: The YAML does not exist, or the checkpoint is not on disk (yolo-det never downloads weights).
    """
    from ..analysis.models import is_example, resolve_model_yaml

    path = Path(model).expanduser()
    if path.suffix in {".yaml", ".yml"}:
        found = resolve_model_yaml(model)
        if found is None:
            raise ModelError(f"model YAML '{model}' not found; give a path, an Ultralytics name such as yolov8n.yaml "
                             "or a yolo-det example such as cbam-max.yaml")
        resolved = str(found) if is_example(found) else model  # Ultralytics finds its own names (and their scale)
        from .prechecks import check_model_yaml

        check_model_yaml(resolved)  # bounded YAML, every module name known: one line now, not a traceback later
        return resolved
    if path.is_file():
        from ..core.pickle_scan import check_checkpoint
        from ..core.safeload import trust_checkpoints

        if not trust_checkpoints():
            # Read the pickle's opcodes, not the pickle: nothing is unpickled before Ultralytics' own loader
            # (which honours ULTRALYTICS_SAFE_LOAD) does; a file naming os.system & co. is refused here.
            check_checkpoint(path)
        return str(path)
    raise ModelError(
        f"model '{model}' is not a local file; yolo-det does not download weights: pass a model YAML "
        "(e.g. model=yolov8n.yaml) or the path of a local checkpoint"
    )


def resolve_data(data: str) -> str:
    """Return the absolute path of a data YAML or a dataset folder (classification), or the name if Ultralytics
    ships it.

    Raises:
        ConfigError: Neither a file, a folder nor a dataset name Ultralytics knows.
    """
    path = Path(data).expanduser()
    if path.is_dir():  # classification data: a folder with train/ and val/
        return str(path.resolve())
    if path.is_file():
        from .prechecks import check_data

        check_data(str(path))
        return str(path.resolve())
    if path.suffix in {".yaml", ".yml"} and not path.parent.parts:
        from ..core.compat import check_yaml

        try:
            found = check_yaml(data, hard=False)
        except Exception:  # check_yaml may try the network for URLs
            found = None
        if found:
            from .prechecks import check_data

            check_data(data)
            return data
    raise ConfigError(f"data '{data}' does not exist; pass the path of a dataset YAML (data=path/to/data.yaml) or, "
                      "for classification, of a folder with train/ and val/ (data=path/to/images)")
