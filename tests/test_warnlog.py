"""The warning log records every non-determinism warning and restores the warnings machinery."""

from __future__ import annotations

import warnings

from yolo_det.core.warnlog import WarningLog

MSG = "adaptive_max_pool2d_backward_cuda does not have a deterministic implementation, but you set x"


def emit(text: str) -> None:
    warnings.warn(text, UserWarning, stacklevel=1)


def test_records_each_occurrence_and_shows_each_message_once(recwarn):
    shown: list[str] = []
    warnings.showwarning = lambda message, *a, **k: shown.append(str(message))
    filters = warnings.filters[:]
    phase = ["train"]
    log = WarningLog(phase=lambda: phase[0])
    log.start()
    for _ in range(3):
        emit(MSG)  # same call site: Python alone would show this once and forget the rest
    phase[0] = "val"
    emit(MSG)
    emit("something unrelated")
    log.stop()
    entries = log.entries()
    assert len(entries) == 1
    assert entries[0]["count"] == 4
    assert entries[0]["phases"] == ["train", "val"]
    assert entries[0]["category"] == "UserWarning"
    assert shown == [MSG, "something unrelated"]
    assert warnings.filters == filters
    emit(MSG)
    assert log.entries()[0]["count"] == 4  # stopped: no longer recording


def test_start_and_stop_are_idempotent():
    log = WarningLog()
    before = (warnings.filters[:], warnings.showwarning)
    log.start()
    log.start()
    assert log.active
    log.stop()
    log.stop()
    assert (warnings.filters[:], warnings.showwarning) == before
