"""The exception hierarchy of yolo-det.

Every error a user can cause (a bad profile, a bad ``key=value``, a model that does not build, a tree
that is not YOLOv5) is a :class:`YoloDetError`. Its message is one line that says what was wrong and
what to do; the CLI prints it and exits with code 2.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class YoloDetError(Exception):
    """Base class of the errors yolo-det raises for bad input or an unusable environment."""

    exit_code: int = 2


class ProfileError(YoloDetError):
    """A determinism profile could not be found, parsed or validated."""


class ConfigError(YoloDetError):
    """A command-line argument or ``key=value`` override is invalid."""


class ModelError(YoloDetError):
    """A model (YAML, checkpoint or factory) could not be loaded or built."""


class PatchError(YoloDetError):
    """A YOLOv5 tree could not be patched."""


class RunFailed(YoloDetError):
    """A run that started could not go on because of its surroundings (a full disk, a read-only run folder):
    one line saying where its record is (or why it could not be written), exit code 1."""

    exit_code = 1


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """Return ``" Did you mean 'x'?"`` for the closest match of ``word`` in ``choices``, or ``""``."""
    match = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" Did you mean '{match[0]}'?" if match else ""
