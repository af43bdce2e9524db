"""Putting a comparison together: every topic, the lineage, the weights and the status of both runs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ...core.errors import ConfigError
from .common import _MISSING, _Collector
from .lineage import _effective, _lineage, _progress, _resumed_after
from .load import load_record
from .ranks import _ranks
from .report import GROUPS, DiffReport
from .sources import _sources
from .topics import _arguments, _data, _data_stream, _environment, _model, _profile, _seeds, _swaps_and_warnings


def diff_records(record_a: Mapping[str, Any], record_b: Mapping[str, Any], *, a: str = "A", b: str = "B") -> DiffReport:
    """Compare two records (see :mod:`yolo_det.tools.diff`).

    Args:
        record_a, record_b: Parsed ``determinism.json`` contents.
        a, b: Names for the two (their paths), shown in the report.
    """
    c = _Collector()
    full_a, full_b = record_a, record_b
    record_a, record_b = _effective(record_a), _effective(record_b)
    _data(c, record_a, record_b)
    _model(c, record_a, record_b)
    _seeds(c, record_a, record_b)
    _ranks(c, record_a, record_b)
    _profile(c, record_a, record_b)
    _lineage(c, full_a, full_b)
    _arguments(c, record_a, record_b)
    _environment(c, record_a, record_b)
    _sources(c, record_a, record_b)
    _swaps_and_warnings(c, record_a, record_b)
    _data_stream(c, record_a.get("data_stream"), record_b.get("data_stream"))
    order = {g: i for i, g in enumerate(GROUPS)}
    items = sorted(c.items, key=lambda d: order[d.group])  # stable: the order of addition within a group
    report = DiffReport(a=a, b=b, differences=items, notes=c.notes, compared=dict(c.compared))
    for key, rec in (("a", record_a), ("b", record_b)):
        found = rec.get("weights")
        weights = found if isinstance(found, Mapping) else {}
        report.weights[key] = weights.get("sha256")
        report.ema[key] = weights.get("ema_fp32_sha256")
        report.status[key] = rec.get("status", _MISSING)
        report.warnings[key] = len(rec.get("nondeterminism_warnings") or [])
        report.progress[key] = _progress(rec)
    report.resumed = {k: _resumed_after(r) for k, r in (("a", full_a), ("b", full_b)) if _resumed_after(r)}
    return report


def diff_paths(paths: Sequence[str | Path]) -> DiffReport:
    """Load two records (run folders or files) and compare them."""
    if len(paths) != 2:
        raise ConfigError(f"diff compares two runs, got {len(paths)}")
    (ra, pa), (rb, pb) = load_record(paths[0]), load_record(paths[1])
    return diff_records(ra, rb, a=pa, b=pb)
