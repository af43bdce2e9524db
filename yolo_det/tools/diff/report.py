"""The report of a comparison of two records: the differences, the verdict, and its text and JSON forms."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

DIFF_SCHEMA = "yolo-det/diff/1"
#: Groups in the order of how likely a difference in them changes the bits; ``other`` never does.
GROUPS: dict[str, str] = {
    "data": "data",
    "model": "model",
    "seed": "seeds",
    "ranks": "ranks",
    "profile": "profile settings",
    "args": "Ultralytics arguments",
    "code": "your project's code",
    "versions": "versions",
    "gpu": "GPU",
    "cpu": "CPU",
    "threads": "threads",
    "env": "environment variables",
    "swaps": "layer swaps",
    "warnings": "non-determinism warnings seen",
    "other": "other",
}


@dataclass
class Difference:
    """One difference between two records.

    Attributes:
        group: One of :data:`GROUPS`.
        name: What differs, e.g. ``seed``, ``torch``, ``data: train labels``, ``imgsz=``.
        a, b: The two values (``"(not recorded)"`` when a record lacks it).
        changes_bits: Whether this difference can change the trained weights.
        note: Why it cannot, or what the values mean, when that needs saying.
        measured: False for a version difference whose effect nobody has measured (it may change the bits or
            not; :attr:`yolo_det.core.machine.MachineCause.measured`, the rule ``check-machine`` uses).
    """

    group: str
    name: str
    a: Any
    b: Any
    changes_bits: bool = True
    note: str | None = None
    measured: bool = True

    def to_dict(self) -> dict[str, Any]:
        """Plain data for JSON."""
        return {
            "group": self.group,
            "name": self.name,
            "a": self.a,
            "b": self.b,
            "changes_bits": self.changes_bits,
            "note": self.note,
            "measured": self.measured,
        }

    def brief(self) -> str:
        """``name (A vs B)``, the values cut to 40 characters."""
        return _short(self)


@dataclass
class DiffReport:
    """The outcome of :func:`diff_records`.

    Attributes:
        a, b: Where the records came from.
        differences: Every difference, ordered by group (see :data:`GROUPS`).
        weights: ``{"a": digest, "b": digest}`` of the final weights (None when a record has none).
        ema: The same for the EMA weights.
        notes: What could not be compared, and why.
        status: ``{"a": ..., "b": ...}`` of the runs (``completed`` or ``failed``).
        compared: The evidence: per group, how many settings both records hold and were compared.
    """

    a: str
    b: str
    differences: list[Difference] = field(default_factory=list)
    weights: dict[str, str | None] = field(default_factory=dict)
    ema: dict[str, str | None] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    status: dict[str, Any] = field(default_factory=dict)
    warnings: dict[str, int] = field(default_factory=dict)
    progress: dict[str, str] = field(default_factory=dict)
    resumed: dict[str, list[int]] = field(default_factory=dict)
    compared: dict[str, int] = field(default_factory=dict)

    @property
    def causes(self) -> list[Difference]:
        """The differences that can change the trained weights, most likely first."""
        return [d for d in self.differences if d.changes_bits]

    @property
    def same_configuration(self) -> bool:
        """True when no difference can change the trained weights."""
        return not self.causes

    @property
    def weights_equal(self) -> bool | None:
        """Whether the final weights digests are equal (None when a record has none)."""
        a, b = self.weights.get("a"), self.weights.get("b")
        if not a or not b:
            return None
        ema_a, ema_b = self.ema.get("a"), self.ema.get("b")
        return a == b and (not ema_a or not ema_b or ema_a == ema_b)

    @property
    def kind(self) -> str:
        """``identical``, ``nondeterministic``, ``expected``, ``configured-differently`` or ``nothing-compared``
        (configured the same as far as the records tell, but a record has no final weights digest)."""
        equal = self.weights_equal
        if self.causes:
            return "configured-differently" if equal else "expected"
        if equal is None:
            return "nothing-compared"
        return "identical" if equal else "nondeterministic"

    @property
    def exit_code(self) -> int:
        """0 when the runs are configured the same and their weights digests are equal; 3 when nothing tells them
        apart but there are no weights to compare (nothing compared); else 1."""
        kind = self.kind
        return 0 if kind == "identical" else 3 if kind == "nothing-compared" else 1

    @property
    def evidence(self) -> str:
        """What was compared, in words: settings and topics both records hold, and the weights."""
        settings = sum(self.compared.values())
        topics = [GROUPS[g] for g in GROUPS if self.compared.get(g)]
        held = sum(1 for k in ("a", "b") if self.weights.get(k))
        weights = "the final weights digests" if held == 2 else f"no weights (digests in {held} of 2 records)"
        return (
            f"{settings} setting(s) in {len(topics)} topic(s){' (' + ', '.join(topics) + ')' if topics else ''}, "
            f"and {weights}"
        )

    @property
    def verdict(self) -> str:
        """One line for people."""
        kind = self.kind
        if kind == "identical":
            if self.resumed:
                after = "; ".join(
                    f"run {k.upper()} resumed after epoch {', '.join(map(str, v))}" for k, v in self.resumed.items()
                )
                return f"equivalent: {after}, and the weights are bitwise identical"
            return "these runs should be bitwise identical and are"
        if kind == "nondeterministic":
            seen = sum(self.warnings.values())
            hint = f"{seen} warning(s) recorded" if seen else "no warning was recorded"
            return (
                "these runs should be bitwise identical but their weights differ: non-determinism not covered "
                f"by the profile (see warnings: {hint})"
            )
        if kind == "nothing-compared":
            missing = [k.upper() for k in ("a", "b") if not self.weights.get(k)]
            why = ", ".join(
                f"run {k} ({self.progress.get(k.lower()) or self.status.get(k.lower(), 'unknown')})" for k in missing
            )
            return (
                f"nothing compared: no final weights digest for {why}, so an equality would prove nothing; "
                "compare the records of finished runs"
            )
        reasons = "; ".join(_short(d) for d in self.causes[:3])
        more = f"; and {len(self.causes) - 3} more" if len(self.causes) > 3 else ""
        if kind == "configured-differently":
            return f"configured differently ({reasons}{more}), yet their weights are identical"
        if not any(d.measured for d in self.causes):
            return (
                f"the weights differ and only versions nobody has measured differ ({reasons}{more}): "
                "the likely cause, though no release pair is promised either way"
            )
        return f"expected to differ because: {reasons}{more}"

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data (schema ``yolo-det/diff/1``)."""
        return {
            "schema": DIFF_SCHEMA,
            "a": self.a,
            "b": self.b,
            "verdict": self.verdict,
            "kind": self.kind,
            "same_configuration": self.same_configuration,
            "weights_equal": self.weights_equal,
            "weights": self.weights,
            "ema": self.ema,
            "status": self.status,
            "differences": [d.to_dict() for d in self.differences],
            "notes": self.notes,
            "exit_code": self.exit_code,
            "compared": {"settings": sum(self.compared.values()), "by_group": dict(self.compared)},
            "progress": self.progress,
            "resumed_after": self.resumed,
        }

    def summary(self) -> str:
        """Lines for the terminal: the records, the weights, the differences by group, the verdict."""
        lines = [f"A: {self.a}", f"B: {self.b}"]
        for key in ("a", "b"):
            if self.status.get(key) not in ("completed", None):
                lines.append(f"run {key.upper()}: {self.progress.get(key) or self.status.get(key)}")
            if self.resumed.get(key):
                lines.append(f"run {key.upper()}: resumed after epoch {', '.join(map(str, self.resumed[key]))}")
        wa, wb = self.weights.get("a"), self.weights.get("b")
        state = {True: "equal", False: "DIFFERENT", None: "not comparable"}[self.weights_equal]
        lines.append(f"weights: A {(wa or 'none')[:16]}  B {(wb or 'none')[:16]}  ({state})")
        for title, items in (
            ("differences that can change the weights, most likely first:", self.causes),
            ("differences that do not change the weights:", [d for d in self.differences if not d.changes_bits]),
        ):
            if not items:
                continue
            lines.append(title)
            group = None
            for d in items:
                if d.group != group:
                    group = d.group
                    lines.append(f"  {GROUPS[group]}")
                note = f"  ({d.note})" if d.note else ""
                lines.append(f"    {d.name}: A {_show(d.a)} | B {_show(d.b)}{note}")
        if not self.differences:
            lines.append("no differences in configuration, software or hardware")
        lines.extend(f"note: {n}" for n in self.notes)
        lines.append(f"compared: {self.evidence}")
        lines.append(f"verdict: {self.verdict}")
        return "\n".join(_esc(line) for line in lines)


def _esc(value: Any) -> str:
    """``value`` as text with every non-printable character escaped (a newline, a terminal escape, a bidi mark):
    text read from a record cannot start a line of its own or change the terminal."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def _show(value: Any, limit: int = 100) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _short(d: Difference) -> str:
    return f"{d.name} ({_show(d.a, 40)} vs {_show(d.b, 40)})"
