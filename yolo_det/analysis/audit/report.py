"""The audit's result: findings and the report, as plain data and as a table."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

__all__ = ["AuditReport", "Finding"]

_MODES = ("strict", "warn", "off")


@dataclass(frozen=True)
class Finding:
    """One module that reaches a non-deterministic kernel (or a source torch cannot check).

    Attributes:
        entry: The table entry id (``observed`` for a real-device alert the table did not predict).
        kernel: The kernel name as torch prints it.
        pass_: ``forward`` or ``backward``.
        effect: ``alert``, ``warn_only``, ``silent`` or ``review`` (see :mod:`yolo_det.analysis.optable`).
        layer: The Ultralytics layer index (``.i``) of the top-level layer holding the module, if any.
        layer_class: Class name of that top-level layer (e.g. ``CBAMMax``, ``RTDETRDecoder``).
        yaml_line: The line of that layer in the model YAML, when the model came from one.
        module: The module path (``model.10.max_pool``); ``""`` is the model itself.
        module_class: Class name of that module.
        op: What matched: the aten op, the Python function, or the autograd node kind.
        call: The torch function that issued the op (``torch.nn.functional.grid_sample``), if any.
        count: How many times the trace saw it in this module.
        behaviour: What happens under ``strict``, ``warn`` (warn_only) and ``off``.
        under_profile: What happens under the profile the audit was run with.
        fix: The deterministic replacement, or what to do without one.
        condition: When the kernel is reached (from the table).
        observed: With a real-device pass: whether the kernel really alerted there (None: not run).
        note: Extra information (a decomposition the running torch takes, a backward that could not be traced).
        handled: True when the audit's profile makes this module deterministic at training time (it swaps the
            module for a deterministic layer, or intercepts the functional call).
    """

    entry: str
    kernel: str
    pass_: str
    effect: str
    layer: int | None
    layer_class: str | None
    yaml_line: int | None
    module: str
    module_class: str
    op: str
    call: str | None
    count: int
    behaviour: Mapping[str, str]
    under_profile: str
    fix: str
    condition: str = ""
    observed: bool | None = None
    note: str = ""
    handled: bool = False

    @property
    def breaks_determinism(self) -> bool:
        """True when training under strict determinism raises here or stays non-deterministic."""
        return self.effect in ("alert", "silent")

    def to_dict(self) -> dict[str, Any]:
        """Plain data (for ``--json``): every field (``pass_`` as ``pass``), and :attr:`breaks_determinism`."""
        out = {f.name.rstrip("_"): getattr(self, f.name) for f in fields(self)}
        out["behaviour"] = dict(self.behaviour)
        return {**out, "breaks_determinism": self.breaks_determinism}


@dataclass
class AuditReport:
    """What :func:`audit` found.

    Attributes:
        model: The model as given (path, name, factory or class name).
        findings: One per (table entry, module), in layer order.
        torch_version: The torch version the table was read for.
        running_torch: The torch version that ran the trace.
        profile: The profile name; its train-phase settings decided the flag at forward time.
        imgsz: Input size of the trace.
        batch: Batch size of the trace.
        device: ``fake-cuda``, or the real device of the second-opinion pass as well.
        yaml_path: The model YAML, when the model came from one.
        notes: Things the trace could not do (nodes whose backward failed, ...).
        stats: Counts and the wall time of the audit.
        fixed: The layers already fixed by yolo-det's own deterministic layers (``DetUpsample`` in a rewritten
            YAML, ...): not findings.
    """

    model: str
    findings: list[Finding]
    torch_version: str
    running_torch: str
    profile: str
    imgsz: int
    batch: int
    device: str
    yaml_path: str | None = None
    notes: list[str] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    fixed: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when nothing in the model raises or stays non-deterministic under strict determinism."""
        return not any(f.breaks_determinism for f in self.findings)

    @property
    def exit_code(self) -> int:
        """0 when :attr:`ok`, else 1 (the CLI's exit code)."""
        return 0 if self.ok else 1

    def to_dict(self) -> dict[str, Any]:
        """Plain data (for ``--json``)."""
        return {
            "model": self.model,
            "ok": self.ok,
            "torch_version": self.torch_version,
            "running_torch": self.running_torch,
            "profile": self.profile,
            "imgsz": self.imgsz,
            "batch": self.batch,
            "device": self.device,
            "yaml_path": self.yaml_path,
            "findings": [f.to_dict() for f in self.findings],
            "notes": list(self.notes),
            "stats": dict(self.stats),
            "fixed": [
                {"layer": f.layer, "yaml_line": f.yaml_line, "module": f.module, "class": f.module_class}
                for f in self.fixed
            ],
        }

    def format_table(self) -> str:
        """A readable report: one row per finding, then what happens under each mode, the fix and a verdict."""
        head = (
            f"yolo-det audit: {self.model}  (imgsz {self.imgsz}, batch {self.batch}, torch {self.torch_version}, "
            f"profile {self.profile}, {self.device} trace)"
        )
        lines = [head]
        for f in self.fixed:
            line = "" if f.yaml_line is None else f" (line {f.yaml_line})"
            lines.append(f"fixed: layer {f.layer}{line} {f.module} {f.module_class}: yolo-det's deterministic layer")
        if not self.findings:
            lines.append("no layer reaches a non-deterministic CUDA kernel: the model trains under strict determinism")
        else:
            rows = [("layer", "line", "module", "class", "kernel", "pass")]
            for f in self.findings:
                layer = "-" if f.layer is None else str(f.layer)
                if f.layer_class and f.layer_class != f.module_class:
                    layer += f" {f.layer_class}"
                rows.append(
                    (
                        layer,
                        "-" if f.yaml_line is None else str(f.yaml_line),
                        f.module or "(model)",
                        f.module_class,
                        f.kernel,
                        f.pass_,
                    )
                )
            widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
            fmt = "  ".join(f"{{:<{w}}}" for w in widths)
            lines.append(fmt.format(*rows[0]).rstrip())
            for f, row in zip(self.findings, rows[1:]):
                lines.append(fmt.format(*row).rstrip())
                b = f.behaviour
                lines.append(f"    strict: {b['strict']} | warn_only: {b['warn']} | off: {b['off']}")
                extra = ""
                if f.observed is not None:
                    extra = f" | seen on {self.device.split('+')[-1]}: {'yes' if f.observed else 'no'}"
                lines.append(f"    under {self.profile}: {f.under_profile} | fix: {f.fix}{extra}")
                if f.note:
                    lines.append(f"    note: {f.note}")
        for note in self.notes:
            lines.append(f"note: {note}")
        bad = [f for f in self.findings if f.breaks_determinism]
        if bad:
            layers = sorted({f.layer for f in bad if f.layer is not None})
            where = f" (layer{'s' if len(layers) > 1 else ''} {', '.join(map(str, layers))})" if layers else ""
            lines.append(
                f"verdict: NOT deterministic under strict mode: {len(bad)} finding{'s' if len(bad) > 1 else ''}{where}"
            )
        else:
            lines.append("verdict: trains under strict determinism")
        return "\n".join(lines)
