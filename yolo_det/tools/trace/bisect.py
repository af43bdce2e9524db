"""Comparing two op traces: the first step where they part, and in it the first op whose output differs.

Steps are aligned by iteration (micro-batches since epoch 0), so a resumed run lines up with its
uninterrupted twin. Within a step the order is the order the data flows: the state the step starts from
(every parameter and buffer), then per micro-batch the batch, the forward calls in the order they ended,
the backward in the order autograd ran it (per module: the gradient reaching its outputs is its input, the
gradients of its inputs and of its own parameters its output), then the optimizer (its hyper-parameters,
then per parameter the gradient applied and the weights after). The first op whose output differs is
named, with whether its inputs are equal on both sides (they are when the runs part at that op) and the
settings of both traces that can change it.

The runs' records (beside a run folder's trace, or the record of the run a replayed checkpoint came from) are
read too, and compared by :func:`yolo_det.tools.diff.diff_records`: the settings that differ are named with the
parting (an augmentation argument such as ``close_mosaic`` for a batch of other pixels, the threads for a
checkpoint made elsewhere), and when every traced step agrees but the final weights differ, the answer is that
the runs part after the traced window, never "equal".
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ...core.errors import ConfigError, YoloDetError
from ...core.record_schema import RECORD_NAME, parse_record
from ..diff import diff_records, load_record
from .report import BisectReport, Parting
from .tracefile import Micro, Trace, TraceStep, read_trace
from .tracer import trace_path

__all__ = ["bisect_paths", "bisect_traces", "record_beside", "resolve_trace"]

_COMMON = ("torch", "device", "deterministic_algorithms", "amp")
_CPU = (
    "threads",
    "interop_threads",
    "cpu_capability",
    "mkldnn",
    "cpu",
    "env:ATEN_CPU_CAPABILITY",
    "env:ONEDNN_MAX_CPU_ISA",
    "env:MKL_CBWR",
    "env:OMP_NUM_THREADS",
    "env:MKL_NUM_THREADS",
)
_CUDA = (
    "gpu",
    "cuda",
    "cudnn",
    "cudnn_enabled",
    "cudnn_benchmark",
    "cudnn_deterministic",
    "tf32_matmul",
    "tf32_cudnn",
    "float32_matmul_precision",
    "env:CUBLAS_WORKSPACE_CONFIG",
)


def _why_no_trace(folder: Path) -> str:
    """What the run's record says of its ``--trace-ops`` request (asked, and what ran), or what to do."""
    try:
        record = parse_record((folder / RECORD_NAME).read_bytes())
    except (OSError, YoloDetError):
        record = {}
    asked = record.get("op_trace")
    if not isinstance(asked, Mapping):
        return "train with --trace-ops STEPS"
    ran = asked.get("steps_run")
    return (
        f"it was trained with --trace-ops {asked.get('asked')}, but the run made {ran} optimizer step"
        f"{'s' if ran != 1 else ''}, so none of those ran; train again with steps that run "
        f"(--trace-ops first:{min(3, ran) if isinstance(ran, int) and ran > 0 else 1})"
    )


def resolve_trace(source: str | os.PathLike[str], rank: int = 0) -> Path:
    """A trace file, or the rank's trace in a run folder (or beside a ``verify --save`` file)."""
    p = Path(source).expanduser()
    if p.is_file() and p.name == RECORD_NAME:  # a run's determinism.json stands for its folder
        p = p.parent
    if p.is_dir():
        found = trace_path(p, rank)
        if not found.is_file():
            raise ConfigError(f"'{p}' holds no op trace for rank {rank} ({found.name}); {_why_no_trace(p)}")
        return found
    if p.suffix == ".json" and p.with_suffix(".ops.jsonl").is_file():
        return p.with_suffix(".ops.jsonl")
    return p


def record_beside(source: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The record of the run a trace came from (a run folder, its ``determinism.json``, its trace, or a ``verify
    --save`` file), or None when there is none; an unreadable one is refused as ``yolo-det diff`` refuses it."""
    p = Path(source).expanduser()
    if p.is_file() and p.suffix == ".jsonl":
        saved = p.with_name(p.name.removesuffix(".ops.jsonl") + ".json")  # verify --save FILE: FILE.ops.jsonl
        p = saved if p.name.endswith(".ops.jsonl") and saved.is_file() else p.parent
    if p.is_dir() and not (p / RECORD_NAME).is_file():
        return None
    if not p.exists():
        return None
    return load_record(p)[0]


def _hyper(a: tuple[tuple[tuple[str, float], ...], ...], b: tuple[tuple[tuple[str, float], ...], ...]) -> str:
    """The hyper-parameters that differ, per parameter group: ``group 0: lr 0.01 | 0.002``."""
    if len(a) != len(b):
        return f"{len(a)} parameter groups in A, {len(b)} in B"
    parts = []
    for i, (ga, gb) in enumerate(zip(a, b)):
        da, db = dict(ga), dict(gb)
        changed = [f"{k} {da[k]:.6g} | {db[k]:.6g}" for k in sorted(set(da) & set(db)) if da[k] != db[k]]
        changed += [f"{k} only in {'A' if k in da else 'B'}" for k in sorted(set(da) ^ set(db))]
        if changed:
            parts.append(f"group {i}: {', '.join(changed)}")
    return "; ".join(parts)


def _module_of(name: str, modules: Mapping[str, Any]) -> str:
    """The module a call key, parameter or buffer belongs to."""
    base = name.split("#", 1)[0]
    if base in modules:
        return base
    return base.rpartition(".")[0]


class _Cmp:
    def __init__(self, a: Trace, b: Trace, causes: list[str]) -> None:
        self.a, self.b = a, b
        self.count = 0
        self.notes: list[str] = []
        self.causes = causes  # the settings the runs' records differ in, most likely first

    def because(self, generic: str) -> str:
        """The settings the records differ in, or ``generic`` when the records name none (or were not found)."""
        return f"the runs' settings differ: {'; '.join(self.causes[:3])}" if self.causes else generic

    def settings(self, module: str) -> list[list[Any]]:
        keys = _COMMON + (_CUDA if self.a.device_type == "cuda" or self.b.device_type == "cuda" else _CPU)
        out = [[k, self.a.settings.get(k, ""), self.b.settings.get(k, "")] for k in keys]
        ma, mb = self.a.modules.get(module, {}), self.b.modules.get(module, {})
        if module or ma:
            out.append(["layer (swap in force)", ma.get("type", "-"), mb.get("type", "-")])
        return out

    def parting(self, sa: TraceStep, sb: TraceStep, phase: str, op: str, detail: str, **kw: Any) -> Parting:
        module = kw.pop("module", None)
        if module is None:
            module = _module_of(op, self.a.modules) if op else ""
        ma, mb = self.a.modules.get(module, {}), self.b.modules.get(module, {})
        return Parting(
            step=sa.step,
            step_b=sb.step,
            epoch=sa.epoch,
            iteration=sa.iteration,
            phase=phase,
            op=op,
            detail=detail,
            module=module,
            type_a=ma.get("type", ""),
            type_b=mb.get("type", ""),
            extra_a=ma.get("extra", ""),
            extra_b=mb.get("extra", ""),
            settings=self.settings(module) if phase != "data" else [],
            **kw,
        )

    def step(self, sa: TraceStep, sb: TraceStep, first: bool) -> Parting | None:
        state_b = dict(sb.state)
        for name, d in sa.state:
            self.count += 1
            if name not in state_b:
                return self.parting(sa, sb, "structure", name, f"'{name}' is in A's model and not in B's")
            if state_b[name] != d:
                if sa.iteration != sb.iteration:
                    return self.parting(
                        sa,
                        sb,
                        "state",
                        name,
                        f"{name}: the steps start from different states at different iterations (A {sa.iteration}, "
                        f"B {sb.iteration}, epochs {sa.epoch + 1} and {sb.epoch + 1}): the runs resumed from "
                        "different epochs",
                    )
                why = (
                    "the step starts from different weights or buffers (the runs started from different states: "
                    f"{self.because('another checkpoint or epoch')})"
                    if first
                    else "the step starts from different weights or buffers, though the previous step ended equal "
                    "(something outside the training step changed them)"
                )
                return self.parting(sa, sb, "state", name, f"{name}: {why}")
        if len(sa.micro) != len(sb.micro):
            return self.parting(
                sa,
                sb,
                "structure",
                "",
                f"{len(sa.micro)} micro-batches in A, {len(sb.micro)} in B (batch or nbs differ)",
            )
        for i, (ma, mb) in enumerate(zip(sa.micro, sb.micro)):
            found = self.micro(sa, sb, i, ma, mb)
            if found is not None:
                return found
        return self.optimizer(sa, sb)

    def micro(self, sa: TraceStep, sb: TraceStep, i: int, ma: Micro, mb: Micro) -> Parting | None:
        self.count += 2
        if ma.files != mb.files:
            return self.parting(
                sa, sb, "data", "batch", "the batch holds other images (the data order differs)", micro=i, module=""
            )
        if ma.data != mb.data:
            return self.parting(
                sa,
                sb,
                "data",
                "batch",
                f"same images, different pixels or labels ({self.because('augmentation randomness')})",
                micro=i,
                module="",
            )
        calls_b = {c.key: c for c in mb.forward}
        for c in ma.forward:
            self.count += 1
            other = calls_b.get(c.key)
            if other is None:
                return self.parting(sa, sb, "structure", c.key, f"'{c.key}' ran in A's forward, not in B's", micro=i)
            if other.outputs != c.outputs:
                n_out = len(c.outputs)
                diff = [k for k, (x, y) in enumerate(zip(c.outputs, other.outputs)) if x != y]
                what = (
                    "its output"
                    if not diff or diff[0] < n_out - self._buffers(c.key)
                    else "a buffer it updates in forward"
                )
                if len(c.outputs) != len(other.outputs):
                    what = "its outputs (another number of tensors)"
                return self.parting(
                    sa,
                    sb,
                    "forward",
                    c.key,
                    f"forward of {c.key or '(the model)'}: {what} differs",
                    micro=i,
                    shapes=list(c.shapes),
                    dtype=c.dtype,
                    inputs_equal=c.inputs == other.inputs,
                )
            self._types(c.key)
        ops_a, ops_b = _backward_ops(ma.backward, self.a.modules), _backward_ops(mb.backward, self.b.modules)
        for key, (ins, outs) in ops_a.items():
            self.count += 1
            other_op = ops_b.get(key)
            if other_op is None:
                return self.parting(sa, sb, "structure", key, f"'{key}' ran in A's backward, not in B's", micro=i)
            if other_op[1] != outs:
                which = sorted(k for k in set(outs) | set(other_op[1]) if outs.get(k) != other_op[1].get(k))
                what = ", ".join(
                    f"gradient of {w[1]}" if w[0] == "p" else f"gradient of input {w[1]}" for w in which[:3]
                )
                return self.parting(
                    sa,
                    sb,
                    "backward",
                    key,
                    f"backward of {key or '(the model)'}: {what} differs",
                    micro=i,
                    inputs_equal=ins == other_op[0],
                )
        return None

    def _buffers(self, key: str) -> int:
        """How many of the call's digests are the module's own buffers (after its outputs)."""
        count = self.a.modules.get(key.split("#", 1)[0], {}).get("buffers", 0)
        return count if isinstance(count, int) else 0

    def _types(self, key: str) -> None:
        name = key.split("#", 1)[0]
        ta, tb = self.a.modules.get(name, {}).get("type"), self.b.modules.get(name, {}).get("type")
        note = f"{name}: {ta} in A, {tb} in B, with equal outputs"
        if ta != tb and note not in self.notes and len(self.notes) < 20:
            self.notes.append(note)

    def optimizer(self, sa: TraceStep, sb: TraceStep) -> Parting | None:
        self.count += 1
        if sa.hyper != sb.hyper:
            return self.parting(
                sa,
                sb,
                "optimizer",
                "hyper-parameters",
                f"the optimizer's hyper-parameters differ (A | B): {_hyper(sa.hyper, sb.hyper)}",
                module="",
            )
        if not (sa.scale is sb.scale or sa.scale == sb.scale):  # a NaN read from a trace is one object
            return self.parting(sa, sb, "optimizer", "AMP scale", f"AMP scale {sa.scale} | {sb.scale}", module="")
        opt_b = {n: (g, w) for n, g, w in sb.optimizer}
        for name, g, w in sa.optimizer:
            self.count += 1
            other = opt_b.get(name)
            if other is None:
                return self.parting(sa, sb, "structure", name, f"'{name}' is trained in A and not in B")
            if other[1] != w:
                return self.parting(
                    sa,
                    sb,
                    "optimizer",
                    name,
                    f"the update of {name}: the weights after the step differ",
                    inputs_equal=other[0] == g,
                )
        return None


def _backward_ops(
    events: Iterable[tuple[str, str, int, str]], modules: Mapping[str, Any]
) -> dict[str, tuple[dict[Any, str], dict[Any, str]]]:
    """Per module call, in the order its first output was computed: (gradients in, gradients out)."""
    ops: dict[str, tuple[dict[Any, str], dict[Any, str]]] = {}
    order: list[str] = []
    for kind, key, index, digest in events:
        owner = _module_of(key, modules) if kind == "grad" else key
        ins, outs = ops.setdefault(owner, ({}, {}))
        if kind == "gout":
            ins[index] = digest
            continue
        outs[("p", key) if kind == "grad" else ("i", str(index))] = digest
        if owner not in order:
            order.append(owner)
    return {k: ops[k] for k in order}


def bisect_traces(
    a: Trace,
    b: Trace,
    records: tuple[Mapping[str, Any] | None, Mapping[str, Any] | None] = (None, None),
    *,
    compare_weights: bool = True,
) -> BisectReport:
    """Compare two traces (see the module docstring), with the runs' records when there are (``records``).

    ``compare_weights``: whether the records' final weights belong to the traced runs (not for a replayed step).

    Raises:
        ConfigError: Digests of different device types (not comparable), or no step both traced.
    """
    if a.device_type != b.device_type:
        raise ConfigError(
            f"A trained on {a.device_type}, B on {b.device_type}: op digests compare only between runs on the same "
            "device type"
        )
    if not a.steps or not b.steps:
        empty = a.path if not a.steps else b.path
        raise ConfigError(f"'{empty}' holds no traced step (the run ended before the steps --trace-ops named)")
    ra, rb = records
    diff = diff_records(ra, rb) if ra is not None and rb is not None else None
    weights_equal = None  # known only when both runs finished and their records are the traced runs'
    if diff is not None and compare_weights and set(diff.status.values()) == {"completed"}:
        weights_equal = diff.weights_equal
    causes = [d.brief() for d in diff.causes] if diff is not None else []
    by_iter = {s.iteration: s for s in b.steps}
    common = [(s, by_iter[s.iteration]) for s in a.steps if s.iteration in by_iter]
    cmp = _Cmp(a, b, causes)
    if not common:  # e.g. two resumes from different epochs: compare the steps by their number in each process
        by_step = {s.step: s for s in b.steps}
        common = [(s, by_step[s.step]) for s in a.steps if s.step in by_step]
        if not common:
            raise ConfigError(
                f"the traces share no step (A traced steps {[s.step for s in a.steps][:6]}, B "
                f"{[s.step for s in b.steps][:6]}); trace the same steps on both sides"
            )
        cmp.notes.append(
            f"no iteration is traced on both sides (A starts at iteration {a.steps[0].iteration}, B at "
            f"{b.steps[0].iteration}): steps are paired by their number in each process"
        )
    if a.rank != b.rank:
        cmp.notes.append(f"A is rank {a.rank}, B rank {b.rank}")
    only = len(a.steps) + len(b.steps) - 2 * len(common)
    if only:
        cmp.notes.append(f"{only} traced steps are on one side only and are not compared")
    parting = None
    n = 0
    for n, (sa, sb) in enumerate(common, start=1):
        parting = cmp.step(sa, sb, first=n == 1)
        if parting is not None:
            break
    if diff is None:
        cmp.notes.append("the runs' records were not both found: the settings they differ in are not named")
    return BisectReport(
        a=a.path,
        b=b.path,
        parting=parting,
        steps_compared=n,
        ops_compared=cmp.count,
        notes=cmp.notes,
        causes=causes,
        weights_equal=weights_equal,
    )


def bisect_paths(
    a: str | os.PathLike[str],
    b: str | os.PathLike[str],
    *,
    rank: int = 0,
    rank_b: int | None = None,
    record_b: str | os.PathLike[str] | None = None,
) -> BisectReport:
    """Read two traces (files or run folders) and the runs' records, and compare them (see :func:`bisect_traces`).

    ``record_b``: where B's record is, when it is not beside B's trace (the run a replayed checkpoint came from:
    its settings are compared, not its final weights).
    """
    ta = read_trace(resolve_trace(a, rank))
    tb = read_trace(resolve_trace(b, rank if rank_b is None else rank_b))
    records = (record_beside(a), record_beside(b if record_b is None else record_b))
    return bisect_traces(ta, tb, records, compare_weights=record_b is None)
