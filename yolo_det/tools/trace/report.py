"""The answer of ``yolo-det bisect``: where two traced runs part, rendered for people, tools and CI."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from ...core.text import printable
from ..ci_report import CheckCase, CheckSuite

__all__ = ["BISECT_SCHEMA", "BisectReport", "Parting", "bisect_suite"]

BISECT_SCHEMA = "yolo-det/bisect/1"


@dataclass
class Parting:
    """The first op where two runs part.

    Attributes:
        step: The step number in trace A (``step_b``: in trace B); epoch and iteration (micro-batches since
            epoch 0) of its first micro-batch.
        phase: ``state`` (the weights or buffers the step starts from), ``data``, ``forward``, ``backward``,
            ``optimizer`` or ``structure`` (the two runs did not run the same ops).
        micro: The micro-batch within the step (0-based), for data, forward and backward.
        op: The module call (``name`` or ``name#k``) or the parameter or buffer.
        module: The module the op belongs to; type_a/type_b and extra_a/extra_b its class and ``extra_repr``.
        shapes, dtype: Of the op's outputs (forward).
        inputs_equal: Whether the op's inputs are equal on both sides (None: not known, e.g. the data).
        detail: One line on what differs.
        settings: ``[name, A, B]`` of the settings that can change this op (both sides' values).
    """

    step: int
    step_b: int
    epoch: int
    iteration: int
    phase: str
    op: str
    detail: str
    micro: int | None = None
    module: str = ""
    type_a: str = ""
    type_b: str = ""
    extra_a: str = ""
    extra_b: str = ""
    shapes: list[str] = field(default_factory=list)
    dtype: str = ""
    inputs_equal: bool | None = None
    settings: list[list[Any]] = field(default_factory=list)


@dataclass
class BisectReport:
    """Two traces compared op by op.

    Attributes:
        a, b: The traces' paths.
        parting: The first op where they part (None: every op of every common step is equal).
        steps_compared: Common steps compared (up to and including the parting one).
        ops_compared: Digests compared.
        notes: What else the comparison found (module types that differ with equal outputs, steps only one
            side traced).
        causes: The settings the runs' records differ in (``yolo-det diff``'s causes), most likely first.
        weights_equal: Whether the runs' final weights are equal, by their records (None: not known).
    """

    a: str
    b: str
    parting: Parting | None
    steps_compared: int
    ops_compared: int
    notes: list[str] = field(default_factory=list)
    causes: list[str] = field(default_factory=list)
    weights_equal: bool | None = None

    @property
    def equal(self) -> bool:
        """Every traced op agrees and the final weights do not differ."""
        return self.parting is None and self.weights_equal is not False

    @property
    def parted_later(self) -> bool:
        """Every traced op agrees, but the final weights differ: the runs part after the traced steps."""
        return self.parting is None and self.weights_equal is False

    def _settings(self) -> str:
        if not self.causes:
            return "their records name no setting that differs (non-determinism the profile does not cover)"
        more = f"; and {len(self.causes) - 3} more" if len(self.causes) > 3 else ""
        return f"the settings that differ: {'; '.join(self.causes[:3])}{more}"

    @property
    def verdict(self) -> str:
        """One line for people."""
        matched = f"{self.ops_compared} digests of {self.steps_compared} common steps match"
        if self.parted_later:
            return (
                f"the traced window agrees ({matched}) and the runs part later: their final weights differ; "
                f"{self._settings()} (trace later steps with --trace-ops to find where)"
            )
        if self.parting is None:
            return f"equal: {matched}"
        p = self.parting
        where = f"step {p.step}" + (f" (step {p.step_b} in B)" if p.step_b != p.step else "")
        before = self.steps_compared - 1
        agree = f"equal for {before} common step{'s' if before != 1 else ''}; " if before else ""
        return f"parted: {agree}in {where} the first difference is the {p.phase} of {p.op or 'the step'}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data (schema ``yolo-det/bisect/1``)."""
        return {
            "schema": BISECT_SCHEMA,
            "a": self.a,
            "b": self.b,
            "equal": self.equal,
            "parted_later": self.parted_later,
            "weights_equal": self.weights_equal,
            "causes": self.causes,
            "verdict": self.verdict,
            "steps_compared": self.steps_compared,
            "ops_compared": self.ops_compared,
            "parting": asdict(self.parting) if self.parting is not None else None,
            "notes": self.notes,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=str)

    def summary(self) -> str:
        """Lines for the terminal (text from the traces made printable)."""
        lines = [f"A: {self.a}", f"B: {self.b}", self.verdict]
        p = self.parting
        if p is not None:
            where = f"  step {p.step}, epoch {p.epoch + 1}, iteration {p.iteration}"
            if p.micro is not None:
                where += f", micro-batch {p.micro}"
            lines.append(where)
            lines.append(f"  {p.phase}: {p.detail}")
            if p.module or p.type_a:
                same = p.type_a == p.type_b and p.extra_a == p.extra_b
                short_a, short_b = p.type_a.rpartition(".")[2], p.type_b.rpartition(".")[2]
                lines.append(
                    f"  module {p.module or '(the model)'}: {short_a}({p.extra_a})"
                    + ("" if same else f" | B: {short_b}({p.extra_b})")
                )
            if p.shapes:
                lines.append(f"  output {', '.join(p.shapes)} {p.dtype}")
            if p.inputs_equal is True:
                lines.append("  its inputs are equal on both sides: this op is where the runs part")
            elif p.inputs_equal is False:
                lines.append(
                    "  its inputs differ too: they come from outside the traced modules (a functional op between "
                    "modules, the loss, or the data)"
                )
            if p.settings:
                lines.append("  settings that can change this op (A | B; * differs):")
                for name, a, b in p.settings:
                    mark = "*" if a != b else " "
                    lines.append(f"   {mark} {name}: {_show(a)} | {_show(b)}")
        if self.causes and not self.parted_later:
            lines.append(f"  the runs' records: {self._settings()}")
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(printable(line, newlines=False) for line in lines)  # a name never starts a line


def _show(value: Any) -> str:
    return "-" if value in ("", None) else str(value)


def bisect_suite(report: BisectReport, *, seconds: float = 0.0) -> CheckSuite:
    """One JUnit test case: the two traces are equal (passed) or part at the op named (failed)."""
    suite = CheckSuite("yolo-det bisect", seconds=seconds, properties={"a": report.a, "b": report.b})
    if report.equal:
        suite.cases.append(CheckCase("ops", "yolo-det.bisect", "passed", details=report.verdict))
    else:
        details = report.summary()
        suite.cases.append(CheckCase("ops", "yolo-det.bisect", "failed", message=report.verdict, details=details))
    return suite
