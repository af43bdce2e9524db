"""Results for CI systems: JUnit XML files and GitHub Actions annotations.

`audit`, `verify` (also `--against`) and `diff` turn their reports into :class:`CheckSuite` objects here:
one test case per model audited, per quantity compared, or per group of differences. A suite is written
as JUnit XML (the Ant/Jenkins format that GitHub, GitLab, Jenkins, Azure and CircleCI read) and printed as
GitHub workflow commands (``::error file=...,line=...::...``) that put the message next to the line of
the model YAML. Nothing here imports torch: the reports are read as plain data.
"""

from __future__ import annotations

import re
import socket
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ..core.fileio import atomic_write_bytes

if TYPE_CHECKING:
    from ..analysis.audit.report import AuditReport, Finding
    from .diff import DiffReport
    from .verify.crossverify import AgainstReport
    from .verify.report import VerifyReport

__all__ = [
    "CheckCase",
    "CheckSuite",
    "against_suite",
    "audit_suite",
    "diff_suite",
    "github_annotations",
    "junit_xml",
    "verify_suite",
    "write_junit",
]

Outcome = Literal["passed", "failed", "skipped", "error"]

# Characters XML 1.0 cannot hold at all (C0 controls other than tab, newline and carriage return, and
# the two non-characters): text from a file that holds them is written with the code point spelled out.
_XML_BAD = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


@dataclass(frozen=True)
class CheckCase:
    """One test case: something checked, and how it went.

    Attributes:
        name: What was checked (``data``, ``gradients``, a model's name, ...).
        classname: The group it belongs to (``yolo-det.audit``, ``yolo-det.verify.run2``, ...).
        outcome: ``passed``, ``failed``, ``skipped`` or ``error``.
        message: One line: why it failed or was skipped.
        details: More lines (the findings, the first divergence, ...).
        file: The file the message is about (a model YAML), for annotations.
        line: The 1-based line in ``file``.
        seconds: How long the check took, when known.
        notes: ``(file, line, message)`` for each place the failure is about (one annotation each); empty:
            one annotation at ``file``/``line`` with ``message``.
    """

    name: str
    classname: str
    outcome: Outcome = "passed"
    message: str = ""
    details: str = ""
    file: str | None = None
    line: int | None = None
    seconds: float = 0.0
    notes: tuple[tuple[str | None, int | None, str], ...] = ()


@dataclass
class CheckSuite:
    """A named list of test cases (one command's result).

    Attributes:
        name: The suite's name (``yolo-det audit``, ``yolo-det verify``, ...).
        cases: The test cases, in order.
        properties: Context shown with the suite (profile, device, torch version, ...).
        seconds: Wall time of the command, when known.
    """

    name: str
    cases: list[CheckCase] = field(default_factory=list)
    properties: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    def count(self, outcome: Outcome) -> int:
        """How many cases have ``outcome``."""
        return sum(1 for c in self.cases if c.outcome == outcome)


def _xml_text(value: Any) -> str:
    return _XML_BAD.sub(
        lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100 else f"\\u{ord(m.group()):04x}", str(value)
    )


def _seconds(value: float) -> str:
    return f"{max(float(value), 0.0):.3f}"


def junit_xml(suites: Sequence[CheckSuite], *, name: str = "yolo-det") -> bytes:
    """The suites as a JUnit XML document (UTF-8, with the XML declaration).

    Args:
        suites: The suites, written in order as ``<testsuite>`` elements of one ``<testsuites>``.
        name: The name of the ``<testsuites>`` element.
    """
    root = ET.Element(
        "testsuites",
        {
            "name": _xml_text(name),
            "tests": str(sum(len(s.cases) for s in suites)),
            "failures": str(sum(s.count("failed") for s in suites)),
            "errors": str(sum(s.count("error") for s in suites)),
            "skipped": str(sum(s.count("skipped") for s in suites)),
            "time": _seconds(sum(s.seconds for s in suites)),
        },
    )
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    host = socket.gethostname() or "localhost"
    for k, suite in enumerate(suites):
        el = ET.SubElement(
            root,
            "testsuite",
            {
                "name": _xml_text(suite.name),
                "tests": str(len(suite.cases)),
                "failures": str(suite.count("failed")),
                "errors": str(suite.count("error")),
                "skipped": str(suite.count("skipped")),
                "time": _seconds(suite.seconds),
                "timestamp": stamp,
                "hostname": _xml_text(host),
                "id": str(k),
            },
        )
        if suite.properties:
            props = ET.SubElement(el, "properties")
            for key, value in suite.properties.items():
                ET.SubElement(props, "property", {"name": _xml_text(key), "value": _xml_text(value)})
        for case in suite.cases:
            c = ET.SubElement(
                el,
                "testcase",
                {"name": _xml_text(case.name), "classname": _xml_text(case.classname), "time": _seconds(case.seconds)},
            )
            where = f"{case.file}:{case.line}: " if case.file and case.line else (f"{case.file}: " if case.file else "")
            if case.outcome in ("failed", "error"):
                tag = "failure" if case.outcome == "failed" else "error"
                sub = ET.SubElement(
                    c,
                    tag,
                    {
                        "message": _xml_text(where + case.message),
                        "type": "nondeterminism" if tag == "failure" else "error",
                    },
                )
                sub.text = _xml_text(case.details or case.message)
            elif case.outcome == "skipped":
                ET.SubElement(c, "skipped", {"message": _xml_text(case.message)})
            elif case.details:
                ET.SubElement(c, "system-out").text = _xml_text(case.details)
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True) + b"\n"


def write_junit(path: str | Path, suites: Sequence[CheckSuite]) -> Path:
    """Write :func:`junit_xml` of ``suites`` to ``path`` atomically; return the path."""
    return atomic_write_bytes(path, junit_xml(suites))


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def github_annotations(suites: Iterable[CheckSuite]) -> list[str]:
    """GitHub Actions workflow commands for the failed and errored cases (one line each).

    A case with a file gets ``file=`` (and ``line=``) so the message shows next to that line of the
    change; the text is escaped as the workflow-command format requires (a message cannot start a new
    command).
    """
    out = []
    for suite in suites:
        for case in suite.cases:
            if case.outcome not in ("failed", "error"):
                continue
            for file, line, message in case.notes or ((case.file, case.line, case.message),):
                props = []
                if file:
                    props.append(f"file={_escape_property(file)}")
                    if line:
                        props.append(f"line={int(line)}")
                props.append(f"title={_escape_property(f'{suite.name}: {case.name}')}")
                out.append(f"::error {','.join(props)}::{_escape_data(message)}")
    return out


# ---------------------------------------------------------------------------------------------------------
# reports -> suites


def _finding_line(f: Finding) -> str:
    layer = "-" if f.layer is None else str(f.layer)
    cls = f.layer_class or f.module_class
    return (
        f"layer {layer} {cls} ({f.module or 'model'}, {f.module_class}): {f.kernel} {f.pass_}; "
        f"under the profile: {f.under_profile}; fix: {f.fix}"
    )


def audit_suite(reports: Sequence[AuditReport], *, fail_on: str = "any", seconds: float = 0.0) -> CheckSuite:
    """One test case per model audited; a failing one lists its findings (one annotation each, at its YAML line).

    Args:
        reports: The audit reports, one per model.
        fail_on: ``any`` (a finding that breaks strict determinism fails) or ``unhandled`` (only one that
            the audit's profile neither swaps nor intercepts).
        seconds: Wall time of the audit.
    """
    suite = CheckSuite("yolo-det audit", seconds=seconds)
    if reports:
        r0 = reports[0]
        suite.properties = {
            "profile": r0.profile,
            "torch_version": r0.torch_version,
            "imgsz": str(r0.imgsz),
            "device": r0.device,
            "fail_on": fail_on,
        }
    for report in reports:
        failing = failing_findings(report, fail_on)
        file = report_file(report)
        if not failing:
            ok_note = (
                "no finding"
                if not report.findings
                else f"{len(report.findings)} finding(s), none failing under fail-on {fail_on}"
            )
            suite.cases.append(CheckCase(report.model, "yolo-det.audit", "passed", details=ok_note, file=file))
            continue
        layers = sorted({f.layer for f in failing if f.layer is not None})
        where = f" (layer{'s' if len(layers) > 1 else ''} {', '.join(map(str, layers))})" if layers else ""
        suite.cases.append(
            CheckCase(
                report.model,
                "yolo-det.audit",
                "failed",
                message=f"{len(failing)} layer finding(s) break strict determinism{where}",
                details="\n".join(_finding_line(f) for f in failing),
                file=file,
                line=next((f.yaml_line for f in failing if f.yaml_line), None),
                notes=tuple(
                    (
                        file,
                        f.yaml_line,
                        f"layer {'-' if f.layer is None else f.layer} "
                        f"{f.layer_class or f.module_class} ({f.module or 'model'}) reaches "
                        f"{f.kernel} ({f.pass_}); fix: {f.fix}",
                    )
                    for f in failing
                ),
            )
        )
    return suite


def report_file(report: AuditReport) -> str | None:
    """The model's file as the user named it (a path relative to where they ran, as annotations need), or
    the YAML the audit resolved it to."""
    return report.model if Path(report.model).is_file() else report.yaml_path


def failing_findings(report: AuditReport, fail_on: str) -> list[Finding]:
    """The findings that fail a check: every one that breaks strict determinism (``any``), or only those the
    audit's profile neither swaps nor intercepts (``unhandled``)."""
    if fail_on not in ("any", "unhandled"):
        raise ValueError(f"fail_on must be 'any' or 'unhandled', got {fail_on!r}")
    bad = [f for f in report.findings if f.breaks_determinism]
    if fail_on == "unhandled":
        bad = [f for f in bad if not f.handled]
    return bad


_QUANTITIES = (
    ("data", "data_differs", "input batches (order and content)"),
    ("loss", "loss_differs", "loss components"),
    ("gradients", "gradients_differ", "gradients of every parameter"),
)


def _quantity_cases(
    classname: str, divergence: Any, steps: int, final_differs: bool, final_detail: str, compared_weights: bool = True
) -> list[CheckCase]:
    cases = []
    for name, flag, what in _QUANTITIES:
        if divergence is None:
            cases.append(CheckCase(name, classname, "passed", details=f"{what} match at all {steps} steps"))
        elif divergence.kind == "model":
            cases.append(CheckCase(name, classname, "skipped", message="not compared: " + divergence.detail))
        elif getattr(divergence, flag, False) or divergence.kind == name:
            cases.append(
                CheckCase(
                    name,
                    classname,
                    "failed",
                    message=f"{what} differ at step {divergence.step}: {divergence.detail}",
                    details=divergence.detail,
                )
            )
        else:
            cases.append(
                CheckCase(
                    name,
                    classname,
                    "skipped",
                    message=f"matched through step {divergence.step}; not compared after the first divergence",
                )
            )
    if compared_weights:
        if divergence is not None and divergence.kind == "model":
            cases.append(CheckCase("weights", classname, "skipped", message="not compared: " + divergence.detail))
        elif final_differs or (divergence is not None and divergence.kind in ("weights", "steps")):
            msg = (
                divergence.detail
                if divergence is not None and divergence.kind in ("weights", "steps")
                else final_detail
            )
            cases.append(CheckCase("weights", classname, "failed", message=msg, details=final_detail or msg))
        else:
            cases.append(CheckCase("weights", classname, "passed", details="final weights digests are equal"))
    return cases


def verify_suite(report: VerifyReport) -> CheckSuite:
    """One test case per compared quantity (data, loss, gradients, final weights) for each run against run 1."""
    suite = CheckSuite(
        "yolo-det verify",
        seconds=report.seconds,
        properties={
            "profile": report.profile,
            "device": report.device,
            "runs": str(len(report.runs)),
            "steps_requested": str(report.steps_requested),
        },
    )
    ref = report.runs[0] if report.runs else None
    for run in report.runs[1:]:
        div = next((d for d in report.divergences if d.run == run.index), None)
        final = bool(ref is not None and run.weights != ref.weights)
        detail = ""
        if run.final_diff:
            k, v = run.final_diff[0]
            detail = f"final weights: {len(run.final_diff)} tensors differ, largest {k} by {v:.3g}"
        elif final:
            detail = "final weights digests differ"
        suite.cases.extend(_quantity_cases(f"yolo-det.verify.run{run.index}", div, len(run.steps), final, detail))
    suite.cases.extend(
        CheckCase("evidence", "yolo-det.verify", "failed", message=f"nothing compared: {why}")
        for why in report.nothing_compared
    )
    return suite


def against_suite(report: AgainstReport) -> CheckSuite:
    """One test case per compared quantity against a saved run, and one for the environment."""
    suite = CheckSuite("yolo-det verify --against", properties={"saved": report.saved})
    steps = report.steps[0] if report.steps else 0
    weights = len(report.weights) == 2 and bool(report.weights[0]) and report.weights[0] != report.weights[1]
    suite.cases.extend(
        _quantity_cases(
            "yolo-det.verify.against",
            report.divergence,
            steps,
            weights,
            "final weights digests differ from the saved run",
            compared_weights=not report.across_devices,
        )
    )
    suite.cases.extend(
        CheckCase("evidence", "yolo-det.verify.against", "failed", message=f"nothing compared: {why}")
        for why in report.nothing_compared
    )
    env = report.environment
    if env is not None:
        causes = env.causes
        if causes and not report.identical:
            suite.cases.append(
                CheckCase(
                    "environment",
                    "yolo-det.verify.against",
                    "failed",
                    message="differs from the saved run in " + ", ".join(c.name for c in causes[:5]),
                    details="\n".join(f"{c.name}: {c.a!r} | {c.b!r}" for c in causes),
                )
            )
        else:
            suite.cases.append(
                CheckCase(
                    "environment",
                    "yolo-det.verify.against",
                    "passed",
                    details="; ".join(c.name for c in causes) or "configured the same",
                )
            )
    return suite


def diff_suite(report: DiffReport) -> CheckSuite:
    """One test case for the weights and one per difference that can change them."""
    suite = CheckSuite("yolo-det diff", properties={"a": report.a, "b": report.b})
    wa, wb = report.weights.get("a"), report.weights.get("b")
    if wa and wb:
        same = wa == wb
        suite.cases.append(
            CheckCase(
                "weights",
                "yolo-det.diff",
                "passed" if same else "failed",
                message="" if same else f"final weights differ ({wa[:16]} vs {wb[:16]})",
            )
        )
    else:
        suite.cases.append(CheckCase("weights", "yolo-det.diff", "skipped", message="a record has no weights digest"))
    for d in report.causes:
        suite.cases.append(
            CheckCase(f"configuration {d.name}", "yolo-det.diff", "failed", message=f"{d.name}: {d.a!r} | {d.b!r}")
        )
    if not report.causes:
        suite.cases.append(
            CheckCase("configuration", "yolo-det.diff", "passed", details="no difference that can change the weights")
        )
    return suite
