"""Comparing two export records (``<export>.determinism.json``, written after ``export()`` under yolo-det).

:func:`compare_export_records` lists every difference that matters for a deployed model, most decisive
first: the export's digest and format, the source weights, the deploy settings in force, the parity
measured (verdict, cause, raw differences, preprocessing mismatches), then the versions. ``yolo-det
check-deploy --compare A B`` prints it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...core.errors import ConfigError

__all__ = ["RecordComparison", "compare_export_records", "compare_record_files", "read_export_record"]

#: The largest export record read (a record is a few kilobytes; anything far larger is not one).
MAX_RECORD_BYTES = 16 * 1024 * 1024

#: (group, dotted key) compared, most decisive first.
_KEYS = (
    ("export", "export.sha256"),
    ("export", "export.format"),
    ("weights", "weights.sha256"),
    ("weights", "weights.state_sha256"),
    ("profile", "profile.name"),
    ("parity", "parity.verdict"),
    ("parity", "parity.cause"),
    ("parity", "parity.numerics.raw_max_abs_diff"),
    ("parity", "parity.numerics.raw_mean_abs_diff"),
    ("parity", "parity.numerics.detections"),
    ("parity", "parity.preprocessing.mismatches"),
    ("parity", "parity.preprocessing.export.imgsz"),
    ("parity", "parity.preprocessing.export.dynamic"),
    ("parity", "error"),
)


def _get(record: Any, dotted: str) -> Any:
    value = record
    for part in dotted.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


@dataclass
class RecordComparison:
    """The differences between two export records: ``(group, key, a, b)`` rows."""

    a: str
    b: str
    differences: list[tuple[str, str, Any, Any]] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        """``same``, ``same weights, other export``, or ``other weights``."""
        keys = {key for _, key, _, _ in self.differences}
        if not self.differences:
            return "same"
        if keys & {"weights.sha256", "weights.state_sha256"}:
            return "other weights"
        if "export.sha256" in keys:
            return "same weights, other export"
        return "same export, other settings or measurements"

    @property
    def exit_code(self) -> int:
        """0 when the records are the same, 1 otherwise."""
        return 0 if self.verdict == "same" else 1

    def to_dict(self) -> dict[str, Any]:
        """The comparison as plain values."""
        return {
            "a": self.a,
            "b": self.b,
            "verdict": self.verdict,
            "differences": [{"group": g, "key": k, "a": va, "b": vb} for g, k, va, vb in self.differences],
        }

    def summary(self) -> str:
        """One line per difference, then the verdict."""
        lines = [f"export records: {self.a} vs {self.b}"]
        lines += [f"  {group:<9} {key}: {_short(va)} -> {_short(vb)}" for group, key, va, vb in self.differences]
        lines.append(f"verdict: {self.verdict}")
        return "\n".join(lines)


def _short(value: Any) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else value
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text if len(text) <= 100 else text[:97] + "..."


def compare_export_records(
    a: dict[str, Any], b: dict[str, Any], *, names: tuple[str, str] = ("A", "B")
) -> RecordComparison:
    """Compare two export records (as read from JSON): digests, weights, deploy settings, parity, versions."""
    out = RecordComparison(*names)
    for group, key in _KEYS:
        va, vb = _get(a, key), _get(b, key)
        if va != vb:
            out.differences.append((group, key, va, vb))
    da, db = a.get("deploy_settings") or {}, b.get("deploy_settings") or {}
    for key in sorted(set(da) | set(db)):
        if da.get(key) != db.get(key):
            out.differences.append(("deploy", f"deploy_settings.{key}", da.get(key), db.get(key)))
    ea, eb = a.get("environment") or {}, b.get("environment") or {}
    for key in sorted(set(ea) | set(eb)):
        if ea.get(key) != eb.get(key):
            out.differences.append(("versions", f"environment.{key}", ea.get(key), eb.get(key)))
    return out


def read_export_record(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read an export record; a file that is not one is a one-line :class:`ConfigError`."""
    p = Path(path).expanduser()
    if p.is_dir() or not p.name.endswith(".determinism.json"):
        raise ConfigError(
            f"'{path}' is not an export record: give the <export>.determinism.json written beside an exported model"
        )
    try:
        if p.stat().st_size > MAX_RECORD_BYTES:
            raise ConfigError(f"'{path}' is too large to be an export record")
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"export record '{path}' not found") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"cannot read export record '{path}': {type(e).__name__}") from None
    if not isinstance(data, dict) or data.get("kind") != "export":
        raise ConfigError(
            f'\'{path}\' is not an export record (no "kind": "export"); a training run\'s '
            "determinism.json is compared with `yolo-det diff`"
        )
    return data


def compare_record_files(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> RecordComparison:
    """:func:`compare_export_records` of two record files."""
    return compare_export_records(read_export_record(a), read_export_record(b), names=(str(a), str(b)))
