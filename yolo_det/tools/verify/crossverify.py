"""Verification across processes and machines: save one run's per-step fingerprints, compare a later run with them.

Length: one file format: writing, checking and reading a saved run, and comparing a run with it, share its schema.

``yolo-det verify --save FILE`` writes what one training recorded (see :mod:`yolo_det.tools.verify`), in a
portable form: per optimizer step the digests of each input batch (as the data loader gave it, and as
preprocessed for the model), its image files (relative to the dataset root), the loss components, a
digest per parameter gradient, the AMP scale and a digest of the parameters after the step; at the end
the weights digests; and the run's ``determinism.json`` (profile, seeds, versions, hardware, dataset and
model fingerprints). The file holds fingerprints, never tensors: a few kilobytes per step for a small
YOLO model. It is JSON with a schema name and a version; a version newer than this yolo-det reads is
refused with one line. It is written atomically.

Digests are those of :mod:`yolo_det.tools.fingerprint`: SHA-256 of the bytes for CPU tensors, integer sums
computed on the device for accelerator tensors. Equal bits give equal digests between two runs that
trained on the same device type, on any machine. Between a CPU run and a GPU run only the loader's
batches (CPU tensors in both), the image files and the loss values compare; the gradients of such runs
are not compared (they are not expected to agree: PyTorch promises nothing across devices).

``yolo-det verify --against FILE`` trains once here, the same way, and reports the first step where
this run and the saved one differ, and what differed first: the data order, the data content, the
loss, the gradients (naming the parameters whose gradients differ), or the weights after the step
(the optimizer update); then the environment differences of ``yolo-det diff`` between the two records.
When the records' ``data_stream`` sections show that the first batches differ, ``data`` is named first
whatever the steps show, with the cause the sections give (the worker count without ``data_invariance``,
the seed, the dataset bytes, an augmentation argument).
The size of a gradient difference cannot be measured across processes (only digests are saved).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ...core.datafp import is_inside
from ...core.errors import ConfigError
from ...core.fileio import atomic_write_text
from ...core.text import printable, short
from ..data_stream import explain_data_stream
from ..diff import VERIFY_SAVED_SCHEMA, DiffReport, diff_records
from .compare import compare_runs
from .records import NOTHING, Divergence, MicroBatch, RunRecord, StepRecord, nothing_trained
from .saved_schema import check_saved_schema
from .saved_schema import not_usable as _fail

__all__ = [
    "SAVED_SCHEMA",
    "SAVED_VERSION",
    "AgainstReport",
    "Saved",
    "compare_against",
    "gate_saved",
    "load_saved",
    "read_saved",
    "save_run",
]

SAVED_SCHEMA = VERIFY_SAVED_SCHEMA
SAVED_VERSION = 1
DIGEST = "fingerprint/1"  # yolo_det.fingerprint: SHA-256 on the CPU, integer sums on a device
_FIRST_BATCHES = "data stream: first batches"


def _relative(files: Sequence[str], root: str) -> list[str]:
    """Image files relative to the dataset root (POSIX) when inside it; other paths stay as they are."""
    out = []
    r = os.path.abspath(root) if root else ""
    for f in files:
        a = os.path.abspath(f)
        if r and is_inside(a, r):
            out.append(Path(os.path.relpath(a, r)).as_posix())
        else:
            out.append(str(f))
    return out


@dataclass
class Saved:
    """A file written by :func:`save_run`, read back.

    Attributes:
        path: Where it was read from.
        version: Its format version.
        run: The recorded run (image files relative to the dataset root).
        record: The run's ``determinism.json`` content (``{}`` when the run wrote none).
        profile: The profile's name.
        args: The Ultralytics arguments of the run.
        steps_requested: ``--steps`` of the saved run (None: the epochs decided).
        device: The device it trained on.
        created: When it was written (UTC, ISO 8601).
    """

    path: str
    version: int
    run: RunRecord
    record: dict[str, Any]
    profile: str
    args: dict[str, Any]
    steps_requested: int | None
    device: str
    created: str


def _run_to_dict(run: RunRecord) -> dict[str, Any]:
    return {
        "param_names": run.param_names,
        "loss_names": run.loss_names,
        "weights": run.weights,
        "optimizer_steps": run.optimizer_steps,
        "device_type": run.device_type,
        "steps": [
            {
                "step": s.step,
                "epoch": s.epoch,
                "scale": s.scale,
                "weights": s.weights,
                "grads": s.grads,
                "batches": [
                    {
                        "index": b.index,
                        "epoch": b.epoch,
                        "data": b.data,
                        "raw": b.raw,
                        "files": _relative(b.files, run.data_root),
                        "loss": list(b.loss) if b.loss is not None else None,
                    }
                    for b in s.batches
                ],
            }
            for s in run.steps
        ],
    }


def save_run(
    path: str | os.PathLike[str],
    run: RunRecord,
    *,
    profile: str,
    args: Mapping[str, Any],
    steps_requested: int | None,
    device: str,
) -> Path:
    """Write ``run``'s fingerprints to ``path`` atomically and return the path.

    Raises:
        ConfigError: The run was not recorded in portable mode (its digests would not compare elsewhere).
    """
    if not run.portable:
        raise ConfigError("this run was not recorded with portable digests; record it with verify(..., portable=True)")
    data = {
        "schema": SAVED_SCHEMA,
        "version": SAVED_VERSION,
        "digest": DIGEST,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "profile": profile,
        "args": {k: v for k, v in args.items() if k not in {"project", "name"}},
        "steps_requested": steps_requested,
        "device": device,
        "run": _run_to_dict(run),
        "record": run.record or {},
    }
    return atomic_write_text(path, json.dumps(data, sort_keys=True, separators=(",", ":"), default=str) + "\n")


def _step_from(data: Mapping[str, Any]) -> StepRecord:
    batches = [
        MicroBatch(
            index=int(b.get("index") or 0),
            epoch=int(b.get("epoch") or 0),
            data=b["data"],
            raw=b.get("raw"),
            files=tuple(b.get("files") or ()),
            loss=tuple(float(x) for x in b["loss"]) if b.get("loss") is not None else None,
        )
        for b in data["batches"]
    ]
    return StepRecord(
        step=int(data.get("step") or 0),
        epoch=int(data.get("epoch") or 0),
        batches=batches,
        grads=list(data["grads"]),
        scale=float(data.get("scale", 1.0) or 0.0),
        weights=data.get("weights"),
    )


def read_saved(data: Any, path: str | os.PathLike[str] = "<data>") -> Saved:
    """Validate parsed file content against the format :func:`save_run` writes and return it as a :class:`Saved`.

    Every field is type-checked (and the determinism record compared with itself) here, before any training,
    so a malformed file is one line and never a failure after the run.

    Raises:
        ConfigError: Not such a file, a newer version, or a malformed entry (one line naming it).
    """
    if not isinstance(data, Mapping) or data.get("schema") != SAVED_SCHEMA:
        raise _fail(path, f"no '{SAVED_SCHEMA}' schema (write one with `yolo-det verify --save FILE`)")
    version = data.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise _fail(path, f"invalid version {short(version)}")
    if version > SAVED_VERSION:
        raise ConfigError(
            f"'{path}' is version {version} of the verify --save format; this yolo-det reads up to "
            f"version {SAVED_VERSION}: upgrade yolo-det on this machine"
        )
    if data.get("digest") != DIGEST:
        raise _fail(path, f"digests of kind {short(data.get('digest'))}, this yolo-det computes {DIGEST!r}")
    run_data = data.get("run")
    if (
        not isinstance(run_data, Mapping)
        or not isinstance(run_data.get("steps"), list)
        or not isinstance(run_data.get("param_names"), list)
    ):
        raise _fail(path, "no recorded run")
    check_saved_schema(data, path)
    steps = [_step_from(s) for s in run_data["steps"]]
    run = RunRecord(
        index=1,
        param_names=list(run_data["param_names"]),
        loss_names=list(run_data.get("loss_names") or []),
        steps=steps,
        weights=dict(run_data.get("weights") or {}),
        optimizer_steps=int(run_data.get("optimizer_steps") or len(steps)),
        portable=True,
        device_type=str(run_data.get("device_type") or ""),
    )
    found = data.get("record")
    record = dict(found) if isinstance(found, Mapping) else {}
    if record:
        try:  # the environment comparison made after training, tried now on the record itself
            diff_records(record, record)
        except ConfigError as e:
            raise _fail(path, f"its determinism record: {' '.join(str(e).split())}") from None
        except (TypeError, ValueError, KeyError, AttributeError, RecursionError) as e:
            raise _fail(path, f"its determinism record is malformed ({type(e).__name__})") from None
    steps_requested = data.get("steps_requested")
    return Saved(
        path=str(path),
        version=version,
        run=run,
        record=record,
        profile=str(data.get("profile") or ""),
        args=dict(data.get("args") or {}),
        device=str(data.get("device") or ""),
        created=str(data.get("created") or ""),
        steps_requested=steps_requested if isinstance(steps_requested, int) else None,
    )


def load_saved(path: str | os.PathLike[str]) -> Saved:
    """Read and validate a file written by :func:`save_run` (see :func:`read_saved`)."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(f"--against file '{p}' does not exist")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:  # RecursionError: nested too deep
        raise _fail(p, f"not JSON ({type(e).__name__})") from None
    saved = read_saved(data, p)
    gate_saved(saved)
    return saved


def gate_saved(saved: Saved) -> None:
    """Pass every path a baseline carries (its Ultralytics arguments, its record's ``run`` section) through the
    one gate, as ``data=`` on the command line is: a baseline is a file from others.

    Raises:
        ConfigError, ModelError: One line naming the file refused and the baseline that named it.
    """
    from ...analysis.gate import check_sourced

    source = f"the verify baseline '{saved.path}'"
    check_sourced(saved.args, source)
    run = saved.record.get("run") if isinstance(saved.record, Mapping) else None
    if isinstance(run, Mapping):
        check_sourced(run, source)


# ---------------------------------------------------------------------------------------------------------
# comparing


@dataclass
class AgainstReport:
    """This run compared with a saved one.

    Attributes:
        saved: The saved file's path.
        divergence: The first difference (None: bitwise identical at every step and at the end).
        parameters: For a gradient or weights divergence, the names of the parameters whose gradients differ
            at that step (model order).
        environment: The environment differences between the two records (None when a record is missing).
        steps: ``[saved, here]`` optimizer steps recorded.
        weights: ``[saved, here]`` final weights digests.
    """

    saved: str
    divergence: Divergence | None
    parameters: list[str] = field(default_factory=list)
    environment: DiffReport | None = None
    steps: list[int] = field(default_factory=list)
    weights: list[dict[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    across_devices: bool = False
    nothing_compared: list[str] = field(default_factory=list)
    evidence: dict[str, Any] = field(default_factory=dict)

    @property
    def identical(self) -> bool:
        """True when everything compared matches (across device types: the data and losses only)."""
        return self.divergence is None

    @property
    def verified(self) -> bool:
        """True only when the runs are shown bitwise identical: everything matches and gradients and weights were
        compared (same device type). The saved file's device type only decides what can be compared; a
        comparison it rules out is never a pass."""
        return self.identical and not self.across_devices and not self.nothing_compared

    @property
    def exit_code(self) -> int:
        """0 when verified, 1 when something differs or could not be compared (another device type), 3 when
        everything matches but the weights never changed (nothing compared)."""
        if self.verified:
            return 0
        return 3 if self.identical and not self.across_devices else 1

    @property
    def verdict(self) -> str:
        """One line for people."""
        n = self.steps[0] if self.steps else 0
        if self.divergence is None and self.across_devices:
            return (
                f"not verified: the loader's batches, image files and losses match the saved run at all {n} steps, "
                "but gradients and weights were not compared (another device type)"
            )
        if self.divergence is None and self.nothing_compared:
            return f"{NOTHING}: data, loss, gradients and weights match at all {n} steps, but the weights never changed"
        if self.divergence is None:
            return f"bitwise identical to the saved run: data, loss, gradients and weights match at all {n} steps"
        d = self.divergence
        where = f"step {d.step}" + (f" (epoch {d.epoch + 1})" if d.epoch is not None else "")
        return f"differs from the saved run at {where}: {d.kind}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data (schema ``yolo-det/verify-against/1``)."""
        d = self.divergence
        return {
            "schema": "yolo-det/verify-against/1",
            "saved": self.saved,
            "identical": self.verified,
            "matched": self.identical,
            "gradients_compared": not self.across_devices,
            "verdict": self.verdict,
            "evidence": self.evidence,
            "nothing_compared": self.nothing_compared,
            "steps": self.steps,
            "weights": self.weights,
            "first_divergence": None
            if d is None
            else {
                "step": d.step,
                "epoch": d.epoch,
                "kind": d.kind,
                "detail": d.detail,
                "differs": {"data": d.data_differs, "loss": d.loss_differs, "gradients": d.gradients_differ},
                "loss_components": d.loss_components,
                "parameter": d.parameter,
                "parameters": self.parameters,
                "parameters_differing": d.parameters_differing,
                "parameters_total": d.parameters_total,
                "files": d.files,
                "note": d.note,
                "cause": d.cause,
            },
            "environment": self.environment.to_dict() if self.environment is not None else None,
            "notes": self.notes,
        }

    def summary(self) -> str:
        """Lines for the terminal."""
        lines = [f"against {self.saved}: {self.verdict}"]
        e = self.evidence
        if e:
            changed = (
                "" if e["steps_changing_weights"] is None else f" ({e['steps_changing_weights']} changed the weights)"
            )
            lines.append(
                f"  compared: {e['optimizer_steps']} optimizer steps{changed}, {e['tensors']} parameter tensors "
                f"({e['elements']} elements)"
            )
        lines.extend(f"  nothing compared: {why}" for why in self.nothing_compared)
        d = self.divergence
        if d is not None:
            lines.append(f"  {d.detail}")
            if d.cause:
                lines.append(f"  cause: {printable(d.cause, newlines=False)}")
            if d.files:
                lines.append(f"  saved images: {', '.join(d.files[0][:4])}")
                lines.append(f"  here:         {', '.join(d.files[1][:4])}")
            for name, (a, b) in list(d.loss_components.items())[:4]:
                lines.append(f"  {name}: saved {a!r} | here {b!r}")
            if self.parameters:
                more = f" and {len(self.parameters) - 5} more" if len(self.parameters) > 5 else ""
                lines.append(
                    f"  gradients differ for {len(self.parameters)} of {d.parameters_total} parameters: "
                    f"{', '.join(self.parameters[:5])}{more}"
                )
            if d.note:
                lines.append(f"  note: {d.note}")
        env = self.environment
        if env is not None:
            causes = env.causes
            if causes:
                lines.append("environment differences that can change the bits (saved | here), most likely first:")
                lines.extend(f"  {c.name}: {_show(c.a)} | {_show(c.b)}" for c in causes)
            else:
                lines.append("environment: configured the same (no difference that can change the bits)")
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)


def _show(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    text = printable(text, newlines=False)  # a value from the saved file never starts a line of its own
    return text if len(text) <= 80 else text[:77] + "..."


def _comparable(run: RunRecord, *, index: int, across_devices: bool) -> RunRecord:
    """``run`` with its image files named relative to the dataset root, as in a saved file; across device
    types, the data digests are those of the loader's (CPU) batches and the gradients and weights are blanked."""
    root = run.data_root if index == 2 else ""  # a saved run's files are already relative

    def batch(b: MicroBatch) -> MicroBatch:
        data = (b.raw or "not recorded") if across_devices else b.data
        files = tuple(_relative(b.files, root)) if root else b.files
        return MicroBatch(index=b.index, epoch=b.epoch, data=data, loss=b.loss, files=files, raw=b.raw)

    steps = [
        StepRecord(
            step=s.step,
            epoch=s.epoch,
            scale=s.scale,
            grads=["not compared"] * len(s.grads) if across_devices else s.grads,
            weights=None if across_devices else s.weights,
            batches=[batch(b) for b in s.batches],
        )
        for s in run.steps
    ]
    return RunRecord(
        index=index,
        param_names=run.param_names,
        loss_names=run.loss_names,
        steps=steps,
        weights={} if across_devices else dict(run.weights),
        optimizer_steps=run.optimizer_steps,
        portable=run.portable,
        device_type=run.device_type,
    )


def compare_against(saved: Saved, run: RunRecord) -> AgainstReport:
    """Compare a run recorded here (in portable mode) with a saved one.

    Raises:
        ConfigError: ``run`` was not recorded in portable mode.
    """
    if not run.portable:
        raise ConfigError("this run was not recorded with portable digests; record it with verify(..., portable=True)")
    across = bool(saved.run.device_type and run.device_type and saved.run.device_type != run.device_type)
    ref = _comparable(saved.run, index=1, across_devices=across)
    cur = _comparable(run, index=2, across_devices=across)
    report = AgainstReport(
        saved=saved.path,
        divergence=None,
        steps=[len(ref.steps), len(cur.steps)],
        weights=[dict(saved.run.weights), dict(run.weights)],
    )
    report.across_devices = across
    report.evidence = {
        "optimizer_steps": min(len(ref.steps), len(cur.steps)),
        "steps_changing_weights": run.steps_changing_weights,
        "weights_changed": None if not run.initial_params else not run.weights_unchanged,
        "tensors": len(run.param_names),
        "elements": run.param_elements,
    }
    why = nothing_trained(run, "this run")
    report.nothing_compared = [why] if why else []
    if across:
        report.notes.append(
            f"the saved run trained on {saved.run.device_type}, this one on {run.device_type}: the "
            "loader's batches, image files and losses are compared; gradients and weights are not "
            "(their digests are computed differently, and the values are not expected to agree)"
        )
    if saved.record and run.record:
        report.environment = diff_records(saved.record, run.record, a=f"saved ({saved.path})", b="here")
    else:
        report.notes.append(
            "no determinism.json for "
            + ("the saved run" if not saved.record else "this run")
            + ": the environments are not compared"
        )
    if ref.param_names != cur.param_names:
        first = next(
            (f"{a} vs {b}" for a, b in zip(ref.param_names, cur.param_names) if a != b),
            f"{len(ref.param_names)} vs {len(cur.param_names)} parameters",
        )
        report.divergence = Divergence(
            run=2,
            step=0,
            epoch=None,
            kind="model",
            detail=f"model: the trainable parameters differ ({first}): not the same model",
        )
        return report
    div = compare_runs(ref, cur)
    weights_step = next(
        (
            a.step
            for a, b in zip(ref.steps, cur.steps)
            if a.weights is not None and b.weights is not None and a.weights != b.weights
        ),
        None,
    )
    if weights_step is not None and (div is None or div.step > weights_step):
        s = cur.steps[weights_step - 1]
        div = Divergence(
            run=2,
            step=weights_step,
            epoch=s.epoch,
            kind="weights",
            detail="weights: same data, loss and gradients at this step, different parameters after it "
            "(the optimizer update differs)",
            parameters_total=len(ref.param_names),
        )
    if div is not None:
        if div.step >= 1 and div.step <= min(len(ref.steps), len(cur.steps)):
            a, b = ref.steps[div.step - 1], cur.steps[div.step - 1]
            report.parameters = [n for n, x, y in zip(ref.param_names, a.grads, b.grads) if x != y]
            if div.kind in {"gradients", "data", "loss"} and report.parameters:
                div.parameter = report.parameters[0]
                div.note = "the saved file holds digests only, so the size of the difference is not known"
                div.top = []
        if div.kind == "weights" and not report.parameters:
            div.parameter = None
            div.note = None
    report.divergence = _data_first(div, saved.record, run.record)
    return report


def _data_first(
    div: Divergence | None, saved: Mapping[str, Any] | None, here: Mapping[str, Any] | None
) -> Divergence | None:
    """Name the data first when the records' ``data_stream`` sections say the runs trained on different batches.

    The fingerprint of the first batches (taken before anything else of the run touches them) differing makes
    ``data`` the first divergence, at the first step, whatever the step records say later (loss, gradients,
    weights, steps); a ``data`` divergence gets the cause the sections give (see
    :func:`yolo_det.tools.data_stream.explain_data_stream`).
    """
    sa = (saved or {}).get("data_stream")
    sb = (here or {}).get("data_stream")
    if sa is None and sb is None:
        return div
    reasons = explain_data_stream(sa, sb)
    causes = [r for r in reasons if r.changes_data and r.name != _FIRST_BATCHES]
    first = next((r for r in reasons if r.name == _FIRST_BATCHES and r.changes_data), None)
    if first is not None and (div is None or div.kind != "data"):
        epoch = sb.get("fingerprint_epoch") if isinstance(sb, Mapping) else None
        div = Divergence(
            run=2,
            step=1,
            epoch=epoch if isinstance(epoch, int) else None,
            kind="data",
            detail="data: the first batches the runs trained on differ (the records' data-stream fingerprints)",
            data_differs=True,
        )
    if div is not None and div.kind == "data" and causes:
        div.cause = "; ".join(
            f"{r.name.removeprefix('data stream: ')} (saved {_show(r.a)} | here {_show(r.b)}): {r.note}" for r in causes
        )
    return div
