"""Pre-checks of Ultralytics train arguments: values Ultralytics would reject (or act on) only after the run began.

Each check judges a value as Ultralytics itself would when it reaches it (``init_seeds``, ``select_device``,
``build_optimizer``, ``check_det_dataset``, the run folder, ``parse_model``), but before anything is
built, downloaded or written, and says in one line what was wrong and what to do.
"""

from __future__ import annotations

import ast
import inspect
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from ..core.errors import ConfigError, ModelError
from ..core.untrusted import safe_yaml
from ..core.untrusted.safe_yaml import short

__all__ = [
    "check_data",
    "check_device",
    "check_model_yaml",
    "check_optimizer",
    "check_run_folder",
    "check_seed",
    "check_train_args",
    "optimizer_names",
    "check_cfg_file",
    "check_checkpoint_model",
    "check_classify_data",
    "check_split",
    "run_dir",
]

SEED_LIMIT = 2**32  # numpy's legacy seeding (Ultralytics' init_seeds) takes [0, 2**32)
_FALLBACK_OPTIMIZERS = ("Adam", "Adamax", "AdamW", "NAdam", "RAdam", "RMSprop", "SGD", "auto")


def _text(value: Any) -> str:
    return str(value)[:60] if isinstance(value, (str, int)) else short(value)


def check_seed(seed: Any) -> None:
    """``seed=`` must be an integer numpy can seed with (``init_seeds`` seeds numpy with it)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < SEED_LIMIT:
        raise ConfigError(
            f"seed={short(seed)} is out of range: give an integer from 0 to {SEED_LIMIT - 1} "
            "(numpy's seeding takes no more)"
        )


def _cuda_indices(device: Any) -> list[int] | None:
    """The CUDA device indices ``device`` asks for (empty list: any/the first), or None when it asks for no CUDA."""
    if device is None or isinstance(device, bool):
        return None
    if isinstance(device, int):
        return [device] if device >= 0 else []
    if isinstance(device, (list, tuple)):
        return [d for d in device if isinstance(d, int)] if device and all(isinstance(d, int) for d in device) else None
    text = str(device).strip().lower().replace(" ", "")
    if text in {"", "cpu", "mps", "none", "-1"} or text.startswith(("mps", "npu", "xpu")):
        return None
    text = text.strip("[]()")
    if text == "cuda":
        return []
    text = text.replace("cuda:", "")
    parts = [p for p in text.split(",") if p]
    if parts and all(p.isdigit() for p in parts):
        return [int(p) for p in parts]
    return None


_DEVICE_HINT = "use cpu, mps, cuda, a CUDA index (0) or a list of them (0,1)"
_CUDA_FORM = re.compile(r"^(?:cuda:)?\d+(?:,(?:cuda:)?\d+)*$")


def _device_form(device: Any) -> None:
    """``device=`` must be one of the forms Ultralytics trains on (allow-list): cpu, mps, cuda, cuda:N, N, N,M, -1."""
    if device is None:
        return
    if isinstance(device, bool) or isinstance(device, float):
        raise ConfigError(f"device={_text(device)} is not a device; {_DEVICE_HINT}")
    if isinstance(device, int):
        if device < -1:
            raise ConfigError(f"device={device} is not a device; {_DEVICE_HINT}")
        return
    if isinstance(device, (list, tuple)):
        if not device or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in device):
            raise ConfigError(f"device={_text(device)} is not a list of CUDA indices; {_DEVICE_HINT}")
        indices = list(device)
    elif isinstance(device, str):
        text = device.strip().lower().replace(" ", "")
        if text in {"", "cpu", "mps", "mps:0", "cuda", "-1"}:
            return
        text = text.strip("[]()")
        if not _CUDA_FORM.match(text):
            raise ConfigError(f"device={_text(device)} is not a device yolo-det trains on; {_DEVICE_HINT}")
        indices = [int(p.replace("cuda:", "")) for p in text.split(",")]
    else:
        raise ConfigError(f"device={_text(device)} is not a device; {_DEVICE_HINT}")
    twice = sorted({i for i in indices if indices.count(i) > 1})
    if twice:
        raise ConfigError(f"device={_text(device)} names CUDA device {twice[0]} twice; list each device once")


def check_device(device: Any) -> None:
    """``device=`` must be a form Ultralytics trains on, and CUDA needs a CUDA device here (Ultralytics'
    ``select_device`` raises otherwise)."""
    _device_form(device)
    import torch

    if isinstance(device, str) and device.strip().lower().startswith("mps") and not torch.backends.mps.is_available():
        raise ConfigError(f"device={_text(device)} asks for Apple's MPS but it is not available here; use device=cpu")
    indices = _cuda_indices(device)
    if indices is None:
        return

    if not torch.cuda.is_available():
        raise ConfigError(
            f"device={_text(device)} asks for a CUDA device but there is no CUDA device here "
            "(torch.cuda.is_available() is False); use device=cpu"
        )
    count = torch.cuda.device_count()
    missing = [i for i in indices if i >= count]
    if missing:
        raise ConfigError(
            f"device={_text(device)} names CUDA device {missing[0]} but this machine has {count} "
            f"(0 to {count - 1}); use device=0 or device=cpu"
        )


def optimizer_names() -> tuple[str, ...]:
    """The optimizer names the installed Ultralytics accepts (read from its trainer, without running it)."""
    try:
        from ..core.compat import BaseTrainer

        source = inspect.getsource(BaseTrainer.build_optimizer)
        m = re.search(r"optimizers\s*=\s*(\{[^}]*\})", source)
        names = ast.literal_eval(m.group(1)) if m else None
        if isinstance(names, set) and names and all(isinstance(n, str) for n in names):
            return tuple(sorted(names, key=str.lower))
    except Exception:  # a changed Ultralytics falls back to the known list
        pass
    return _FALLBACK_OPTIMIZERS


def check_optimizer(name: Any) -> None:
    """``optimizer=`` must be one Ultralytics builds (case-insensitive, as Ultralytics matches it)."""
    from ..core.errors import did_you_mean

    names = optimizer_names()
    if str(name).lower() not in {n.lower() for n in names}:
        raise ConfigError(
            f"optimizer={_text(name)} is not an optimizer Ultralytics builds; choose from "
            f"{', '.join(names)}.{did_you_mean(str(name)[:100], names)}"
        )


#: Longest file name and path the run folder may have (Linux's NAME_MAX and PATH_MAX); the run folder's own
#: files (weights/last.pt, ...) and Ultralytics' ``-N`` suffix must still fit.
NAME_MAX = 255
PATH_MAX = 4096
_RUN_FILES = len("/weights/best.pt.yolo-det-partial") + 1


def _folder_name(key: str, value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ConfigError(f"{key}={short(value)} is not a folder name; give a name such as {key}=exp")
    text = str(value)
    if not text.strip() or "\0" in text:
        raise ConfigError(f"{key}= must be a non-empty folder name without NUL characters")
    from ..core.text import printable

    if printable(text) != text or "\n" in text:
        raise ConfigError(
            f"{key}={printable(text, newlines=False)[:80]} holds control characters; give a folder "
            "name of printable characters"
        )
    return text


def _check_name(name: str) -> None:
    """``name=`` is one folder name inside ``project=``: no separators, no ``.``/``..``, not too long."""
    if "/" in name or "\\" in name or os.sep in name or name in {".", ".."}:
        raise ConfigError(
            f"name={short(name)} is not a folder name (it holds a path); the run folder is "
            "project/name: put the folders in project= (project=/abs/runs name=exp)"
        )
    if len(name.encode("utf-8", "surrogateescape")) > NAME_MAX - 6:
        raise ConfigError(
            f"name= is {len(name)} characters long; a folder name takes at most {NAME_MAX - 6} "
            "(room for Ultralytics' -N suffix): give a shorter name"
        )


def _check_project(project: str) -> None:
    """``project=``: no part longer than a folder name may be, the whole within a path's length, and a relative
    project stays inside the runs folder (no ``..``)."""
    if len(project.encode("utf-8", "surrogateescape")) > PATH_MAX - NAME_MAX - _RUN_FILES:
        raise ConfigError(
            f"project= is {len(project)} characters long; a path takes at most "
            f"{PATH_MAX - NAME_MAX - _RUN_FILES} here: give a shorter folder"
        )
    path = Path(project).expanduser()
    for part in path.parts:
        if len(part.encode("utf-8", "surrogateescape")) > NAME_MAX:
            raise ConfigError(
                f"project= has a folder name of {len(part)} characters ({short(part)}); a folder "
                f"name takes at most {NAME_MAX}: give a shorter one"
            )
    if not path.is_absolute() and ".." in path.parts:
        raise ConfigError(
            f"project={short(project)} climbs out of the runs folder with '..'; a relative project= "
            "is a folder under the runs folder: give an absolute project= to write elsewhere"
        )


def run_dir(args: Mapping[str, Any], task: str | None) -> Path:
    """The run folder Ultralytics will create for ``args`` (``project/name``, ``-N`` added when it exists),
    computed as Ultralytics computes it, without creating anything."""
    from types import SimpleNamespace

    from ..core.compat import get_save_dir

    ns = SimpleNamespace(
        project=args.get("project"),
        name=args.get("name"),
        task=task or "detect",
        mode="train",
        exist_ok=bool(args.get("exist_ok", False)),
    )
    return Path(get_save_dir(ns))


def _probe_writable(folder: Path, key: str, value: str) -> None:
    """Create and remove an empty folder in ``folder``: the only true test that runs can be written there
    (``os.access`` says yes to root on read-only mounts and on /proc)."""
    import tempfile

    try:
        probe = tempfile.mkdtemp(prefix=".yolo-det-probe-", dir=folder)
    except OSError as e:
        raise ConfigError(
            f"{key}={short(value)}: cannot create the run folder in '{folder}' "
            f"({e.strerror or type(e).__name__}); give a folder you can write to"
        ) from None
    os.rmdir(probe)


def check_run_folder(args: dict[str, Any], task: str | None = None) -> None:
    """``project=`` and ``name=`` must name a folder that can be created and written (normalised to strings).

    ``name=`` is one folder name (no path), so the run stays inside ``project=``; a relative ``project=`` stays
    inside Ultralytics' runs folder. Lengths are checked before any folder exists, and the nearest existing
    folder is probed by creating and removing an empty folder.
    """
    for key in ("project", "name"):
        if args.get(key) is not None:
            args[key] = _folder_name(key, args[key])
    if args.get("name") is not None:
        _check_name(args["name"])
    if args.get("project") is not None:
        _check_project(args["project"])
    project = args.get("project")
    if project is not None:
        path = Path(project).expanduser()
        probe = path
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        if probe.exists() and not probe.is_dir():
            what = "is not a folder" if probe == path else f"is under '{probe}', which is not a folder"
            raise ConfigError(f"project={project} {what}; give a folder for the runs (e.g. project=runs)")
        if not os.access(probe, os.W_OK | os.X_OK):
            raise ConfigError(f"project={project}: '{probe}' is not writable; give a folder you can write to")
        name = args.get("name")
        if name is not None and path.is_dir():
            run = path / name
            if run.exists() and not run.is_dir():
                raise ConfigError(f"name={name}: '{run}' exists and is not a folder; choose another name")
    try:
        where = run_dir(args, task)
    except Exception:  # a changed Ultralytics: the checks above stand
        return
    if len(str(where)) + _RUN_FILES > PATH_MAX:
        raise ConfigError(
            f"the run folder '{short(str(where))}' would be {len(str(where))} characters long; "
            "give a shorter project= or name="
        )
    probe = where
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise ConfigError(
            f"the run folder '{where}' would be under '{probe}', which is not a folder; give another project= or name="
        )
    if project is not None:  # the place the user named; Ultralytics' own runs folder is its settings' business
        _probe_writable(probe, "project", str(project))


def _images(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return list(value)
    raise ConfigError(f"image folder {short(value)} must be a path or a list of paths")


#: How many entries of an image folder are looked at for one image before the folder is judged empty.
SCAN_LIMIT = 200_000
_IMAGE_SUFFIXES = {
    ".bmp",
    ".dng",
    ".jpeg",
    ".jpg",
    ".mpo",
    ".png",
    ".tif",
    ".tiff",
    ".webp",
    ".pfm",
    ".heic",
    ".avif",
    ".jp2",
}
DATA_SUFFIXES = (".yaml", ".yml")


def _has_images(folder: Path) -> bool:
    """Whether ``folder`` (searched as Ultralytics searches it, recursively) holds an image file; bounded."""
    seen = 0
    for _, _, files in os.walk(folder):
        for name in files:
            if Path(name).suffix.lower() in _IMAGE_SUFFIXES:
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
        from ..core.compat import check_yaml

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
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or "not valid YAML"
        raise ConfigError(f"data '{data}'{line}: malformed YAML: {problem}") from None
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
    from ..core.compat import DATASETS_DIR

    root_value = cfg.get("path")
    if root_value is not None and not isinstance(root_value, str):
        raise ConfigError(f"data '{data}': 'path:' must be a folder, got {short(root_value)}")
    root = Path(root_value or path.parent)
    if not root.exists() and not root.is_absolute():
        root = (Path(DATASETS_DIR) / root).resolve()
    for split, value in (("train", cfg["train"]), ("val", val)):
        for item in _images(value):
            where = (root / item).resolve()
            if not where.exists() and item.startswith("../"):
                where = (root / item[3:]).resolve()
            if where.exists():
                if where.is_dir() and not _has_images(where):
                    raise ConfigError(
                        f"data '{data}': the {split} images '{where}' hold no image files; fix "
                        f"'{split}:' or 'path:' in the data YAML"
                    )
                continue
            if cfg.get("download"):
                raise ConfigError(
                    f"dataset '{data}' is not here ({split} images '{where}' missing); Ultralytics would "
                    "download it but yolo-det does not download datasets: fetch it yourself or pass "
                    "a local data YAML"
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
    from ..core.compat import DEFAULT_CFG_DICT
    from ..core.errors import did_you_mean

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
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise ConfigError(
            f"cfg '{short(cfg)}'{line}: malformed YAML: {getattr(e, 'problem', None) or 'invalid'}"
        ) from None
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


_TASK_OF_CLASS = {
    "DetectionModel": "detect",
    "SegmentationModel": "segment",
    "PoseModel": "pose",
    "ClassificationModel": "classify",
    "OBBModel": "obb",
    "WorldModel": "detect",
    "YOLOEModel": "detect",
    "YOLOESegModel": "segment",
    "RTDETRDetectionModel": "detect",
}


def check_checkpoint_model(path: str, names: list[str]) -> str | None:
    """A ``model=FILE.pt`` must hold a model for Ultralytics to train from, judged from the ``module.name`` globals
    its pickle references (:func:`yolo_det.core.untrusted.safeload.checkpoint_globals`: nothing imported or run).

    Returns:
        The model's task when an Ultralytics model class tells it (``DetectionModel`` -> detect, ...), else None.

    Raises:
        ModelError: The pickle references no model class (a state dict, ``{"epoch": 3}``, a bare tensor).
    """
    tasks = {
        _TASK_OF_CLASS[n.rsplit(".", 1)[1]]
        for n in names
        if n.startswith("ultralytics.") and n.rsplit(".", 1)[1] in _TASK_OF_CLASS
    }
    modules = [n for n in names if n.startswith(("torch.nn.modules.", "ultralytics.nn.")) or n.endswith("Model")]
    if not tasks and not modules:
        raise ModelError(
            f"'{path}' holds no model Ultralytics can train from (its pickle names no model class: a "
            "state dict or other data); pass a checkpoint saved by Ultralytics, or a model YAML"
        )
    return tasks.pop() if len(tasks) == 1 else None


def check_model_yaml(model: str) -> None:
    """A model YAML must be within YAML bounds and name only modules Ultralytics (with yolo-det's layers) resolves.

    Raises:
        ModelError: Not found, malformed, beyond bounds, or a module name is unknown (file, line, close match).
    """
    from ..analysis.loader import _read_yaml, check_yaml_modules
    from ..analysis.models import model_names, resolve_model_yaml
    from ..core.compat import tasks

    path = resolve_model_yaml(model)
    if path is None:
        raise ModelError(f"model YAML '{model}' not found; give a path or an Ultralytics name such as yolov8n.yaml")
    text, cfg = _read_yaml(path)
    with model_names():
        check_yaml_modules(cfg, text, str(path), vars(tasks))


def check_train_args(args: dict[str, Any], *, device: bool = True, task: str | None = None) -> dict[str, Any]:
    """Run every pre-check on resolved train arguments (see the module docstring); return them normalised.

    Args:
        args: The arguments.
        device: Also check ``device=`` (a command with its own rules on devices checks it after them).
        task: The model's task when known (where Ultralytics puts the run folder).
    """
    if "seed" in args:
        check_seed(args["seed"])
    if device and "device" in args:
        check_device(args["device"])
    if args.get("optimizer") is not None:
        check_optimizer(args["optimizer"])
    check_run_folder(args, task)
    return args
