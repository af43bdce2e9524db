"""Shape-only tensors that say they live on a device this machine may not have (the audit's fake CUDA).

A :class:`PretendTensor` holds no data: underneath it is a ``meta`` tensor (shape, strides, dtype), and it
reports the device it stands for (``cuda``) everywhere torch asks, in Python (``x.device``, ``x.is_cuda``)
and in C++ (the dispatch keys of that device, ``tensor.device()``). So torch takes the code paths it takes on
that device (cuDNN's batch norm, the CUDA choice of attention kernel, the Python-level branches of
``F.interpolate``) while every kernel that runs is a meta kernel: no GPU, no memory, no arithmetic.

:class:`PretendDevice` is the dispatch mode the tensors are made and computed under: factories
(``torch.empty(..., device="cuda")``) give pretend tensors, a real tensor that meets one (a constant the
model keeps as an attribute) takes part by its shape only, and each op's outputs are pretend tensors on the
device of its inputs (a CPU scalar joins any device; other mixes are refused as the device would refuse
them). A one-element tensor made from Python numbers (``torch.tensor(2.0)``) keeps its value, and so does
what is computed from such values only, so that ``.item()`` on it works as it does for real.

Each op is computed as torch's own ``FakeTensorMode`` computes it for a trace without symbolic shapes: an op
without a Python meta kernel runs torch's decomposition of it, op by op; a view goes through torch's reference
reshape; a convolution's outputs get the layout torch's convolution backend picks for CUDA; indices and copies
may mix devices. ``tests/test_pretend.py`` compares the two op by op. What this leaves out of
``FakeTensorMode`` is what the audit never needs (symbolic shapes, its cache, real-tensor propagation), and its
imports: ``torch._dynamo``, ``torch._inductor`` and their dependencies, about two seconds of a fresh process
on first use.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_unflatten

from .pretend_shapes import CONV, as_format, conv_memory_format, stand_in

__all__ = ["PretendDevice", "PretendTensor"]

_META = torch.device("meta")
_CPU = torch.device("cpu")
_aten = torch.ops.aten
#: ``*_like`` factories: their device defaults to the input's.
_LIKE = frozenset(
    {
        _aten.empty_like.default,
        _aten.full_like.default,
        _aten.ones_like.default,
        _aten.zeros_like.default,
        _aten.rand_like.default,
        _aten.randn_like.default,
        _aten.randint_like.default,
        _aten.randint_like.low_dtype,
    }
)
_VIEWS = frozenset({_aten.view.default, _aten._unsafe_view.default})
_LIFT = frozenset({_aten.lift_fresh.default, _aten.lift_fresh_copy.default, _aten.lift.default})
#: Ops whose inputs may sit on different devices (CPU indices into a CUDA tensor, a copy between devices): the
#: output is on the first input's device.
_MIXED = frozenset(
    {
        _aten._to_copy.default,
        _aten.copy_.default,
        _aten.copy.default,
        _aten._foreach_copy.default,
        _aten.index.Tensor,
        _aten.index_put.default,
        _aten.index_put_.default,
        _aten._unsafe_index_put.default,
        _aten.slice_scatter.default,
        _aten.diagonal_scatter.default,
    }
)
#: The largest tensor that keeps its value (as torch's fake tensors do: one element).
_CONSTANT_NUMEL = 1


class _State(threading.local):
    in_kernel = False


_STATE = _State()


class PretendTensor(torch.Tensor):
    """A meta tensor that reports ``pretend_device`` as its device (see the module's docstring)."""

    pretend_device: torch.device
    constant: torch.Tensor | None

    @staticmethod
    def __new__(cls, elem: torch.Tensor, device: torch.device, constant: torch.Tensor | None = None) -> PretendTensor:
        self = torch.Tensor._make_subclass(
            cls, elem, elem.requires_grad, dispatch_device=True, device_for_backend_keys=device
        )
        self.pretend_device = device
        self.constant = constant
        return self

    @property  # Tensor.device is read-only; the stubs say otherwise
    def device(self) -> torch.device:  # type: ignore[override]
        return _META if _STATE.in_kernel else self.pretend_device

    def __repr__(self) -> str:  # type: ignore[override]
        return f"PretendTensor(size={tuple(self.shape)}, dtype={self.dtype}, device={self.pretend_device})"

    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]

    @classmethod
    def __torch_dispatch__(  # type: ignore[override]
        cls, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        if func is torch.ops.prim.device.default:
            return _META if _STATE.in_kernel else args[0].pretend_device
        return _run(func, args, kwargs or {}, None)


class PretendDevice(TorchDispatchMode):
    """The dispatch mode of a pretend-device trace: every op computes shapes only (see the module docstring).

    Real tensors that meet pretend ones take part by their shape (one pretend tensor per real one, for the
    mode's life); factories without a device make CPU pretend tensors, as torch would make CPU tensors.
    """

    def __init__(self) -> None:
        super().__init__()
        # torch's slot for the fake-tensor mode: torch then makes no device context for the pretend device (a
        # factory such as ``torch.empty(..., device="cuda")`` initialises CUDA first, unless that slot is taken)
        self._mode_key = torch._C._TorchDispatchModeKey.FAKE
        self._lift_before: list[bool] = []
        self._seen: dict[int, tuple[torch.Tensor, PretendTensor]] = {}

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch would wrap the handler in ``torch._dynamo.disable``, importing torch._dynamo (seconds) on the
        # first op; nothing is compiled inside a trace
        return False

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        if func is torch.ops.prim.device.default:
            t = args[0]
            return t.pretend_device if isinstance(t, PretendTensor) and not _STATE.in_kernel else t.device
        return _run(func, args, kwargs or {}, self)

    def __enter__(self) -> PretendDevice:
        if not torch.cuda.is_available():
            # without a usable CUDA device torch puts a no-op device guard in place of CUDA's (as its fake-tensor
            # mode does), so that autograd can note the pretend tensors' streams
            torch._C._ensureCUDADeviceGuardSet()
        # torch.tensor(data, device="cuda") makes the tensor on the CPU and moves it through the mode
        self._lift_before.append(torch._C._only_lift_cpu_tensors())
        torch._C._set_only_lift_cpu_tensors(True)
        try:
            return super().__enter__()
        except BaseException:
            torch._C._set_only_lift_cpu_tensors(self._lift_before.pop())
            raise

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)
        finally:
            torch._C._set_only_lift_cpu_tensors(self._lift_before.pop())


@contextlib.contextmanager
def _in_kernel() -> Iterator[None]:
    """Run kernels on the meta device: pretend tensors say ``meta`` and dispatch to meta kernels."""
    before = _STATE.in_kernel
    with torch._C._DisableTorchDispatch(), torch._C._PreserveDispatchKeyGuard():
        torch._C._set_meta_in_tls_dispatch_include(True)
        _STATE.in_kernel = True
        try:
            yield
        finally:
            _STATE.in_kernel = before


def _pretend(t: torch.Tensor, seen: dict[int, tuple[torch.Tensor, PretendTensor]]) -> PretendTensor:
    """The pretend stand-in of a real tensor: its shape, strides, dtype, device and ``requires_grad``."""
    hit = seen.get(id(t))
    if hit is not None and hit[0] is t:
        return hit[1]
    out = PretendTensor(_meta_like(t, t.requires_grad), t.device)
    seen[id(t)] = (t, out)
    return out


def _meta_like(t: torch.Tensor, requires_grad: bool = False) -> torch.Tensor:
    with _in_kernel():
        elem = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=_META)
    return elem.requires_grad_(requires_grad) if requires_grad else elem


def _constant(t: torch.Tensor, device: torch.device) -> PretendTensor:
    """A pretend tensor that keeps the value of ``t`` (a real CPU tensor of at most one element)."""
    return PretendTensor(_meta_like(t), device, t.detach().clone())


def _common_device(func: Any, tensors: list[PretendTensor]) -> torch.device:
    """The device the op runs on: that of its tensors, a CPU scalar joining any other (as on CUDA); for the ops
    of ``_MIXED``, the first input's."""
    if func in _MIXED:
        return tensors[0].pretend_device
    device = tensors[0].pretend_device
    scalar = device.type == "cpu" and tensors[0].dim() == 0
    for t in tensors[1:]:
        d = t.pretend_device
        t_scalar = d.type == "cpu" and t.dim() == 0
        if d == device:
            scalar = scalar and t_scalar
        elif t_scalar:
            continue
        elif scalar:
            device, scalar = d, False
        else:
            raise RuntimeError(
                f"Expected all tensors to be on the same device, but found at least two devices, {device} and {d}!"
            )
    return device


def _normal(device: Any) -> torch.device:
    """``cuda`` -> ``cuda:0`` (the current device once CUDA is initialised), as torch names a tensor's device."""
    d = torch.device(device)
    if d.index is None and d.type not in ("cpu", "meta"):
        backend = getattr(torch, d.type, None)
        initialised = backend is not None and d.type != "mps" and backend.is_initialized()
        d = torch.device(d.type, backend.current_device() if initialised else 0)
    return d


_DEVICE_SLOT: dict[Any, int | None] = {}


def _device_slot(func: Any) -> int | None:
    """The position of the op's ``device`` argument (None: it has none)."""
    if func not in _DEVICE_SLOT:
        schema = getattr(func, "_schema", None)
        names = [a.name for a in schema.arguments] if schema is not None else []
        _DEVICE_SLOT[func] = names.index("device") if "device" in names else None
    return _DEVICE_SLOT[func]


def _run(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], mode: PretendDevice | None) -> Any:
    """One op on pretend tensors (real ones joining by their shape), computed as torch's fake tensors compute it."""
    seen = mode._seen if mode is not None else {}
    if func in _LIFT:  # torch.tensor(data): a new real tensor enters the trace
        t = args[0]
        if isinstance(t, PretendTensor):
            return t
        if t.numel() <= _CONSTANT_NUMEL and t.device.type == "cpu":
            return _constant(t, _CPU)
        return _pretend(t, seen)
    args, kwargs, tensors = _inputs(args, kwargs, seen)
    if func is _aten._local_scalar_dense.default and args[0].constant is not None:
        return args[0].constant.item()
    device, meta_args, meta_kwargs = _placement(func, args, kwargs, tensors)
    constant = _constant_result(func, args, kwargs, tensors, device)
    if constant is not None:
        return constant
    if func in _VIEWS:
        # torch's fake tensors reshape through the reference implementation (its strides of size-1 dimensions
        # differ from the kernel's); run it here on the pretend tensors
        from torch._refs import _reshape_view_helper

        with _reentered(mode):
            return _reshape_view_helper(*args, **kwargs, allow_copy=False)
    with _in_kernel():
        out = stand_in(func, meta_args, meta_kwargs)
    if out is None and _decomposes(func):
        # as torch's fake tensors do: an op without a Python meta kernel runs its decomposition, op by op
        out = _decompose(func, args, kwargs, mode)
        if out is not NotImplemented:
            return out
        out = None
    conv_format = None
    if func in CONV:
        with _reentered(mode):
            conv_format = conv_memory_format(func, args, kwargs)
    with _in_kernel():
        if out is None:
            out = func(*meta_args, **meta_kwargs)
        if conv_format is not None:
            out = as_format(func, out, conv_format)
    _forget_constants(func, args)
    return _wrap(out, device)


def _inputs(
    args: tuple[Any, ...], kwargs: dict[str, Any], seen: dict[int, tuple[torch.Tensor, PretendTensor]]
) -> tuple[tuple[Any, ...], dict[str, Any], list[PretendTensor]]:
    """The call's arguments with every real tensor replaced by its pretend stand-in, and the tensors among them."""
    flat, spec = tree_flatten((args, kwargs))
    tensors: list[PretendTensor] = []
    for i, leaf in enumerate(flat):
        if isinstance(leaf, torch.Tensor):
            if not isinstance(leaf, PretendTensor):
                leaf = flat[i] = _pretend(leaf, seen)
            tensors.append(leaf)
    args, kwargs = tree_unflatten(flat, spec)
    return args, kwargs, tensors


def _placement(
    func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], tensors: list[PretendTensor]
) -> tuple[torch.device, tuple[Any, ...], dict[str, Any]]:
    """The device of the op's outputs, and its arguments with the ``device`` one (if any) set to ``meta``."""
    slot = _device_slot(func)
    if slot is None:
        return (_common_device(func, tensors) if tensors else _CPU), args, kwargs
    positional = slot < len(args)
    given = args[slot] if positional else kwargs.get("device")
    if given is not None:
        device = _normal(given)
    elif tensors and (func in _LIKE or func is _aten._to_copy.default):
        device = tensors[0].pretend_device
    else:
        device = _common_device(func, tensors) if tensors else _CPU
    if positional:
        return device, (*args[:slot], _META, *args[slot + 1 :]), kwargs
    return device, args, {**kwargs, "device": _META}


def _reentered(mode: PretendDevice | None) -> PretendDevice:
    """The mode to run torch's Python code on pretend tensors under (so that what it computes stays pretend and
    the tensors' device questions go to the mode, not to torch's tensor-subclass path)."""
    return mode if mode is not None else PretendDevice()


#: Ops whose C++ meta kernel torch's fake tensors run directly (the rest without a Python meta decompose).
_CPP_META = frozenset(
    {
        _aten.empty.memory_format,
        _aten.empty_strided.default,
        _aten.as_strided_scatter.default,
        _aten.as_strided.default,
        _aten.as_strided_.default,
        _aten.zeros.default,
        _aten.detach.default,
        _aten.view_as_real.default,
        _aten.view_as_complex.default,
        _aten.set_.source_Storage_storage_offset,
        _aten.stack.default,
    }
)
_DECOMPOSES: dict[Any, bool] = {}


def _decomposes(func: Any) -> bool:
    """Whether torch's fake tensors compute ``func`` through a decomposition: it has no Python meta kernel, no
    C++ one they trust, and either a decomposition of ``torch._decomp`` or a composite implementation."""
    hit = _DECOMPOSES.get(func)
    if hit is None:
        from torch._decomp import meta_table

        hit = isinstance(func, torch._ops.OpOverload) and not (
            func in meta_table or func in _CPP_META or torch.Tag.view_copy in func.tags
        )
        _DECOMPOSES[func] = hit
    return hit


def _decompose(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], mode: PretendDevice | None) -> Any:
    import torch._decomp.decompositions as decompositions
    from torch._decomp import decomposition_table

    with _reentered(mode):
        decomposition = decomposition_table.get(func)
        if (
            decomposition is not None
            and decomposition.__module__.startswith("torch._decomp")
            and hasattr(decompositions, decomposition.__name__)
        ):
            return decomposition(*args, **kwargs)
        return func.decompose(*args, **kwargs)


def _writes(func: Any) -> bool:
    schema = getattr(func, "_schema", None)
    return schema is not None and any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)


def _constant_result(
    func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], tensors: list[PretendTensor], device: torch.device
) -> Any:
    """The op computed for real when every tensor it reads holds its value and its outputs are scalars."""
    if not tensors or any(t.constant is None for t in tensors) or device.type != "cpu":
        return None
    if not isinstance(func, torch._ops.OpOverload) or torch.Tag.nondeterministic_seeded in func.tags:
        return None
    if torch.Tag.inplace_view in func.tags or func is _aten._local_scalar_dense.default or _writes(func):
        return None
    flat, spec = tree_flatten((args, kwargs))
    r_args, r_kwargs = tree_unflatten([x.constant if isinstance(x, PretendTensor) else x for x in flat], spec)
    with torch._C._DisableTorchDispatch():
        out = func(*r_args, **r_kwargs)
    outs, out_spec = tree_flatten(out)
    if any(isinstance(o, torch.Tensor) and o.numel() > _CONSTANT_NUMEL for o in outs):
        return None
    return tree_unflatten([_constant(o, device) if isinstance(o, torch.Tensor) else o for o in outs], out_spec)


def _forget_constants(func: Any, args: tuple[Any, ...]) -> None:
    """An op that wrote into a tensor without computing its value leaves it without one."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return
    for arg, value in zip(schema.arguments, args):
        if isinstance(value, PretendTensor) and arg.alias_info is not None and arg.alias_info.is_write:
            value.constant = None


def _wrap(out: Any, device: torch.device) -> Any:
    if isinstance(out, PretendTensor):
        return out
    if isinstance(out, torch.Tensor):
        return PretendTensor(out, device)
    if isinstance(out, (tuple, list)):
        return type(out)(_wrap(o, device) for o in out)
    return out
