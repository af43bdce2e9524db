"""The knowledge table: CUDA kernels that are not deterministic, per torch version.

The table is package data (``yolo_det/analysis/optable/nondeterministic_ops.yaml``), readable and meant to be
edited: each entry names the kernel torch prints in its error, the aten ops and autograd nodes that
reach it, the pass (forward/backward), what torch does under each deterministic mode (the *effect*),
the condition, per torch version range whether it holds, and the deterministic replacement. The
audit (:mod:`yolo_det.analysis.audit`) and the CPU emulator (:mod:`yolo_det.analysis.emulator`) both read it, for the
running torch version or for one given explicitly::

    table = load_table()
    for entry, when in table.active("2.0.1"):
        print(entry.id, entry.kernel, when)

Matching a traced op against the table is :meth:`OpTable.lookup`; whether an occurrence reaches the
kernel is :meth:`OpEntry.reaches`, which encodes the only run-time condition torch has today: since
2.1, ``F.interpolate``/``F.pad`` route some calls through a deterministic decomposition on CUDA when
deterministic algorithms are on at forward time (``native_path``).
"""

from __future__ import annotations

from .decompose import decomposable_op, function_name, op_arguments
from .model import Fix, OpEntry, OpTable, VersionRange
from .parse import load_table, parse_table
from .schema import BEHAVIOUR, EFFECTS
from .versions import FAKE_CUDA_WITHOUT_DEVICE, fake_cuda_trace_problem, parse_version, torch_version, version_in

__all__ = [
    "BEHAVIOUR",
    "FAKE_CUDA_WITHOUT_DEVICE",
    "EFFECTS",
    "Fix",
    "OpEntry",
    "OpTable",
    "VersionRange",
    "decomposable_op",
    "fake_cuda_trace_problem",
    "function_name",
    "load_table",
    "op_arguments",
    "parse_table",
    "parse_version",
    "torch_version",
    "version_in",
]
