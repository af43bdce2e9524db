"""Model-build errors that name the layer: index, module, ``from`` and YAML line."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from ...core.errors import ModelError
from . import channels
from .channels import ATTRIBUTE
from .rows import _one_line, _tasks, _where


def _frames(tb: TracebackType | None) -> Iterator[Any]:
    while tb is not None:
        yield tb.tb_frame
        tb = tb.tb_next


def build_error(e: BaseException, d: Mapping[str, Any] | None = None) -> str | None:
    """One line naming the layer ``e`` was raised in while a model was built, or None when no layer is known.

    The layer is read from the traceback: the row ``parse_model`` was building, or the layer the model's
    forward pass was running (Ultralytics' first forward, which finds the strides).
    """
    tasks = _tasks()
    wrapper = channels._parse_model.__code__  # read now: the wrapper's state lives in its module
    codes = {getattr(f, "__code__", None) for f in (tasks.parse_model, channels._original)} - {None, wrapper}
    found: tuple[int, Any, str] | None = None
    for frame in _frames(e.__traceback__):
        local = frame.f_locals
        if frame.f_code in codes and isinstance(local.get("i"), int):
            m = local.get("m")
            name = getattr(m, "__name__", None) or str(m)
            found = (local["i"], local.get("f"), name)
        elif frame.f_code.co_name == "_predict_once":
            m = local.get("m")
            if isinstance(getattr(m, "i", None), int):
                found = (m.i, getattr(m, "f", None), str(getattr(m, "type", type(m).__name__)).rsplit(".", 1)[-1])
    if found is None:
        return None
    index, source, name = found
    cfg: Mapping[str, Any] = d or {}
    hint = ""
    if isinstance(source, list) and isinstance(e, TypeError) and "list indices" in str(e):
        hint = (
            f"; {name} takes {len(source)} inputs and Ultralytics cannot tell its output channels: declare them "
            f"({ATTRIBUTE} = staticmethod(lambda c_in, *args: (c_out, args)) or yolo_det.declare_block)"
        )
    elif isinstance(e, RuntimeError) and ("shape" in str(e) or "channels" in str(e)):
        hint = "; check the channel arguments of this layer (or the channel rule it declares)"
    return f"{_where(cfg, index, name, source)}: {type(e).__name__}: {_one_line(e)}{hint}"


@contextlib.contextmanager
def naming_build_errors(model_yaml: str | Path | None = None) -> Iterator[None]:
    """Turn an exception raised while a model is built into a one-line :class:`ModelError` naming the layer
    (:func:`build_error`); an exception with no layer to name passes through unchanged.

    Args:
        model_yaml: The model YAML being built (for its line numbers), when there is one.
    """
    from ...core.errors import YoloDetError

    try:
        yield
    except YoloDetError:
        raise
    except Exception as e:
        named = build_error(e, {"yaml_file": str(model_yaml)} if model_yaml else None)
        if named is None:
            raise
        raise ModelError(f"the model does not build: {named}") from None
