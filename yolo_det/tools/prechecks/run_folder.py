"""Pre-checks of the run folder: ``project=`` and ``name=`` name a folder that can be created and written."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...core.errors import ConfigError
from ...core.text import short

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
    from ...core.text import printable

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

    from ...core.compat import run_folder

    ns = SimpleNamespace(
        project=args.get("project"),
        name=args.get("name"),
        task=task or "detect",
        mode="train",
        exist_ok=bool(args.get("exist_ok", False)),
    )
    return run_folder(ns)


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
