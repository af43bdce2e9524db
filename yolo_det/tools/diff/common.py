"""Reading fields of a record for the comparison, and the collector of differences every topic adds to."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .report import Difference

#: Ultralytics arguments that only name or decorate outputs (never change the trained weights).
OUTPUT_ARGS = frozenset(
    {
        "project",
        "name",
        "save_dir",
        "exist_ok",
        "verbose",
        "plots",
        "save",
        "save_period",
        "save_json",
        "save_txt",
        "save_conf",
        "save_crop",
        "save_frames",
        "show",
        "show_labels",
        "show_conf",
        "show_boxes",
        "line_width",
        "visualize",
        "vid_stride",
        "stream_buffer",
        "embed",
        "source",
        "format",
        "keras",
        "optimize",
        "int8",
        "dynamic",
        "simplify",
        "opset",
        "workspace",
        "nms",
        "mode",
    }
)
_MISSING = "(not recorded)"


def _get(record: Mapping[str, Any], *keys: str) -> Any:
    value: Any = record
    for k in keys:
        if not isinstance(value, Mapping) or k not in value:
            return _MISSING
        value = value[k]
    return value


class _Collector:
    def __init__(self) -> None:
        self.items: list[Difference] = []
        self.notes: list[str] = []
        self.compared: dict[str, int] = {}  # group -> settings both records hold, compared

    def add(
        self,
        group: str,
        name: str,
        a: Any,
        b: Any,
        *,
        changes_bits: bool = True,
        note: str | None = None,
        held: bool | None = None,
    ) -> bool:
        """Compare one setting (``held``: whether both records hold it, when a default stands in for a missing
        value); a difference is kept, and a setting both hold counts as compared."""
        if held if held is not None else all(v is not None and v != _MISSING for v in (a, b)):
            self.compared[group] = self.compared.get(group, 0) + 1
        if _canon(a) == _canon(b):
            return False
        self.items.append(Difference(group, name, a, b, changes_bits, note))
        return True


def _canon(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


_MARKERS = {"data": "splits", "model": "kind"}  # a key only the fingerprint has (YOLOv5 records hold another "model")


def _fingerprint(record: Mapping[str, Any], key: str) -> Mapping[str, Any] | None:
    value = record.get(key)
    if isinstance(value, Mapping) and "error" not in value and _MARKERS[key] in value:
        return value
    return None


def _why_missing(record: Mapping[str, Any], key: str, label: str) -> str:
    value = record.get(key)
    if isinstance(value, Mapping) and "error" in value:
        return f"record {label} has no {key} fingerprint ({value['error']})"
    return f"record {label} has no {key} fingerprint (written by an older yolo-det, or by the YOLOv5 integration)"


def _short_hash(h: Any) -> Any:
    return h[:12] if isinstance(h, str) else h


def _args(record: Mapping[str, Any]) -> Mapping[str, Any]:
    args = record.get("ultralytics_args")
    if isinstance(args, Mapping) and "error" not in args:
        return args
    run = record.get("run")
    return run if isinstance(run, Mapping) else {}


def _trained_on_cpu(record: Mapping[str, Any]) -> bool:
    device = _args(record).get("device")
    if str(device).strip().lower() in {"cpu", "mps"}:
        return True
    return device in (None, "") and not _get(record, "environment", "cuda_available")


def _sharded(ra: Mapping[str, Any], rb: Mapping[str, Any]) -> int | None:
    """``K`` when both runs trained under the same ``shards: K`` (their weights do not depend on the ranks)."""
    ka, kb = _get(ra, "profile", "train", "shards"), _get(rb, "profile", "train", "shards")
    return int(ka) if isinstance(ka, int) and not isinstance(ka, bool) and ka > 0 and ka == kb else None
