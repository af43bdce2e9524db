"""Pre-checks of the data: ``data=`` (a dataset YAML or a classification folder), ``split=`` and ``cfg=``."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from ...core.errors import ConfigError
from ...core.text import short
from ...core.untrusted import safe_yaml
from .values import _text

#: How many entries of an image folder are looked at for one image before the folder is judged empty.
SCAN_LIMIT = 200_000
DATA_SUFFIXES = (".yaml", ".yml")


def _has_images(folder: Path) -> bool:
    """Whether ``folder`` (searched as Ultralytics searches it, recursively) holds an image file of a format the
    installed Ultralytics reads; bounded."""
    from ...core.compat import internal

    formats = internal("IMG_FORMATS")
    seen = 0
    for _, _, files in os.walk(folder):
        for name in files:
            if Path(name).suffix.lower()[1:] in formats:
                return True
        seen += len(files) + 1
        if seen > SCAN_LIMIT:
            return True  # too big to judge here: Ultralytics will
    return False


def check_classify_data(data: str, task: str | None) -> None:
    """Data given as a folder is classification data: a folder with ``train/`` (and ``val/`` or ``test/``)."""
    if task not in (None, "classify"):
        raise ConfigError(
            f"data={short(data)} is a folder, which is classification data, but the model is a {task} "
            "model; pass a dataset YAML (data=path/to/data.yaml)"
        )
    root = Path(data)
    if not (root / "train").is_dir():
        raise ConfigError(
            f"data={short(data)}: a classification folder needs train/ (and val/) holding one folder "
            "per class; none found"
        )


def check_data(data: str, task: str | None = None) -> dict[str, Any] | None:
    """A dataset YAML must name train and val images that exist here (Ultralytics would otherwise
    download it, or run its ``download:`` script; yolo-det never downloads), and suit the model's task.

    Args:
        data: The data YAML (a path, or a name Ultralytics ships such as ``coco8.yaml``).
        task: The model's task when known: a classify model takes a folder, a pose model needs ``kpt_shape``.

    Returns:
        The parsed YAML (read once), or None when Ultralytics does not ship the name (resolve_data judged it).

    Raises:
        ConfigError: The YAML is malformed or beyond bounds, lacks ``train``/``val``, its images are missing, or it
            does not suit the task.
    """
    path = Path(data)
    if path.suffix.lower() not in DATA_SUFFIXES:
        raise ConfigError(
            f"data={short(data)} is not a dataset YAML (.yaml or .yml) or a folder; Ultralytics would "
            "convert other formats by downloading their images: convert it first and pass the YAML"
        )
    if task == "classify":
        raise ConfigError(
            f"data={short(data)} is a dataset YAML but the model is a classify model, which trains on a "
            "folder with train/ and val/ holding one folder per class: pass data=path/to/images"
        )
    if not path.is_file():
        from ...core.compat import check_yaml

        try:
            found = check_yaml(data, hard=False)
        except Exception:  # check_yaml raises on ambiguous names
            found = None
        if not found:
            return None  # resolve_data judged the name
        path = Path(found)
    try:
        text = path.read_text(encoding="utf-8")
        cfg = safe_yaml.load(text)
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read data '{data}': {e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(safe_yaml.error_line(f"data '{data}'", e, fallback="not valid YAML")) from None
    if not isinstance(cfg, Mapping):
        raise ConfigError(f"data '{data}' must be a mapping with train:, val: and names:, got {type(cfg).__name__}")
    val = cfg.get("val") if cfg.get("val") is not None else cfg.get("validation")
    if cfg.get("train") is None or val is None:
        raise ConfigError(f"data '{data}' needs 'train:' and 'val:' image folders")
    if task == "pose" and cfg.get("kpt_shape") is None:
        raise ConfigError(
            f"data '{data}' has no 'kpt_shape:' but the model is a pose model; pass a pose dataset YAML "
            "(with kpt_shape: [keypoints, dims]) or a model of the data's task"
        )
    from ...analysis.datacheck import dataset_root, split_paths

    root_value = cfg.get("path")
    if root_value is not None and not isinstance(root_value, str):
        raise ConfigError(f"data '{data}': 'path:' must be a folder, got {short(root_value)}")
    root = dataset_root(cfg, path)
    for split, value in (("train", cfg["train"]), ("val", val)):
        wheres = split_paths(value, root)
        if wheres is None:
            raise ConfigError(f"image folder {short(value)} must be a path or a list of paths")
        for where in wheres:
            if where.exists():
                if where.is_dir() and not _has_images(where):
                    raise ConfigError(
                        f"data '{data}': the {split} images '{where}' hold no image files; fix "
                        f"'{split}:' or 'path:' in the data YAML"
                    )
                continue
            if cfg.get("download"):
                from ...analysis.gate import DOWNLOAD_FLAG, downloads_allowed

                if downloads_allowed():  # the user opted in: Ultralytics runs the YAML's download:
                    return dict(cfg)
                raise ConfigError(
                    f"dataset '{data}' is not here ({split} images '{where}' missing); Ultralytics would "
                    f"download it but yolo-det does not download datasets unless asked: fetch it yourself, or "
                    f"pass {DOWNLOAD_FLAG} if you trust this file"
                )
            raise ConfigError(
                f"data '{data}': the {split} images '{where}' do not exist; fix '{split}:' or 'path:' in the data YAML"
            )
    return dict(cfg)


def check_split(split: Any, data: Mapping[str, Any] | None) -> None:
    """``split=`` names a split of the data YAML Ultralytics validates on: train, val or test."""
    if split not in ("train", "val", "test"):
        raise ConfigError(f"split={_text(split)} is not a split; use split=val, split=test or split=train")
    if data is not None and split == "test" and data.get("test") is None:
        raise ConfigError("split=test but the data YAML has no 'test:' images; add them or use split=val")


def check_cfg_file(cfg: Any) -> dict[str, Any]:
    """``cfg=`` is an Ultralytics settings YAML (keys of ``default.yaml``); return its values, read once.

    Raises:
        ConfigError: Not a .yaml file, not readable, malformed, beyond bounds, or a key Ultralytics does not know
            (a data YAML given as cfg= is caught here).
    """
    from ...core.compat import DEFAULT_CFG_DICT
    from ...core.errors import did_you_mean

    if not isinstance(cfg, str) or Path(cfg).suffix.lower() not in DATA_SUFFIXES:
        raise ConfigError(
            f"cfg={_text(cfg)} is not a settings YAML (.yaml); give a file like Ultralytics' "
            "default.yaml, or pass the settings as key=value"
        )
    path = Path(cfg).expanduser()
    try:
        values = safe_yaml.load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read cfg={short(cfg)}: {getattr(e, 'strerror', None) or e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(safe_yaml.error_line(f"cfg '{short(cfg)}'", e, fallback="invalid")) from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ConfigError(f"cfg={short(cfg)} must be a mapping of Ultralytics settings, got {type(values).__name__}")
    unknown = [k for k in values if k not in DEFAULT_CFG_DICT]
    if unknown:
        hint = " (it looks like a dataset YAML: pass it as data=)" if {"names", "nc"} & set(values) else ""
        raise ConfigError(
            f"cfg={short(cfg)}: {short(unknown[0])} is not an Ultralytics setting"
            f"{hint or did_you_mean(str(unknown[0]), DEFAULT_CFG_DICT)}"
        )
    return {k: v for k, v in values.items() if k != "cfg"}
