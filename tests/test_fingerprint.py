"""Tensor fingerprints: equal bits give equal digests, any changed bit or moved value a different one."""

from __future__ import annotations

import pytest
import torch

from yolo_det.tools import fingerprint
from yolo_det.tools.fingerprint import combine, device_digests, tensor_digest, tensor_digests

DTYPES = [
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float64,
    torch.int64,
    torch.int32,
    torch.uint8,
    torch.bool,
]
PATHS = {"cpu-sha256": tensor_digests, "device-sums": device_digests}


def sample(dtype: torch.dtype, n: int = 257) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    if dtype == torch.bool:
        return torch.rand(n, generator=g) > 0.5
    if dtype.is_floating_point:
        return torch.randn(n, generator=g).to(dtype)
    return torch.randint(0, 100, (n,), generator=g).to(dtype)


def flip_bit(t: torch.Tensor, index: int) -> torch.Tensor:
    out = t.clone()
    raw = out.view(torch.uint8) if out.dtype != torch.bool else out.view(torch.uint8)
    raw.view(-1)[index * out.element_size()] ^= 1
    return out


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_equal_bits_equal_digest_and_one_bit_changes_it(path, dtype):
    digests = PATHS[path]
    t = sample(dtype)
    same = t.clone()
    changed = flip_bit(t, 100)
    a, b, c = digests([t, same, changed])
    assert a == b
    assert a != c
    assert len(a) == 32
    assert all(ch in "0123456789abcdef" for ch in a)


@pytest.mark.parametrize("path", PATHS)
def test_moved_values_change_the_digest(path):
    digests = PATHS[path]
    t = torch.arange(1000, dtype=torch.float32)
    swapped = t.clone()
    swapped[[3, 700]] = swapped[[700, 3]]
    rolled = torch.roll(t, 1)
    d = digests([t, swapped, rolled])
    assert len(set(d)) == 3


@pytest.mark.parametrize("path", PATHS)
def test_dtype_and_shape_are_part_of_the_digest(path):
    digests = PATHS[path]
    t = torch.arange(12, dtype=torch.int32)
    d = digests([t, t.view(3, 4), t.view(torch.float32), torch.zeros(0), torch.zeros(0, 3)])
    assert len(set(d)) == 5


def test_device_digest_does_not_depend_on_grouping(monkeypatch):
    tensors = [sample(torch.float32, n) for n in (5, 300, 1, 4096, 17)] + [sample(torch.int64, 9), torch.zeros(0)]
    alone = [device_digests([t])[0] for t in tensors]
    together = device_digests(tensors)
    assert together == alone
    monkeypatch.setattr(fingerprint, "_GROUP_ELEMENTS", 64)  # force many small groups
    assert device_digests(tensors) == alone


def test_non_contiguous_tensors_hash_like_their_contiguous_copy():
    t = torch.randn(8, 6)
    view = t.t()
    assert not view.is_contiguous()
    for digests in PATHS.values():
        assert digests([view])[0] == digests([view.contiguous()])[0]


def test_digests_leave_tensors_and_autograd_alone():
    p = torch.nn.Parameter(torch.randn(10))
    (p * 2).sum().backward()
    grad = p.grad.clone()
    tensor_digests([p, p.grad])
    device_digests([p, p.grad])
    assert torch.equal(p.grad, grad)
    assert p.grad_fn is None


def test_device_digest_under_strict_determinism():
    torch.use_deterministic_algorithms(True)  # the conftest restores the flag
    assert device_digests([torch.randn(100)])[0]


def test_combine_is_order_sensitive():
    a, b = tensor_digest(torch.zeros(2)), tensor_digest(torch.ones(2))
    assert combine([a, b]) != combine([b, a])
    assert combine([a, b]) == combine([a, b])
