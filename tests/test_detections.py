"""Detection tables compared as a user reads them: rows matched within tolerance anywhere, near ties explained."""

from __future__ import annotations

import torch

from yolo_det.core.detections import BOX_RTOL, compare_detections


def _table(*rows: tuple[float, ...]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def test_rows_in_another_order_match_when_their_scores_are_tied() -> None:
    ref = _table((0, 0, 10, 10, 0.5, 0), (30, 30, 40, 40, 0.5, 0), (60, 60, 70, 70, 0.4, 1))
    got = ref[[1, 0, 2]]
    result = compare_detections(ref, got, atol=1e-4)
    assert result["verdict"] == "within tolerance"
    assert result["matched"] == 3
    assert result["near_ties"] == 0
    assert result["changed"] == [0, 1]  # not the same bits in the same place
    # the same reordering with a box that moved is caught, with or without the candidates
    moved = got.clone()
    moved[0, 0] += 1.0
    assert compare_detections(ref, moved, atol=1e-4)["verdict"] == "differs"
    strict = {"ref_candidates": ref, "got_candidates": moved}
    assert compare_detections(ref, moved, atol=1e-4, **strict)["verdict"] == "differs"


def test_an_nms_tie_that_flips_is_a_near_tie_and_an_unexplained_row_is_not() -> None:
    a = (0.0, 0.0, 10.0, 10.0, 0.50001, 0.0)
    b = (0.5, 0.0, 10.5, 10.0, 0.50000, 0.0)  # IoU with a about 0.9: NMS keeps one of the two
    far = (50.0, 50.0, 60.0, 60.0, 0.3, 0.0)
    ref, got = _table(a, far), _table(b, far)  # the other side kept the twin
    both = _table(a, b, far)  # both sides' NMS started from the twins
    result = compare_detections(ref, got, atol=1e-4, ref_candidates=both, got_candidates=both)
    assert result["verdict"] == "within tolerance"
    assert (result["matched"], result["near_ties"]) == (1, 2)
    # a box the other side never had as a candidate is no tie
    only_a = _table(a, far)
    assert compare_detections(ref, got, atol=1e-4, ref_candidates=only_a, got_candidates=both)["verdict"] == "differs"
    # the same flip with scores apart is a real difference
    apart = _table((0.5, 0.0, 10.5, 10.0, 0.4, 0.0), far)
    assert compare_detections(ref, apart, atol=1e-4)["verdict"] == "differs"
    # without evidence that NMS started from the same candidates, no row is a tie
    assert compare_detections(ref, got, atol=1e-4)["verdict"] == "differs"
    # a row on one side only with nothing that could have suppressed it
    assert (
        compare_detections(_table(a, far), _table(far), atol=1e-4, ref_candidates=both, got_candidates=both)["verdict"]
        == "differs"
    )
    # a suppressing row of another class does not explain it (NMS is per class)
    b_other = (0.5, 0.0, 10.5, 10.0, 0.50000, 1.0)
    cands = _table(a, b_other, far)
    assert (
        compare_detections(ref, _table(b_other, far), atol=1e-4, ref_candidates=cands, got_candidates=cands)["verdict"]
        == "differs"
    )


def test_a_chain_of_suppression_after_a_tie_is_explained() -> None:
    a = (0.0, 0.0, 10.0, 10.0, 0.6, 0.0)
    b = (1.0, 0.0, 11.0, 10.0, 0.6, 0.0)  # a's near-tied twin
    c = (2.0, 0.0, 12.0, 10.0, 0.2, 0.0)  # overlaps b above 0.7, a below it
    ref = _table(a, c)  # a kept, b suppressed by a, c kept
    got = _table(b)  # b kept, a and c suppressed by b
    cands = {"ref_candidates": _table(a, b, c), "got_candidates": _table(a, b, c)}
    assert compare_detections(ref, got, atol=1e-4, iou=0.7, **cands)["verdict"] == "within tolerance"
    # without the tie, b does not explain c
    assert compare_detections(_table(a, c), _table(a), atol=1e-4, iou=0.7, **cands)["verdict"] == "differs"


def test_a_row_at_the_threshold_may_be_on_one_side_only() -> None:
    ref = _table((0, 0, 10, 10, 0.9, 0), (30, 30, 40, 40, 0.25003, 0))
    got = ref[:1]
    assert compare_detections(ref, got, atol=1e-4, conf=0.25)["verdict"] == "within tolerance"
    assert compare_detections(ref, got, atol=1e-4)["verdict"] == "differs"  # threshold unknown
    assert compare_detections(ref, got, atol=1e-4, conf=0.2)["verdict"] == "differs"  # far from it


def test_box_tolerance_grows_with_the_coordinates_as_float32_rounding_does() -> None:
    ref = _table((600, 400, 640, 480, 0.9, 0))
    one_ulp = ref.clone()
    one_ulp[0, 2] = torch.nextafter(ref[0, 2], torch.tensor(1e9))  # 640 + 6.1e-5
    assert compare_detections(ref, one_ulp, atol=0.0)["verdict"] == "within tolerance"
    beyond = ref.clone()
    beyond[0, 2] += 640 * BOX_RTOL * 4
    strict = {"ref_candidates": ref, "got_candidates": beyond}
    assert compare_detections(ref, beyond, atol=0.0, **strict)["verdict"] == "differs"


def test_empty_tables() -> None:
    empty = torch.zeros((0, 6))
    assert compare_detections(empty, empty, atol=0)["verdict"] == "bitwise"
    one = _table((0, 0, 10, 10, 0.9, 0))
    assert compare_detections(one, empty, atol=1e-4)["verdict"] == "differs"
    assert compare_detections(empty, one, atol=1e-4)["changed"] == [0]
