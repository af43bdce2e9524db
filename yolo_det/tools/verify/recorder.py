"""Recording a training run step by step: losses, gradient and weight digests, through Ultralytics callbacks."""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from ...core.compat import loss_components
from ...core.record import checkpoint_weights_digest, state_dict_digest
from ...core.resume import NUMPY_COPY_DTYPES
from ...integrations.ultralytics.seam import BatchObserver, observe, unobserve
from ..fingerprint import combine, tensor_digests
from ..runtime import unwrap_model
from .records import _MAX_INFLIGHT, MicroBatch, RunRecord, StepRecord


class _Recorder(BatchObserver):
    """Ultralytics callbacks and a batch observer of the trainer seam that record one run (see the module
    docstring)."""

    def __init__(
        self,
        record: RunRecord,
        *,
        reference: RunRecord | None,
        steps: int | None,
        keep_bytes: int,
        enabled: bool = True,
        portable: bool = False,
    ) -> None:
        self.record = record
        self.portable = portable
        record.portable = portable
        self._weight_futures: deque[tuple[StepRecord, Future[list[str]]]] = deque()
        self.reference = reference
        self.steps = steps
        self.keep_bytes = keep_bytes
        self.enabled = enabled
        self.kept_bytes = 0
        self.count = 0
        self.iteration = 0
        self._pending: list[MicroBatch] = []
        self._current: MicroBatch | None = None
        self._raw: str | None = None
        self._params: list[tuple[str, torch.nn.Parameter]] = []
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

    def add_to(self, model: Any) -> None:
        """Register the callbacks on an Ultralytics ``model`` (the trainer it builds needs the seam)."""
        for event, fn in self.callbacks.items():
            model.add_callback(event, fn)

    # -- observing ----------------------------------------------------------------------------------
    def on_pretrain_routine_end(self, trainer: Any) -> None:
        self._trainer = trainer
        model = unwrap_model(trainer.model)
        self._params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.record.param_names = [n for n, _ in self._params]
        self.record.device_type = self._params[0][1].device.type if self._params else ""
        if (
            self.enabled and not self.record.initial_params
        ):  # a resumed run keeps the digest from where it first started
            self.record.initial_params = self._params_digest()
            self.record.param_elements = sum(p.numel() for _, p in self._params)
        data = trainer.data
        self.record.data_root = str(data.get("path") or "") if isinstance(data, Mapping) else ""
        observe(trainer, self, "verify's step recorder")

    def before_batch(self, trainer: Any, batch: Any) -> None:
        self._raw = self._raw_digest(batch) if self.portable and self.enabled else None

    def after_batch(self, trainer: Any, batch: Any) -> None:
        self._on_batch(trainer, batch)
        if self._current is not None:
            self._current.raw = self._raw

    def before_step(self, trainer: Any) -> None:
        self._before_step(trainer)

    def after_step(self, trainer: Any) -> None:
        if self.portable:
            self._after_step()
        self.count += 1
        if self.steps is not None and self.count >= self.steps:
            trainer.stop = True

    def teardown(self, trainer: Any) -> None:
        self._inflight.clear()  # after a failure, digests still pending are of no use
        self._weight_futures.clear()
        self._drain()
        unobserve(trainer, self)
        self._trainer = None

    # -- per micro-batch ----------------------------------------------------------------------------
    def _raw_digest(self, batch: Mapping[str, Any]) -> str:
        """Digest of the batch as the loader gave it (CPU tensors: the same on any training device)."""
        return combine(tensor_digests([batch[k] for k in sorted(batch) if isinstance(batch[k], torch.Tensor)]))

    def _on_batch(self, trainer: Any, batch: Mapping[str, Any]) -> None:
        index, self.iteration = self.iteration, self.iteration + 1
        if not self.enabled:
            return
        tensors = [batch[k] for k in sorted(batch) if isinstance(batch[k], torch.Tensor)]
        files = batch.get("im_file", ())
        mb = MicroBatch(
            index=index,
            epoch=int(trainer.epoch),
            data=combine(tensor_digests(tensors)),
            files=tuple(str(f) for f in files) if isinstance(files, (list, tuple)) else (),
        )
        self._pending.append(mb)
        self._current = mb

    def on_train_batch_end(self, trainer: Any) -> None:
        mb, self._current = self._current, None
        items = trainer.loss_items
        if mb is None or items is None:
            return
        names, values = loss_components(items)
        if names is not None and not self.record.loss_names:
            self.record.loss_names = names
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
        step = StepRecord(
            step=len(self.record.steps) + 1,
            epoch=int(trainer.epoch),
            batches=self._pending,
            grads=[],
            scale=float(trainer.scaler.get_scale()) if trainer.scaler.is_enabled() else 1.0,
        )
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

    def _finish(
        self,
        step: StepRecord,
        names: list[str],
        values: Mapping[str, torch.Tensor],
        digests: list[str],
        *,
        copied: bool,
    ) -> None:
        """Store ``step``'s gradient digests; a later run keeps the differing gradients of its first differing step."""
        by_name = dict(zip(values, digests))
        step.grads = [by_name.get(n, "none") for n in names]
        if self.reference is None or self._captured:
            return
        ref = self.reference.steps[step.step - 1] if step.step <= len(self.reference.steps) else None
        if ref is None or ref.grads != step.grads or [b.data for b in ref.batches] != [b.data for b in step.batches]:
            self._captured = True
            theirs = dict(zip(names, ref.grads)) if ref is not None else {}
            self.record.kept[step.step] = {
                n: (v if copied else _host_copy(v)) for n, v in values.items() if by_name[n] != theirs.get(n)
            }

    def _after_step(self) -> None:
        """Portable mode: digest the trainable parameters just updated (on a CPU: a copy, hashed on the worker)."""
        if not self.enabled or not self.record.steps:
            return
        step = self.record.steps[-1]
        params = [p.detach() for _, p in self._params]
        if params and all(p.device.type == "cpu" for p in params):
            copies = [_host_copy(p) for p in params]
            self._weight_futures.append((step, self._executor().submit(tensor_digests, copies)))
            while len(self._weight_futures) > _MAX_INFLIGHT:
                done, future = self._weight_futures.popleft()
                done.weights = combine(future.result())
            return
        step.weights = combine(tensor_digests(params))

    def _params_digest(self) -> str:
        """Digest of the trainable parameters as they are now (the same digest :meth:`_after_step` records)."""
        return combine(tensor_digests([p.detach() for _, p in self._params]))

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
            while self._weight_futures:
                step, future = self._weight_futures.popleft()
                step.weights = combine(future.result())
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None

    def on_train_end(self, trainer: Any) -> None:
        self._drain()
        model = unwrap_model(trainer.model)
        self.record.weights = {"model": state_dict_digest(model)}
        ema = trainer.ema.ema
        if isinstance(ema, torch.nn.Module):
            self.record.weights["ema"] = state_dict_digest(ema)
        # the digest `train` prints and the record keeps: the weights last.pt holds (the EMA in float16)
        self.record.weights["sha256"] = checkpoint_weights_digest(ema if isinstance(ema, torch.nn.Module) else model)
        self.record.save_dir = str(trainer.save_dir)
        if not self.enabled:
            return
        self.record.final_params = self._params_digest()
        record_file = Path(self.record.save_dir) / "determinism.json"  # the plugin's on_train_end ran first
        if self.portable and self.record.save_dir and record_file.is_file():
            try:
                self.record.record = json.loads(record_file.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                self.record.record = None
        state = {k: v.detach() for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}
        if self.reference is None:
            self.record.final_state = {k: _host_copy(v) for k, v in state.items()}
        elif self.reference.final_state is not None:
            self.record.final_diff = _state_diff(self.reference.final_state, state)


def _host_copy(t: torch.Tensor) -> torch.Tensor:
    """A CPU copy of ``t``; for CPU tensors a plain single-threaded memcpy (no intra-op thread pool)."""
    t = t.detach()
    if t.device.type == "cpu" and t.dtype in NUMPY_COPY_DTYPES:
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
