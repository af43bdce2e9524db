"""Tracing a model on fake CUDA (and for real) and recording which kernels each module reaches.

Length: one concern, the trace. :class:`_Trace` is one dispatch handler whose hooks share its state,
and the three drivers (fake CUDA, the real device, the loss) set it up around the model.
"""

from __future__ import annotations

import contextlib
import copy
import os
import warnings
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ...core.constants import ALERT
from ...core.errors import ConfigError, ModelError, YoloDetError
from ..loader import LoadedModel
from ..optable import OpTable, decomposable_op, function_name, op_arguments
from ..tracing import DispatchHook, FunctionHook, current_node, deterministic_flag, node_metadata, tensors

_META = "yolo_det.analysis.audit"
_KNOWN_NAMESPACES = frozenset(
    {
        "aten",
        "prim",
        "prims",
        "torchvision",
        "_c10d_functional",
        "c10d",
        "profiler",
        "_quantized",
        "quantized",
        "rngprims",
        "higher_order",
        "debugprims",
    }
)
_ALERT = ALERT
_MISSING = object()


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
            self.occurrences.append(
                _Occurrence("decomposed", expected, "", self.pass_, module, None, name, expected, self.forward_det)
            )
        if name in self.functions:
            self.occurrences.append(
                _Occurrence("function", name, "", self.pass_, module, None, name, None, self.forward_det)
            )
        meta = {"module": module, "call": name, "native": expected if native_ran else None, "det": self.forward_det}
        todo = [t.grad_fn for t in tensors(out) if t.grad_fn is not None]
        while todo:
            node = todo.pop()
            if node is None:
                continue
            md = node_metadata(node)
            if _META in md:
                continue
            md[_META] = meta
            self.counts["nodes"] += 1
            kind = _node_kind(node)
            if kind in ("python_function", "extension"):
                self.occurrences.append(
                    _Occurrence(
                        "node",
                        kind,
                        "",
                        "backward",
                        module,
                        type(node).__name__,
                        name,
                        None,
                        self.forward_det,
                        label=type(node).__name__,
                    )
                )
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
            self.occurrences.append(
                _Occurrence("node", "extension", "", self.pass_, module, node, call, None, det, label=schema)
            )
            return
        bound = None
        entries = self.table.lookup(schema, func._overloadname)
        if any(e.args for e in entries):
            bound = op_arguments(func, args, kwargs)
        self.occurrences.append(
            _Occurrence("op", schema, func._overloadname, self.pass_, module, node, call, native, det, bound)
        )

    # -- the hooks' handlers (analysis.tracing) ---------------------------------------------------------
    def call_function(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Torch-function handler: note the outermost F.* call around the ops it runs."""
        outer = self.before_function(func, args, kwargs)
        try:
            out = func(*args, **kwargs)
        except BaseException:
            if outer:
                self.function = self.expected = None
            raise
        if outer:
            self.after_function(out)
        return out

    def dispatch(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Dispatch handler: record the op; on fake CUDA stand in for cuDNN-only ops; on a real run record
        each kernel that refuses strict mode and rerun it with the flag off."""
        self.on_op(func, args, kwargs)
        if not self.real:
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
            kernel = msg.split(_ALERT, 1)[0].strip().splitlines()[-1]
            self.alert_messages.setdefault(kernel, msg)
            if self.pass_ == "forward":
                self.alerts.append((kernel, "forward", self.module(), None))
            else:
                node = current_node()
                meta = (node_metadata(node).get(_META) if node is not None else None) or {}
                self.alerts.append((kernel, "backward", meta.get("module", ""), type(node).__name__ if node else None))
            with deterministic_flag("off"):
                return func(*args, **kwargs)

    def expose_node(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Dispatch handler for a real backward: expose the running node's metadata (the engine runs the nodes)."""
        node = current_node()
        self.node_meta = node_metadata(node).get(_META) if node is not None else None
        self.node_name = type(node).__name__ if node is not None else None
        return func(*args, **kwargs)

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
                    self.node_meta = node_metadata(node).get(_META)
                    self.node_name = type(node).__name__
                    try:
                        if isinstance(node, torch.autograd.function.BackwardCFunction):
                            outs = node.apply(*grad_in)
                        else:
                            outs = node(*grad_in)
                        self.counts["backward_nodes"] += 1
                    except Exception as e:  # a node without a fake kernel: match it by name
                        failed[f"{type(node).__name__} ({type(e).__name__})"] += 1
                        meta = self.node_meta or {}
                        self.occurrences.append(
                            _Occurrence(
                                "node_name",
                                type(node).__name__,
                                "",
                                "backward",
                                meta.get("module", ""),
                                type(node).__name__,
                                meta.get("call"),
                                meta.get("native"),
                                meta.get("det"),
                            )
                        )
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
    parts = [t.float().sum() for t in tensors(out) if t.requires_grad and t.is_floating_point()]
    if not parts:
        return None
    total = parts[0]
    for p in parts[1:]:
        total = total + p
    return total


def _real_backward(trace: _Trace, root: torch.Tensor) -> None:
    """Run autograd's backward from ``root`` for real, recording its ops with the running node's metadata."""
    trace.pass_ = "backward"
    try:
        with DispatchHook(trace.dispatch), DispatchHook(trace.expose_node):
            root.backward()
    finally:
        trace.pass_ = "forward"


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
        params = {
            k: torch.empty(v.shape, dtype=v.dtype, device="cuda").requires_grad_(v.requires_grad)
            for k, v in model.named_parameters()
        }
        params.update({k: torch.empty(v.shape, dtype=v.dtype, device="cuda") for k, v in model.named_buffers()})
        dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.get_default_dtype())
        x = torch.empty((batch, loaded.channels, imgsz, imgsz), dtype=dtype, device="cuda")
        stack.enter_context(deterministic_flag("warn" if forward_det else "off"))
        stack.enter_context(trace.hooks())
        dispatch = DispatchHook(trace.dispatch)
        fmode = FunctionHook(trace.call_function)
        try:
            with dispatch, fmode:
                out = torch.func.functional_call(model, params, (x,), strict=False)
                root = _loss_root(out)
        except Exception as e:  # the model's own forward failed
            msg = " ".join(str(e).split()) or type(e).__name__
            raise ModelError(
                f"the model's forward failed on a {tuple(x.shape)} input: {type(e).__name__}: {msg[:300]}"
            ) from None
        if root is None or root.grad_fn is None:
            trace.notes.append("no output requires grad: only the forward was traced")
        else:
            with dispatch:
                trace.run_backward(root.grad_fn)
    return trace


def _real_trace(
    loaded: LoadedModel, table: OpTable, *, imgsz: int, batch: int, forward_det: bool, device: str
) -> _Trace:
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
            stack.enter_context(deterministic_flag("strict"))
            stack.enter_context(trace.hooks())
            with DispatchHook(trace.dispatch), FunctionHook(trace.call_function):
                out = model(x)
                root = _loss_root(out)
            if root is not None:
                _real_backward(trace, root)
            if device.startswith("cuda"):
                torch.cuda.synchronize(device)
    except Exception as e:  # the model's own code on the device
        msg = " ".join(str(e).split()) or type(e).__name__
        raise ModelError(f"the real pass on {device} failed: {type(e).__name__}: {msg[:300]}") from None
    finally:
        if env_before is None:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
    return trace


def _head(model: torch.nn.Module) -> Any:
    """The last layer of an Ultralytics model (its ``model`` is the layer list; the head comes last)."""
    layers: Any = getattr(model, "model", None)
    return layers[-1] if layers is not None else None


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
    out: dict[str, Any] = {
        "img": img,
        "batch_idx": torch.arange(batch).repeat_interleave(per).float(),
        "cls": torch.randint(0, nc, (n, 1), generator=gen).float(),
        "bboxes": torch.cat([xy, wh], 1),
    }
    if cls_name == "OBBModel":
        out["bboxes"] = torch.cat([xy, wh, torch.zeros((n, 1))], 1)
    head = _head(model)
    if cls_name == "PoseModel":
        kpt = list(getattr(head, "kpt_shape", [17, 3]))
        points = torch.rand((n, kpt[0], kpt[1]), generator=gen)
        if kpt[1] == 3:
            points[..., 2] = 1.0
        out["keypoints"] = points
    if "Segment" in type(head).__name__:
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
        from ...core.compat import get_cfg

        work.args = get_cfg(
            overrides={
                k: v
                for k, v in (args or {}).items()
                if k in ("box", "cls", "dfl", "mask_ratio", "overlap_mask", "pose", "kobj")
            }
        )
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
            stack.enter_context(deterministic_flag("warn" if forward_det else "off"))
            stack.enter_context(trace.hooks())
            with DispatchHook(trace.dispatch), FunctionHook(trace.call_function):
                preds = work(data["img"]) if "txt_feats" not in data else work(data["img"], txt_feats=data["txt_feats"])
                trace.stack.append("(loss)")
                try:
                    loss = work.loss(data, preds)
                finally:
                    trace.stack.pop()
            trace.classes["(loss)"] = type(getattr(work, "criterion", None)).__name__
            root = _loss_root(loss[0] if isinstance(loss, (tuple, list)) else loss)
            if root is not None:
                _real_backward(trace, root)
    except YoloDetError:
        raise
    except Exception as e:  # the model's own loss on a synthetic batch
        msg = " ".join(str(e).split()) or type(e).__name__
        raise ModelError(f"the loss pass failed on a synthetic batch: {type(e).__name__}: {msg[:300]}") from None
    return trace
