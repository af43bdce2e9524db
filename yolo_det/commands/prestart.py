"""What a training command sets before torch starts: the instruction-set environment of the profile's ``cpu_isa``.

ATen, oneDNN and MKL read their instruction-set variables once, when torch starts. ``yolo-det train`` and
``yolo-det verify`` with a profile that has ``cpu_isa`` (``portable``) set them here, before anything imports
torch: when they are missing from the environment, the command runs again in a fresh process with them
(``os.execve``, the same arguments). In a process that already imported torch (a program calling
:func:`yolo_det.cli.main`) nothing can set them any more, and the run is refused in one line naming them.
A machine that cannot run the profile's branch (another architecture, no AVX2) is refused in one line too.
This module imports no torch.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from ..core.errors import ConfigError, ProfileError
from ..core.machine_settings import ISA_ENV, cannot_match, missing_env
from ..core.profiles import PHASES, load_profile

__all__ = ["TRAINING_COMMANDS", "prepare"]

#: The commands that train under ``--profile`` in this process.
TRAINING_COMMANDS = ("train", "verify")


def _profile_arg(tokens: Sequence[str]) -> str | None:
    for i, arg in enumerate(tokens):
        if arg == "--profile" and i + 1 < len(tokens):
            return tokens[i + 1]
        if arg.startswith("--profile="):
            return arg.split("=", 1)[1]
    return None


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
    name = _profile_arg(tokens)
    if name is None:
        return
    try:
        profile = load_profile(name)
    except ProfileError:
        return  # the command itself reports it, with its usual message
    isas = {str(v) for v in (profile.phase(p).extra.get("cpu_isa") for p in PHASES) if v is not None}
    if not isas:
        return
    if len(isas) > 1:
        raise ConfigError(
            f"profile '{profile.name}' asks for cpu_isa {' and '.join(sorted(isas))}; one process has one; choose one"
        )
    isa = str(isas.pop())
    problem = cannot_match(isa)
    if problem:
        raise ConfigError(f"profile '{profile.name}' cannot reproduce its weights on this machine: {problem}")
    missing = missing_env(isa)
    if not missing:
        return
    if "torch" in sys.modules or not reexec:
        needed = " ".join(f"{k}={v}" for k, v in ISA_ENV[isa].items())
        raise ConfigError(
            f"profile '{profile.name}' needs {needed} before torch starts, and torch is already imported here; "
            f"start the process with them"
        )
    env = {**os.environ, **missing}
    os.execve(sys.executable, [sys.executable, "-m", "yolo_det", *tokens], env)  # noqa: S606 - the same command
