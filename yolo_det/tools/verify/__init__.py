"""Train the same configuration several times and prove the runs bitwise identical, or find where they split.

:func:`verify` trains N times (default 2) under a profile, each run a fresh ``ultralytics.YOLO`` with the
profile attached exactly as ``yolo-det train`` does, and records per optimizer step:

- per micro-batch: a digest of the preprocessed input batch (images, labels, every tensor in it), the
  image files (the data order) and the loss components;
- a digest per parameter of the gradient the optimizer is about to apply, and the AMP scale;

and at the end the weights digests (model and EMA, as in ``determinism.json``). Digests are exact (see
:mod:`yolo_det.tools.fingerprint`: any changed bit changes them) and cheap (hashed where the tensor lives).

What is kept beyond digests is what naming the parameter and the size of the first difference needs:
the first run (the reference) keeps a CPU copy of its gradients for as many early steps as
``keep_mib`` allows (non-determinism almost always shows at the first step), a later run copies only
the gradients that differ, at the first step where they differ (it compares live against the
reference), and the reference keeps its final state dict so the final weights can be compared too.

The report says "bitwise identical" or gives the first divergence: the step, what differed first
(``data`` (order or content), ``loss``, ``gradients``, ``weights``, or the number of ``steps``), the
parameter whose gradient differs most and by how much. Hooks: the recorder is one of the trainer seam's batch
observers (:mod:`yolo_det.integrations.ultralytics.seam`: it sees each ``preprocess_batch`` and
``optimizer_step``), added at ``on_pretrain_routine_end`` and taken off at ``teardown``; ``steps=K`` sets
``trainer.stop`` after the K-th optimizer step.

``portable=True`` (``--save``/``--against``, see :mod:`yolo_det.tools.verify.crossverify`) also records, per
micro-batch, a digest of the batch as the data loader gave it (before ``preprocess_batch`` moves it to the
device: CPU tensors, so the digest is the same whatever device trains), a digest of the trainable parameters
after every step, the device type the gradients lived on, and the run's ``determinism.json``, so a run can be
compared with one made in another process or on another machine.

In-process runs share one process, so non-determinism that only shows across processes (cuDNN's
autotuning cache under ``cudnn_benchmark``, hash seeds) can stay hidden; compare separate ``yolo-det train``
runs with ``yolo-det diff``, or use ``--save``/``--against``, for that.
"""

from __future__ import annotations

from .compare import compare_runs
from .records import Divergence, MicroBatch, RunRecord, StepRecord
from .report import VerifyReport, loss_figure, plot_losses
from .run import check_args, progress_to_stderr, record_runs, verify

__all__ = [
    "Divergence",
    "MicroBatch",
    "RunRecord",
    "StepRecord",
    "VerifyReport",
    "check_args",
    "compare_runs",
    "loss_figure",
    "plot_losses",
    "progress_to_stderr",
    "record_runs",
    "verify",
]
