"""Why two runs' data streams differ, from the records' ``data_stream`` sections (no torch import).

:func:`explain_data_stream` compares two sections (see
:func:`yolo_det.integrations.ultralytics.data.data_stream_section`) and returns the reasons the batches could
differ, the most likely first: the data mode, the worker count without invariance, the seed, the dataset
bytes, the augmentation arguments, and last the fingerprint of the first batches itself. A worker count
that differs while both runs were worker-invariant is listed as a difference that cannot change the data.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["StreamReason", "explain_data_stream", "neutral_args"]

_KEYED = "keyed"
_MISSING = "(not recorded)"


@dataclass(frozen=True)
class StreamReason:
    """One reason two data streams could differ (or, ``changes_data`` False, a difference that cannot).

    Attributes:
        name: What differs (``data stream: workers``).
        a, b: The two values.
        changes_data: Whether this difference can change the batches the runs trained on.
        note: Why, in one sentence.
    """

    name: str
    a: Any
    b: Any
    changes_data: bool
    note: str


def _short(value: Any) -> Any:
    return value[:12] if isinstance(value, str) else value


def _section(value: Any) -> Mapping[str, Any] | None:
    return value if isinstance(value, Mapping) else None


def explain_data_stream(a: Any, b: Any) -> list[StreamReason]:
    """The reasons the data streams of two runs could differ (empty when their sections agree).

    Args:
        a, b: The ``data_stream`` sections of two records (None or anything else: not recorded).
    """
    sa, sb = _section(a), _section(b)
    if sa is None and sb is None:
        return []
    if sa is None or sb is None:
        return [
            StreamReason(
                "data stream",
                "recorded" if sa else _MISSING,
                "recorded" if sb else _MISSING,
                True,
                "only one record says what its data depended on (the other is from an older yolo-det)",
            )
        ]
    out: list[StreamReason] = []
    keyed = sa.get("mode") == _KEYED and sb.get("mode") == _KEYED
    if sa.get("mode") != sb.get("mode"):
        out.append(
            StreamReason(
                "data stream: mode",
                sa.get("mode"),
                sb.get("mode"),
                True,
                "one run keyed every augmentation draw to (seed, epoch, sample), the other drew "
                "them from each worker's history (data_invariance)",
            )
        )
    if sa.get("workers") != sb.get("workers"):
        if keyed:
            out.append(
                StreamReason(
                    "data stream: workers",
                    sa.get("workers"),
                    sb.get("workers"),
                    False,
                    "both runs were worker-invariant: the worker count cannot change the batches",
                )
            )
        else:
            out.append(
                StreamReason(
                    "data stream: workers",
                    sa.get("workers"),
                    sb.get("workers"),
                    True,
                    "without data_invariance the mosaic partners and augmentation seeds depend on "
                    "the worker count (Ultralytics and YOLOv5 lower workers= to the CPU count; Ultralytics "
                    "to 0 on a CPU)",
                )
            )
    if sa.get("seed") != sb.get("seed"):
        out.append(
            StreamReason(
                "data stream: seed",
                sa.get("seed"),
                sb.get("seed"),
                True,
                "the shuffle order and every augmentation draw follow the seed",
            )
        )
    if sa.get("dataset") != sb.get("dataset"):
        out.append(
            StreamReason(
                "data stream: dataset",
                _short(sa.get("dataset")),
                _short(sb.get("dataset")),
                True,
                "the dataset's bytes (images, labels or image list) differ",
            )
        )
    aug_a, aug_b = sa.get("augment") or {}, sb.get("augment") or {}
    for key in sorted(set(aug_a) | set(aug_b)):
        if aug_a.get(key, _MISSING) != aug_b.get(key, _MISSING):
            out.append(
                StreamReason(
                    f"data stream: {key}=",
                    aug_a.get(key, _MISSING),
                    aug_b.get(key, _MISSING),
                    True,
                    "an augmentation argument",
                )
            )
    fa, fb = sa.get("fingerprint"), sb.get("fingerprint")
    comparable = (
        fa
        and fb
        and sa.get("fingerprint_epoch") == sb.get("fingerprint_epoch")
        and sa.get("fingerprint_batches") == sb.get("fingerprint_batches")
    )
    if comparable and fa != fb:
        causes = [r.name.removeprefix("data stream: ") for r in out if r.changes_data]
        out.append(
            StreamReason(
                "data stream: first batches",
                _short(fa),
                _short(fb),
                True,
                f"the runs trained on different inputs from the first batch on"
                f"{' (' + ', '.join(causes) + ')' if causes else ''}",
            )
        )
    elif comparable and out:
        out.append(
            StreamReason(
                "data stream: first batches", _short(fa), _short(fb), False, "the first batches' inputs are identical"
            )
        )
    return out


def neutral_args(a: Any, b: Any) -> frozenset[str]:
    """Arguments whose difference cannot change the data, given both sections (``workers`` when both runs were
    worker-invariant)."""
    sa, sb = _section(a), _section(b)
    if sa is not None and sb is not None and sa.get("mode") == _KEYED and sb.get("mode") == _KEYED:
        return frozenset({"workers"})
    return frozenset()
