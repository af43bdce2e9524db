"""Shape-only stand-ins for the pretend-CUDA trace (:mod:`yolo_det.analysis.pretend`): where torch's meta kernels
are not what torch's fake tensors compute on CUDA, or are slow Python that imports ``torch._dynamo``.

- Convolutions: on CUDA the backend (cuDNN, ...) decides the layout of the output and of the gradients; the
  meta kernel does not know it, so :func:`conv_memory_format` asks torch's backend choice for the pretend device
  and :func:`as_format` gives the outputs that layout.
- :func:`stand_in`: the output of an op computed without running torch's Python meta kernel (cuDNN's batch norm
  runs torch's whole decomposition per call; the elementwise ops' type-promotion wrapper, used by their meta
  kernels and by ``cat``'s, imports ``torch._dynamo`` on its first call; a copy between two pretend tensors
  makes torch import ``torch.distributed.tensor``). Each stand-in returns None where it does not apply (torch's
  kernel then runs); tests/test_pretend.py checks each against torch's own kernels.

Everything here runs inside the trace's kernel invocation (the tensors say ``meta``), except
:func:`conv_memory_format`, which needs them to say ``cuda``.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["CONV", "as_format", "conv_memory_format", "stand_in"]

_META = torch.device("meta")
_aten = torch.ops.aten


_CONV_FORWARD = frozenset({_aten.convolution.default, _aten._convolution.default, _aten._convolution.deprecated})
CONV = _CONV_FORWARD | {_aten.convolution_backward.default}


def conv_memory_format(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.memory_format | None:
    """The layout torch's backend for the tensors' (pretend) device gives a convolution's output and input and
    weight gradients (None for an unbatched input: contiguous, as the meta kernel gives)."""
    named = dict(kwargs)
    for arg, value in zip(func._schema.arguments, args):
        named[arg.name] = value
    x, w = named["input"], named["weight"]
    if x.dim() == w.dim() - 1:  # unbatched: the slow kernels, contiguous
        return None
    options = {k: named[k] for k in ("stride", "padding", "dilation", "transposed", "output_padding", "groups")}
    options["bias"] = named.get("bias")
    if options["bias"] is None:
        options["bias_sizes"] = named.get("bias_sizes")
    backend = torch._C._select_conv_backend(x, w, **options)
    if w.dim() == 3:  # 1-D convolutions run as 2-D ones
        x, w = x.contiguous().unsqueeze(2), w.unsqueeze(2)
    return torch._C._conv_determine_backend_memory_format(x, w, backend)


def as_format(func: Any, out: Any, memory_format: torch.memory_format) -> Any:
    """A convolution's meta outputs in ``memory_format`` (the bias gradient keeps its own)."""

    def convert(t: torch.Tensor | None) -> torch.Tensor | None:
        if t is None:
            return None
        if t.dim() == 3 and memory_format == torch.channels_last:
            return t.unsqueeze(2).contiguous(memory_format=memory_format).squeeze(2)
        return t.contiguous(memory_format=memory_format)

    if func in _CONV_FORWARD:
        return convert(out)
    return convert(out[0]), convert(out[1]), out[2]


#: Elementwise ops whose result, for inputs of one floating dtype and Python numbers, has that dtype.
_POINTWISE = frozenset(
    getattr(getattr(_aten, name), overload)
    for name, overload in (
        ("add", "Tensor"),
        ("add", "Scalar"),
        ("sub", "Tensor"),
        ("sub", "Scalar"),
        ("rsub", "Scalar"),
        ("mul", "Tensor"),
        ("mul", "Scalar"),
        ("div", "Tensor"),
        ("div", "Scalar"),
        ("neg", "default"),
        ("exp", "default"),
        ("sqrt", "default"),
        ("rsqrt", "default"),
        ("reciprocal", "default"),
        ("pow", "Tensor_Scalar"),
        ("sigmoid", "default"),
        ("sigmoid_backward", "default"),
        ("silu", "default"),
        ("silu_backward", "default"),
        ("relu", "default"),
        ("threshold_backward", "default"),
        ("tanh", "default"),
        ("tanh_backward", "default"),
        ("hardswish", "default"),
        ("hardswish_backward", "default"),
        ("hardsigmoid", "default"),
        ("hardsigmoid_backward", "default"),
        ("gelu", "default"),
        ("gelu_backward", "default"),
        ("leaky_relu", "default"),
        ("leaky_relu_backward", "default"),
    )
)


def _pointwise(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor | None:
    """An elementwise op's output (inputs of one floating dtype and Python numbers; otherwise None): the inputs'
    broadcast shape, their dtype, and the strides torch's own meta kernels give (``compute_elementwise_output_strides``
    of the broadcast inputs)."""
    from torch._prims_common import compute_elementwise_output_strides

    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if not tensors or any(isinstance(v, torch.Tensor) for v in kwargs.values()):
        return None
    dtype = tensors[0].dtype
    if not dtype.is_floating_point or any(t.dtype != dtype for t in tensors):
        return None
    if any(not isinstance(a, (torch.Tensor, bool, int, float)) for a in args):
        return None
    shape = torch.broadcast_shapes(*(t.shape for t in tensors))
    operands = [t if t.shape == shape else t.expand(shape) for t in tensors]
    return torch.empty_strided(shape, compute_elementwise_output_strides(*operands), dtype=dtype, device=_META)


def _dense(t: torch.Tensor) -> bool:
    return t.is_contiguous() or (t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last))


def _stat_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _cudnn_batch_norm(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    running_mean: torch.Tensor | None,
    running_var: torch.Tensor | None,
    training: bool,
    *rest: Any,
) -> tuple[torch.Tensor, ...] | None:
    if weight is None or input.dim() < 2 or not _dense(input) or not input.dtype.is_floating_point:
        return None
    out = torch.empty_like(input)
    reserve = torch.empty((0,), dtype=torch.uint8, device=_META)
    if training:
        channels = (input.shape[1],)
        stat = _stat_dtype(input.dtype)
        return (
            out,
            torch.empty(channels, dtype=stat, device=_META),
            torch.empty(channels, dtype=stat, device=_META),
            reserve,
        )
    return (
        out,
        torch.empty((0,), dtype=weight.dtype, device=_META),
        torch.empty((0,), dtype=weight.dtype, device=_META),
        reserve,
    )


def _cudnn_batch_norm_backward(
    input: torch.Tensor,
    grad_output: torch.Tensor,
    weight: torch.Tensor,
    running_mean: torch.Tensor | None,
    running_var: torch.Tensor | None,
    save_mean: torch.Tensor | None,
    save_var: torch.Tensor | None,
    *rest: Any,
) -> tuple[torch.Tensor, ...] | None:
    if weight is None or input.dim() < 2 or not _dense(input) or grad_output.stride() != input.stride():
        return None
    if grad_output.shape != input.shape or grad_output.dtype != input.dtype:
        return None
    channels = (input.shape[1],)
    if any(s is None or s.shape != channels for s in (save_mean, save_var)):  # not after a training forward
        return None
    return torch.empty_like(input), torch.empty_like(weight), torch.empty_like(weight)


def _cat(tensors: list[torch.Tensor], dim: int = 0) -> torch.Tensor | None:
    """``torch.cat`` of tensors of one dtype and rank whose shapes agree but along ``dim``; otherwise None."""
    from torch._prims_common import suggest_memory_format

    first = tensors[0] if tensors else None
    if first is None or first.dim() == 0 or not -first.dim() <= dim < first.dim():
        return None
    dim %= first.dim()
    if any(t.dtype != first.dtype or t.dim() != first.dim() for t in tensors):
        return None
    if any(t.shape[:dim] != first.shape[:dim] or t.shape[dim + 1 :] != first.shape[dim + 1 :] for t in tensors):
        return None
    shape = list(first.shape)
    shape[dim] = sum(t.shape[dim] for t in tensors)
    formats = {suggest_memory_format(t) for t in tensors}
    memory_format = formats.pop() if len(formats) == 1 else torch.contiguous_format
    return torch.empty(shape, dtype=first.dtype, device=_META, memory_format=memory_format)


def _clone(t: torch.Tensor, *, memory_format: torch.memory_format | None = None) -> torch.Tensor:
    """``clone`` is ``empty_like`` and a copy: the copy between two pretend tensors would make torch import
    ``torch.distributed.tensor`` (to tell a distributed tensor), and on the meta device it copies nothing."""
    return torch.empty_like(t, memory_format=memory_format or torch.preserve_format)


def _copy_(dst: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor | None:
    """``copy_`` writes values only: the destination, once ``src`` is known to broadcast to it (else None)."""
    if not isinstance(src, torch.Tensor) or torch.broadcast_shapes(dst.shape, src.shape) != dst.shape:
        return None
    return dst  # the same pretend tensor: an in-place op returns its input


_SHAPES: dict[Any, Any] = {
    _aten.clone.default: _clone,
    _aten.copy_.default: _copy_,
    _aten.cat.default: _cat,
    _aten.cudnn_batch_norm.default: _cudnn_batch_norm,
    _aten.cudnn_batch_norm_backward.default: _cudnn_batch_norm_backward,
}


def stand_in(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The output of a shape-only stand-in for ``func``, or None: the op runs as torch runs it."""
    shape_fn = _SHAPES.get(func)
    try:
        if shape_fn is not None:
            return shape_fn(*args, **kwargs)
        if func in _POINTWISE:
            return _pointwise(args, kwargs)
    except (TypeError, RuntimeError):  # arguments it does not handle: torch's own kernel decides (and raises)
        return None
    return None
