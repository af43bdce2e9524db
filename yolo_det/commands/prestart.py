"""What a training command sets before torch starts: the instruction-set environment of the profile's ``cpu_isa``.

ATen, oneDNN and MKL read their instruction-set variables once, when torch starts. ``yolo-det train``,
``yolo-det verify`` and ``yolo-det reproduce`` with a profile that has ``cpu_isa`` (``portable``) set them here,
before anything imports torch: when they are missing from the environment, the command runs again in a fresh
process with them (``os.execve``, the same arguments). The new process starts as the console script does, never as
``python -m yolo_det`` (which puts the current folder first on ``sys.path``, so that an ``argparse.py`` in a
received folder would run): ``python -c`` with the current folder taken off ``sys.path`` before anything is
imported, and the very ``yolo_det`` package this process runs loaded by its file (:data:`START`). The environment
is this one plus the profile's fixed table (:data:`~yolo_det.core.machine_settings.ISA_ENV`). A value of the user's
own that the profile replaces (``MKL_CBWR=AUTO``, say) is named in one line, and the run's record keeps it
(``environment.replaced_env``). In a process that already imported torch (a program calling
:func:`yolo_det.cli.main`) nothing can set them any more, and the run is refused in one line naming them.
A machine that cannot run the profile's branch (another architecture, no AVX2) is refused in one line too.
This module imports no torch.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence

from ..core.errors import ConfigError, ProfileError
from ..core.launcher import export_slurm_env
from ..core.machine_settings import ISA_ENV, REPLACED_VAR, cannot_match, missing_env, user_values
from ..core.profiles import PHASES, load_profile

__all__ = ["START", "TRAINING_COMMANDS", "prepare"]

#: The commands that train under ``--profile`` in this process. (``bench`` is not one: it measures several profiles
#: in one process, and the others would be measured under the pinned branches; run ``portable`` there with the
#: variables set, as the one-line refusal says.)
TRAINING_COMMANDS = ("train", "verify", "reproduce")
#: What the re-executed process runs (``python -c START PACKAGE_DIR ARGS``): the current folder off ``sys.path`` (put
#: there by ``-c``, unless ``-P``/``PYTHONSAFEPATH`` already left it off) before any import, then the package at
#: ``PACKAGE_DIR`` loaded by its file, and the command line as the console script runs it.
START = """import sys
if sys.path[:1] == [""] and not getattr(sys.flags, "safe_path", False):
    del sys.path[0]
import importlib.util, os
pkg = sys.argv.pop(1)
init = os.path.join(pkg, "__init__.py")
spec = importlib.util.spec_from_file_location("yolo_det", init, submodule_search_locations=[pkg])
mod = importlib.util.module_from_spec(spec)
sys.modules["yolo_det"] = mod
spec.loader.exec_module(mod)
sys.argv[0] = "yolo-det"
from yolo_det.cli import run_cli
run_cli()
"""


def _profile_args(tokens: Sequence[str]) -> list[str]:
    names: list[str] = []
    for i, arg in enumerate(tokens):
        for flag in ("--profile", "--profiles"):
            if arg == flag and i + 1 < len(tokens):
                names.extend(tokens[i + 1].split(",") if flag == "--profiles" else [tokens[i + 1]])
            elif arg.startswith(flag + "="):
                value = arg.split("=", 1)[1]
                names.extend(value.split(",") if flag == "--profiles" else [value])
    return [n for n in names if n]


def prepare(command: str | None, tokens: Sequence[str], *, reexec: bool) -> None:
    """Put the profile's pre-start environment in place for ``command`` (see the module docstring).

    Args:
        command: The command named in ``tokens`` (None: nothing to do).
        tokens: The command line after ``yolo-det``.
        reexec: Whether this process may replace itself (the console entry point; not an in-process call).

    Raises:
        ConfigError: The machine cannot run the profile's ``cpu_isa``, or torch is already imported without it.
    """
    if command not in TRAINING_COMMANDS:
        return
    export_slurm_env()  # SLURM's tasks under torchrun's names, before Ultralytics reads RANK at import
    isas: dict[str, str] = {}  # cpu_isa -> the profile asking for it
    for name in _profile_args(tokens):
        try:
            profile = load_profile(name)
        except ProfileError:
            continue  # the command itself reports it, with its usual message
        for phase in PHASES:
            value = profile.phase(phase).extra.get("cpu_isa")
            if value is not None:
                isas.setdefault(str(value), profile.name)
    if not isas:
        return
    if len(isas) > 1:
        raise ConfigError(
            f"the profiles ask for cpu_isa {' and '.join(sorted(isas))}; one process has one; run them separately"
        )
    isa, profile_name = isas.popitem()
    problem = cannot_match(isa)
    if problem:
        raise ConfigError(f"profile '{profile_name}' cannot reproduce its weights on this machine: {problem}")
    missing = missing_env(isa)
    if not missing:
        return
    if "torch" in sys.modules or not reexec:
        needed = " ".join(f"{k}={v}" for k, v in ISA_ENV[isa].items())
        raise ConfigError(
            f"profile '{profile_name}' needs {needed} before torch starts, and torch is already imported here; "
            f"start the process with them"
        )
    env = {**os.environ, **missing}
    env.pop(REPLACED_VAR, None)  # only this start's replacements are handed on
    yours = user_values(isa)
    if yours:
        print(
            f"yolo-det: profile '{profile_name}' replaces your "
            + ", ".join(f"{k}={v}" for k, v in yours.items())
            + " with "
            + ", ".join(f"{k}={missing[k]}" for k in yours)
            + " (yours are kept in determinism.json, environment.replaced_env)",
            file=sys.stderr,
        )
        env[REPLACED_VAR] = json.dumps(yours)
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.execve(sys.executable, [sys.executable, "-c", START, package, *tokens], env)  # noqa: S606 - the same command
