"""What a verify run records: micro-batches, steps, runs, divergences (plain data)."""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from typing import Any

import torch

from ...core.constants import ALERT

__all__ = ["Divergence", "MicroBatch", "RunRecord", "StepRecord"]

SCHEMA = "yolo-det/verify/1"
#: Ultralytics arguments verify refuses: they make runs differ on purpose or leave the single process.
RESERVED = {
    "resume": "verify trains fresh runs; resuming would compare different trainings",
    "time": "time-limited training stops after a wall-clock time, not a step count; use --steps",
}
#: The verdict when the compared weights never changed from the initial ones: an equality over them proves nothing.
NOTHING = "nothing compared"
_MAX_INFLIGHT = 2  # CPU steps whose gradient copies may wait for their digests at once
#: What torch says when strict deterministic mode meets a kernel without a deterministic implementation.
NONDETERMINISTIC_KERNEL = ALERT.strip()


@dataclass
class MicroBatch:
    """One forward/backward pass.

    Attributes:
        index: Iteration number in the run (0-based, across epochs).
        epoch: Epoch (0-based).
        data: Digest of the preprocessed batch (every tensor: images, classes, boxes, indices).
        files: The batch's image files, in order (empty when the dataset gives none).
        loss: Loss components after the forward pass (``None`` until known).
        raw: Portable mode: digest of the batch before ``preprocess_batch`` (as the data loader gave it).
    """

    index: int
    epoch: int
    data: str
    files: tuple[str, ...] = ()
    loss: tuple[float, ...] | None = None
    raw: str | None = None


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
        weights: Digest of the trainable parameters right after the step (recorded in portable mode only).
    """

    step: int
    epoch: int
    batches: list[MicroBatch]
    grads: list[str]
    scale: float = 1.0
    weights: str | None = None

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
        weights: Digests of the final weights (see :mod:`yolo_det.core.record`): ``sha256``, the weights digest
            ``train`` prints and the record keeps (the EMA as ``last.pt`` holds it, in float16); ``model`` and
            ``ema``, the live model and the EMA in full precision.
        seconds: Wall time of the run (``model.train``).
        save_dir: The run folder.
        kept: Gradient values kept on the CPU, ``{step: {parameter: tensor}}`` (scaled like the digests).
        final_diff: For a run after the first: ``[(parameter, max |difference|)]`` of the final model state
            against the reference, largest first (empty when equal).
        final_state: The reference's final model state (CPU copy), compared with the later runs'.
        kept_until: The last step whose gradient values the reference kept.
        optimizer_steps: Optimizer steps the run made (counted even when nothing is recorded).
        data_root: The dataset root (image files are named relative to it across machines).
        record: The run's ``determinism.json`` content, when the plugin wrote one.
        portable: Recorded for a comparison across processes or machines (raw batch and per-step weights digests).
        device_type: Where the gradients lived (``cpu``, ``cuda``, ...): digests of tensors on different device
            types are computed differently (see :mod:`yolo_det.tools.fingerprint`) and do not compare.
        initial_params: Digest of the trainable parameters when training started ("" when not recorded).
        final_params: Digest of the trainable parameters when training ended ("" when not recorded).
        param_elements: How many elements the trainable parameters hold.
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
    data_root: str = ""
    record: dict[str, Any] | None = None
    portable: bool = False
    device_type: str = ""
    initial_params: str = ""
    final_params: str = ""
    param_elements: int = 0

    @property
    def weights_unchanged(self) -> bool:
        """True when the trainable weights at the end are known to equal those at the start (nothing trained)."""
        return bool(self.initial_params) and self.initial_params == self.final_params

    @property
    def steps_changing_weights(self) -> int | None:
        """Optimizer steps after which the trainable weights differ from before them (portable records only)."""
        if not self.initial_params or not self.steps or any(s.weights is None for s in self.steps):
            return None
        previous, count = self.initial_params, 0
        for s in self.steps:
            count += s.weights != previous
            previous = s.weights or previous
        return count

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
        cause: For a ``data`` divergence, what the records say the data streams differ by (worker count
            without invariance, seed, dataset bytes, augmentation arguments), or None when they do not say.
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
    cause: str | None = None

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
            "cause": self.cause,
        }


def nothing_trained(run: RunRecord, where: str = "run 1") -> str | None:
    """Why an equality verdict over ``run`` would rest on nothing (its trainable weights at the end equal the
    initial ones), with what to do; None when the weights changed or nothing is known about them."""
    if not run.weights_unchanged:
        return None
    n = len(run.steps) or run.optimizer_steps
    return (
        f"the trainable weights of {where} after its {n} optimizer step(s) equal the initial ones, so equal "
        "gradients and weights prove nothing: raise --steps or epochs= (Ultralytics' warmup starts the weights' "
        "learning rate at 0; warmup_epochs=0 removes it)"
    )


def _json_float(x: float | None) -> float | str | None:
    if x is None:
        return None
    return x if math.isfinite(x) else str(x)


def _same_float(a: float, b: float) -> bool:
    return struct.pack("<d", a) == struct.pack("<d", b)
