"""What the bench measures: the settings toggled one at a time, and their bases."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...core.constants import DEFAULT_BENCH_PROFILES as DEFAULT_PROFILES
from ...core.profiles import PhaseSettings

__all__ = ["BASES", "DEFAULT_PROFILES", "ISOLATIONS", "Isolation"]

SCHEMA = "yolo-det/bench/1"
POOL_BATCHES = 4  # input batches loaded once and cycled through by every configuration
RESERVED = {
    "resume": "the bench trains from the model as given",
    "time": "the bench decides how many steps to run (use --steps)",
}

_OFF = PhaseSettings(
    deterministic_algorithms="off",
    cudnn_benchmark=False,
    cudnn_deterministic=False,
    allow_tf32=False,
    fill_uninitialized_memory=False,
    backward="keep",
    swaps="none",
    intercept=False,
)
#: The bases settings are toggled from: everything off, and deterministic algorithms (strict) alone.
BASES: dict[str, PhaseSettings] = {"off": _OFF, "strict": _OFF.replace(deterministic_algorithms="strict")}


@dataclass(frozen=True)
class Isolation:
    """One setting measured on its own: ``base`` against ``base`` with ``changes``.

    Attributes:
        setting: The :class:`~yolo_det.core.profiles.PhaseSettings` field.
        base: A key of :data:`BASES`.
        changes: The fields changed from the base.
        devices: Device types where the setting can change anything (None: all).
        needs_scope: A setting applied by a registered scope (``swaps``, ``intercept``); measured only when a
            scope handles it.
    """

    setting: str
    base: str
    changes: Mapping[str, Any]
    devices: tuple[str, ...] | None = None
    needs_scope: str | None = None

    @property
    def label(self) -> str:
        return ", ".join(f"{k}={_fmt_value(v)}" for k, v in self.changes.items())


def _fmt_value(v: Any) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


ISOLATIONS: tuple[Isolation, ...] = (
    Isolation("deterministic_algorithms", "off", {"deterministic_algorithms": "strict"}),
    Isolation("cudnn_deterministic", "off", {"cudnn_deterministic": True}, devices=("cuda",)),
    Isolation("cudnn_benchmark", "off", {"cudnn_benchmark": True}, devices=("cuda",)),
    # TF32 is a CUDA tensor-core format: on a CPU the toggle has nothing to change, and a "cost" there is noise
    Isolation("allow_tf32", "off", {"allow_tf32": True}, devices=("cuda",)),
    Isolation("fill_uninitialized_memory", "strict", {"fill_uninitialized_memory": True}),
    Isolation("backward", "strict", {"backward": "disable"}),
    Isolation("swaps", "strict", {"swaps": "auto"}, needs_scope="swaps"),
    Isolation("intercept", "strict", {"intercept": True}, needs_scope="intercept"),
)
