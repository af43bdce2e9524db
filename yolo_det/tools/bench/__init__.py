"""What each determinism profile costs on the user's model and device: step time, throughput, peak memory.

:func:`bench` sets up one Ultralytics training (the user's model, data, batch size, device, AMP) and, once
the trainer has built its model, optimizer, scaler and loaders, runs its own timed loop in the same process:
every *configuration* (a profile's ``train`` phase, or one setting toggled from a base) gets ``warmup``
untimed steps, then blocks of ``block`` measured steps in round-robin order, the order rotating every round,
until each has ``steps`` measurements. A step is the trainer's own step: ``preprocess_batch``, forward
under the trainer's autocast, ``scaler.scale(loss).backward()``, ``trainer.optimizer_step()``. Every block
starts from the same weights, optimizer, EMA and scaler state, and cycles over the same few input batches
(loaded once), so configurations differ only by their settings; data loading is not timed. On a CPU
device the process CPU time of each step is recorded next to its wall time (steadier on a busy machine). A
configuration whose step raises (strict determinism meeting a kernel without a deterministic version) is
reported with its error and the others are still measured.

A configuration is applied through a :class:`~yolo_det.session.session.DeterminismSession` (undone after
each block): flags, the backward toggle on the trainer's scaler, the layer swaps on its model (the audit that
decides them runs once per model and policy, outside the timed steps) and functional interception. Scopes
registered with :func:`register_scope` take part as session extensions.

Peak memory: on CUDA ``torch.cuda.max_memory_allocated`` over each timed block (reset before it). On Linux
CPUs the process's peak resident set size (``VmHWM``) over one extra, untimed step per configuration, after
returning freed heap memory to the OS (``malloc_trim``) and resetting the high-water mark
(``/proc/self/clear_refs``); it includes everything resident (libraries, the model), so compare the rows'
differences. Elsewhere memory is not measured.

The bench's own cost per measured step (clock reads, bookkeeping, the loop) is measured with an empty step
and reported, in absolute terms and as a share of the median step.
"""

from __future__ import annotations

from .isolations import BASES, DEFAULT_PROFILES, ISOLATIONS, Isolation
from .report import BenchReport, plot_bench
from .runner import bench, check_args, parse_profiles
from .scopes import register_scope, unregister_scope

__all__ = [
    "BASES",
    "BenchReport",
    "DEFAULT_PROFILES",
    "ISOLATIONS",
    "Isolation",
    "bench",
    "check_args",
    "parse_profiles",
    "plot_bench",
    "register_scope",
    "unregister_scope",
]
