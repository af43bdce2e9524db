"""The schema check of a ``verify --save`` file: every field has the type ``crossverify.save_run`` writes.

A saved file comes from elsewhere (another machine, another user): :func:`check_saved_schema` names the first
field that is not what this yolo-det writes, in one line, before anything reads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...core.errors import ConfigError

__all__ = ["check_saved_schema", "not_usable"]


def not_usable(path: Any, what: str) -> ConfigError:
    """The one-line error for a saved file that cannot be used, saying ``what`` is wrong with it."""
    return ConfigError(f"'{path}' is not a usable verify --save file: {what}")


_DEVICE_TYPES = ("cpu", "cuda", "mps", "xpu", "npu", "")
_MAX_TEXT = 4096


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_text(v: Any) -> bool:
    return isinstance(v, str) and len(v) <= _MAX_TEXT


def _texts(v: Any) -> bool:
    return isinstance(v, list) and all(_is_text(x) for x in v)


def check_saved_schema(data: Mapping[str, Any], path: Any) -> None:
    """Every field of a saved file has the type :func:`save_run` writes; the first one that does not is named."""

    def need(ok: bool, where: str, what: str) -> None:
        if not ok:
            raise not_usable(path, f"'{where}' must be {what}")

    for key in ("created", "profile", "device"):
        need(data.get(key) is None or _is_text(data[key]), key, "a string")
    need(data.get("args") is None or isinstance(data["args"], Mapping), "args", "a mapping")
    need(data.get("steps_requested") is None or _is_int(data["steps_requested"]), "steps_requested", "an integer")
    need(data.get("record") is None or isinstance(data["record"], Mapping), "record", "a mapping (determinism.json)")
    run = data["run"]
    need(_texts(run["param_names"]), "run.param_names", "a list of strings")
    need(run.get("loss_names") is None or _texts(run["loss_names"]), "run.loss_names", "a list of strings")
    weights = run.get("weights")
    need(
        weights is None
        or (isinstance(weights, Mapping) and all(_is_text(k) and _is_text(v) for k, v in weights.items())),
        "run.weights",
        "a mapping of names to digests",
    )
    need(
        run.get("optimizer_steps") is None or (_is_int(run["optimizer_steps"]) and run["optimizer_steps"] >= 0),
        "run.optimizer_steps",
        "a non-negative integer",
    )
    need(
        run.get("device_type") in _DEVICE_TYPES or run.get("device_type") is None,
        "run.device_type",
        f"one of {', '.join(repr(t) for t in _DEVICE_TYPES[:-1])}",
    )
    n_params = len(run["param_names"])
    for i, step in enumerate(run["steps"], start=1):
        at = f"run.steps[{i - 1}]"
        need(isinstance(step, Mapping), at, "a mapping")
        for key in ("step", "epoch"):
            need(step.get(key) is None or _is_int(step[key]), f"{at}.{key}", "an integer")
        need(step.get("scale") is None or _is_num(step["scale"]), f"{at}.scale", "a number")
        need(step.get("weights") is None or _is_text(step["weights"]), f"{at}.weights", "a digest (string)")
        need(
            _texts(step.get("grads")) and len(step["grads"]) == n_params,
            f"{at}.grads",
            f"a list of {n_params} digests (one per parameter)",
        )
        need(isinstance(step.get("batches"), list), f"{at}.batches", "a list")
        for j, b in enumerate(step["batches"]):
            bat = f"{at}.batches[{j}]"
            need(isinstance(b, Mapping), bat, "a mapping")
            for key in ("index", "epoch"):
                need(b.get(key) is None or _is_int(b[key]), f"{bat}.{key}", "an integer")
            need(_is_text(b.get("data")), f"{bat}.data", "a digest (string)")
            need(b.get("raw") is None or _is_text(b["raw"]), f"{bat}.raw", "a digest (string)")
            need(b.get("files") is None or _texts(b["files"]), f"{bat}.files", "a list of paths")
            need(
                b.get("loss") is None or (isinstance(b["loss"], list) and all(_is_num(x) for x in b["loss"])),
                f"{bat}.loss",
                "a list of numbers",
            )
