"""The labels a training is about to read, checked with Ultralytics' own rules before anything is written.

Ultralytics reads a dataset's label files when its trainer builds the data loaders, after the run folder,
``args.yaml`` and yolo-det's record exist. A label file it cannot use (a class id at or above the number of
classes the data YAML names, a wrong column count, coordinates beyond the image, negative values, ...) is
dropped together with its image, with one warning among hundreds of lines, and the run trains on what is
left; a split none of whose images has a label file ends in a traceback. :func:`check_training_data` reads the
data YAML and every label file of the training and validation splits first and refuses, in one line that names
the first offending file and how many there are:

- label files Ultralytics would drop as corrupt (:func:`label_fault`: the label rules of Ultralytics'
  ``verify_image_label``, which a test compares with it on the same files);
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
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from ..core.errors import ConfigError
from ..core.untrusted import safe_yaml

__all__ = ["LABEL_TASKS", "check_stored_dataset", "check_training_data", "label_caches", "label_fault"]

#: The tasks whose datasets hold YOLO label files (one ``.txt`` per image).
LABEL_TASKS = frozenset({"detect", "segment", "pose", "obb"})
_CLASS = "class"  # the kind of fault of a class id at or above the class count


def label_fault(
    text: str, *, classes: int, keypoint: bool = False, nkpt: int = 0, ndim: int = 0, single_cls: bool = False
) -> tuple[str, str] | None:
    """Why Ultralytics would drop a label file with this text as corrupt, or None when it keeps it.

    Args:
        text: The label file's text.
        classes: How many classes the data YAML names.
        keypoint: The labels are pose labels (a pose model).
        nkpt, ndim: The data YAML's ``kpt_shape``.
        single_cls: ``single_cls=True`` (every class id is then read as 0).

    Returns:
        ``(kind, detail)``: kind ``"class"`` for a class id at or above ``classes``, else ``"format"``.
    """
    rows = [x.split() for x in text.strip().splitlines() if x.strip()]
    if nkpt and not keypoint:  # pose labels for a box task: the box is kept
        rows = [x[:5] if len(x) == 5 + nkpt * ndim else x for x in rows]
    if not rows:
        return None  # a background image
    for n, row in enumerate(rows, 1):
        try:
            np.array(row, dtype=np.float32)
        except ValueError:
            return "format", f"row {n} holds something that is not a number"
    polygons = not keypoint and any(len(x) > 6 for x in rows)
    if polygons:
        if any(len(x) == 5 for x in rows):
            return "format", "it mixes polygon rows and box rows"
        if any(len(x) % 2 == 0 for x in rows):
            return "format", "a polygon row has an odd count of coordinates (x y pairs follow the class)"
        from ..core.compat import internal

        ids = np.array([x[0] for x in rows], dtype=np.float32)
        points = [np.array(x[1:], dtype=np.float32).reshape(-1, 2) for x in rows]
        lb = np.concatenate((ids.reshape(-1, 1), internal("ops").segments2boxes(points)), 1)
    else:
        widths = sorted({len(x) for x in rows})
        if len(widths) > 1:
            return "format", f"its rows have {' and '.join(map(str, widths))} columns"
        lb = np.array(rows, dtype=np.float32)
    need = 5 + nkpt * ndim if keypoint else 5
    if lb.shape[1] != need:
        what = f"class, box and {nkpt}x{ndim} keypoint values" if keypoint else "class x y w h"
        return "format", f"{lb.shape[1]} columns where a label has {need} ({what})"
    coords = lb[:, 5:].reshape(-1, ndim)[:, :2] if keypoint else lb[:, 1:]
    if not coords.size or not coords.max() <= 1.01:
        return "format", "coordinates above 1: they must be normalized to the image size (0 to 1)"
    if not (lb.min() >= 0 or (lb.min() >= -0.01 and lb[:, 3:5].min() >= 0)):
        return "format", "negative values"
    if not (lb[:, 0] % 1 == 0).all():
        return "format", "a class id that is not a whole number"
    top = 0 if single_cls else int(lb[:, 0].max())
    if not top < classes:
        return _CLASS, f"class {top}"
    return None


def _class_count(cfg: Mapping[str, Any]) -> int | None:
    names = cfg.get("names")
    if isinstance(names, (list, Mapping)):
        return len(names)
    nc = cfg.get("nc")
    if names is None and isinstance(nc, (int, float)) and not isinstance(nc, bool) and nc == int(nc):
        return int(nc)
    return None


def _root(cfg: Mapping[str, Any], yaml_path: Path) -> Path:
    """The dataset root, as Ultralytics' ``check_det_dataset`` finds it."""
    from ..core.compat import internal

    value = cfg.get("path")
    root = Path(value) if isinstance(value, str) and value else yaml_path.parent
    if not root.exists() and not root.is_absolute():
        root = (Path(internal("DATASETS_DIR")) / root).resolve()
    return root


def _split_paths(value: Any, root: Path) -> list[Path] | None:
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


def _check_split(
    data: str, split: str, images: list[str], *, classes: int, keypoint: bool, nkpt: int, ndim: int, single_cls: bool
) -> None:
    from ..core.compat import internal

    labels = internal("img2label_paths")(images)
    found = 0
    faults: dict[str, int] = {}
    first: tuple[str, str, str] | None = None
    for label in labels:
        try:
            raw = Path(label).read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            continue
        except OSError as e:
            fault: tuple[str, str] | None = ("format", f"unreadable: {e.strerror or e}")
        else:
            found += 1
            try:
                text = raw.decode("utf-8-sig")
            except UnicodeDecodeError:
                fault = ("format", "not UTF-8 text")
            else:
                fault = label_fault(
                    text, classes=classes, keypoint=keypoint, nkpt=nkpt, ndim=ndim, single_cls=single_cls
                )
        if fault is not None:
            faults[fault[0]] = faults.get(fault[0], 0) + 1
            if first is None:
                first = (label, *fault)
    if first is not None:
        file, kind, detail = first
        count, others = faults[kind], sum(faults.values()) - faults[kind]
        more = f" (and {others} more Ultralytics drops for other faults)" if others else ""
        if kind == _CLASS:
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


def check_training_data(args: Mapping[str, Any], *, task: str | None = None) -> None:
    """Refuse a training whose labels Ultralytics would drop or cannot find (see the module docstring).

    Args:
        args: The training's Ultralytics arguments (``data``, ``task``, ``split``, ``fraction``, ``single_cls``,
            ``resume``).
        task: The model's task, when ``args`` does not name one.

    Raises:
        ConfigError: One line naming the first offending file and the count.
    """
    resume = args.get("resume")
    if resume not in (None, False, "", "False", "false"):
        return  # the checkpoint's run checked its data when it began
    data = args.get("data")
    if not isinstance(data, (str, os.PathLike)):
        return
    path = Path(data).expanduser()
    task = str(args.get("task") or task or "detect")
    if task not in LABEL_TASKS or path.suffix.lower() not in {".yaml", ".yml"} or not path.is_file():
        return
    try:
        cfg = safe_yaml.load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return
    if not isinstance(cfg, Mapping) or (classes := _class_count(cfg)) is None:
        return
    kpt = cfg.get("kpt_shape")
    nkpt, ndim = (int(kpt[0]), int(kpt[1])) if isinstance(kpt, list) and len(kpt) == 2 else (0, 0)
    if task == "pose" and not nkpt:
        return
    root = _root(cfg, path)
    val = str(args.get("split") or "val")
    for split in ("train", val):
        value = cfg.get(split) if split != "val" or cfg.get("val") is not None else cfg.get("validation")
        paths = _split_paths(value, root)
        images = _image_files(paths, _fraction(args.get("fraction", 1.0), split)) if paths else None
        if images is None:
            continue
        _check_split(
            str(data),
            split,
            images,
            classes=classes,
            keypoint=task == "pose",
            nkpt=nkpt,
            ndim=ndim,
            single_cls=bool(args.get("single_cls")),
        )


def label_caches(args: Mapping[str, Any], *, task: str | None = None) -> list[Path] | None:
    """The label cache files (``*.cache``) Ultralytics reads, or writes when they are missing, for a training with
    ``args``: one per training and validation split, where its ``get_labels`` puts it (beside the folder of the
    split's first label file). None when the data is not a local data YAML of a label dataset whose splits are
    here (a name Ultralytics ships, a classification folder): the files are not known."""
    from ..core.compat import internal

    data = args.get("data")
    if not isinstance(data, (str, os.PathLike)):
        return None
    path = Path(data).expanduser()
    task = str(args.get("task") or task or "detect")
    if task not in LABEL_TASKS or path.suffix.lower() not in {".yaml", ".yml"} or not path.is_file():
        return None
    try:
        cfg = safe_yaml.load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    if not isinstance(cfg, Mapping):
        return None
    root = _root(cfg, path)
    caches: list[Path] = []
    for split in ("train", str(args.get("split") or "val")):
        value = cfg.get(split) if split != "val" or cfg.get("val") is not None else cfg.get("validation")
        paths = _split_paths(value, root)
        images = _image_files(paths, _fraction(args.get("fraction", 1.0), split)) if paths else None
        if not images:
            return None
        cache = Path(internal("img2label_paths")(images[:1])[0]).parent.with_suffix(".cache")
        if cache not in caches:
            caches.append(cache)
    return caches


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
