"""The shared machinery: sparse axis maps, running outside modes, autocast plans, precision settings."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.overrides import TorchFunctionMode

import yolo_det.layers as L
from yolo_det.layers import _common as C


def _dense(amap: C.AxisMap) -> torch.Tensor:
    """The map as an ``(out, in)`` matrix."""
    m = torch.zeros(amap.out_size, amap.in_size, dtype=torch.float64)
    w = amap.weight if amap.weight is not None else torch.ones(amap.index.shape, dtype=torch.float64)
    for i in range(amap.out_size):
        for k in range(amap.taps):
            m[i, amap.index[i, k]] += w[i, k]
    return m


def test_axis_map_round_trips_a_dense_matrix_and_transposes():
    g = torch.Generator().manual_seed(0)
    matrix = torch.randn(7, 5, generator=g, dtype=torch.float64) * (torch.rand(7, 5, generator=g) < 0.4)
    matrix[:, 2] = 0  # an output with no input at all
    amap = C.AxisMap.from_dense(matrix)
    assert torch.equal(_dense(amap), matrix.t())
    assert torch.equal(_dense(amap.transpose()), matrix)
    assert amap.transpose().transpose() is amap
    x = torch.randn(3, 7, 2, dtype=torch.float64)
    torch.testing.assert_close(
        C.apply_axis_map(x, 1, amap), torch.einsum("oi,bic->boc", matrix.t(), x), rtol=0, atol=1e-12
    )


def test_window_mean_and_identity():
    x = torch.randn(2, 5, 3, dtype=torch.float64, requires_grad=True)
    starts, ends = (0, 1, 3), (2, 4, 5)
    expected = torch.stack([x[:, s:e].mean(1) for s, e in zip(starts, ends)], 1)
    torch.testing.assert_close(C.apply_window_mean(x, 1, starts, ends), expected, rtol=0, atol=1e-15)
    assert torch.autograd.gradgradcheck(lambda t: C.apply_window_mean(t, 1, starts, ends), (x,))
    assert C.AxisMap.from_dense(torch.eye(4, dtype=torch.float64)).is_identity()
    assert not C.AxisMap.from_dense(torch.ones(4, 4, dtype=torch.float64)).is_identity()


def test_axis_map_is_twice_differentiable():
    amap = C.AxisMap.from_dense(torch.randn(6, 4, dtype=torch.float64))
    x = torch.randn(2, 6, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda t: C.apply_axis_map(t, 1, amap), (x,))


def test_tables_are_built_outside_fake_mode():
    with FakeTensorMode():
        x = torch.randn(2, 3, 11, 7, device="cuda")
        y = L.interpolate(x, size=(23, 5), mode="bicubic", align_corners=True)
        assert isinstance(y, FakeTensor)
        assert y.shape == (2, 3, 23, 5)
    amap = L.upsample._interp_map("bicubic", 2, 0, 11, 23, None, True, False)
    assert type(amap.index) is torch.Tensor
    assert amap.index.device.type == "cpu"


class _Redirect(TorchFunctionMode):
    """What a functional interception does: route F.interpolate / F.pad to yolo-det."""

    def __init__(self) -> None:
        super().__init__()
        self.hits = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.interpolate:
            self.hits += 1
            return L.interpolate(*args, **kwargs)
        if func is F.pad:
            self.hits += 1
            return L.pad(*args, **kwargs)
        return func(*args, **kwargs)


def test_layers_under_an_interception_mode_do_not_recurse():
    x = torch.randn(2, 3, 9, 13, dtype=torch.float64)
    expected = F.interpolate(x, size=(17, 6), mode="bicubic", antialias=True)
    with _Redirect() as mode:
        # a configuration never seen before: the probe of PyTorch's kernel runs inside the mode
        y = F.interpolate(x, size=(17, 6), mode="bicubic", antialias=True)
        z = F.pad(x, (2, 2, 1, 1), mode="reflect")
    assert mode.hits == 2
    torch.testing.assert_close(y, expected, rtol=0, atol=1e-12)
    assert torch.equal(z, torch._C._nn.reflection_pad2d(x, (2, 2, 1, 1)))


def test_results_do_not_depend_on_matmul_precision_settings():
    x = torch.randn(2, 4, 13, 11)
    grid = torch.rand(2, 6, 5, 2) * 2 - 1

    def run():
        return [
            L.interpolate(x, scale_factor=1.7, mode="bicubic"),
            L.adaptive_avg_pool2d(x, (5, 4)),
            L.grid_sample(x, grid, align_corners=False),
            L.interpolate(x, size=(5, 6), mode="bilinear", antialias=True),
        ]

    reference = run()
    old_precision = torch.get_float32_matmul_precision()
    old_tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        torch.set_float32_matmul_precision("medium")
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        for a, b in zip(run(), reference):
            assert torch.equal(a, b)
    finally:
        torch.set_float32_matmul_precision(old_precision)
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old_tf32


def test_amp_plan_follows_the_native_autocast_policy():
    x = torch.randn(1, 1, 4, 4, dtype=torch.bfloat16)

    def pad_probe(device):
        return F.pad(torch.zeros(1, 1, 3, 3, dtype=torch.bfloat16, device=device), (1, 1, 1, 1), mode="reflect")

    def pool_probe(device):
        return F.adaptive_avg_pool2d(torch.zeros(1, 1, 4, 4, dtype=torch.bfloat16, device=device), 3)

    assert C.amp_plan("test-pad", pad_probe, [x]) == (torch.float32, torch.bfloat16, False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        # reflection_pad2d is on the CPU autocast fp32 list; adaptive_avg_pool2d is not
        assert C.amp_plan("test-pad", pad_probe, [x]) == (torch.float32, torch.float32, True)
        assert C.amp_plan("test-pool", pool_probe, [x]) == (torch.float32, torch.bfloat16, True)
        with C.autocast_off("cpu", True):
            assert not torch.is_autocast_enabled("cpu")
        assert torch.is_autocast_enabled("cpu")


def test_amp_plan_probes_accelerators_with_fake_tensors():
    # no GPU needed: the native op's autocast policy on CUDA is read off a fake-tensor run
    # (torch.autocast refuses "cuda" without a device, so the thread-local switch is set directly)
    with FakeTensorMode():
        x = torch.randn(1, 1, 4, 4, device="cuda", dtype=torch.float16)

    def probe(device):
        return F.interpolate(torch.zeros(1, 1, 4, 4, dtype=torch.float16, device=device), size=5, mode="bicubic")

    def sample_probe(device):
        return F.grid_sample(
            torch.zeros(1, 1, 2, 2, dtype=torch.float16, device=device),
            torch.zeros(1, 1, 1, 2, dtype=torch.float32, device=device),
            align_corners=False,
        )

    enabled, dtype = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
    torch.set_autocast_enabled("cuda", True)
    torch.set_autocast_dtype("cuda", torch.float16)
    try:
        compute, out, active = C.amp_plan("test-bicubic-cuda", probe, [x])
        # grid_sampler is a "promote" op on CUDA: float16 input with a float32 grid gives float32
        sample = C.amp_plan("test-grid-cuda", sample_probe, [x, x.float()])
    finally:
        torch.set_autocast_enabled("cuda", enabled)
        torch.set_autocast_dtype("cuda", dtype)
    assert active
    assert compute == torch.float32
    assert out in (torch.float32, torch.float16)  # fp32 where upsample_bicubic2d is on CUDA's fp32 list (2.14)
    assert sample == (torch.float32, torch.float32, True)


def test_separable_maps_split_a_single_image_into_channel_chunks_by_the_larger_side(monkeypatch):
    # batch-1 upsampling: the backward's input (the gradient) is four times its result; the work is
    # split along the channels by the larger of the two, and stays the native function
    import torch.nn.functional as F

    from yolo_det.layers import _axis_maps
    from yolo_det.layers.upsample import interpolate

    writes = []
    real = _axis_maps._DeviceTaps.apply

    def spy(self, x, dim, out=None):
        if out is not None:
            writes.append(tuple(out.shape))
        return real(self, x, dim, out=out)

    monkeypatch.setattr(_axis_maps._DeviceTaps, "apply", spy)
    monkeypatch.setattr(_axis_maps, "_CHUNK_FLOOR", 5)
    x = torch.randn(1, 40, 24, 24, dtype=torch.float64, requires_grad=True)  # 23040 in, 92160 out
    y = interpolate(x, scale_factor=2, mode="bilinear")
    assert writes == [(1, 8, 48, 48)] * 5
    writes.clear()
    ref = F.interpolate(x, scale_factor=2, mode="bilinear")
    g = torch.randn(ref.shape, dtype=torch.float64)
    (got,) = torch.autograd.grad(y, x, g)
    assert writes == [(1, 8, 24, 24)] * 5  # by the gradient's size, not the result's
    (want,) = torch.autograd.grad(ref, x, g)
    assert torch.allclose(y, ref, rtol=0, atol=1e-13)
    assert torch.allclose(got, want, rtol=0, atol=1e-12)
