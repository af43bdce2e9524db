"""Say, on any machine, which layer of a model will break strict determinism on CUDA, and how to fix it.

:func:`audit` runs the model's forward and backward on a *fake* CUDA device (``FakeTensorMode``: no GPU,
no memory, no arithmetic) with deterministic algorithms set as the profile sets them at forward time, so
torch takes the code paths it takes on a GPU, the Python-level ones in ``F.interpolate``/``F.pad`` included.
Every aten op of the forward and of the backward, and every autograd node, is attributed to the module
that produced it (module path, class, and for Ultralytics models the YAML layer index and line), then
matched against the knowledge table (:mod:`yolo_det.optable`) for the running torch version, or for any
version given with ``torch_version=``::

    report = yolo_det.audit("data/models/cbam-max.yaml", imgsz=64)
    print(report.format_table())
    report.ok            # False: layer 10 (CBAMMax) reaches adaptive_max_pool2d_backward_cuda

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

import contextlib
import copy
import os
import time
import warnings
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from .errors import ConfigError, ModelError, YoloDetError
from .loader import LoadedModel, load_model
from .optable import OpEntry, OpTable, decomposable_op, function_name, load_table, op_arguments, parse_version
from .optable import torch_version as _running_torch
from .profiles import PhaseSettings, Profile, load_profile

__all__ = ["AuditReport", "Finding", "audit"]

_META = "yolo_det.audit"
_KNOWN_NAMESPACES = frozenset({"aten", "prim", "prims", "torchvision", "_c10d_functional", "c10d", "profiler",
                               "_quantized", "quantized", "rngprims", "higher_order", "debugprims"})
_ALERT = " does not have a deterministic implementation"
_MISSING = object()
_MODES = ("strict", "warn", "off")


# ---------------------------------------------------------------------------------------------------------
# report


@dataclass(frozen=True)
class Finding:
    """One module that reaches a non-deterministic kernel (or a source torch cannot check).

    Attributes:
        entry: The table entry id (``observed`` for a real-device alert the table did not predict).
        kernel: The kernel name as torch prints it.
        pass_: ``forward`` or ``backward``.
        effect: ``alert``, ``warn_only``, ``silent`` or ``review`` (see :mod:`yolo_det.optable`).
        layer: The Ultralytics layer index (``.i``) of the top-level layer holding the module, if any.
        layer_class: Class name of that top-level layer (e.g. ``CBAMMax``, ``RTDETRDecoder``).
        yaml_line: The line of that layer in the model YAML, when the model came from one.
        module: The module path (``model.10.max_pool``); ``""`` is the model itself.
        module_class: Class name of that module.
        op: What matched: the aten op, the Python function, or the autograd node kind.
        call: The torch function that issued the op (``torch.nn.functional.grid_sample``), if any.
        count: How many times the trace saw it in this module.
        behaviour: What happens under ``strict``, ``warn`` (warn_only) and ``off``.
        under_profile: What happens under the profile the audit was run with.
        fix: The deterministic replacement, or what to do without one.
        condition: When the kernel is reached (from the table).
        observed: With a real-device pass: whether the kernel really alerted there (None: not run).
        note: Extra information (a decomposition the running torch takes, a backward that could not be traced).
    """

    entry: str
    kernel: str
    pass_: str
    effect: str
    layer: int | None
    layer_class: str | None
    yaml_line: int | None
    module: str
    module_class: str
    op: str
    call: str | None
    count: int
    behaviour: Mapping[str, str]
    under_profile: str
    fix: str
    condition: str = ""
    observed: bool | None = None
    note: str = ""

    @property
    def breaks_determinism(self) -> bool:
        """True when training under strict determinism raises here or stays non-deterministic."""
        return self.effect in ("alert", "silent")

    def to_dict(self) -> dict[str, Any]:
        """Plain data (for ``--json``)."""
        return {
            "entry": self.entry, "kernel": self.kernel, "pass": self.pass_, "effect": self.effect,
            "layer": self.layer, "layer_class": self.layer_class, "yaml_line": self.yaml_line,
            "module": self.module, "module_class": self.module_class, "op": self.op, "call": self.call,
            "count": self.count, "behaviour": dict(self.behaviour), "under_profile": self.under_profile,
            "fix": self.fix, "condition": self.condition, "observed": self.observed, "note": self.note,
            "breaks_determinism": self.breaks_determinism,
        }


@dataclass
class AuditReport:
    """What :func:`audit` found.

    Attributes:
        model: The model as given (path, name, factory or class name).
        findings: One per (table entry, module), in layer order.
        torch_version: The torch version the table was read for.
        running_torch: The torch version that ran the trace.
        profile: The profile name; its train-phase settings decided the flag at forward time.
        imgsz: Input size of the trace.
        batch: Batch size of the trace.
        device: ``fake-cuda``, or the real device of the second-opinion pass as well.
        yaml_path: The model YAML, when the model came from one.
        notes: Things the trace could not do (nodes whose backward failed, ...).
        stats: Counts and the wall time of the audit.
    """

    model: str
    findings: list[Finding]
    torch_version: str
    running_torch: str
    profile: str
    imgsz: int
    batch: int
    device: str
    yaml_path: str | None = None
    notes: list[str] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when nothing in the model raises or stays non-deterministic under strict determinism."""
        return not any(f.breaks_determinism for f in self.findings)

    @property
    def exit_code(self) -> int:
        """0 when :attr:`ok`, else 1 (the CLI's exit code)."""
        return 0 if self.ok else 1

    def to_dict(self) -> dict[str, Any]:
        """Plain data (for ``--json``)."""
        return {
            "model": self.model, "ok": self.ok, "torch_version": self.torch_version,
            "running_torch": self.running_torch, "profile": self.profile, "imgsz": self.imgsz, "batch": self.batch,
            "device": self.device, "yaml_path": self.yaml_path, "findings": [f.to_dict() for f in self.findings],
            "notes": list(self.notes), "stats": dict(self.stats),
        }

    def format_table(self) -> str:
        """A readable report: one row per finding, then what happens under each mode, the fix and a verdict."""
        head = (f"yolo-det audit: {self.model}  (imgsz {self.imgsz}, batch {self.batch}, torch {self.torch_version}, "
                f"profile {self.profile}, {self.device} trace)")
        lines = [head]
        if not self.findings:
            lines.append("no layer reaches a non-deterministic CUDA kernel: the model trains under strict determinism")
        else:
            rows = [("layer", "line", "module", "class", "kernel", "pass")]
            for f in self.findings:
                layer = "-" if f.layer is None else str(f.layer)
                if f.layer_class and f.layer_class != f.module_class:
                    layer += f" {f.layer_class}"
                rows.append((layer, "-" if f.yaml_line is None else str(f.yaml_line), f.module or "(model)",
                             f.module_class, f.kernel, f.pass_))
            widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
            fmt = "  ".join(f"{{:<{w}}}" for w in widths)
            lines.append(fmt.format(*rows[0]).rstrip())
            for f, row in zip(self.findings, rows[1:]):
                lines.append(fmt.format(*row).rstrip())
                b = f.behaviour
                lines.append(f"    strict: {b['strict']} | warn_only: {b['warn']} | off: {b['off']}")
                extra = f" | seen on {self.device.split('+')[-1]}: {'yes' if f.observed else 'no'}" if f.observed is not None else ""
                lines.append(f"    under {self.profile}: {f.under_profile} | fix: {f.fix}{extra}")
                if f.note:
                    lines.append(f"    note: {f.note}")
        for note in self.notes:
            lines.append(f"note: {note}")
        bad = [f for f in self.findings if f.breaks_determinism]
        if bad:
            layers = sorted({f.layer for f in bad if f.layer is not None})
            where = f" (layer{'s' if len(layers) > 1 else ''} {', '.join(map(str, layers))})" if layers else ""
            lines.append(f"verdict: NOT deterministic under strict mode: {len(bad)} finding{'s' if len(bad) > 1 else ''}{where}")
        else:
            lines.append("verdict: trains under strict determinism")
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------
# the trace


@dataclass(frozen=True)
class _Occurrence:
    kind: str  # op | decomposed | function | node
    name: str  # aten::op, function qualname, or node kind
    overload: str
    pass_: str
    module: str
    node: str | None
    call: str | None
    native: str | None  # the aten op the call could have been decomposed from, when it went through F.*
    forward_det: bool | None
    args: Mapping[str, Any] | None = None
    label: str | None = None  # what the report shows as the op, when not ``name``


def _node_kind(node: Any) -> str:
    name = type(node).__name__
    if isinstance(node, torch.autograd.function.BackwardCFunction):
        return "library_op" if name.startswith("GeneratedBackwardFor_") else "python_function"
    if hasattr(torch._C._functions, name):
        return "builtin"
    return "extension"


def _tensors(obj: Any, out: list[torch.Tensor] | None = None, depth: int = 0) -> list[torch.Tensor]:
    out = [] if out is None else out
    if depth > 6:
        return out
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            _tensors(o, out, depth + 1)
    elif isinstance(obj, Mapping):
        for o in obj.values():
            _tensors(o, out, depth + 1)
    return out


class _Trace:
    """Collects occurrences of table-relevant ops, functions and nodes, each with its module."""

    def __init__(self, model: torch.nn.Module, table: OpTable, *, forward_det: bool, real: bool = False) -> None:
        self.model = model
        self.table = table
        self.forward_det = forward_det
        self.real = real
        self.paths = {id(m): p for p, m in model.named_modules()}
        self.classes = {p: type(m).__name__ for p, m in model.named_modules()}
        self.op_names = table.op_names
        self.functions = table.functions
        self.stack: list[str] = []
        self.pass_ = "forward"
        self.function: str | None = None
        self.expected: str | None = None  # native op the current F.* call may decompose
        self.native_seen: set[str] = set()
        self.node_meta: dict[str, Any] | None = None
        self.node_name: str | None = None
        self.occurrences: list[_Occurrence] = []
        self.notes: list[str] = []
        self.alerts: list[tuple[str, str, str, str | None]] = []  # (kernel, pass, module, node) from a real run
        self.alert_messages: dict[str, str] = {}  # kernel -> the message torch raised
        self.counts: Counter[str] = Counter()

    # -- module stack -----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def hooks(self) -> Iterator[None]:
        handles = []

        def pre(mod: torch.nn.Module, args: Any) -> None:
            self.stack.append(self.paths.get(id(mod), "?"))

        def post(mod: torch.nn.Module, args: Any, out: Any) -> None:
            if self.stack:
                self.stack.pop()

        try:
            for m in self.model.modules():
                handles.append(m.register_forward_pre_hook(pre))
                handles.append(m.register_forward_hook(post, always_call=True))
            yield
        finally:
            for h in handles:
                h.remove()
            self.stack.clear()

    def module(self) -> str:
        return self.stack[-1] if self.stack else ""

    # -- forward: torch functions -----------------------------------------------------------------------
    def before_function(self, func: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bool:
        if self.function is not None:
            return False
        self.function = function_name(func)
        self.expected = decomposable_op(self.function, args, kwargs)
        self.native_seen = set()
        return True

    def after_function(self, out: Any) -> None:
        name, expected = self.function, self.expected
        self.function = self.expected = None
        module = self.module()
        if name is None:
            return
        native_ran = expected is not None and expected in self.native_seen
        if expected is not None and not native_ran:
            # torch's Python layer took its deterministic decomposition: record the op it stands for, so that
            # a table entry for a torch version without that decomposition still sees the call.
            self.occurrences.append(_Occurrence("decomposed", expected, "", self.pass_, module, None, name, expected,
                                                self.forward_det))
        if name in self.functions:
            self.occurrences.append(_Occurrence("function", name, "", self.pass_, module, None, name, None,
                                                self.forward_det))
        meta = {"module": module, "call": name, "native": expected if native_ran else None, "det": self.forward_det}
        todo = [t.grad_fn for t in _tensors(out) if t.grad_fn is not None]
        while todo:
            node = todo.pop()
            if node is None:
                continue
            md = node.metadata
            if _META in md:
                continue
            md[_META] = meta
            self.counts["nodes"] += 1
            kind = _node_kind(node)
            if kind in ("python_function", "extension"):
                self.occurrences.append(_Occurrence("node", kind, "", "backward", module, type(node).__name__, name,
                                                    None, self.forward_det, label=type(node).__name__))
            todo.extend(fn for fn, _ in node.next_functions if fn is not None)

    # -- ops ---------------------------------------------------------------------------------------------
    def on_op(self, func: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
        self.counts["ops"] += 1
        schema = func._schema.name
        if self.function is not None:
            self.native_seen.add(schema)
        namespace = schema.split("::", 1)[0]
        unknown_ns = namespace not in _KNOWN_NAMESPACES
        if schema not in self.op_names and not unknown_ns:
            return
        if self.pass_ == "forward":
            module, call, node = self.module(), self.function, None
            native = schema if self.expected == schema else None
            det: bool | None = self.forward_det
        else:
            meta = self.node_meta or {}
            module, call, node = meta.get("module", ""), meta.get("call"), self.node_name
            native = meta.get("native")
            det = meta.get("det")
        if unknown_ns and schema not in self.op_names:
            self.occurrences.append(_Occurrence("node", "extension", "", self.pass_, module, node, call, None, det,
                                                label=schema))
            return
        bound = None
        entries = self.table.lookup(schema, func._overloadname)
        if any(e.args for e in entries):
            bound = op_arguments(func, args, kwargs)
        self.occurrences.append(_Occurrence("op", schema, func._overloadname, self.pass_, module, node, call, native, det,
                                            bound))

    # -- backward ----------------------------------------------------------------------------------------
    def run_backward(self, root: Any) -> None:
        """Call every node reachable from ``root`` once, in dependency order (the autograd engine's job)."""
        deps: Counter[Any] = Counter()
        seen = {root}
        order = [root]
        i = 0
        while i < len(order):
            node = order[i]
            i += 1
            for fn, _ in node.next_functions:
                if fn is None:
                    continue
                deps[fn] += 1
                if fn not in seen:
                    seen.add(fn)
                    order.append(fn)
        grads: dict[Any, dict[int, torch.Tensor]] = defaultdict(dict)
        grads[root][0] = torch.ones((), dtype=root._input_metadata[0].dtype, device=root._input_metadata[0].device)
        ready = [root]
        failed: Counter[str] = Counter()
        self.pass_ = "backward"
        try:
            while ready:
                node = ready.pop()
                g = grads.pop(node, {})
                outs: Any = None
                if type(node).__name__ != "AccumulateGrad":
                    n_in = len(node._input_metadata)
                    grad_in = [g.get(k) for k in range(n_in)]
                    self.node_meta = node.metadata.get(_META)
                    self.node_name = type(node).__name__
                    try:
                        if isinstance(node, torch.autograd.function.BackwardCFunction):
                            outs = node.apply(*grad_in)
                        else:
                            outs = node(*grad_in)
                        self.counts["backward_nodes"] += 1
                    except Exception as e:  # noqa: BLE001 - a node without a fake kernel: match it by name
                        failed[f"{type(node).__name__} ({type(e).__name__})"] += 1
                        meta = self.node_meta or {}
                        self.occurrences.append(_Occurrence("node_name", type(node).__name__, "", "backward",
                                                            meta.get("module", ""), type(node).__name__,
                                                            meta.get("call"), meta.get("native"), meta.get("det")))
                        outs = None
                    finally:
                        self.node_meta = self.node_name = None
                    if isinstance(outs, torch.Tensor) or outs is None:
                        outs = (outs,)
                for k, (fn, input_nr) in enumerate(node.next_functions):
                    if fn is None:
                        continue
                    if outs is not None and k < len(outs) and isinstance(outs[k], torch.Tensor):
                        grad = outs[k]
                        want = fn._input_metadata[input_nr]
                        if list(grad.shape) != list(want.shape):
                            try:
                                grad = grad.sum_to_size(list(want.shape))
                            except RuntimeError:
                                grad = None
                        if grad is not None and grad.dtype != want.dtype:
                            grad = grad.to(want.dtype)
                        if grad is not None:
                            slot = grads[fn]
                            slot[input_nr] = grad if input_nr not in slot else slot[input_nr] + grad
                    deps[fn] -= 1
                    if deps[fn] == 0:
                        ready.append(fn)
        finally:
            self.pass_ = "forward"
        for what, n in failed.items():
            self.notes.append(f"backward of {what} could not be traced ({n}x); matched by node name instead")


class _FunctionMode(TorchFunctionMode):
    def __init__(self, trace: _Trace) -> None:
        super().__init__()
        self.trace = trace

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        outer = self.trace.before_function(func, args, kwargs)
        try:
            out = func(*args, **kwargs)
        except BaseException:
            if outer:
                self.trace.function = self.trace.expected = None
            raise
        if outer:
            self.trace.after_function(out)
        return out


def _cudnn_grid_sampler(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    x, grid = args[0], args[1]
    return torch.empty((x.shape[0], x.shape[1], grid.shape[1], grid.shape[2]), dtype=x.dtype, device=x.device)


def _cudnn_grid_sampler_backward(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    x, grid = args[0], args[1]
    return torch.empty_like(x), torch.empty_like(grid)


# Ops that reach cuDNN on a GPU and have no fake kernel: shape-only stand-ins.
_STAND_INS: dict[Any, Callable[[tuple[Any, ...], Mapping[str, Any]], Any]] = {
    torch.ops.aten.cudnn_grid_sampler.default: _cudnn_grid_sampler,
    torch.ops.aten.cudnn_grid_sampler_backward.default: _cudnn_grid_sampler_backward,
}


class _DispatchMode(TorchDispatchMode):
    def __init__(self, trace: _Trace) -> None:
        super().__init__()
        self.trace = trace

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        t = self.trace
        t.on_op(func, args, kwargs)
        if not t.real:
            stand_in = _STAND_INS.get(func)
            if stand_in is not None:
                return stand_in(args, kwargs)
            return func(*args, **kwargs)
        try:
            return func(*args, **kwargs)
        except RuntimeError as e:
            msg = str(e)
            if _ALERT not in msg:
                raise
            # A real kernel refused to run under strict mode: record it, then run it with the flag off.
            kernel = msg.split(_ALERT, 1)[0].strip().splitlines()[-1]
            t.alert_messages.setdefault(kernel, msg)
            if t.pass_ == "forward":
                t.alerts.append((kernel, "forward", t.module(), None))
            else:
                node = torch._C._current_autograd_node()
                meta = (node.metadata.get(_META) if node is not None else None) or {}
                t.alerts.append((kernel, "backward", meta.get("module", ""), type(node).__name__ if node else None))
            warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
            torch.use_deterministic_algorithms(False)
            try:
                return func(*args, **kwargs)
            finally:
                torch.use_deterministic_algorithms(True, warn_only=warn_only)


class _RealBackwardMeta(TorchDispatchMode):
    """During a real backward, expose the running node's metadata to the trace (the engine runs the nodes)."""

    def __init__(self, trace: _Trace) -> None:
        super().__init__()
        self.trace = trace

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        node = torch._C._current_autograd_node()
        self.trace.node_meta = node.metadata.get(_META) if node is not None else None
        self.trace.node_name = type(node).__name__ if node is not None else None
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def _deterministic(on: bool, *, warn_only: bool) -> Iterator[None]:
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    try:
        if on:
            torch.use_deterministic_algorithms(True, warn_only=warn_only)
        else:
            torch.use_deterministic_algorithms(False)
        yield
    finally:
        if before[0]:
            torch.use_deterministic_algorithms(True, warn_only=before[1])
        else:
            torch.use_deterministic_algorithms(False)


@contextlib.contextmanager
def _preserved(model: torch.nn.Module) -> Iterator[None]:
    """Put back training flags and every instance attribute a forward pass set or replaced on the modules.

    A traced forward leaves fake tensors behind in caches (RT-DETR's decoder keeps its anchors and the shapes
    they were made for); the model must come out exactly as it went in.
    """
    modules = list(model.modules())
    training = [m.training for m in modules]
    attrs = [dict(vars(m)) for m in modules]
    try:
        yield
    finally:
        for m, flag, before in zip(modules, training, attrs):
            now = vars(m)
            for key in [k for k in now if k not in before]:
                del now[key]
            for key, value in before.items():
                if now.get(key, _MISSING) is not value:
                    now[key] = value
            m.training = flag


def _loss_root(out: Any) -> Any:
    parts = [t.float().sum() for t in _tensors(out) if t.requires_grad and t.is_floating_point()]
    if not parts:
        return None
    total = parts[0]
    for p in parts[1:]:
        total = total + p
    return total


def _fake_trace(loaded: LoadedModel, table: OpTable, *, imgsz: int, batch: int, forward_det: bool) -> _Trace:
    from torch._subclasses.fake_tensor import FakeTensorMode

    model = loaded.model
    trace = _Trace(model, table, forward_det=forward_det)
    with contextlib.ExitStack() as stack:
        stack.enter_context(_preserved(model))
        stack.enter_context(warnings.catch_warnings())
        warnings.simplefilter("ignore")
        stack.enter_context(torch.enable_grad())
        model.train()
        stack.enter_context(FakeTensorMode(allow_non_fake_inputs=True))
        params = {k: torch.empty(v.shape, dtype=v.dtype, device="cuda").requires_grad_(v.requires_grad)
                  for k, v in model.named_parameters()}
        params.update({k: torch.empty(v.shape, dtype=v.dtype, device="cuda") for k, v in model.named_buffers()})
        dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.get_default_dtype())
        x = torch.empty((batch, loaded.channels, imgsz, imgsz), dtype=dtype, device="cuda")
        stack.enter_context(_deterministic(forward_det, warn_only=True))
        stack.enter_context(trace.hooks())
        dispatch = _DispatchMode(trace)
        fmode = _FunctionMode(trace)
        try:
            with dispatch, fmode:
                out = torch.func.functional_call(model, params, (x,), strict=False)
                root = _loss_root(out)
        except Exception as e:  # noqa: BLE001 - the model's own forward failed
            msg = " ".join(str(e).split()) or type(e).__name__
            raise ModelError(f"the model's forward failed on a {tuple(x.shape)} input: {type(e).__name__}: {msg[:300]}") from None
        if root is None or root.grad_fn is None:
            trace.notes.append("no output requires grad: only the forward was traced")
        else:
            with dispatch:
                trace.run_backward(root.grad_fn)
    return trace


def _real_trace(loaded: LoadedModel, table: OpTable, *, imgsz: int, batch: int, forward_det: bool,
                device: str) -> _Trace:
    """Run a copy of the model for real on ``device`` under strict mode, recording every kernel that alerts.

    An alerting kernel is recorded with its module and rerun with the flag off, so the pass reaches the end.
    ``CUBLAS_WORKSPACE_CONFIG`` is set for the pass when unset (strict mode refuses cuBLAS without it).
    """
    model = copy.deepcopy(loaded.model).to(device)
    trace = _Trace(model, table, forward_det=forward_det, real=True)
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = torch.rand((batch, loaded.channels, imgsz, imgsz), generator=gen).to(device)
    env_before = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    try:
        with contextlib.ExitStack() as stack:
            if env_before is None:
                os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
            stack.enter_context(warnings.catch_warnings())
            warnings.simplefilter("ignore")
            stack.enter_context(torch.enable_grad())
            model.train()
            stack.enter_context(_deterministic(True, warn_only=False))
            stack.enter_context(trace.hooks())
            with _DispatchMode(trace), _FunctionMode(trace):
                out = model(x)
                root = _loss_root(out)
            if root is not None:
                trace.pass_ = "backward"
                try:
                    with _DispatchMode(trace), _RealBackwardMeta(trace):
                        root.backward()
                finally:
                    trace.pass_ = "forward"
            if device.startswith("cuda"):
                torch.cuda.synchronize(device)
    except Exception as e:  # noqa: BLE001 - the model's own code on the device
        msg = " ".join(str(e).split()) or type(e).__name__
        raise ModelError(f"the real pass on {device} failed: {type(e).__name__}: {msg[:300]}") from None
    finally:
        if env_before is None:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
    return trace


def _synthetic_batch(model: torch.nn.Module, *, imgsz: int, batch: int, channels: int) -> dict[str, Any]:
    """A small labelled batch in the layout Ultralytics' losses expect (two objects per image)."""
    gen = torch.Generator().manual_seed(0)
    names = getattr(model, "names", None)
    yaml_cfg = getattr(model, "yaml", {}) or {}
    nc = int(yaml_cfg.get("nc") or (len(names) if names else 1))
    cls_name = type(model).__name__
    img = torch.rand((batch, channels, imgsz, imgsz), generator=gen)
    if cls_name == "ClassificationModel":
        return {"img": img, "cls": torch.randint(0, nc, (batch,), generator=gen)}
    per = 2
    n = batch * per
    xy = 0.3 + 0.4 * torch.rand((n, 2), generator=gen)
    wh = 0.1 + 0.2 * torch.rand((n, 2), generator=gen)
    out: dict[str, Any] = {"img": img, "batch_idx": torch.arange(batch).repeat_interleave(per).float(),
                           "cls": torch.randint(0, nc, (n, 1), generator=gen).float(), "bboxes": torch.cat([xy, wh], 1)}
    if cls_name == "OBBModel":
        out["bboxes"] = torch.cat([xy, wh, torch.zeros((n, 1))], 1)
    if cls_name == "PoseModel":
        kpt = list(getattr(model.model[-1], "kpt_shape", [17, 3]))
        points = torch.rand((n, kpt[0], kpt[1]), generator=gen)
        if kpt[1] == 3:
            points[..., 2] = 1.0
        out["keypoints"] = points
    if "Segment" in type(model.model[-1]).__name__:
        args = getattr(model, "args", None)
        ratio = int(getattr(args, "mask_ratio", 4) or 4)
        size = max(imgsz // ratio, 1)
        masks = torch.zeros((batch, size, size))
        for k in range(n):  # overlapping-mask layout: pixel value = instance index within its image + 1
            b, idx = k // per, k % per + 1
            x0, y0 = int((xy[k, 0] - wh[k, 0] / 2) * size), int((xy[k, 1] - wh[k, 1] / 2) * size)
            x1, y1 = int((xy[k, 0] + wh[k, 0] / 2) * size) + 1, int((xy[k, 1] + wh[k, 1] / 2) * size) + 1
            masks[b, y0:y1, x0:x1] = idx
        out["masks"] = masks
    if cls_name in ("WorldModel", "YOLOEModel", "YOLOESegModel"):
        txt = getattr(model, "txt_feats", None)
        if isinstance(txt, torch.Tensor):
            out["txt_feats"] = txt.expand(batch, *txt.shape[1:]).clone()
    return out


def _loss_trace(loaded: LoadedModel, table: OpTable, *, imgsz: int, batch: int, forward_det: bool) -> _Trace:
    """One real training step on the CPU (forward, the model's own loss on a synthetic batch, backward).

    The loss is data-dependent (target assignment branches on the number of matches), which fake tensors
    cannot follow, so this pass computes for real on a copy of the model. Ops are recorded with the same
    forward-time facts as the fake trace (the flag, whether torch's Python layer would decompose the call), so
    the table decides as it would on CUDA; only the loss's own findings (module ``(loss)``) are kept.
    """
    model = loaded.model
    if not callable(getattr(model, "loss", None)) or not callable(getattr(model, "init_criterion", None)):
        raise ConfigError("the loss pass needs an Ultralytics model (one with .loss(batch)); audit without loss=True")
    work = copy.deepcopy(model).cpu().float()
    args = getattr(work, "args", None)
    if args is None or isinstance(args, dict):
        from ultralytics.cfg import get_cfg

        work.args = get_cfg(overrides={k: v for k, v in (args or {}).items() if k in ("box", "cls", "dfl", "mask_ratio",
                                                                                    "overlap_mask", "pose", "kobj")})
    work.criterion = None
    if not isinstance(getattr(work, "nc", None), int):  # trainers set it; RT-DETR's criterion reads it
        work.nc = int((getattr(work, "yaml", None) or {}).get("nc") or len(getattr(work, "names", None) or [0]))
    data = _synthetic_batch(work, imgsz=imgsz, batch=batch, channels=loaded.channels)
    trace = _Trace(work, table, forward_det=forward_det, real=True)
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(warnings.catch_warnings())
            warnings.simplefilter("ignore")
            stack.enter_context(torch.enable_grad())
            work.train()
            stack.enter_context(_deterministic(forward_det, warn_only=True))
            stack.enter_context(trace.hooks())
            with _DispatchMode(trace), _FunctionMode(trace):
                preds = work(data["img"]) if "txt_feats" not in data else work(data["img"], txt_feats=data["txt_feats"])
                trace.stack.append("(loss)")
                try:
                    loss = work.loss(data, preds)
                finally:
                    trace.stack.pop()
            trace.classes["(loss)"] = type(getattr(work, "criterion", None)).__name__
            root = _loss_root(loss[0] if isinstance(loss, (tuple, list)) else loss)
            if root is not None:
                trace.pass_ = "backward"
                try:
                    with _DispatchMode(trace), _RealBackwardMeta(trace):
                        root.backward()
                finally:
                    trace.pass_ = "forward"
    except YoloDetError:
        raise
    except Exception as e:  # noqa: BLE001 - the model's own loss on a synthetic batch
        msg = " ".join(str(e).split()) or type(e).__name__
        raise ModelError(f"the loss pass failed on a synthetic batch: {type(e).__name__}: {msg[:300]}") from None
    return trace


# ---------------------------------------------------------------------------------------------------------
# matching


def _layer_of(model: torch.nn.Module, path: str) -> tuple[int | None, str | None]:
    parts = path.split(".") if path else []
    for n in range(1, len(parts) + 1):
        try:
            mod = model.get_submodule(".".join(parts[:n]))
        except AttributeError:
            return None, None
        i = getattr(mod, "i", None)
        if isinstance(i, int) and not isinstance(i, bool) and hasattr(mod, "f"):
            return i, type(mod).__name__
    return None, None


def _under(entry: OpEntry, settings: PhaseSettings, module_class: str, call: str | None) -> str:
    mode = settings.deterministic_algorithms
    if entry.pass_ == "backward" and settings.backward == "disable":
        mode = "off"
    if settings.swaps != "none" and entry.fix.swap_for(module_class):
        return f"swapped for {entry.fix.swap_for(module_class)} (swaps: {settings.swaps})"
    if settings.intercept and call and call in entry.fix.functions:
        return f"intercepted: {call.rsplit('.', 1)[-1]} -> {entry.fix.functions[call]}"
    text = entry.behaviour(mode)
    if mode == "off" and settings.deterministic_algorithms != "off" and entry.pass_ == "backward":
        text = f"no error; {text} (backward runs with the flag off)"
    return text


def _match(trace: _Trace, table: OpTable, version: str, loaded: LoadedModel, settings: PhaseSettings) -> list[Finding]:
    v = parse_version(version)
    model = loaded.model
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    running = parse_version(_running_torch())

    def add(entry: OpEntry, occ: _Occurrence, note: str = "") -> None:
        key = (entry.id, occ.module)
        g = groups.get(key)
        if g is None:
            groups[key] = {"entry": entry, "occ": occ, "count": 1, "note": note}
        else:
            g["count"] += 1

    for occ in trace.occurrences:
        if occ.kind == "op":
            candidates = table.lookup(occ.name, occ.overload)
        elif occ.kind == "decomposed":
            candidates = table.lookup_forward(occ.name)
        elif occ.kind == "function":
            candidates = table.lookup_function(occ.name)
        elif occ.kind == "node":
            candidates = table.lookup_kind(occ.name)
        else:  # node_name: a backward that could not be traced
            candidates = table.lookup_node(occ.name)
        for entry in candidates:
            when = entry.rule(v)
            if when is None or when == "never":
                continue
            if entry.args and not (occ.args is not None and entry.args_hold(occ.args)):
                continue
            if occ.kind == "decomposed":
                if not OpEntry.reaches(when, via_functional=True, forward_deterministic=True):
                    continue
                note = ""
                if v != running:
                    note = (f"torch {'.'.join(map(str, running))} takes a deterministic decomposition here; "
                            f"torch {version} has none")
                add(entry, occ, note)
                continue
            via = occ.native is not None and (occ.native in entry.forward_ops or occ.native in entry.ops)
            if not OpEntry.reaches(when, via_functional=via, forward_deterministic=occ.forward_det):
                continue
            add(entry, occ)

    findings = []
    for g in groups.values():
        entry, occ = g["entry"], g["occ"]
        layer, layer_class = _layer_of(model, occ.module)
        module_class = trace.classes.get(occ.module, "?")
        findings.append(Finding(
            entry=entry.id, kernel=entry.kernel, pass_=entry.pass_, effect=entry.effect, layer=layer,
            layer_class=layer_class, yaml_line=loaded.layer_lines.get(layer) if layer is not None else None,
            module=occ.module, module_class=module_class,
            op=occ.label or occ.name, call=occ.call, count=g["count"],
            behaviour={m: entry.behaviour(m) for m in _MODES}, under_profile=_under(entry, settings, module_class, occ.call),
            fix=entry.fix.describe(module_class), condition=entry.condition, note=g["note"],
        ))
    findings.sort(key=lambda f: (f.layer if f.layer is not None else 10**9, f.module, f.entry))
    return findings


def _merge_observed(findings: list[Finding], trace: _Trace, table: OpTable, loaded: LoadedModel,
                    settings: PhaseSettings) -> list[Finding]:
    seen = {(k, m) for k, _, m, _ in trace.alerts}
    out = []
    for f in findings:
        obs = (f.kernel, f.module) in seen if f.effect == "alert" else None
        out.append(Finding(**{**f.__dict__, "observed": obs}))
    known = {(f.kernel, f.module) for f in findings}
    extra: dict[tuple[str, str], list[Any]] = {}
    for kernel, pass_, module, node in trace.alerts:
        if (kernel, module) in known:
            continue
        extra.setdefault((kernel, module), [pass_, node, 0])[2] += 1
    for (kernel, module), (pass_, node, count) in extra.items():
        layer, layer_class = _layer_of(loaded.model, module)
        module_class = trace.classes.get(module, "?")
        out.append(Finding(
            entry="observed", kernel=kernel, pass_=pass_, effect="alert", layer=layer, layer_class=layer_class,
            yaml_line=loaded.layer_lines.get(layer) if layer is not None else None, module=module,
            module_class=module_class, op=node or kernel, call=None, count=count,
            behaviour={"strict": "raises RuntimeError", "warn": "warns; non-deterministic", "off": "non-deterministic, no message"},
            under_profile="raises RuntimeError" if settings.deterministic_algorithms == "strict" else "non-deterministic",
            fix="not in yolo-det's table: scoped toggle (profile balanced) or accept", observed=True,
            note="seen on the real device only; please report it so the table can learn it",
        ))
    out.sort(key=lambda f: (f.layer if f.layer is not None else 10**9, f.module, f.entry))
    return out


# ---------------------------------------------------------------------------------------------------------
# public API


def _check_size(imgsz: Any, batch: Any, stride: int | None) -> int:
    if isinstance(imgsz, bool) or not isinstance(imgsz, int) or imgsz < 1:
        raise ConfigError(f"imgsz must be a positive integer, got {imgsz!r}")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ConfigError(f"batch must be a positive integer, got {batch!r}")
    if stride:
        if imgsz < stride or imgsz % stride:
            lower = max(stride, imgsz // stride * stride)
            upper = lower if lower > imgsz else lower + stride
            options = sorted({lower, upper})
            raise ConfigError(f"imgsz {imgsz} is not a multiple of the model's stride {stride}; use "
                              f"{' or '.join(map(str, options))}")
    return imgsz


def _load(model: Any, modules: Any = None) -> LoadedModel:
    if isinstance(model, LoadedModel):
        return model
    from .names import custom_modules

    with custom_modules(list(modules or [])):  # the user's blocks, yolo-det's layer names and the example blocks
        return load_model(model)


def audit(
    model: Any,
    *,
    imgsz: int = 640,
    batch: int = 2,
    profile: str | Profile = "repro",
    device: str = "fake",
    torch_version: str | None = None,
    table: str | Path | OpTable | None = None,
    loss: bool = False,
    modules: Any = None,
) -> AuditReport:
    """Find the layers of ``model`` that will not train under strict determinism on CUDA.

    Args:
        model: A model YAML (path, Ultralytics name such as ``yolov8n.yaml``, or yolo-det example such as
            ``cbam-max.yaml``; rewritten YAMLs' ``Det*`` names and the blocks of :mod:`yolo_det.zoo` are known), a checkpoint path, a factory ``package.module:function``, an
            ``nn.Module`` or an ``ultralytics.YOLO``.
        imgsz: Square input size of the trace (a multiple of the model's stride).
        batch: Batch size of the trace.
        profile: The profile (name, file or :class:`~yolo_det.profiles.Profile`) whose train phase decides
            the deterministic flag at forward time and the "under profile" column.
        device: ``fake`` (the default: fake CUDA, any machine) or ``cuda``/``cuda:N`` to also run the real kernels
            under strict mode as a second opinion.
        torch_version: Read the table for this torch version instead of the running one ("what would happen on
            torch 2.0?"). The trace itself always runs on the installed torch.
        table: A table file of the same format as the built-in one (default: the built-in table).
        loss: Also run one real training step of an Ultralytics model on the CPU (forward, the model's own loss
            on a synthetic batch, backward) and report what the loss itself reaches (module ``(loss)``). The loss
            branches on its data, which a fake trace cannot follow; use a small ``imgsz``.
        modules: The user's modules whose classes a model YAML names: module names (``"mypkg.blocks"``), ``.py``
            paths, module objects or ``{name: class}`` mappings (the CLI's ``--import``); see
            :func:`yolo_det.names.custom_modules`. yolo-det's layer names (``DetUpsample``, ...) and example
            blocks always resolve; a name the process already binds is never replaced.

    Returns:
        The report: ``.findings``, ``.ok``, ``.to_dict()``, ``.format_table()``.

    Raises:
        ModelError: The model cannot be loaded, built or run.
        ConfigError: Bad ``imgsz``/``batch``/``device``/``torch_version``, or a bad table.
        ProfileError: Bad profile.
    """
    started = time.perf_counter()
    prof = load_profile(profile)
    settings = prof.train
    tbl = load_table(table)
    running = _running_torch()
    version = running if torch_version is None else str(torch_version)
    parse_version(version)
    if not isinstance(device, str) or not (device == "fake" or device == "cuda" or device.startswith("cuda:")):
        raise ConfigError(f"device must be 'fake' or 'cuda[:N]', got {device!r}")
    if device != "fake" and not torch.cuda.is_available():
        raise ConfigError(f"device '{device}' needs a CUDA GPU and none is available; the default fake-CUDA trace needs none")
    loaded = _load(model, modules)
    _check_size(imgsz, batch, loaded.stride)
    trace = _fake_trace(loaded, tbl, imgsz=imgsz, batch=batch, forward_det=settings.deterministic)
    findings = _match(trace, tbl, version, loaded, settings)
    notes = list(trace.notes)
    if loss:
        loss_trace = _loss_trace(loaded, tbl, imgsz=imgsz, batch=batch, forward_det=settings.deterministic)
        findings += [f for f in _match(loss_trace, tbl, version, loaded, settings) if f.module == "(loss)"]
    device_label = "fake-cuda"
    if device != "fake":
        real = _real_trace(loaded, tbl, imgsz=imgsz, batch=batch, forward_det=True, device=device)
        findings = _merge_observed(findings, real, tbl, loaded, settings)
        notes += real.notes
        device_label = f"fake-cuda+{device}"
    return AuditReport(
        model=loaded.source, findings=findings, torch_version=version, running_torch=running,
        profile=prof.name, imgsz=imgsz, batch=batch, device=device_label,
        yaml_path=str(loaded.yaml_path) if loaded.yaml_path else None, notes=notes,
        stats={"ops": trace.counts["ops"], "autograd_nodes": trace.counts["nodes"],
               "backward_nodes_run": trace.counts["backward_nodes"], "seconds": round(time.perf_counter() - started, 3)},
    )

