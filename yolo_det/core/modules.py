"""Small facts about ``nn.Module`` objects that every layer needs (no torch import of its own)."""

from __future__ import annotations

from typing import Any

__all__ = ["unwrap_model"]


def unwrap_model(model: Any) -> Any:
    """The module inside DDP/DataParallel/``torch.compile`` wrappers (``model`` itself when unwrapped)."""
    while True:
        inner = getattr(model, "_orig_mod", None) or getattr(model, "module", None)
        if inner is None or inner is model:
            return model
        model = inner
