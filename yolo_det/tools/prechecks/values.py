"""Pre-checks of single values: ``seed=``, ``device=`` and ``optimizer=``."""

from __future__ import annotations

import ast
import inspect
import re
from typing import Any

from ...core.errors import ConfigError
from ...core.text import short

SEED_LIMIT = 2**32  # numpy's legacy seeding (Ultralytics' init_seeds) takes [0, 2**32)


def _text(value: Any) -> str:
    return str(value)[:60] if isinstance(value, (str, int)) else short(value)


def check_seed(seed: Any) -> None:
    """``seed=`` must be an integer numpy can seed with (``init_seeds`` seeds numpy with it)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < SEED_LIMIT:
        raise ConfigError(
            f"seed={short(seed)} is out of range: give an integer from 0 to {SEED_LIMIT - 1} "
            "(numpy's seeding takes no more)"
        )


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


_DEVICE_HINT = "use cpu, mps, cuda, a CUDA index (0) or a list of them (0,1)"
_CUDA_FORM = re.compile(r"^(?:cuda:)?\d+(?:,(?:cuda:)?\d+)*$")


def _device_form(device: Any) -> None:
    """``device=`` must be one of the forms Ultralytics trains on (allow-list): cpu, mps, cuda, cuda:N, N, N,M, -1."""
    if device is None:
        return
    if isinstance(device, bool) or isinstance(device, float):
        raise ConfigError(f"device={_text(device)} is not a device; {_DEVICE_HINT}")
    if isinstance(device, int):
        if device < -1:
            raise ConfigError(f"device={device} is not a device; {_DEVICE_HINT}")
        return
    if isinstance(device, (list, tuple)):
        if not device or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in device):
            raise ConfigError(f"device={_text(device)} is not a list of CUDA indices; {_DEVICE_HINT}")
        indices = list(device)
    elif isinstance(device, str):
        text = device.strip().lower().replace(" ", "")
        if text in {"", "cpu", "mps", "mps:0", "cuda", "-1"}:
            return
        text = text.strip("[]()")
        if not _CUDA_FORM.match(text):
            raise ConfigError(f"device={_text(device)} is not a device yolo-det trains on; {_DEVICE_HINT}")
        indices = [int(p.replace("cuda:", "")) for p in text.split(",")]
    else:
        raise ConfigError(f"device={_text(device)} is not a device; {_DEVICE_HINT}")
    twice = sorted({i for i in indices if indices.count(i) > 1})
    if twice:
        raise ConfigError(f"device={_text(device)} names CUDA device {twice[0]} twice; list each device once")


def check_device(device: Any) -> None:
    """``device=`` must be a form Ultralytics trains on, and CUDA needs a CUDA device here (Ultralytics'
    ``select_device`` raises otherwise)."""
    _device_form(device)
    import torch

    if isinstance(device, str) and device.strip().lower().startswith("mps") and not torch.backends.mps.is_available():
        raise ConfigError(f"device={_text(device)} asks for Apple's MPS but it is not available here; use device=cpu")
    indices = _cuda_indices(device)
    if indices is None:
        return

    if not torch.cuda.is_available():
        raise ConfigError(
            f"device={_text(device)} asks for a CUDA device but there is no CUDA device here "
            "(torch.cuda.is_available() is False); use device=cpu"
        )
    count = torch.cuda.device_count()
    missing = [i for i in indices if i >= count]
    if missing:
        raise ConfigError(
            f"device={_text(device)} names CUDA device {missing[0]} but this machine has {count} "
            f"(0 to {count - 1}); use device=0 or device=cpu"
        )


def optimizer_names() -> tuple[str, ...]:
    """The optimizer names the installed Ultralytics accepts (read from its trainer, without running it); empty when
    its trainer no longer lists them where this reads (then Ultralytics alone judges ``optimizer=``)."""
    from ...core.compat import BaseTrainer

    try:
        source = inspect.getsource(BaseTrainer.build_optimizer)
    except (OSError, TypeError):  # no source shipped
        return ()
    m = re.search(r"optimizers\s*=\s*(\{[^}]*\})", source)
    try:
        names = ast.literal_eval(m.group(1)) if m else None
    except (ValueError, SyntaxError):
        return ()
    if isinstance(names, set) and names and all(isinstance(n, str) for n in names):
        return tuple(sorted(names, key=str.lower))
    return ()


def check_optimizer(name: Any) -> None:
    """``optimizer=`` must be one Ultralytics builds (case-insensitive, as Ultralytics matches it)."""
    from ...core.errors import did_you_mean

    names = optimizer_names()
    if names and str(name).lower() not in {n.lower() for n in names}:
        raise ConfigError(
            f"optimizer={_text(name)} is not an optimizer Ultralytics builds; choose from "
            f"{', '.join(names)}.{did_you_mean(str(name)[:100], names)}"
        )
