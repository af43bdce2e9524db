"""Every deterministic layer avoids the CUDA kernels whose backward is non-deterministic.

Two CPU-only checks, each with a positive control (the native op must fail it, so the check can fail):

* **fake CUDA graph**: the layer runs forward under ``FakeTensorMode`` on a fake ``cuda`` device with
  ``torch.use_deterministic_algorithms(True)`` (so device-dependent Python branches take their CUDA
  path) and every autograd node of the graph is listed. None may be an alerting backward node
  (``Adaptive*``, ``Upsample*``, ``GridSampler*``, ``ReflectionPad*``, ``ReplicationPad*``,
  ``NllLoss2D``); custom nodes must be yolo-det's own. (The autograd engine cannot run a backward on
  fake CUDA tensors without a device, hence the second check.)
* **meta backward**: the layer runs forward *and* backward on the ``meta`` device (not the CPU, so
  the layers take their accelerator paths) under a dispatch mode that records every ATen op; none
  may be one of the non-deterministic CUDA kernels, nor ``scatter_add``/``index_add`` (deterministic
  only under the flag: the layers do not even need it).
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from layer_helpers import graph_node_names
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

import yolo_det.layers as L

FORBIDDEN_NODE = re.compile(
    r"^(Adaptive(Avg|Max)Pool\dDBackward|Upsample\w*Backward|GridSampler\dDBackward|"
    r"ReflectionPad\dDBackward|ReplicationPad\dDBackward|NllLoss2DBackward)"
)
OUR_NODES = {
    "DetAxisMapBackward",
    "DetSeparableMapBackward",
    "DetAdaptiveMaxPoolBackward",
    "DetAdaptiveAvgPoolBackward",
    "DetPadBackward",
    "DetGridSampleBackward",
}
# The adaptive pooling *forward* kernels are deterministic on CUDA (one thread per output, no atomics): the
# layers use them and replace only the backward, so only the backward kernels are forbidden here.
FORBIDDEN_OP = re.compile(
    r"^(_?adaptive_(avg|max)_pool\dd_backward|upsample_\w+_backward|_upsample_\w+_backward|"
    r"grid_sampler_\dd_backward|reflection_pad\dd_backward|replication_pad\dd_backward|"
    r"nll_loss2d_\w+|scatter_add_?|index_add_?)$"
)


def _grid(device: str) -> torch.Tensor:
    return torch.rand(2, 5, 6, 2, device=device) * 2.4 - 1.2


def _target(device: str) -> torch.Tensor:
    return torch.randint(0, 8, (2, 20, 18), device=device)


# name -> (yolo-det call, native call); each takes (x, device) with x of shape (2, 8, 20, 18)
LAYERS = {
    "adaptive_avg_pool2d(None,1)": (
        lambda x, d: L.adaptive_avg_pool2d(x, (None, 1)),
        lambda x, d: F.adaptive_avg_pool2d(x, (None, 1)),
    ),
    "adaptive_avg_pool2d(6,5)": (
        lambda x, d: L.adaptive_avg_pool2d(x, (6, 5)),
        lambda x, d: F.adaptive_avg_pool2d(x, (6, 5)),
    ),
    "adaptive_avg_pool2d(4,3)": (
        lambda x, d: L.adaptive_avg_pool2d(x, (4, 3)),
        lambda x, d: F.adaptive_avg_pool2d(x, (4, 3)),
    ),
    "adaptive_avg_pool1d": (
        lambda x, d: L.adaptive_avg_pool1d(x.flatten(2), 7),
        lambda x, d: F.adaptive_avg_pool1d(x.flatten(2), 7),
    ),
    "adaptive_avg_pool3d": (
        lambda x, d: L.adaptive_avg_pool3d(x.unsqueeze(2), (1, 3, 7)),
        lambda x, d: F.adaptive_avg_pool3d(x.unsqueeze(2), (1, 3, 7)),
    ),
    "adaptive_max_pool2d(1)": (lambda x, d: L.adaptive_max_pool2d(x, 1), lambda x, d: F.adaptive_max_pool2d(x, 1)),
    "adaptive_max_pool2d(3)": (lambda x, d: L.adaptive_max_pool2d(x, 3), lambda x, d: F.adaptive_max_pool2d(x, 3)),
    "adaptive_max_pool2d(5,6)": (
        lambda x, d: L.adaptive_max_pool2d(x, (5, 6)),
        lambda x, d: F.adaptive_max_pool2d(x, (5, 6)),
    ),
    "adaptive_max_pool1d": (
        lambda x, d: L.adaptive_max_pool1d(x.flatten(2), 7),
        lambda x, d: F.adaptive_max_pool1d(x.flatten(2), 7),
    ),
    "interpolate bicubic": (
        lambda x, d: L.interpolate(x, scale_factor=2, mode="bicubic"),
        lambda x, d: F.interpolate(x, scale_factor=2, mode="bicubic"),
    ),
    "interpolate bilinear aa": (
        lambda x, d: L.interpolate(x, size=(9, 7), mode="bilinear", antialias=True),
        lambda x, d: F.interpolate(x, size=(9, 7), mode="bilinear", antialias=True),
    ),
    "interpolate linear": (
        lambda x, d: L.interpolate(x.flatten(2), scale_factor=1.5, mode="linear", align_corners=True),
        lambda x, d: F.interpolate(x.flatten(2), scale_factor=1.5, mode="linear", align_corners=True),
    ),
    "interpolate area": (
        lambda x, d: L.interpolate(x, size=(7, 5), mode="area"),
        lambda x, d: F.interpolate(x, size=(7, 5), mode="area"),
    ),
    "interpolate bilinear": (
        lambda x, d: L.interpolate(x, scale_factor=2, mode="bilinear"),
        # the deterministic flag makes PyTorch decompose bilinear on CUDA: a plain kernel call
        lambda x, d: torch._C._nn.upsample_bilinear2d(x, (40, 36), False, None),
    ),
    "grid_sample zeros": (
        lambda x, d: L.grid_sample(x, _grid(d).requires_grad_(), align_corners=False),
        lambda x, d: F.grid_sample(x, _grid(d).requires_grad_(), align_corners=False),
    ),
    "grid_sample border": (
        lambda x, d: L.grid_sample(x, _grid(d), padding_mode="border", align_corners=True),
        lambda x, d: F.grid_sample(x, _grid(d), padding_mode="border", align_corners=True),
    ),
    "pad reflect 2d": (
        lambda x, d: L.pad(x, (1, 2, 3, 1), mode="reflect"),
        lambda x, d: torch._C._nn.reflection_pad2d(x, (1, 2, 3, 1)),
    ),
    "pad reflect 1d": (
        lambda x, d: L.pad(x.flatten(2), (3, 2), mode="reflect"),
        lambda x, d: F.pad(x.flatten(2), (3, 2), mode="reflect"),
    ),
    "pad replicate 3d": (
        lambda x, d: L.pad(x.unsqueeze(2), (1, 2, 3, 1, 1, 0), mode="replicate"),
        lambda x, d: torch._C._nn.replication_pad3d(x.unsqueeze(2), (1, 2, 3, 1, 1, 0)),
    ),
    "cross_entropy": (
        lambda x, d: L.cross_entropy(x, _target(d), label_smoothing=0.1),
        lambda x, d: F.cross_entropy(x, _target(d), label_smoothing=0.1),
    ),
    "nll_loss": (
        lambda x, d: L.nll_loss(x.log_softmax(1), _target(d)),
        lambda x, d: F.nll_loss(x.log_softmax(1), _target(d)),
    ),
    "DetAdaptiveMaxPool2d": (lambda x, d: L.DetAdaptiveMaxPool2d(3)(x), lambda x, d: torch.nn.AdaptiveMaxPool2d(3)(x)),
    "DetAdaptiveAvgPool2d": (
        lambda x, d: L.DetAdaptiveAvgPool2d((1, None))(x),
        lambda x, d: torch.nn.AdaptiveAvgPool2d((1, None))(x),
    ),
    "DetUpsample": (
        lambda x, d: L.DetUpsample(scale_factor=2, mode="bicubic")(x),
        lambda x, d: torch.nn.Upsample(scale_factor=2, mode="bicubic")(x),
    ),
    "DetReflectionPad2d": (
        lambda x, d: L.DetReflectionPad2d(2)(x),
        lambda x, d: torch._C._nn.reflection_pad2d(x, [2] * 4),
    ),
    "DetReplicationPad2d": (
        lambda x, d: L.DetReplicationPad2d(2)(x),
        lambda x, d: torch._C._nn.replication_pad2d(x, [2] * 4),
    ),
    "DetCrossEntropyLoss": (
        lambda x, d: L.DetCrossEntropyLoss()(x, _target(d)),
        lambda x, d: torch.nn.CrossEntropyLoss()(x, _target(d)),
    ),
}


class _OpLog(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def _fake_cuda_nodes(fn) -> set[str]:
    previous = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        with FakeTensorMode():
            x = torch.randn(2, 8, 20, 18, device="cuda", requires_grad=True)
            out = fn(x, "cuda")
            assert out.device.type == "cuda"
            return graph_node_names(out)
    finally:
        torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])


def _meta_ops(fn) -> set[str]:
    x = torch.randn(2, 8, 20, 18, device="meta", requires_grad=True)
    with _OpLog() as log:
        out = fn(x, "meta")
        out.sum().backward()
    return log.ops


@pytest.mark.parametrize("name", list(LAYERS))
def test_fake_cuda_graph_has_no_nondeterministic_node(name):
    ours, native = LAYERS[name]
    nodes = _fake_cuda_nodes(ours)
    assert not [n for n in nodes if FORBIDDEN_NODE.match(n)], nodes
    custom = {n for n in nodes if n.endswith("Backward")}  # built-in nodes end in Backward0, Backward1, ...
    assert custom <= OUR_NODES, custom
    assert [n for n in _fake_cuda_nodes(native) if FORBIDDEN_NODE.match(n)], "positive control"


@pytest.mark.parametrize("name", list(LAYERS))
def test_meta_backward_uses_no_nondeterministic_kernel(name):
    ours, native = LAYERS[name]
    ops = _meta_ops(ours)
    assert not [op for op in ops if FORBIDDEN_OP.match(op)], sorted(ops)
    assert [op for op in _meta_ops(native) if FORBIDDEN_OP.match(op)], "positive control"


def test_layers_run_under_strict_deterministic_mode_on_cpu():
    previous = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        for ours, _ in LAYERS.values():
            x = torch.randn(2, 8, 20, 18, requires_grad=True)
            ours(x, "cpu").sum().backward()
            assert torch.isfinite(x.grad).all()
    finally:
        torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])
