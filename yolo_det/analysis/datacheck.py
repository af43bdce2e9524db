"""The labels a training is about to read, checked with Ultralytics' own rules before anything is written.

Ultralytics reads a dataset's label files when its trainer builds the data loaders, after the run folder,
``args.yaml`` and yolo-det's record exist. A label file it cannot use (a class id at or above the number of
classes the data YAML names, a wrong column count, coordinates beyond the image, negative values, ...) is
dropped together with its image, with one warning among hundreds of lines, and the run trains on what is
left; a split none of whose images has a label file ends in a traceback. :func:`check_training_data` reads the
data YAML and every label file of the training and validation splits first and refuses, in one line that names
the first offending file and how many there are:

- label files Ultralytics would drop as corrupt: each is judged by the installed Ultralytics' own
  ``verify_image_label`` (:func:`yolo_det.core.compat.label_verdict`), so the rules are the release's;
- a split whose images have no label file at all (an image folder without its ``labels/`` folder).

An empty label file, or an image without one, is a background image, valid as Ultralytics has it. The images
are listed as Ultralytics lists them (a folder searched recursively, a ``.txt`` list, its image suffixes,
``fraction=``) and each label file is found by its rule (``img2label_paths``). Images are not decoded. Data the
check cannot read as a detection, segmentation, pose or OBB dataset (classification folders, a name
Ultralytics ships, a missing split, a malformed YAML) is left to the other checks and to Ultralytics.

A resumed run trains on the dataset its checkpoint names unless the user names ``data=``: where Ultralytics keeps
that dataset's label caches (:func:`label_caches`), and that each is there and runs no code when Ultralytics
unpickles it (:func:`check_stored_dataset`, which the gate calls).
"""

from __future__ import annotations

import glob
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from ..core.errors import ConfigError
from ..core.untrusted import safe_yaml

__all__ = ["LABEL_TASKS", "check_stored_dataset", "check_training_data", "dataset_root", "label_caches", "split_paths"]

#: The tasks whose datasets hold YOLO label files (one ``.txt`` per image).
LABEL_TASKS = frozenset({"detect", "segment", "pose", "obb"})


def _class_count(cfg: Mapping[str, Any]) -> int | None:
    names = cfg.get("names")
    if isinstance(names, (list, Mapping)):
        return len(names)
    nc = cfg.get("nc")
    if names is None and isinstance(nc, (int, float)) and not isinstance(nc, bool) and nc == int(nc):
        return int(nc)
    return None


def dataset_root(cfg: Mapping[str, Any], yaml_path: Path) -> Path:
    """The root of the dataset the data YAML ``yaml_path`` (read as ``cfg``) names, as Ultralytics'
    ``check_det_dataset`` finds it."""
    from ..core.compat import internal

    value = cfg.get("path")
    root = Path(value) if isinstance(value, str) and value else yaml_path.parent
    if not root.exists() and not root.is_absolute():
        root = (Path(internal("DATASETS_DIR")) / root).resolve()
    return root


def split_paths(value: Any, root: Path) -> list[Path] | None:
    """The paths a data YAML's split ``value`` names, as ``check_det_dataset`` resolves them (None: not a path or a
    list of paths)."""
    if isinstance(value, str):
        where = (root / value).resolve()
        if not where.exists() and value.startswith("../"):
            where = (root / value[3:]).resolve()
        return [where]
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return [(root / v).resolve() for v in value]
    return None


def _fraction(value: Any, split: str) -> float | int:
    """The share (float) or count (int) of a split's images Ultralytics uses for ``fraction=value``."""
    if isinstance(value, list):
        order = ("train", "val", "test")
        index = order.index(split) if split in order else len(value)
        value = value[index] if index < len(value) else 1.0
    elif split != "train":
        return 1.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value in (0, 1):
        return 1.0
    return value


def _image_files(paths: Sequence[Path], fraction: float | int) -> list[str] | None:
    """The split's images as Ultralytics' ``get_img_files`` lists them (None: a path Ultralytics cannot read)."""
    from ..core.compat import internal

    formats = internal("IMG_FORMATS")
    found: list[str] = []
    for p in paths:
        if p.is_dir():
            found += glob.glob(str(Path(glob.escape(str(p))) / "**" / "*.*"), recursive=True)
        elif p.is_file():
            try:
                lines = p.read_text(encoding="utf-8-sig").strip().splitlines()
            except (OSError, UnicodeDecodeError):
                return None
            parent = str(p.parent) + os.sep
            found += [x.replace("./", parent, 1) if x.startswith("./") else x for x in lines]
        else:
            return None
    files = sorted(x.replace("/", os.sep) for x in found if x.rpartition(".")[-1].lower() in formats)
    count = fraction if isinstance(fraction, int) else max(1, round(len(files) * fraction))
    return files[:count] if count < len(files) else files


def _check_split(data: str, split: str, images: list[str], classes: int, rules: dict[str, Any]) -> None:
    from ..core.compat import internal, label_verdict

    labels = internal("img2label_paths")(images)
    found, dropped = 0, []  # (label file, fault, dropped for a class id alone: kept with any class count)
    for label in labels:
        there, fault = label_verdict(label, classes=classes, **rules)
        found += there
        if fault is not None:
            dropped.append((label, fault, label_verdict(label, classes=math.inf, **rules)[1] is None))
    if dropped:
        file, detail, classy = dropped[0]
        count = sum(d[2] == classy for d in dropped)
        others = len(dropped) - count
        more = f" (and {others} more Ultralytics drops for other faults)" if others else ""
        if classy:
            raise ConfigError(
                f"data '{data}': {count} of {len(images)} {split} label files use a class id at or above nc={classes} "
                f"(the classes 'names:' lists){more}, which Ultralytics drops with their images; the first is "
                f"'{file}' ({detail}): fix the labels or name every class in the data YAML"
            )
        raise ConfigError(
            f"data '{data}': {count} of {len(images)} {split} label files are ones Ultralytics drops with their "
            f"images as corrupt{more}; the first is '{file}' ({detail}): fix or remove the bad rows"
        )
    if images and not found:
        raise ConfigError(
            f"data '{data}': none of the {len(images)} {split} images has a label file (the first would be "
            f"'{labels[0]}'); put the labels in a labels/ folder beside images/, or fix '{split}:' in the data YAML"
        )


def _label_data(args: Mapping[str, Any], task: str | None) -> tuple[str, Mapping[str, Any], dict[str, Any]] | None:
    """``(task, data YAML, {split: its images or None})`` of a training's local data YAML of a label task (the
    training and validation splits), or None when the data is not one."""
    data = args.get("data")
    path = Path(data).expanduser() if isinstance(data, (str, os.PathLike)) else None
    task = str(args.get("task") or task or "detect")
    if path is None or task not in LABEL_TASKS or path.suffix.lower() not in {".yaml", ".yml"} or not path.is_file():
        return None
    try:
        cfg = safe_yaml.load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    if not isinstance(cfg, Mapping):
        return None
    root, splits = dataset_root(cfg, path), {}
    for split in ("train", str(args.get("split") or "val")):
        value = cfg.get(split) if split != "val" or cfg.get("val") is not None else cfg.get("validation")
        paths = split_paths(value, root)
        splits[split] = _image_files(paths, _fraction(args.get("fraction", 1.0), split)) if paths else None
    return task, cfg, splits


def check_training_data(args: Mapping[str, Any], *, task: str | None = None) -> None:
    """Refuse a training whose labels Ultralytics would drop or cannot find (see the module docstring).

    Args:
        args: The training's Ultralytics arguments (``data``, ``task``, ``split``, ``fraction``, ``single_cls``,
            ``resume``).
        task: The model's task, when ``args`` does not name one.

    Raises:
        ConfigError: One line naming the first offending file and the count.
    """
    if args.get("resume") not in (None, False, "", "False", "false"):
        return  # the checkpoint's run checked its data when it began
    found = _label_data(args, task)
    if found is None or (classes := _class_count(found[1])) is None:
        return
    task, cfg, splits = found
    kpt = cfg.get("kpt_shape")
    nkpt, ndim = (int(kpt[0]), int(kpt[1])) if isinstance(kpt, list) and len(kpt) == 2 else (0, 0)
    if task == "pose" and not nkpt:
        return
    rules = {"keypoint": task == "pose", "nkpt": nkpt, "ndim": ndim, "single_cls": bool(args.get("single_cls"))}
    for split, images in splits.items():
        if images is not None:
            _check_split(str(args["data"]), split, images, classes, rules)


def label_caches(args: Mapping[str, Any], *, task: str | None = None) -> list[Path] | None:
    """The label cache files (``*.cache``) Ultralytics reads, or writes when they are missing, for a training with
    ``args``: one per training and validation split, where its ``get_labels`` puts it (beside the folder of the
    split's first label file). None when the data is not a local data YAML of a label dataset whose splits are
    here (a name Ultralytics ships, a classification folder): the files are not known."""
    from ..core.compat import internal

    found = _label_data(args, task)
    if found is None or not all(found[2].values()):
        return None
    caches = [
        Path(internal("img2label_paths")(images[:1])[0]).parent.with_suffix(".cache") for images in found[2].values()
    ]
    return list(dict.fromkeys(caches))


def check_stored_dataset(stored: Mapping[str, Any], source: str) -> None:
    """Refuse a resumed run's stored ``data`` (the user did not name ``data=``) whose dataset lacks a label cache
    Ultralytics reads (it would write one into that folder) or holds one whose loading runs code (Ultralytics
    loads it with ``allow_pickle``): :func:`label_caches`, :func:`yolo_det.core.untrusted.safeload.check_label_cache`.
    The gate calls it for a resumed checkpoint. Data whose caches are not known (a dataset name Ultralytics ships,
    a classification folder) passes.

    Args:
        stored: The arguments the checkpoint stores, without those the user gave.
        source: What stored them, for the message.

    Raises:
        ConfigError: One line naming the cache, the folder and how to resume (``data=``).
    """
    data = stored.get("data")
    if data is None:
        return
    from ..core.errors import ModelError
    from ..core.text import printable
    from ..core.untrusted.safeload import check_label_cache
    from ..core.untrusted.unpickle import RefusedGlobal

    shown = printable(str(data), newlines=False)[:200]
    for cache in label_caches(stored) or []:
        where = printable(str(cache), newlines=False)[:300]
        if not cache.is_file():
            raise ConfigError(
                f"{source} stores data={shown}, whose dataset has no label cache '{where}': resuming would write "
                f"one into that folder, a folder you did not name; name the dataset to resume with it (data={shown})"
            )
        try:
            check_label_cache(cache)
        except ModelError as e:
            why = f"its pickle calls {e.name[:120]}" if isinstance(e, RefusedGlobal) else str(e).split("' ", 1)[-1]
            raise ConfigError(
                f"{source} stores data={shown}, whose label cache '{where}' Ultralytics would unpickle, running "
                f"what it names ({why}); delete that file, or name the dataset if you trust it (data={shown})"
            ) from None
