"""Lineage: the parts of a resumed run, compared part by part, and how far a run got."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .common import _MISSING, OUTPUT_ARGS, _args, _canon, _Collector, _get

#: Arguments a resumed part has by being resumed (never a difference of configuration).
_RESUME_ARGS = frozenset({"resume", "model", "pretrained"})


def _parts(record: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The parts of a run, oldest first: its ``segments``, then the record itself."""
    segments = record.get("segments")
    return [*(s for s in segments if isinstance(s, Mapping)), record] if isinstance(segments, list) else [record]


def _span(parts: list[Mapping[str, Any]], i: int) -> str:
    start = parts[i - 1].get("epochs_completed") if i else 0
    end = parts[i].get("epochs_completed")
    if isinstance(start, int) and isinstance(end, int) and end > start:
        return f"epochs {start + 1}-{end}"
    return "no epoch checkpointed"


def _effective(record: Mapping[str, Any]) -> Mapping[str, Any]:
    """A resumed run's record as one run: the first part's start (model fingerprint, model=, resume=) with the
    rest of the last part's record."""
    parts = _parts(record)
    if len(parts) == 1:
        return record
    first = parts[0]
    out = dict(record)
    if "model" in first:
        out["model"] = first["model"]
    for key in ("ultralytics_args", "run"):
        args, first_args = record.get(key), first.get(key)
        if isinstance(args, Mapping) and isinstance(first_args, Mapping):
            out[key] = {**args, **{k: first_args[k] for k in _RESUME_ARGS if k in first_args}}
    return out


def _lineage(c: _Collector, ra: Mapping[str, Any], rb: Mapping[str, Any]) -> None:
    """Each part of a resumed run against the other run: its profile and arguments, and what its resume says."""
    for label, rec, other in (("A", ra, _parts(rb)[-1]), ("B", rb, _parts(ra)[-1])):
        parts = _parts(rec)
        if len(parts) == 1:
            continue
        other_train = _get(other, "profile", "train")
        other_args = _args(other)
        for i, part in enumerate(parts):
            name = f"part {i + 1} of {label} ({_span(parts, i)})"
            train = _get(part, "profile", "train")
            if _canon(train) != _canon(other_train):
                mine, theirs = (_get(part, "profile", "name"), _get(other, "profile", "name"))
                pair = (mine, theirs) if label == "A" else (theirs, mine)
                c.add("profile", f"{name}: trained under the profile", *pair)
            args = _args(part)
            for key in sorted((set(args) & set(other_args)) - OUTPUT_ARGS - _RESUME_ARGS - {"seed", "data", "cfg"}):
                if _canon(args[key]) != _canon(other_args[key]):
                    pair = (args[key], other_args[key]) if label == "A" else (other_args[key], args[key])
                    c.add("args", f"{name}: {key}=", *pair)
        resume = rec.get("resume")
        if isinstance(resume, Mapping) and resume.get("bitwise_expected") is False:
            reasons = resume.get("reasons") or ["the resume state was not used"]
            c.add(
                "args",
                f"resume of {label}: not expected bit for bit",
                "; ".join(map(str, reasons)),
                "",
                note=f"as recorded by run {label}",
            )


def _resumed_after(record: Mapping[str, Any]) -> list[int]:
    return [
        int(p["resume"]["epoch"])
        for p in _parts(record)
        if isinstance(p.get("resume"), Mapping) and isinstance(p["resume"].get("epoch"), int)
    ]


def _progress(record: Mapping[str, Any]) -> str:
    """How far a run that did not complete got: ``terminated after 2 of 4 epochs``."""
    status = record.get("status", _MISSING)
    done, total = record.get("epochs_completed"), _args(record).get("epochs")
    if status == "running":
        status = "running, or killed (its record still says running)"
    if isinstance(done, int):
        of = f" of {total}" if isinstance(total, int) else ""
        return f"{status} after {done}{of} epoch(s) checkpointed"
    return str(status)
