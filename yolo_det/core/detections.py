"""Comparing detection tables (rows ``x1 y1 x2 y2 score class``, in score order), shared by the deploy checks."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["VERDICTS", "compare_detections", "worst"]

#: Verdicts from best to worst.
VERDICTS = ("bitwise", "within tolerance", "differs")
#: How many changed rows are listed per comparison.
LISTED = 10


def worst(verdicts: Any) -> str:
    """The worst of ``verdicts`` (``bitwise`` when there are none)."""
    verdicts = list(verdicts)
    return max(verdicts, key=VERDICTS.index) if verdicts else "bitwise"


def compare_detections(ref: torch.Tensor, got: torch.Tensor, *, atol: float) -> dict[str, Any]:
    """Compare two detection tables.

    Returns:
        ``verdict`` (``bitwise``: equal bit for bit; ``within tolerance``: same count and classes, boxes and scores
        within ``atol``; else ``differs``), ``count`` (reference, compared), ``max_box_diff`` and ``max_score_diff``
        over the rows both have (in order), ``classes_equal``, and ``changed``: the indices of the rows that differ
        (at most 10; rows only one side has count as changed).
    """
    n = min(len(ref), len(got))
    a, b = ref[:n].double(), got[:n].double()
    box = (a[:, :4] - b[:, :4]).abs().amax(1) if n else torch.zeros(0, dtype=torch.float64)
    score = (a[:, 4] - b[:, 4]).abs() if n else torch.zeros(0, dtype=torch.float64)
    classes_equal = bool(torch.equal(a[:, 5], b[:, 5]))
    row_changed = (box > 0) | (score > 0) | (a[:, 5] != b[:, 5])
    changed = [int(i) for i in torch.nonzero(row_changed).flatten()[:LISTED]]
    changed += list(range(n, max(len(ref), len(got))))[: max(0, LISTED - len(changed))]
    max_box = float(box.max()) if n else 0.0
    max_score = float(score.max()) if n else 0.0
    if len(ref) == len(got) and torch.equal(ref, got):
        verdict = "bitwise"
    elif len(ref) == len(got) and classes_equal and max_box <= atol and max_score <= atol:
        verdict = "within tolerance"
    else:
        verdict = "differs"
    return {
        "verdict": verdict,
        "count": [len(ref), len(got)],
        "max_box_diff": max_box,
        "max_score_diff": max_score,
        "classes_equal": classes_equal,
        "changed": changed,
    }
