"""Train the same configuration several times and prove the runs bitwise identical, or find where they split.

:func:`verify` trains N times (default 2) under a profile, each run a fresh ``ultralytics.YOLO`` with the
profile attached exactly as ``yolo-det train`` does, and records per optimizer step:

- per micro-batch: a digest of the preprocessed input batch (images, labels, every tensor in it), the
  image files (the data order) and the loss components;
- a digest per parameter of the gradient the optimizer is about to apply, and the AMP scale;

and at the end the weights digests (model and EMA, as in ``determinism.json``). Digests are exact (see
:mod:`yolo_det.fingerprint`: any changed bit changes them) and cheap (hashed where the tensor lives).

What is kept beyond digests is what naming the parameter and the size of the first difference needs:
the first run (the reference) keeps a CPU copy of its gradients for as many early steps as
``keep_mib`` allows (non-determinism almost always shows at the first step), a later run copies only
the gradients that differ, at the first step where they differ (it compares live against the
reference), and the reference keeps its final state dict so the final weights can be compared too.

The report says "bitwise identical" or gives the first divergence: the step, what differed first
(``data`` (order or content), ``loss``, ``gradients``, ``weights``, or the number of ``steps``), the
parameter whose gradient differs most and by how much. Hooks: the recorder wraps the trainer's
``preprocess_batch`` and ``optimizer_step`` on the instance (from ``on_pretrain_routine_end``) and puts them
back at ``teardown``; ``steps=K`` sets ``trainer.stop`` after the K-th optimizer step.

In-process runs share one process, so non-determinism that only shows across processes (cuDNN's
autotuning cache under ``cudnn_benchmark``, hash seeds) can stay hidden; compare ``determinism.json``
digests of separate ``yolo-det train`` runs for that.
"""

from __future__ import annotations

import math
import struct
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from . import state as _state
from .errors import ConfigError
from .fingerprint import combine, tensor_digests
from .profiles import Profile, load_profile
from .record import state_dict_digest
from .runtime import new_figure, quiet_ultralytics, run_folder, save_figure, unwrap_model

__all__ = [
    "Divergence",
    "MicroBatch",
    "RunRecord",
    "StepRecord",
    "VerifyReport",
    "check_args",
    "compare_runs",
    "plot_losses",
    "progress_to_stderr",
    "record_runs",
    "verify",
]

SCHEMA = "yolo-det/verify/1"
DEFAULT_KEEP_MIB = 64
#: Ultralytics arguments verify refuses: they make runs differ on purpose or leave the single process.
RESERVED = {
    "resume": "verify trains fresh runs; resuming would compare different trainings",
    "time": "time-limited training stops after a wall-clock time, not a step count; use --steps",
}
_MISSING = object()
_MAX_INFLIGHT = 2  # CPU steps whose gradient copies may wait for their digests at once
#: What torch says when strict deterministic mode meets a kernel without a deterministic implementation.
NONDETERMINISTIC_KERNEL = "does not have a deterministic implementation"


@dataclass
class MicroBatch:
    """One forward/backward pass.

    Attributes:
        index: Iteration number in the run (0-based, across epochs).
        epoch: Epoch (0-based).
        data: Digest of the preprocessed batch (every tensor: images, classes, boxes, indices).
        files: The batch's image files, in order (empty when the dataset gives none).
        loss: Loss components after the forward pass (``None`` until known).
    """

    index: int
    epoch: int
    data: str
    files: tuple[str, ...] = ()
    loss: tuple[float, ...] | None = None


@dataclass
class StepRecord:
    """One optimizer step: its micro-batches and the gradients the optimizer applied.

    Attributes:
        step: 1-based optimizer step.
        epoch: Epoch (0-based) of the step.
        batches: The micro-batches accumulated into this step.
        grads: Digest of each parameter's gradient (order of :attr:`RunRecord.param_names`; ``"none"``
            when a parameter had no gradient).
        scale: The AMP grad-scaler scale (1.0 without AMP); gradients are recorded scaled.
    """

    step: int
    epoch: int
    batches: list[MicroBatch]
    grads: list[str]
    scale: float = 1.0

    @property
    def loss(self) -> float | None:
        """Mean over the micro-batches of the summed loss components (for plots)."""
        totals = [sum(b.loss) for b in self.batches if b.loss is not None]
        return sum(totals) / len(totals) if totals else None


@dataclass
class RunRecord:
    """What one run recorded.

    Attributes:
        index: 1-based run number.
        param_names: Names of the trainable parameters, in recording order.
        loss_names: Names of the loss components.
        steps: One record per optimizer step.
        weights: ``{"model": sha256, "ema": sha256}`` of the final weights (see :mod:`yolo_det.record`).
        seconds: Wall time of the run (``model.train``).
        save_dir: The run folder.
        kept: Gradient values kept on the CPU, ``{step: {parameter: tensor}}`` (scaled like the digests).
        final_diff: For a run after the first: ``[(parameter, max |difference|)]`` of the final model state
            against the reference, largest first (empty when equal).
        final_state: The reference's final model state (CPU copy), compared with the later runs'.
        kept_until: The last step whose gradient values the reference kept.
        optimizer_steps: Optimizer steps the run made (counted even when nothing is recorded).
    """

    index: int
    param_names: list[str] = field(default_factory=list)
    loss_names: list[str] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    weights: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    save_dir: str = ""
    kept: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)
    final_state: dict[str, torch.Tensor] | None = None
    final_diff: list[tuple[str, float]] = field(default_factory=list)
    kept_until: int = 0
    optimizer_steps: int = 0

    def losses(self) -> list[float | None]:
        """The loss per step (see :attr:`StepRecord.loss`)."""
        return [s.loss for s in self.steps]


@dataclass
class Divergence:
    """Where two runs first differ.

    Attributes:
        run: The run compared with the reference (run 1).
        step: 1-based optimizer step (for ``weights``: the last step).
        epoch: Epoch (0-based) of that step, or None.
        kind: What differed first: ``data``, ``loss``, ``gradients``, ``weights`` or ``steps``.
        detail: One sentence for people.
        data_differs, loss_differs, gradients_differ: Which records differ at that step.
        loss_components: ``{name: [reference, run]}`` of the components that differ.
        parameter: The parameter whose value differs most (gradient at the step, or final weight).
        max_abs_diff: Its largest absolute difference (gradients unscaled from AMP), or None when the values
            were not kept.
        reference_abs_max: The largest absolute value of that parameter in the reference.
        parameters_differing: How many parameters' gradients (or weights) differ.
        parameters_total: How many were compared.
        top: Up to five ``{"parameter", "max_abs_diff"}``, largest first.
        files: ``[reference files, run files]`` of the first micro-batch whose data differs.
        note: Why a value is missing, if one is.
    """

    run: int
    step: int
    epoch: int | None
    kind: str
    detail: str
    data_differs: bool = False
    loss_differs: bool = False
    gradients_differ: bool = False
    loss_components: dict[str, list[float]] = field(default_factory=dict)
    parameter: str | None = None
    max_abs_diff: float | None = None
    reference_abs_max: float | None = None
    parameters_differing: int = 0
    parameters_total: int = 0
    top: list[dict[str, Any]] = field(default_factory=list)
    files: list[list[str]] | None = None
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain data for JSON."""
        return {
            "run": self.run,
            "against": 1,
            "step": self.step,
            "epoch": self.epoch,
            "kind": self.kind,
            "detail": self.detail,
            "differs": {"data": self.data_differs, "loss": self.loss_differs, "gradients": self.gradients_differ},
            "loss_components": self.loss_components,
            "parameter": self.parameter,
            "max_abs_diff": _json_float(self.max_abs_diff),
            "reference_abs_max": _json_float(self.reference_abs_max),
            "parameters_differing": self.parameters_differing,
            "parameters_total": self.parameters_total,
            "top": self.top,
            "files": self.files,
            "note": self.note,
        }


def _json_float(x: float | None) -> float | str | None:
    if x is None:
        return None
    return x if math.isfinite(x) else str(x)


def _same_float(a: float, b: float) -> bool:
    return struct.pack("<d", a) == struct.pack("<d", b)


# ---------------------------------------------------------------------------------------------------------
# recording


class _Recorder:
    """Ultralytics callbacks that record one run (see the module docstring)."""

    def __init__(self, record: RunRecord, *, reference: RunRecord | None, steps: int | None, keep_bytes: int,
                 enabled: bool = True) -> None:
        self.record = record
        self.reference = reference
        self.steps = steps
        self.keep_bytes = keep_bytes
        self.enabled = enabled
        self.kept_bytes = 0
        self.count = 0
        self.iteration = 0
        self._pending: list[MicroBatch] = []
        self._current: MicroBatch | None = None
        self._params: list[tuple[str, torch.nn.Parameter]] = []
        self._saved: dict[str, Any] = {}
        self._trainer: Any = None
        self._captured = False
        self._pool: ThreadPoolExecutor | None = None
        self._inflight: deque[tuple[StepRecord, list[str], dict[str, torch.Tensor], Future[list[str]]]] = deque()

    @property
    def callbacks(self) -> dict[str, Callable[[Any], None]]:
        return {
            "on_pretrain_routine_end": self.on_pretrain_routine_end,
            "on_train_batch_end": self.on_train_batch_end,
            "on_train_end": self.on_train_end,
            "teardown": self.teardown,
        }

    # -- wrapping -----------------------------------------------------------------------------------
    def on_pretrain_routine_end(self, trainer: Any) -> None:
        self._trainer = trainer
        model = unwrap_model(trainer.model)
        self._params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.record.param_names = [n for n, _ in self._params]
        for name in ("preprocess_batch", "optimizer_step"):
            self._saved[name] = trainer.__dict__.get(name, _MISSING)
        original_pre = trainer.preprocess_batch
        original_step = trainer.optimizer_step

        def preprocess_batch(batch: dict[str, Any]) -> dict[str, Any]:
            out = original_pre(batch)
            self._on_batch(trainer, out)
            return out

        def optimizer_step() -> None:
            self._before_step(trainer)
            original_step()
            self.count += 1
            if self.steps is not None and self.count >= self.steps:
                trainer.stop = True

        trainer.preprocess_batch = preprocess_batch
        trainer.optimizer_step = optimizer_step

    def teardown(self, trainer: Any) -> None:
        self._inflight.clear()  # after a failure, digests still pending are of no use
        self._drain()
        for name, value in self._saved.items():
            if value is _MISSING:
                trainer.__dict__.pop(name, None)
            else:
                trainer.__dict__[name] = value
        self._saved.clear()
        self._trainer = None

    # -- per micro-batch ----------------------------------------------------------------------------
    def _on_batch(self, trainer: Any, batch: Mapping[str, Any]) -> None:
        index, self.iteration = self.iteration, self.iteration + 1
        if not self.enabled:
            return
        tensors = [batch[k] for k in sorted(batch) if isinstance(batch[k], torch.Tensor)]
        files = batch.get("im_file", ())
        mb = MicroBatch(index=index, epoch=int(getattr(trainer, "epoch", 0)), data=combine(tensor_digests(tensors)),
                        files=tuple(str(f) for f in files) if isinstance(files, (list, tuple)) else ())
        self._pending.append(mb)
        self._current = mb

    def on_train_batch_end(self, trainer: Any) -> None:
        mb, self._current = self._current, None
        items = getattr(trainer, "loss_items", None)
        if mb is None or items is None:
            return
        if isinstance(items, Mapping):
            if not self.record.loss_names:
                self.record.loss_names = [str(k) for k in items]
            values = list(items.values())
        else:
            values = list(items) if isinstance(items, (list, tuple)) else [items]
        if values and all(isinstance(v, torch.Tensor) for v in values):
            mb.loss = tuple(float(x) for x in torch.stack([v.detach().float().reshape(()) for v in values]).tolist())
        else:
            mb.loss = tuple(float(v) for v in values)

    # -- per optimizer step -------------------------------------------------------------------------
    def _before_step(self, trainer: Any) -> None:
        """Record the gradients the optimizer is about to apply.

        On an accelerator the digests are computed on the device, right away. On a CPU the gradients are
        copied (one memcpy; the copy also serves as the kept values) and hashed on a worker thread:
        hashlib releases the GIL, and Ultralytics trains on one core fewer than the machine has, so the
        hashing overlaps the next steps instead of adding to them.
        """
        if not self.enabled:
            return
        scaler = getattr(trainer, "scaler", None)
        scale = 1.0
        if scaler is not None and getattr(scaler, "is_enabled", lambda: False)():
            scale = float(scaler.get_scale())
        step = StepRecord(step=len(self.record.steps) + 1, epoch=int(getattr(trainer, "epoch", 0)),
                          batches=self._pending, grads=[], scale=scale)
        self._pending = []
        self.record.steps.append(step)
        names = [n for n, _ in self._params]
        present = {n: p.grad for n, p in self._params if p.grad is not None}
        keep = False
        if self.reference is None:
            size = sum(g.numel() * g.element_size() for g in present.values())
            if self.kept_bytes + size <= self.keep_bytes:
                keep = True
                self.kept_bytes += size
                self.record.kept_until = step.step
        if present and all(g.device.type == "cpu" for g in present.values()):
            copies = {n: _host_copy(g) for n, g in present.items()}
            if keep:
                self.record.kept[step.step] = copies
            future = self._executor().submit(tensor_digests, list(copies.values()))
            self._inflight.append((step, names, copies, future))
            while len(self._inflight) > _MAX_INFLIGHT:
                self._resolve_oldest()
            return
        self._finish(step, names, present, tensor_digests(list(present.values())), copied=False)
        if keep:
            self.record.kept[step.step] = {n: _host_copy(g) for n, g in present.items()}

    def _finish(self, step: StepRecord, names: list[str], values: Mapping[str, torch.Tensor], digests: list[str],
                *, copied: bool) -> None:
        """Store ``step``'s gradient digests; a later run keeps the differing gradients of its first differing step."""
        by_name = dict(zip(values, digests))
        step.grads = [by_name.get(n, "none") for n in names]
        if self.reference is None or self._captured:
            return
        ref = self.reference.steps[step.step - 1] if step.step <= len(self.reference.steps) else None
        if ref is None or ref.grads != step.grads or [b.data for b in ref.batches] != [b.data for b in step.batches]:
            self._captured = True
            theirs = dict(zip(names, ref.grads)) if ref is not None else {}
            self.record.kept[step.step] = {n: (v if copied else _host_copy(v)) for n, v in values.items()
                                           if by_name[n] != theirs.get(n)}

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="yolo-det-digest")
        return self._pool

    def _resolve_oldest(self) -> None:
        step, names, copies, future = self._inflight.popleft()
        self._finish(step, names, copies, future.result(), copied=True)

    def _drain(self) -> None:
        """Wait for every pending digest and stop the worker thread."""
        try:
            while self._inflight:
                self._resolve_oldest()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None

    def on_train_end(self, trainer: Any) -> None:
        self._drain()
        model = unwrap_model(trainer.model)
        self.record.weights = {"model": state_dict_digest(model)}
        ema = getattr(getattr(trainer, "ema", None), "ema", None)
        if isinstance(ema, torch.nn.Module):
            self.record.weights["ema"] = state_dict_digest(ema)
        self.record.save_dir = str(getattr(trainer, "save_dir", ""))
        if not self.enabled:
            return
        state = {k: v.detach() for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}
        if self.reference is None:
            self.record.final_state = {k: _host_copy(v) for k, v in state.items()}
        elif self.reference.final_state is not None:
            self.record.final_diff = _state_diff(self.reference.final_state, state)


_NUMPY_DTYPES = {torch.float32, torch.float64, torch.float16, torch.int64, torch.int32, torch.int16, torch.int8,
                 torch.uint8, torch.bool}


def _host_copy(t: torch.Tensor) -> torch.Tensor:
    """A CPU copy of ``t``; for CPU tensors a plain single-threaded memcpy (no intra-op thread pool)."""
    t = t.detach()
    if t.device.type == "cpu" and t.dtype in _NUMPY_DTYPES:
        return torch.from_numpy(t.numpy().copy())
    return t.to("cpu", copy=True)


def _max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest absolute elementwise difference (inf when shapes differ or only one side is NaN)."""
    if a.shape != b.shape:
        return math.inf
    if a.numel() == 0:
        return 0.0
    x, y = a.detach().double().cpu(), b.detach().double().cpu()
    nan_x, nan_y = torch.isnan(x), torch.isnan(y)
    if not torch.equal(nan_x, nan_y):
        return math.inf
    d = (x - y).abs().masked_fill(nan_x, 0.0)
    return float(d.max())


_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors hold the same bits (NaN payloads and signed zeros included)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_floating_point() and a.element_size() in _INT_OF_SIZE:
        kind = _INT_OF_SIZE[a.element_size()]
        return torch.equal(a.contiguous().view(kind), b.contiguous().view(kind))
    return torch.equal(a, b)


def _state_diff(reference: Mapping[str, torch.Tensor], state: Mapping[str, torch.Tensor]) -> list[tuple[str, float]]:
    """``[(key, max |difference|)]`` of the entries whose bits differ, largest first."""
    out = []
    for key in sorted(set(reference) | set(state)):
        a, b = reference.get(key), state.get(key)
        if a is None or b is None:
            out.append((key, math.inf))
            continue
        b = b.detach().to("cpu")
        if not _bits_equal(a, b):
            out.append((key, _max_abs_diff(a, b)))
    out.sort(key=lambda kv: -kv[1])
    return out


# ---------------------------------------------------------------------------------------------------------
# comparison


def _loss_bits_differ(a: tuple[float, ...] | None, b: tuple[float, ...] | None) -> bool:
    if a is None or b is None:
        return (a is None) != (b is None)
    return len(a) != len(b) or any(not _same_float(x, y) for x, y in zip(a, b))


def compare_runs(reference: RunRecord, run: RunRecord) -> Divergence | None:
    """Return where ``run`` first differs from ``reference``, or None when they are bitwise identical."""
    names = reference.param_names
    for i, (ref, cur) in enumerate(zip(reference.steps, run.steps)):
        data_differs = len(ref.batches) != len(cur.batches) or any(a.data != b.data for a, b in zip(ref.batches, cur.batches))
        loss_differs = len(ref.batches) != len(cur.batches) or any(
            _loss_bits_differ(a.loss, b.loss) for a, b in zip(ref.batches, cur.batches))
        differing = [n for n, a, b in zip(names, ref.grads, cur.grads) if a != b]
        grads_differ = bool(differing) or ref.grads != cur.grads
        if not (data_differs or loss_differs or grads_differ):
            continue
        div = Divergence(run=run.index, step=i + 1, epoch=cur.epoch, kind="", detail="", data_differs=data_differs,
                         loss_differs=loss_differs, gradients_differ=grads_differ,
                         parameters_differing=len(differing), parameters_total=len(names))
        if data_differs:
            div.kind = "data"
            pair = next(((a, b) for a, b in zip(ref.batches, cur.batches) if a.data != b.data), None)
            if pair is not None and pair[0].files != pair[1].files:
                div.files = [list(pair[0].files), list(pair[1].files)]
                div.detail = "data order: the runs fed different images at this step"
            elif pair is not None:
                div.detail = "data content: same images, different pixels or labels (augmentation randomness)"
            else:
                div.detail = "data: the runs accumulated a different number of batches into this step"
        elif loss_differs:
            div.kind = "loss"
            div.detail = "loss: same input, different forward result"
        else:
            div.kind = "gradients"
            div.detail = "gradients: same input and loss, different backward result"
        for a, b in zip(ref.batches, cur.batches):
            if _loss_bits_differ(a.loss, b.loss) and a.loss is not None and b.loss is not None:
                loss_names = reference.loss_names or [f"loss{j}" for j in range(len(a.loss))]
                div.loss_components = {n: [x, y] for n, x, y in zip(loss_names, a.loss, b.loss) if not _same_float(x, y)}
                break
        _magnitude(div, reference, run, ref, cur, differing)
        return div
    if len(reference.steps) != len(run.steps):
        n = min(len(reference.steps), len(run.steps))
        return Divergence(run=run.index, step=n + 1, epoch=None, kind="steps",
                          detail=f"steps: run 1 made {len(reference.steps)} optimizer steps, run {run.index} made "
                                 f"{len(run.steps)}")
    if reference.weights != run.weights or run.final_diff:
        last = run.steps[-1] if run.steps else None
        div = Divergence(run=run.index, step=last.step if last else 0, epoch=last.epoch if last else None,
                         kind="weights", detail="weights: every step's data, loss and gradients match but the final "
                                                "weights differ (optimizer, EMA or buffers)")
        if run.final_diff:
            div.parameter, div.max_abs_diff = run.final_diff[0]
            div.parameters_differing = len(run.final_diff)
            div.parameters_total = len(reference.final_state or {})
            div.top = [{"parameter": k, "max_abs_diff": _json_float(v)} for k, v in run.final_diff[:5]]
            ref_value = (reference.final_state or {}).get(div.parameter)
            if ref_value is not None and ref_value.numel() and ref_value.is_floating_point():
                div.reference_abs_max = float(ref_value.abs().max())
        elif reference.weights.get("model") == run.weights.get("model"):
            div.detail = "weights: the model weights match but the EMA weights differ"
        return div
    return None


def _magnitude(div: Divergence, reference: RunRecord, run: RunRecord, ref: StepRecord, cur: StepRecord,
               differing: list[str]) -> None:
    ref_values = reference.kept.get(ref.step)
    cur_values = run.kept.get(cur.step)
    if not differing:
        div.note = "the gradients of this step are identical"
        return
    if ref_values is None or cur_values is None:
        div.parameter = differing[0]
        div.note = (f"gradient values were kept for the first {reference.kept_until} step(s) only; "
                    f"raise --keep-mib or lower --steps to measure the difference at step {ref.step}")
        return
    sizes = []
    for name in differing:
        a, b = ref_values.get(name), cur_values.get(name)
        if a is None or b is None:
            continue
        diff = _max_abs_diff(a / ref.scale, b / cur.scale) if a.is_floating_point() else _max_abs_diff(a, b)
        sizes.append((name, diff, float((a / ref.scale).abs().max()) if a.numel() else 0.0))
    if not sizes:
        div.parameter = differing[0]
        div.note = "gradient values were not kept for this step"
        return
    sizes.sort(key=lambda t: -t[1])
    div.parameter, div.max_abs_diff, div.reference_abs_max = sizes[0]
    div.top = [{"parameter": n, "max_abs_diff": _json_float(d)} for n, d, _ in sizes[:5]]


# ---------------------------------------------------------------------------------------------------------
# the report


@dataclass
class VerifyReport:
    """The outcome of :func:`verify`.

    Attributes:
        profile: The profile's name.
        args: The Ultralytics arguments every run used.
        runs: What each run recorded.
        divergences: One entry per run after the first that differs from run 1.
        steps_requested: ``--steps`` (None: the epochs decide).
        seconds: Wall time of the whole verification.
        plot: Path of the loss-curve PNG, when one was written.
        note: How the runs differ by design (``--resume-at``: run 2 was interrupted and resumed).
    """

    profile: str
    args: dict[str, Any]
    runs: list[RunRecord]
    divergences: list[Divergence]
    steps_requested: int | None
    seconds: float
    device: str = "cpu"
    plot: str | None = None
    note: str | None = None

    @property
    def identical(self) -> bool:
        """True when every run matches run 1 bit for bit (data, losses, gradients, final weights)."""
        return not self.divergences

    @property
    def first(self) -> Divergence | None:
        """The earliest divergence over all runs (lowest step, then lowest run)."""
        return min(self.divergences, key=lambda d: (d.step, d.run)) if self.divergences else None

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data (schema ``yolo-det/verify/1``)."""
        first = self.first
        return {
            "schema": SCHEMA,
            "identical": self.identical,
            "verdict": "bitwise identical" if self.identical else "diverged",
            "profile": self.profile,
            "device": self.device,
            "runs": len(self.runs),
            "steps_requested": self.steps_requested,
            "steps": [len(r.steps) for r in self.runs],
            "seconds": round(self.seconds, 3),
            "run_seconds": [round(r.seconds, 3) for r in self.runs],
            "args": {k: v for k, v in self.args.items() if k not in {"project", "name"}},
            "weights": [dict(r.weights) for r in self.runs],
            "loss_names": self.runs[0].loss_names if self.runs else [],
            "loss": [[_json_float(x) for x in r.losses()] for r in self.runs],
            "first_divergence": first.to_dict() if first else None,
            "comparisons": [
                {
                    "run": r.index,
                    "against": 1,
                    "identical": all(d.run != r.index for d in self.divergences),
                    "first_divergence": next((d.to_dict() for d in self.divergences if d.run == r.index), None),
                    "final_weights": ({"parameter": r.final_diff[0][0], "max_abs_diff": _json_float(r.final_diff[0][1]),
                                       "parameters_differing": len(r.final_diff)} if r.final_diff else None),
                }
                for r in self.runs[1:]
            ],
            "plot": self.plot,
            "note": self.note,
        }

    def summary(self) -> str:
        """A few lines for the terminal."""
        n_steps = sorted({len(r.steps) for r in self.runs})
        lines = [f"yolo-det verify: profile {self.profile}, {len(self.runs)} runs, "
                 f"{'/'.join(map(str, n_steps))} optimizer steps each, device {self.device}"]
        if self.note:
            lines.append(f"  ({self.note})")
        for r in self.runs:
            lines.append(f"  run {r.index}: {len(r.steps)} steps in {r.seconds:.1f} s, "
                         f"weights {r.weights.get('model', '?')[:16]}")
        if self.identical:
            lines.append(f"bitwise identical: input batches, losses and gradients at every step and the final "
                         f"weights of all {len(self.runs)} runs match")
            return "\n".join(lines)
        d = self.first
        if d is None:  # pragma: no cover - not identical implies a divergence
            return "\n".join(lines)
        where = f"step {d.step}" + (f" (epoch {d.epoch + 1})" if d.epoch is not None else "")
        lines.append(f"NOT reproducible: run {d.run} first differs from run 1 at {where}: {d.kind}")
        lines.append(f"  {d.detail}")
        if d.files:
            lines.append(f"  run 1 images: {_short_files(d.files[0])}")
            lines.append(f"  run {d.run} images: {_short_files(d.files[1])}")
        for name, (a, b) in list(d.loss_components.items())[:4]:
            lines.append(f"  {name}: {a!r} vs {b!r}")
        if d.parameter is not None:
            what = "weight" if d.kind == "weights" else "gradient"
            size = f"max |difference| {d.max_abs_diff:.3g}" if d.max_abs_diff is not None else "difference not measured"
            scale = f" (largest |value| {d.reference_abs_max:.3g})" if d.reference_abs_max is not None else ""
            count = f"; {d.parameters_differing} of {d.parameters_total} parameters differ" if d.parameters_total else ""
            lines.append(f"  largest {what} difference: {d.parameter}: {size}{scale}{count}")
        if d.note:
            lines.append(f"  note: {d.note}")
        for r in self.runs[1:]:
            if r.final_diff:
                k, v = r.final_diff[0]
                lines.append(f"  final weights of run {r.index}: {len(r.final_diff)} tensors differ, largest {k} by {v:.3g}")
        return "\n".join(lines)


def _short_files(files: Sequence[str], n: int = 4) -> str:
    names = [Path(f).name for f in files[:n]]
    return ", ".join(names) + (f", ... ({len(files)} images)" if len(files) > n else "")


def plot_losses(report: VerifyReport, path: str | Path) -> Path:
    """Write a PNG that overlays the runs' loss curves and marks the first divergence.

    The lower panel shows each run's absolute loss difference to run 1 (zero is drawn at the bottom), which
    makes a divergence visible long before the curves themselves separate.
    """
    from matplotlib.ticker import MaxNLocator

    fig = new_figure(8.0, 6.0)
    top = fig.add_subplot(2, 1, 1)
    bottom = fig.add_subplot(2, 1, 2, sharex=top)
    styles = ["-", "--", ":", "-."]
    ref = report.runs[0].losses() if report.runs else []
    diffs: list[float] = []
    for k, run in enumerate(report.runs):
        losses = run.losses()
        pts = [(s.step, v) for s, v in zip(run.steps, losses) if v is not None]
        marker = "o" if len(pts) <= 30 else None
        top.plot([x for x, _ in pts], [y for _, y in pts], styles[k % len(styles)], color=f"C{k}", marker=marker,
                 markersize=3, linewidth=1.5, label=f"run {run.index}")
        if k:
            d = [(s.step, abs(v - r)) for s, v, r in zip(run.steps, losses, ref) if v is not None and r is not None]
            diffs += [y for _, y in d]
            bottom.plot([x for x, _ in d], [y for _, y in d], styles[k % len(styles)], color=f"C{k}", marker=marker,
                        markersize=3, linewidth=1.2, label=f"run {run.index} vs run 1")
    nonzero = [y for y in diffs if y > 0]
    bottom.set_yscale("symlog", linthresh=min(nonzero) if nonzero else 1e-12)
    first = report.first
    if first is not None:
        for ax in (top, bottom):
            ax.axvline(first.step, color="red", linewidth=1, alpha=0.8)
        label = f"first divergence: step {first.step}, {first.kind}" + (f"\n{first.parameter}" if first.parameter else "")
        top.annotate(label, xy=(first.step, 0.95), xycoords=("data", "axes fraction"), va="top", ha="left",
                     fontsize=8, color="red", xytext=(4, 0), textcoords="offset points")
        title = f"{report.profile}: runs diverge at step {first.step} ({first.kind})"
    else:
        title = f"{report.profile}: {len(report.runs)} runs bitwise identical"
    top.set_title(title)
    top.set_ylabel("training loss (sum of components)")
    bottom.set_ylabel("|loss - loss of run 1|")
    bottom.set_xlabel("optimizer step")
    bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)


# ---------------------------------------------------------------------------------------------------------
# running


def check_args(args: Mapping[str, Any], runs: int, steps: int | None, keep_mib: float) -> None:
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 2:
        raise ConfigError(f"--runs must be an integer >= 2, got {runs!r}")
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise ConfigError(f"--steps must be a positive integer, got {steps!r}")
    if not (isinstance(keep_mib, (int, float)) and keep_mib >= 0):
        raise ConfigError(f"--keep-mib must be >= 0, got {keep_mib!r}")
    for key, why in RESERVED.items():
        if args.get(key) not in (None, False, 0):
            raise ConfigError(f"'{key}=' cannot be passed to verify: {why}")
    device = args.get("device")
    if isinstance(device, (list, tuple)) or (isinstance(device, str) and "," in device.strip(",")):
        raise ConfigError(f"verify runs on one device; got device={device!r} (pass a single device, e.g. device=0)")


def verify(
    profile: Profile | str,
    args: Mapping[str, Any],
    *,
    runs: int = 2,
    steps: int | None = None,
    keep_mib: float = DEFAULT_KEEP_MIB,
    callbacks: Mapping[str, Sequence[Callable[[Any], None]]] | None = None,
    verbose: bool = False,
    progress: Callable[[str], None] | None = None,
) -> VerifyReport:
    """Train ``runs`` times with the same arguments under ``profile`` and compare the runs step by step.

    Args:
        profile: A built-in name, a profile file path, or a :class:`~yolo_det.profiles.Profile`.
        args: Ultralytics train arguments (``model`` included), as ``yolo-det train`` would pass them (see
            :func:`yolo_det.commands.train.prepare`). Without ``project`` the runs go to a temporary folder
            that is removed afterwards.
        runs: How many trainings (>= 2); run 1 is the reference.
        steps: Stop every run after this many optimizer steps (None: the epochs decide).
        keep_mib: Memory (MiB) the reference may use to keep gradient values of its first steps, which
            measuring the size of a difference needs.
        callbacks: Extra Ultralytics callbacks ``{event: [fn]}`` added to every run (after yolo-det's).
        verbose: Show Ultralytics' own log (it goes to stderr either way).
        progress: Called with a line of text as each run ends.

    Returns:
        The report; ``report.identical`` says whether the runs match bit for bit.
    """
    resolved = load_profile(profile)
    check_args(args, runs, steps, keep_mib)
    started = time.perf_counter()
    records = record_runs(resolved, args, runs=runs, steps=steps, keep_mib=keep_mib, callbacks=callbacks,
                          verbose=verbose, progress=progress)
    divergences = [d for r in records[1:] if (d := compare_runs(records[0], r)) is not None]
    return VerifyReport(profile=resolved.name, args=dict(args), runs=records, divergences=divergences,
                        steps_requested=steps, seconds=time.perf_counter() - started,
                        device=_device_name(args.get("device")))


def record_runs(
    profile: Profile | str,
    args: Mapping[str, Any],
    *,
    runs: int,
    steps: int | None = None,
    keep_mib: float = DEFAULT_KEEP_MIB,
    callbacks: Mapping[str, Sequence[Callable[[Any], None]]] | None = None,
    verbose: bool = False,
    progress: Callable[[str], None] | None = None,
    record: bool = True,
) -> list[RunRecord]:
    """Train ``runs`` times as :func:`verify` does and return what each run recorded (no comparison).

    ``record=False`` trains the same way (same stopping rule) without recording anything: one such run is
    the baseline the cost of verification is measured against (``bench/verify_cost.py``).
    """
    from ultralytics import YOLO

    from .demo import ensure_local_font
    from .integrations.ultralytics import attach

    resolved = load_profile(profile)
    train_args = dict(args)
    model_src = train_args.pop("model")
    base_name = str(train_args.pop("name", None) or "verify")
    if train_args.get("plots", True):
        ensure_local_font()
    records: list[RunRecord] = []
    before = _state.snapshot()  # ultralytics.YOLO() itself sets CUBLAS_WORKSPACE_CONFIG: put everything back after
    with ExitStack() as stack:
        stack.callback(_state.restore, before)
        project = stack.enter_context(run_folder(train_args.pop("project", None)))
        stack.enter_context(quiet_ultralytics(verbose))
        for index in range(1, runs + 1):
            rec = RunRecord(index=index)
            recorder = _Recorder(rec, reference=records[0] if records else None, steps=steps,
                                 keep_bytes=int(keep_mib * 2**20), enabled=record)
            model = YOLO(model_src)
            attach(model, resolved)
            for event, fn in recorder.callbacks.items():
                model.add_callback(event, fn)
            for event, fns in (callbacks or {}).items():
                for fn in fns:
                    model.add_callback(event, fn)
            t0 = time.perf_counter()
            try:
                model.train(**train_args, project=project, name=f"{base_name}-run{index}", exist_ok=True)
            except RuntimeError as e:
                if NONDETERMINISTIC_KERNEL not in str(e):
                    raise
                first = " ".join(str(e).split())[:300]
                raise ConfigError(
                    f"run {index} stopped: {first} -- the profile '{resolved.name}' forbids this kernel; use a profile "
                    "that swaps the layer for a deterministic one, or one with 'backward: disable' (e.g. balanced)"
                ) from None
            rec.seconds = time.perf_counter() - t0
            rec.optimizer_steps = recorder.count
            records.append(rec)
            if progress is not None:
                progress(f"run {index}/{runs}: {recorder.count} optimizer steps in {rec.seconds:.1f} s")
    return records


def _device_name(device: Any) -> str:
    if device in (None, ""):
        return "cuda:0" if torch.cuda.is_available() else "cpu"
    text = str(device)
    return f"cuda:{text}" if text.isdigit() else text


def progress_to_stderr(line: str) -> None:
    """A ``progress`` callback for :func:`verify` that prints to stderr."""
    print(line, file=sys.stderr, flush=True)
