"""Recording an op trace: digests of every module's forward, the backward and the optimizer step, for chosen steps.

:class:`OpTracer` is a set of Ultralytics callbacks and a batch observer of the trainer seam
(:mod:`yolo_det.integrations.ultralytics.seam`). For each traced optimizer step (a
:class:`~yolo_det.tools.trace.steps.StepRange`) it installs hooks at the first micro-batch and removes them
after the optimizer step, so untraced steps run exactly as without it:

- the state the step starts from: a digest of every parameter and buffer;
- per micro-batch, the batch as preprocessed (its tensors, and its image files in order);
- forward: for every module call (forward hooks, in the order the calls end) the digests of its input
  tensors and of its output tensors and own buffers (a BatchNorm's running statistics change in forward),
  with the output shapes and dtype;
- backward, in the order autograd runs it: the gradient reaching each module's outputs and inputs (tensor
  hooks registered in forward) and each parameter's gradient once accumulated
  (``register_post_accumulate_grad_hook``);
- the optimizer: per parameter the gradient it applies, and the weights after the step; the
  hyper-parameters of every group and the AMP scale.

Digests are those of :mod:`yolo_det.tools.fingerprint` (SHA-256 of the bytes on a CPU, exact integer sums on
a device): order-sensitive, any changed bit changes them. The trace is written atomically (JSON lines,
:mod:`yolo_det.tools.trace.tracefile`) after every traced step, one file per rank. Every hook is removed
and the observer taken off the trainer at ``teardown``, whatever ended the run.

Steps asked for that the run never reached (``--trace-ops 500`` on a run of 12 steps) are not silent:
:meth:`OpTracer.summary` says what was asked, how many steps ran and which were traced (the run's record keeps
it as ``op_trace``), and :meth:`OpTracer.shortfall` is the warning ``yolo-det train`` prints at the end.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from ...integrations.ultralytics.seam import BatchObserver, observe, unobserve
from ..fingerprint import combine, tensor_digests
from ..runtime import unwrap_model
from .settings import op_settings
from .steps import StepRange, parse_steps
from .tracefile import write_trace

__all__ = ["OpTracer", "trace_path"]

_MAX_SHAPES = 4


def trace_path(folder: str | os.PathLike[str], rank: int = 0) -> Path:
    """Where a run folder holds rank ``rank``'s op trace."""
    return Path(folder) / f"ops-trace-rank{rank}.jsonl"


def _tensors(value: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    """The tensors in ``value`` (nested tuples, lists and dicts), in order."""
    if isinstance(value, torch.Tensor):
        yield value
    elif depth < 6 and isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v, depth + 1)
    elif depth < 6 and isinstance(value, Mapping):
        for v in value.values():
            yield from _tensors(v, depth + 1)


def _digests(tensors: list[torch.Tensor]) -> list[str]:
    return tensor_digests([t.detach() for t in tensors]) if tensors else []


class OpTracer(BatchObserver):
    """Ultralytics callbacks that trace the ops of chosen optimizer steps (see the module docstring).

    Args:
        steps: The steps to trace (``"3-5"``, ``"first:2"``, a :class:`StepRange`).
        path: The trace file; None: ``ops-trace-rank{R}.jsonl`` in the run's folder.
        meta: Extra header entries (the command, the profile).
        stop: Stop the training after the last traced step (``bisect --replay`` re-runs one step only).
    """

    def __init__(
        self,
        steps: str | int | StepRange,
        path: str | os.PathLike[str] | None = None,
        *,
        meta: dict[str, Any] | None = None,
        stop: bool = False,
    ) -> None:
        self.steps = parse_steps(steps)
        self.stop = stop
        self.path = Path(path) if path is not None else None
        self.meta = dict(meta or {})
        self.rank = max(int(os.environ.get("RANK", "-1") or -1), 0)
        self.world_size = max(int(os.environ.get("WORLD_SIZE", "1") or 1), 1)
        self.written: Path | None = None
        self._trainer: Any = None
        self._model: torch.nn.Module | None = None
        self._handles: list[Any] = []
        self._count = 0  # optimizer steps done in this process
        self._iteration = 0  # micro-batches seen in this process
        self._step: dict[str, Any] | None = None
        self._before: dict[str, str] | None = None
        self._micro: dict[str, Any] | None = None
        self._calls: dict[str, int] = {}
        self._header: dict[str, Any] = {}
        self._lines: list[dict[str, Any]] = []

    @property
    def callbacks(self) -> dict[str, Callable[[Any], None]]:
        return {"on_pretrain_routine_end": self.on_pretrain_routine_end, "teardown": self.teardown}

    def summary(self) -> dict[str, Any]:
        """What was asked and what was traced: ``asked`` (the steps), ``steps_run`` (the optimizer steps this
        process ran), ``traced`` (the steps in the trace), ``file`` (the trace written, or None)."""
        return {
            "asked": str(self.steps),
            "steps_run": self._count,
            "traced": [int(line["step"]) for line in self._lines],
            "file": str(self.written) if self.written is not None else None,
        }

    def shortfall(self) -> str | None:
        """One line when steps asked for were never traced (the run ended before them), else None."""
        traced = [int(line["step"]) for line in self._lines]
        if len(traced) == self.steps.last - self.steps.first + 1:
            return None
        ran = f"the run had {self._count} optimizer step{'s' if self._count != 1 else ''}"
        if not traced:
            return (
                f"--trace-ops {self.steps} traced nothing: {ran}, so no op trace was written; "
                f"ask for steps that run (--trace-ops first:{min(3, max(self._count, 1))})"
            )
        done = str(StepRange(traced[0], traced[-1]))
        return f"--trace-ops {self.steps} traced steps {done} only: {ran}; the others never ran"

    def add_to(self, model: Any) -> None:
        """Register on an Ultralytics ``model`` (the trainer it builds needs the seam)."""
        model.add_callback("on_pretrain_routine_end", self.on_pretrain_routine_end)
        model.add_callback("teardown", self.teardown)

    # -- observing the trainer --------------------------------------------------------------------------
    def on_pretrain_routine_end(self, trainer: Any) -> None:
        from ...integrations.trainer_state import state_of

        state_of(trainer).op_trace = self.summary  # the run's record says what was asked and what ran
        self._trainer = trainer
        self._model = unwrap_model(trainer.model)
        if self.path is None:
            self.path = trace_path(trainer.save_dir, self.rank)
        observe(trainer, self, "the op trace")

    def after_batch(self, trainer: Any, batch: Any) -> None:
        self._on_batch(trainer, batch)

    def before_step(self, trainer: Any) -> None:
        self._before = self._before_optimizer() if self._step is not None else None

    def after_step(self, trainer: Any) -> None:
        step, before, self._before = self._step, self._before, None
        self._count += 1
        if step is not None and before is not None:
            self._after_optimizer(step, before)
        if self.stop and self._count >= self.steps.last:
            trainer.stop = True

    def teardown(self, trainer: Any) -> None:
        self._remove_hooks()
        unobserve(trainer, self)
        self._step = self._micro = None
        self._trainer = self._model = None

    # -- per micro-batch ------------------------------------------------------------------------------
    def _on_batch(self, trainer: Any, batch: Mapping[str, Any]) -> None:
        iteration, self._iteration = self._iteration, self._iteration + 1
        number = self._count + 1
        if number not in self.steps:
            return
        if self._step is None:
            self._start_step(trainer, number, iteration)
        if self._step is None:
            return
        tensors = [batch[k] for k in sorted(batch) if isinstance(batch[k], torch.Tensor)]
        files = batch.get("im_file", ())
        names = [os.path.basename(str(f)) for f in files] if isinstance(files, (list, tuple)) else []
        self._micro = {"data": combine(_digests(tensors)), "files": combine(names), "forward": [], "backward": []}
        self._calls = {}
        self._step["micro"].append(self._micro)

    def _start_step(self, trainer: Any, number: int, iteration: int) -> None:
        model = self._model
        if model is None:
            return
        if not self._header:
            device = next((p.device for p in model.parameters()), None)
            self._header = {
                "rank": self.rank,
                "world_size": self.world_size,
                "steps": str(self.steps),
                "device_type": device.type if device is not None else "cpu",
                "settings": {**op_settings(device), "amp": bool(trainer.amp)},
                "modules": {
                    name: {
                        "type": f"{type(m).__module__}.{type(m).__qualname__}",
                        "extra": m.extra_repr()[:300],
                        "buffers": len(list(m.named_buffers(recurse=False))),
                    }
                    for name, m in model.named_modules()
                },
                "meta": self.meta,
            }
        names = [n for n, _ in model.named_parameters()] + [n for n, _ in model.named_buffers()]
        values = [p for _, p in model.named_parameters()] + [b for _, b in model.named_buffers()]
        self._step = {
            "step": number,
            "epoch": int(trainer.epoch),
            "iteration": iteration + int(trainer.start_epoch) * len(trainer.train_loader),
            "state": [[n, d] for n, d in zip(names, _digests(values))],
            "micro": [],
        }
        if not self._handles:  # the previous step was traced too: its hooks stay
            self._install_hooks(model)

    # -- hooks --------------------------------------------------------------------------------------
    def _install_hooks(self, model: torch.nn.Module) -> None:
        for name, module in model.named_modules():
            self._handles.append(module.register_forward_hook(self._forward_hook(name), with_kwargs=True))
        for name, p in model.named_parameters():
            if p.requires_grad:
                self._handles.append(p.register_post_accumulate_grad_hook(self._grad_hook(name)))

    def _remove_hooks(self) -> None:
        handles, self._handles = self._handles, []
        for h in handles:
            h.remove()

    def _forward_hook(self, name: str) -> Callable[..., None]:
        def hook(module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> None:
            micro = self._micro
            if micro is None:
                return
            k = self._calls.get(name, 0)
            self._calls[name] = k + 1
            key = name if k == 0 else f"{name}#{k}"
            inputs = list(_tensors(args)) + list(_tensors(kwargs))
            outputs = list(_tensors(output))
            buffers = [b for _, b in module.named_buffers(recurse=False)]
            shapes = ["x".join(str(s) for s in t.shape) for t in outputs[:_MAX_SHAPES]]
            dtype = str(outputs[0].dtype).removeprefix("torch.") if outputs else ""
            micro["forward"].append([key, _digests(inputs), _digests(outputs + buffers), shapes, dtype])
            if torch.is_grad_enabled():
                for i, t in enumerate(outputs):
                    if t.requires_grad:
                        t.register_hook(self._tensor_hook("gout", key, i))
                for i, t in enumerate(inputs):
                    if t.requires_grad:
                        t.register_hook(self._tensor_hook("gin", key, i))

        return hook

    def _tensor_hook(self, kind: str, key: str, index: int) -> Callable[[torch.Tensor], None]:
        micro = self._micro

        def hook(grad: torch.Tensor) -> None:
            if micro is not None and micro is self._micro:
                micro["backward"].append([kind, key, index, _digests([grad])[0]])

        return hook

    def _grad_hook(self, name: str) -> Callable[[torch.Tensor], None]:
        def hook(p: torch.Tensor) -> None:
            micro = self._micro
            if micro is not None and p.grad is not None:
                micro["backward"].append(["grad", name, 0, _digests([p.grad])[0]])

        return hook

    # -- the optimizer step ---------------------------------------------------------------------------
    def _params(self) -> list[tuple[str, torch.nn.Parameter]]:
        model = self._model
        return [] if model is None else [(n, p) for n, p in model.named_parameters() if p.requires_grad]

    def _before_optimizer(self) -> dict[str, str]:
        self._micro = None  # nothing after this belongs to a micro-batch
        present = [(n, p.grad) for n, p in self._params() if p.grad is not None]
        return dict(zip([n for n, _ in present], _digests([g for _, g in present])))

    def _after_optimizer(self, step: dict[str, Any], grads: dict[str, str]) -> None:
        params = self._params()
        after = _digests([p for _, p in params])
        step["optimizer"] = [[n, grads.get(n, "none"), w] for (n, _), w in zip(params, after)]
        trainer = self._trainer
        groups = trainer.optimizer.param_groups
        step["hyper"] = [
            {
                k: float(v)
                for k, v in g.items()
                if k in ("lr", "momentum", "weight_decay") and isinstance(v, (int, float))
            }
            for g in groups
        ]
        step["scale"] = float(trainer.scaler.get_scale()) if trainer.scaler.is_enabled() else 1.0
        self._lines.append(step)
        self._step = None
        if self._count + 1 not in self.steps:
            self._remove_hooks()
        if self.path is not None:
            self.written = write_trace(self.path, self._header, self._lines)
