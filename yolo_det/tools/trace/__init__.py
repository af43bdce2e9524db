"""Op traces: record order-sensitive digests of every op of chosen steps, and find where two runs part.

:mod:`.tracer` records (Ultralytics callbacks installing hooks for the chosen steps only), :mod:`.tracefile`
writes and strictly reads the file, :mod:`.bisect` compares two traces and names the first op whose inputs
are equal and whose output differs, with the settings of both sides that can change that op.
"""

from __future__ import annotations

from .steps import StepRange, parse_steps
from .tracefile import TRACE_SCHEMA, TRACE_VERSION, Trace, read_trace
from .tracer import OpTracer, trace_path

__all__ = ["TRACE_SCHEMA", "TRACE_VERSION", "OpTracer", "StepRange", "Trace", "parse_steps", "read_trace", "trace_path"]
