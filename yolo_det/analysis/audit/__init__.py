"""Say, on any machine, which layer of a model will break strict determinism on CUDA, and how to fix it.

:func:`audit` runs the model's forward and backward on a *fake* CUDA device (torch's ``FakeTensorMode``:
tensors that report ``cuda`` and hold only a shape; no GPU, no memory, no arithmetic) with deterministic
algorithms set as the profile sets them at forward time, so torch takes the code paths it takes on a GPU,
the Python-level ones in ``F.interpolate``/``F.pad`` included.
Every aten op of the forward and of the backward, and every autograd node, is attributed to the module
that produced it (module path, class, and for Ultralytics models the YAML layer index and line), then
matched against the knowledge table (:mod:`yolo_det.analysis.optable`) for the running torch version, or for any
version given with ``torch_version=``::

    report = yolo_det.audit("data/models/cbam-max.yaml", imgsz=64)
    print(report.format_table())
    report.ok  # False: layer 10 (CBAMMax) reaches adaptive_max_pool2d_backward_cuda

With ``device="cuda"`` (on a machine with a GPU) the model also runs for real under strict mode; each
kernel that raises is recorded with the module that ran it (and rerun with the flag off so the pass can
finish), as a second opinion on the table.

How attribution works: module hooks keep the stack of modules whose forward is running; a
``TorchFunctionMode`` tags each autograd node created by a torch function call with the innermost
module (node ``metadata``); a ``TorchDispatchMode`` sees every aten op, forward and backward. The
backward of a fake-CUDA graph cannot go through the autograd engine on a machine without CUDA, so the
trace runs the graph itself: each node is called once, in dependency order, with its gradients.
"""

from __future__ import annotations

from .entry import audit
from .report import AuditReport, Finding

__all__ = ["AuditReport", "Finding", "audit"]
