"""Comparing detection tables (rows ``x1 y1 x2 y2 score class``, in score order), shared by the deploy checks.

Two tables are compared the way a user reads them, not row by row: a row of one table *matches* a row of the
other of the same class whose box and score are within tolerance, wherever it stands (near-tied scores may
come out of NMS in another order). A row left without a match is a *near tie* when a difference within the
tolerance explains it:

- its score is within the tolerance of the confidence threshold (a tiny change decides whether it is kept), or
- NMS kept it on one side and its near-tied twin on the other. This needs evidence that both sides' NMS started
  from the same candidates: the boxes above the threshold before NMS (``ref_candidates``, ``got_candidates``)
  pair up one to one within tolerance. Then a row is a near tie when the other side holds a row of the same
  class that overlaps it above the IoU threshold and scores no lower than it (within the tolerance), and that
  row is its twin (scores within the tolerance) or itself a near tie (NMS chains: a box the winner suppressed).
  Without such evidence (candidates not known, or other candidates: another input) no row is a tie of NMS.

Known candidates that differ (another input) excuse nothing: then the tables must match row for row.

One tolerance rule holds boxes and raw outputs alike (:func:`tolerances`): a value may move ``atol`` plus
:data:`BOX_RTOL` of its size (a box corner at 600 px moves further in float32 than one at 6 px); a score
``atol``. A row whose box another row of another class holds is a class flip, named as such (never as the
distance to the next box in order).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["BOX_RTOL", "VERDICTS", "candidates", "compare_detections", "compare_raw", "tolerances", "worst"]

#: Verdicts from best to worst.
VERDICTS = ("bitwise", "within tolerance", "differs")
#: How many changed rows are listed per comparison.
LISTED = 10
#: Relative box tolerance: 64 float32 epsilons (about 7.6e-6), a few roundings of a box's decoding and scaling.
BOX_RTOL = 64 * float(torch.finfo(torch.float32).eps)


#: A box kept with another class: the two boxes overlap at least this much.
FLIP_IOU = 0.9


def tolerances(atol: float) -> dict[str, Any]:
    """The tolerances a comparison at ``atol`` holds values to, stated for the report and the record."""
    return {
        "box_px": f"{atol:g} + {BOX_RTOL:.2g} x |coordinate|",
        "score": f"{atol:g}",
        "raw_output": f"{atol:g} + {BOX_RTOL:.2g} x |value|",
        "atol": atol,
        "rtol": BOX_RTOL,
    }


def compare_raw(ref: torch.Tensor | None, got: torch.Tensor | None, atol: float) -> dict[str, Any]:
    """Compare two raw head outputs: ``raw_max_diff``, ``raw_bitwise``, ``raw_elements`` and ``raw_within`` (every
    element within ``atol`` plus :data:`BOX_RTOL` of its size; None when an output is missing)."""
    if ref is None or got is None:
        return {"raw_max_diff": None, "raw_bitwise": None, "raw_within": None}
    if ref.shape != got.shape:
        return {
            "raw_max_diff": None,
            "raw_bitwise": False,
            "raw_within": False,
            "raw_note": f"raw outputs of other shapes {tuple(ref.shape)} and {tuple(got.shape)}",
        }
    a, b = ref.double(), got.double()
    diff = (a - b).abs()
    bound = atol + BOX_RTOL * torch.maximum(a.abs(), b.abs())
    return {
        "raw_max_diff": float(diff.max()) if diff.numel() else 0.0,
        "raw_bitwise": bool(torch.equal(ref, got)),
        "raw_within": bool((diff <= bound).all()),
        "raw_elements": int(diff.numel()),
    }


def worst(verdicts: Any) -> str:
    """The worst of ``verdicts`` (``bitwise`` when there are none)."""
    verdicts = list(verdicts)
    return max(verdicts, key=VERDICTS.index) if verdicts else "bitwise"


def candidates(raw: torch.Tensor, conf: float) -> torch.Tensor:
    """The rows an NMS over one image's raw head output starts from: ``x1 y1 x2 y2 score class``, score above ``conf``.

    Args:
        raw: A detection head's output for one image, ``(4 + classes, anchors)`` with boxes as ``x y w h``.
        conf: The confidence threshold.
    """
    x = raw.detach().double().t()
    score, cls = x[:, 4:].max(1)
    xy, wh = x[:, :2], x[:, 2:4] / 2
    rows = torch.cat([xy - wh, xy + wh, score[:, None], cls[:, None].double()], 1)
    return rows[score > conf]


def _box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Pairwise IoU of boxes ``a`` (n, 4) and ``b`` (m, 4), ``x1 y1 x2 y2``."""
    lt = torch.maximum(a[:, None, :2], b[None, :, :2])
    rb = torch.minimum(a[:, None, 2:4], b[None, :, 2:4])
    inter = (rb - lt).clamp(min=0).prod(2)
    area_a = (a[:, 2:4] - a[:, :2]).clamp(min=0).prod(1)
    area_b = (b[:, 2:4] - b[:, :2]).clamp(min=0).prod(1)
    union = area_a[:, None] + area_b[None, :] - inter
    return torch.where(union > 0, inter / union.clamp(min=1e-12), torch.zeros_like(inter))


def _match(a: torch.Tensor, b: torch.Tensor, atol: float) -> tuple[list[int], list[int], torch.Tensor, torch.Tensor]:
    """Greedy one-to-one matching of rows within tolerance: for each row of ``a``, the closest free row of ``b``.

    Returns the partner in ``b`` of each row of ``a`` (-1: none), the partner in ``a`` of each row of ``b``, and the
    box and score differences of every pair (n, m).
    """
    n, m = len(a), len(b)
    if not n or not m:
        empty = torch.zeros((n, m), dtype=torch.float64)
        return [-1] * n, [-1] * m, empty, empty
    box = (a[:, None, :4] - b[None, :, :4]).abs()
    box_tol = atol + BOX_RTOL * torch.maximum(a[:, None, :4].abs(), b[None, :, :4].abs())
    box_ok = (box <= box_tol).all(2)
    score = (a[:, None, 4] - b[None, :, 4]).abs()
    ok = box_ok & (score <= atol) & (a[:, None, 5] == b[None, :, 5])
    cost = torch.where(ok, box.amax(2) + score, torch.full_like(score, float("inf")))
    of_a, of_b = [-1] * n, [-1] * m
    for i in range(n):
        row = cost[i].clone()
        row[[j for j in range(m) if of_b[j] >= 0]] = float("inf")
        j = int(torch.argmin(row))
        if torch.isfinite(row[j]):
            of_a[i], of_b[j] = j, i
    return of_a, of_b, box.amax(2), score


def _same_candidates(cand_a: torch.Tensor | None, cand_b: torch.Tensor | None, atol: float, conf: float | None) -> bool:
    """Whether both sides' NMS started from the same candidates, paired one to one within ``atol`` (rows within
    ``atol`` of the threshold ``conf`` aside: either side may have cut them)."""
    if cand_a is None or cand_b is None:
        return False
    a, b = cand_a.double(), cand_b.double()
    if conf is not None:
        a, b = a[a[:, 4] - conf > atol], b[b[:, 4] - conf > atol]
    if len(a) != len(b):
        return False
    of_a, _, _, _ = _match(a, b, atol)
    return all(j >= 0 for j in of_a)


def _near_ties(
    a: torch.Tensor,
    b: torch.Tensor,
    of_a: list[int],
    of_b: list[int],
    *,
    atol: float,
    conf: float | None,
    iou: float,
    evidence: bool,
    nms_ties: bool,
) -> tuple[set[int], set[int]]:
    """The unmatched rows of ``a`` and of ``b`` that a difference within ``atol`` explains (the module docstring)."""
    free_a = {i for i, j in enumerate(of_a) if j < 0}
    free_b = {j for j, i in enumerate(of_b) if i < 0}
    if not evidence:
        return set(), set()
    ties_a = {i for i in free_a if conf is not None and float(a[i, 4]) - conf <= atol}
    ties_b = {j for j in free_b if conf is not None and float(b[j, 4]) - conf <= atol}
    if not nms_ties or not (free_a or free_b) or not len(a) or not len(b):
        return ties_a, ties_b
    overlap = _box_iou(a[:, :4], b[:, :4]) > iou
    same_class = a[:, None, 5] == b[None, :, 5]
    # could_suppress[i, j]: row j of b outscores row i of a (within atol) where NMS would compare them
    could_suppress = overlap & same_class & (b[None, :, 4] >= a[:, None, 4] - atol)
    could_be_suppressed = overlap & same_class & (a[:, None, 4] >= b[None, :, 4] - atol)
    twins = (a[:, None, 4] - b[None, :, 4]).abs() <= atol
    changed = True
    while changed:
        changed = False
        for i in sorted(free_a - ties_a):
            if any(could_suppress[i, j] and (twins[i, j] or j in ties_b) for j in range(len(b))):
                ties_a.add(i)
                changed = True
        for j in sorted(free_b - ties_b):
            if any(could_be_suppressed[i, j] and (twins[i, j] or i in ties_a) for i in range(len(a))):
                ties_b.add(j)
                changed = True
    return ties_a, ties_b


def compare_detections(
    ref: torch.Tensor,
    got: torch.Tensor,
    *,
    atol: float,
    conf: float | None = None,
    iou: float = 0.7,
    ref_candidates: torch.Tensor | None = None,
    got_candidates: torch.Tensor | None = None,
) -> dict[str, Any]:
    """Compare two detection tables, tie-aware (see the module docstring).

    Args:
        ref: The reference table (n, 6).
        got: The table compared with it (m, 6).
        atol: What "within tolerance" allows (pixels for boxes, on top of the relative ``BOX_RTOL``; absolute
            for scores).
        conf: The confidence threshold the tables were cut at, when known: a row within ``atol`` of it may be on
            one side only.
        iou: The NMS IoU threshold the tables were made with.
        ref_candidates: The rows ``ref``'s NMS started from (same layout), when known: with ``got_candidates``
            the evidence that lets a row kept by NMS on one side only be a near tie.
        got_candidates: The rows ``got``'s NMS started from, when known.

    Returns:
        ``verdict`` (``bitwise``: equal bit for bit; ``within tolerance``: every row matched within tolerance or a
        near tie; else ``differs``), ``count`` (reference, compared), ``matched`` (rows paired), ``near_ties``
        (rows on one side only that a difference within tolerance explains), ``same_candidates`` (whether both
        NMS started from the same candidates within tolerance; False when not known), ``max_box_diff`` and
        ``max_score_diff`` over the matched pairs when every row is matched or a near tie, else over the rows in
        order (where the tables part),
        ``classes_equal`` (the rows in order have the same classes), ``class_flips`` (``[row, class, class
        there]`` for each reference row left unexplained whose box the other table holds, IoU at least
        :data:`FLIP_IOU`, with another class), and ``changed``: the indices of the
        reference rows (then of the compared rows past the reference's length) that differ or are unexplained
        (at most 10).
    """
    a, b = ref.double(), got.double()
    n_ref, n_got = len(a), len(b)
    if n_ref == n_got and torch.equal(ref, got):
        return {
            "verdict": "bitwise",
            "count": [n_ref, n_got],
            "matched": n_ref,
            "near_ties": 0,
            "same_candidates": _same_candidates(ref_candidates, got_candidates, 0.0, None),
            "max_box_diff": 0.0,
            "max_score_diff": 0.0,
            "classes_equal": True,
            "class_flips": [],
            "changed": [],
        }
    of_a, of_b, box, score = _match(a, b, atol)
    known = ref_candidates is not None and got_candidates is not None
    nms_ties = _same_candidates(ref_candidates, got_candidates, atol, conf)
    ties_a, ties_b = _near_ties(
        a, b, of_a, of_b, atol=atol, conf=conf, iou=iou, evidence=nms_ties or not known, nms_ties=nms_ties
    )
    pairs = [(i, j) for i, j in enumerate(of_a) if j >= 0]
    n = min(n_ref, n_got)
    in_order = list(range(n))
    unexplained = (set(range(n_ref)) - {i for i, _ in pairs} - ties_a) | (
        set(range(n_got)) - {j for _, j in pairs} - ties_b
    )
    if pairs and not unexplained:  # how far apart the rows that belong together are
        max_box = max(float(box[i, j]) for i, j in pairs)
        max_score = max(float(score[i, j]) for i, j in pairs)
    else:  # where the tables differ: the rows in order
        max_box = max((float(box[i, i]) for i in in_order), default=0.0)
        max_score = max((float(score[i, i]) for i in in_order), default=0.0)
    classes_equal = bool(torch.equal(a[:n, 5], b[:n, 5]))
    flips: list[list[Any]] = []
    if unexplained and n_ref and n_got:
        iou_ab = _box_iou(a[:, :4], b[:, :4])
        for i in sorted(set(range(n_ref)) - {i for i, _ in pairs} - ties_a):
            j = int(torch.argmax(iou_ab[i]))
            if float(iou_ab[i, j]) >= FLIP_IOU and a[i, 5] != b[j, 5]:
                flips.append([i, int(a[i, 5]), int(b[j, 5])])
    # rows that are not the same bits in the same place, reference first
    changed = [i for i in range(n_ref) if i >= n_got or not torch.equal(ref[i], got[i])]
    changed += [j for j in range(n_ref, n_got)]
    verdict = "within tolerance" if not unexplained else "differs"
    return {
        "verdict": verdict,
        "count": [n_ref, n_got],
        "matched": len(pairs),
        "near_ties": len(ties_a) + len(ties_b),
        "same_candidates": nms_ties,
        "max_box_diff": max_box,
        "max_score_diff": max_score,
        "classes_equal": classes_equal,
        "class_flips": flips[:LISTED],
        "changed": changed[:LISTED],
    }
