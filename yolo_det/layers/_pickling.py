"""A yolo-det class that pickles as the class it stands for: a checkpoint saved from a model holding it loads
where yolo-det is not imported (``copy.deepcopy`` keeps the yolo-det class)."""

from __future__ import annotations

import copy
import copyreg
from typing import Any

from torch import nn

__all__ = ["pickles_as"]


def pickles_as(target: type[nn.Module], source: type[nn.Module]) -> None:
    """Make ``target`` instances (a subclass of ``source`` with the same state) pickle as ``source`` and keep
    their class under ``copy.deepcopy``."""

    def __reduce_ex__(self: nn.Module, protocol: Any) -> Any:
        rv = super(target, self).__reduce_ex__(protocol)
        state = rv[2] if isinstance(rv, tuple) and len(rv) > 2 else self.__getstate__()
        # copyreg._reconstructor is the standard library's: loading needs the source's module, not yolo-det
        return (copyreg._reconstructor, (source, object, None), state)  # type: ignore[attr-defined]  # not in the stubs

    def __deepcopy__(self: nn.Module, memo: dict[int, Any]) -> nn.Module:
        new = target.__new__(target)
        memo[id(self)] = new
        for key, value in self.__dict__.items():
            new.__dict__[key] = copy.deepcopy(value, memo)
        return new

    target.__reduce_ex__ = __reduce_ex__  # type: ignore[method-assign,assignment]
    target.__deepcopy__ = __deepcopy__  # type: ignore[attr-defined]
