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

from ..core import safe_yaml
from ..core.errors import ConfigError, ModelError
from ..core.safe_yaml import short

__all__ = ["check_data", "check_device", "check_model_yaml", "check_optimizer", "check_run_folder", "check_seed",
           "check_train_args", "optimizer_names"]

SEED_LIMIT = 2**32  # numpy's legacy seeding (Ultralytics' init_seeds) takes [0, 2**32)
_FALLBACK_OPTIMIZERS = ("Adam", "Adamax", "AdamW", "NAdam", "RAdam", "RMSprop", "SGD", "auto")


def _text(value: Any) -> str:
    return str(value)[:60] if isinstance(value, (str, int)) else short(value)


def check_seed(seed: Any) -> None:
    """``seed=`` must be an integer numpy can seed with (``init_seeds`` seeds numpy with it)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < SEED_LIMIT:
        raise ConfigError(f"seed={short(seed)} is out of range: give an integer from 0 to {SEED_LIMIT - 1} "
                          "(numpy's seeding takes no more)")


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


def check_device(device: Any) -> None:
    """``device=`` asking for CUDA needs a CUDA device here (Ultralytics' ``select_device`` raises otherwise)."""
    indices = _cuda_indices(device)
    if indices is None:
        return
    import torch

    if not torch.cuda.is_available():
        raise ConfigError(f"device={_text(device)} asks for a CUDA device but there is no CUDA device here "
                          "(torch.cuda.is_available() is False); use device=cpu")
    count = torch.cuda.device_count()
    missing = [i for i in indices if i >= count]
    if missing:
        raise ConfigError(f"device={_text(device)} names CUDA device {missing[0]} but this machine has {count} "
                          f"(0 to {count - 1}); use device=0 or device=cpu")


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
        raise ConfigError(f"optimizer={_text(name)} is not an optimizer Ultralytics builds; choose from "
                          f"{', '.join(names)}.{did_you_mean(str(name)[:100], names)}")


def _folder_name(key: str, value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ConfigError(f"{key}={short(value)} is not a folder name; give a name such as {key}=exp")
    text = str(value)
    if not text.strip() or "\0" in text:
        raise ConfigError(f"{key}= must be a non-empty folder name without NUL characters")
    return text


def check_run_folder(args: dict[str, Any]) -> None:
    """``project=`` and ``name=`` must name a folder that can be created and written (normalised to strings)."""
    for key in ("project", "name"):
        if args.get(key) is not None:
            args[key] = _folder_name(key, args[key])
    project = args.get("project")
    if project is None:
        return
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


def _images(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return list(value)
    raise ConfigError(f"image folder {short(value)} must be a path or a list of paths")


def check_data(data: str) -> None:
    """A detection dataset YAML must name train and val images that exist here (Ultralytics would otherwise
    download it, or run its ``download:`` script); yolo-det never downloads.

    Args:
        data: The data YAML (a path, or a name Ultralytics ships such as ``coco8.yaml``).

    Raises:
        ConfigError: The YAML is malformed or beyond bounds, lacks ``train``/``val``, or its images are missing.
    """
    path = Path(data)
    if not path.is_file():
        from ..core.compat import check_yaml

        try:
            found = check_yaml(data, hard=False)
        except Exception:  # check_yaml raises on ambiguous names
            found = None
        if not found:
            return  # resolve_data judged the name
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
                continue
            if cfg.get("download"):
                raise ConfigError(f"dataset '{data}' is not here ({split} images '{where}' missing); Ultralytics would "
                                  "download it but yolo-det does not download datasets: fetch it yourself or pass "
                                  "a local data YAML")
            raise ConfigError(f"data '{data}': the {split} images '{where}' do not exist; fix '{split}:' or 'path:' "
                              "in the data YAML")


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


def check_train_args(args: dict[str, Any], *, device: bool = True) -> dict[str, Any]:
    """Run every pre-check on resolved train arguments (see the module docstring); return them normalised.

    Args:
        args: The arguments.
        device: Also check ``device=`` (a command with its own rules on devices checks it after them).
    """
    if "seed" in args:
        check_seed(args["seed"])
    if device and "device" in args:
        check_device(args["device"])
    if args.get("optimizer") is not None:
        check_optimizer(args["optimizer"])
    check_run_folder(args)
    return args
