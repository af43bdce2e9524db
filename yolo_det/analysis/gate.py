"""The one gate: every Ultralytics argument that names a file passes here before Ultralytics reads it.

:data:`PATH_KEYS` lists the arguments through which Ultralytics reads a file, with how each is read;
:data:`NOT_PATHS` lists the other untyped arguments of Ultralytics' ``default.yaml`` and why they read no
file from others (a test keeps both tables complete against the installed Ultralytics). :func:`check_arguments`
classifies each value and decides, in every command (through :func:`yolo_det.tools.prepare.prepare`) and
in the Python API (the guards :func:`yolo_det.attach` puts on ``train/val/predict/export``):

- a checkpoint (``model``, ``pretrained``, ``resume``, ``distill_model``, a tracker's ReID ``model``) must
  load under the allow-list (:func:`yolo_det.core.untrusted.safeload.check_checkpoint`);
- a model YAML must name allowed modules only (:func:`yolo_det.analysis.loader.check_model_file`);
- a ``cfg`` YAML and a tracker YAML are bounded YAML whose own path-valued keys pass the gate too;
- a data YAML (or each YAML at the top of a data folder) may not have a ``download:`` that Ultralytics would
  run (a split it names is missing), nor be an ``.ndjson`` file Ultralytics converts (and downloads)
  elsewhere, unless the user opts in (:func:`downloads_allowed`);
- a resumed checkpoint's run folder: every other checkpoint Ultralytics reads there (``weights/best.pt`` at the
  final evaluation, ``weights/last.pt``) passes the gate before the run starts (:func:`run_folder_reads`);
- a resumed checkpoint's stored arguments may not make the run write outside its run folder: a stored
  ``cache: disk`` (images cached as ``.npy`` files in the dataset) is refused unless the user names ``cache=``
  (:data:`STORED_WRITES`, :func:`check_stored_writes`; YOLOv5's ``opt.yaml`` too); nor read code there: the
  dataset a stored ``data`` names (the user did not name ``data=``, which Ultralytics' resume takes instead) must
  hold every label cache Ultralytics reads (a missing one it writes into the dataset), each one loading without
  running code (Ultralytics unpickles it) (:func:`yolo_det.analysis.datacheck.check_stored_dataset`).

Refusals are :class:`~yolo_det.core.errors.ModelError`/:class:`~yolo_det.core.errors.ConfigError`: one
line, exit 2.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from ..core.errors import ConfigError
from ..core.text import printable, short
from ..core.untrusted import safe_yaml

__all__ = [
    "BOOL_OR_PATH",
    "DOWNLOAD_FLAG",
    "NOT_PATHS",
    "PATH_KEYS",
    "STORED_WRITES",
    "allow_downloads",
    "check_arguments",
    "check_sourced",
    "check_stored_writes",
    "downloads_allowed",
    "path_keys",
    "resumed_checkpoint",
    "run_folder_reads",
]

#: The command-line flag that lets a data YAML's ``download:`` run.
DOWNLOAD_FLAG = "--allow-download"

#: Ultralytics arguments that name a file it reads, and how the gate reads it (a path-valued argument not
#: listed here is read as ``"file"``: by its suffix, a checkpoint or a bounded YAML whose own arguments are gated).
PATH_KEYS: dict[str, str] = {
    "model": "model",
    "pretrained": "checkpoint",
    "resume": "checkpoint",
    "distill_model": "model",
    "cfg": "cfg",
    "data": "data",
    "tracker": "tracker",
}
#: Untyped arguments of Ultralytics' default.yaml that read no file from others, and why.
NOT_PATHS: dict[str, str] = {
    "task": "a task name",
    "mode": "a mode name",
    "time": "a number of hours",
    "device": "a device name",
    "project": "the output folder (written, not read; checked by the pre-checks)",
    "name": "the run's folder name (written, not read)",
    "optimizer": "an optimizer name",
    "freeze": "layer indices or names",
    "channels_last": "a switch",
    "split": "a split name (the data YAML's)",
    "conf": "a number",
    "quantize": "a precision",
    "nms": "a switch",
    "source": "images or videos to predict on: read as pixels, never unpickled or evaluated",
    "classes": "class indices",
    "embed": "layer indices",
    "line_width": "a number",
    "format": "an export format",
    "opset": "a number",
    "workspace": "a number",
    "copy_paste_mode": "a mode name",
    "auto_augment": "a policy name",
}

#: Arguments a resumed run takes from its checkpoint (YOLOv5: its ``opt.yaml``) that would make it write outside
#: its run folder, with the values known to write nothing there: ``cache`` (``disk`` writes a ``.npy`` file per
#: image beside the dataset's images; ``ram`` and no cache write nothing). Any other stored value is refused
#: unless the user names the argument.
STORED_WRITES: dict[str, frozenset[Any]] = {
    "cache": frozenset({None, False, True, "", "ram", "false", "true", "none", "False", "True", "None"}),
}

#: The checkpoints of a run folder that Ultralytics reads when it resumes a run from it, besides the resumed
#: checkpoint: ``best.pt`` at the final evaluation, ``last.pt`` when it strips it.
RUN_FOLDER_READS = ("last.pt", "best.pt")

#: Arguments Ultralytics types as switches but also reads as a path (``isinstance(args.KEY, (str, Path))``).
BOOL_OR_PATH = frozenset({"resume", "pretrained"})

_ALLOW_DOWNLOAD: contextvars.ContextVar[bool] = contextvars.ContextVar("yolo_det_allow_download", default=False)
_CKPT_SUFFIXES = {".pt", ".pth", ".ckpt", ".bin"}


@contextlib.contextmanager
def allow_downloads(allow: bool = True) -> Iterator[None]:
    """While active, a data YAML's ``download:`` may run (the user's opt-in, ``--allow-download``)."""
    token = _ALLOW_DOWNLOAD.set(bool(allow))
    try:
        yield
    finally:
        _ALLOW_DOWNLOAD.reset(token)


def downloads_allowed() -> bool:
    """Whether the user opted in to a data YAML's ``download:`` running."""
    return _ALLOW_DOWNLOAD.get()


def _yaml_mapping(path: Path) -> dict[str, Any]:
    """The mapping a YAML file holds; ``{}`` for one that is unreadable, malformed or not a mapping (nothing there
    for the gate to follow: the pre-checks, or Ultralytics, report it)."""
    try:
        data = safe_yaml.load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def _file(value: Any) -> Path | None:
    if isinstance(value, (str, os.PathLike)) and not isinstance(value, bool):
        p = Path(value).expanduser()
        try:
            return p if p.is_file() else None
        except (OSError, ValueError):
            return None
    return None


def _first_visit(path: Path, seen: set[str]) -> bool:
    try:
        key = str(path.resolve())
    except OSError:
        key = str(path.absolute())
    if key in seen:
        return False
    seen.add(key)
    return True


def _check_checkpoint(value: Any, *, depth: int, seen: set[str], given: set[str], resumed: bool = False) -> None:
    path = _file(value)
    if path is not None and path.suffix.lower() in _CKPT_SUFFIXES:  # what Ultralytics hands to torch.load
        if not _first_visit(path, seen):
            return
        from ..core.untrusted.safeload import check_checkpoint
        from .loader import check_checkpoint_yaml

        check_checkpoint(path)
        check_checkpoint_yaml(path)
        _check_stored(path, depth, seen, given, resumed=resumed)
    if resumed and path is not None:
        for other in run_folder_reads(path):
            _check_checkpoint(other, depth=depth + 1, seen=seen, given=given)


def resumed_checkpoint(args: Mapping[str, Any]) -> Path | None:
    """The checkpoint a training with ``args`` resumes (``resume=PATH``, or ``resume=True`` with ``model=PATH``);
    None when it resumes none, or names no file here."""
    resume = args.get("resume")
    if isinstance(resume, str) and resume.strip().lower() in {"true", "false", ""}:
        resume = resume.strip().lower() == "true"
    if resume is True:
        return _file(args.get("model"))
    if isinstance(resume, (str, os.PathLike)):
        return _file(resume)
    return None


def run_folder_reads(checkpoint: str | os.PathLike[str]) -> list[Path]:
    """The other checkpoints of the run folder holding ``checkpoint`` (``RUN/weights/X.pt``) that a run resumed
    from it reads (:data:`RUN_FOLDER_READS` that are here): they pass the gate before the run starts."""
    weights = Path(checkpoint).expanduser().absolute().parent
    if weights.name != "weights":
        return []
    return [weights / name for name in RUN_FOLDER_READS if (weights / name).is_file()]


def check_stored_writes(stored: Mapping[str, Any], source: str, *, opt_in: str) -> None:
    """Refuse a stored argument that would make a resumed run write outside its run folder (see
    :data:`STORED_WRITES`); the caller has removed the arguments the user gave.

    Args:
        stored: The arguments the file stores (a checkpoint's ``train_args``, a YOLOv5 ``opt.yaml``).
        source: What stored them, for the message.
        opt_in: How the user names the argument instead (ends the message).

    Raises:
        ConfigError: One line naming the argument, its value, where it was stored and how to opt in.
    """
    for key, safe in STORED_WRITES.items():
        value = stored.get(key)
        try:
            known = value in safe
        except TypeError:  # a list or a mapping: not a known value
            known = False
        if not known:
            shown = printable(value, newlines=False)[:80] if isinstance(value, str) else short(value)
            raise ConfigError(
                f"{source} stores {key}={shown}, which makes the resumed run write cached images into "
                f"its dataset, a folder you did not name; {opt_in.format(key=key, value=shown)}"
            )


def _check_model(value: Any, *, depth: int, seen: set[str], given: set[str], resumed: bool = False) -> None:
    if not isinstance(value, (str, os.PathLike)):
        return
    text = str(value)
    if Path(text).suffix.lower() in {".yaml", ".yml"}:
        from ..core.errors import ModelError
        from .loader import check_model_file

        try:
            check_model_file(text)
        except ModelError as e:
            if "not found" not in str(e):  # a missing file reads nothing: the pre-checks name it
                raise
    else:
        _check_checkpoint(value, depth=depth, seen=seen, given=given, resumed=resumed)


def _check_cfg(value: Any, depth: int, seen: set[str]) -> None:
    path = _file(value)
    if path is None or not _first_visit(path, seen):
        return
    check_arguments(_yaml_mapping(path), _depth=depth + 1, _seen=seen)


def _check_tracker(value: Any, *, depth: int, seen: set[str]) -> None:
    path = _file(value)
    if path is None:
        return
    cfg = _yaml_mapping(path)
    for key in ("model", "reid_model"):
        if key in cfg:
            _check_checkpoint(cfg[key], depth=depth, seen=seen, given=set())


def _split_paths(cfg: Mapping[str, Any], base: Path) -> list[Path]:
    root = cfg.get("path")
    root_path = Path(str(root)).expanduser() if isinstance(root, str) and root else base
    if not root_path.is_absolute():
        root_path = base / root_path
    out: list[Path] = []
    for split in ("train", "val", "test", "minival"):
        value = cfg.get(split)
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str) and item:
                p = Path(item).expanduser()
                out.append(p if p.is_absolute() else root_path / p)
    return out


def _check_data_yaml(path: Path) -> None:
    cfg = _yaml_mapping(path)
    script = cfg.get("download")
    if script in (None, "", False) or downloads_allowed():
        return
    missing = [p for p in _split_paths(cfg, path.parent) if not p.exists()]
    if missing or not _split_paths(cfg, path.parent):
        why = f"split '{missing[0]}' is not here" if missing else "it names no split"
        raise ConfigError(
            f"data YAML '{path}' has a 'download:' that Ultralytics would run ({why}); yolo-det never runs it: "
            f"download the dataset yourself, or pass {DOWNLOAD_FLAG} if you trust this file"
        )


def _check_data(value: Any) -> None:
    if isinstance(value, (Mapping, list, tuple)):
        raise ConfigError(
            f"data is a {'mapping' if isinstance(value, Mapping) else 'list'} ({short(value)}), not the "
            "path of a data YAML or folder; pass data=path/to/data.yaml"
        )
    if not isinstance(value, (str, os.PathLike)):
        return
    path = Path(value).expanduser()
    if path.suffix.lower() == ".ndjson" and not downloads_allowed():
        raise ConfigError(
            f"data '{value}' is an NDJSON dataset, which Ultralytics converts by downloading its "
            f"images outside the dataset folder; convert it yourself, or pass {DOWNLOAD_FLAG}"
        )
    if path.is_dir() and not (path / "train").is_dir():  # with its splits here, Ultralytics reads the folder only
        for child in sorted(path.iterdir())[:1000]:
            if child.suffix.lower() in {".yaml", ".yml"} and child.is_file():
                _check_data_yaml(child)
    elif path.is_file() and path.suffix.lower() in {".yaml", ".yml"}:
        _check_data_yaml(path)


@functools.lru_cache(maxsize=1)
def path_keys() -> dict[str, str]:
    """Every Ultralytics argument that may name a file, derived from the installed Ultralytics, with its kind.

    The rule: an argument of Ultralytics' ``default.yaml`` that is neither typed (Ultralytics' float, fraction,
    int and bool key tables), nor a number or switch by its default, nor listed in :data:`NOT_PATHS` holds a
    path; so do :data:`BOOL_OR_PATH`. A new path-valued argument of a later Ultralytics is thus gated, as a
    ``"file"`` (by its suffix), without a change here.
    """
    from ..core.compat import internal

    defaults = internal("DEFAULT_CFG_DICT")
    typed = frozenset().union(
        *(internal(name) for name in ("CFG_FLOAT_KEYS", "CFG_FRACTION_KEYS", "CFG_INT_KEYS", "CFG_BOOL_KEYS"))
    )
    keys = {
        k: PATH_KEYS.get(k, "file")
        for k, v in defaults.items()
        if k not in typed and k not in NOT_PATHS and not isinstance(v, (bool, int, float))
    }
    keys.update({k: PATH_KEYS.get(k, "checkpoint") for k in BOOL_OR_PATH})
    return keys


def _check_file(value: Any, depth: int, seen: set[str]) -> None:
    """A path-valued argument of no known kind: a checkpoint or a bounded YAML, by its suffix."""
    path = _file(value)
    if path is None:
        return
    if path.suffix.lower() in _CKPT_SUFFIXES:
        _check_checkpoint(path, depth=depth, seen=seen, given=set())
    elif path.suffix.lower() in {".yaml", ".yml"}:
        _check_cfg(path, depth, seen)


def _check_stored(path: Path, depth: int, seen: set[str], given: set[str], *, resumed: bool = False) -> None:
    """The path-valued arguments a checkpoint stores (``train_args``): what Ultralytics reads from them on resume,
    fine-tune, val, predict and export, unless the caller gives the argument itself; for a resumed checkpoint,
    also the stored arguments that would make it write outside its run folder (:func:`check_stored_writes`)."""
    from ..core.errors import ModelError, YoloDetError
    from ..core.resume.checkpoint import stored_arguments

    try:
        stored = stored_arguments(path)
    except ModelError:
        return  # refused already by the allow-list above, or trusted: nothing more to read safely
    stored = {k: v for k, v in stored.items() if k not in given}
    if resumed:
        check_stored_writes(
            stored,
            f"checkpoint '{path}'",
            opt_in="name it to resume with it ({key}={value}, or {key}=False to cache nothing)",
        )
        from .datacheck import check_stored_dataset

        check_stored_dataset(stored, f"checkpoint '{path}'")
    try:
        check_arguments(stored, _depth=depth + 1, _seen=seen)
    except YoloDetError as e:
        raise type(e)(f"{e} (named in the train_args stored in checkpoint '{path}')") from None


def check_sourced(args: Mapping[str, Any], source: str, *, kinds: Mapping[str, str] | None = None) -> None:
    """Pass the arguments a file from others stores (``source``: a ``verify --save`` baseline, a YOLOv5
    ``opt.yaml``) through the gate, as if given on the command line; a refusal names ``source``.

    Args:
        args: The stored arguments.
        source: What stored them, for the message ("the verify baseline 'base.json'").
        kinds: Argument name -> kind (see :func:`check_arguments`), for a framework other than Ultralytics.

    Raises:
        ModelError, ConfigError: As :func:`check_arguments`, the message ending with where the path was named.
    """
    from ..core.errors import YoloDetError

    try:
        check_arguments(args, kinds=kinds)
    except YoloDetError as e:
        raise type(e)(f"{e} (named in {source})") from None


def check_arguments(
    args: Mapping[str, Any],
    *,
    kinds: Mapping[str, str] | None = None,
    _depth: int = 0,
    _seen: set[str] | None = None,
) -> None:
    """Pass every path-valued Ultralytics argument in ``args`` through the gate (see the module docstring).

    The arguments are those of :func:`path_keys` (or ``kinds``: name -> ``checkpoint``, ``model``, ``cfg``,
    ``data``, ``tracker``, ``file``, or ``stored``: a checkpoint another framework loads itself, of which only
    the arguments it stores are gated); a checkpoint's own stored arguments pass the gate with it.

    Raises:
        ModelError: A checkpoint or model YAML is refused (one line naming why and the opt-in).
        ConfigError: A cfg, tracker or data file is refused.
    """
    if _depth > 8:
        raise ConfigError("files name other files more than 8 deep (a cfg or checkpoint naming another ...)")
    seen = set() if _seen is None else _seen
    given = {k for k, v in args.items() if v is not None}
    resumed = resumed_checkpoint(args) if kinds is None else None
    for key, kind in (path_keys() if kinds is None else kinds).items():
        value = args.get(key)
        if value is None or isinstance(value, bool):
            continue
        is_resumed = resumed is not None and _file(value) == resumed and key in ("resume", "model")
        if kind == "checkpoint":
            _check_checkpoint(value, depth=_depth, seen=seen, given=given - {key}, resumed=is_resumed)
        elif kind == "model":
            _check_model(value, depth=_depth, seen=seen, given=given - {key}, resumed=is_resumed)
        elif kind == "cfg":
            _check_cfg(value, _depth, seen)
        elif kind == "data":
            _check_data(value)
        elif kind == "tracker":
            _check_tracker(value, depth=_depth, seen=seen)
        elif kind == "stored":  # a checkpoint another framework reads itself: the arguments it stores
            path = _file(value)
            if path is not None and _first_visit(path, seen):
                _check_stored(path, _depth, seen, given - {key})
        else:
            _check_file(value, _depth, seen)
