"""Exact, cheap fingerprints of tensors: equal bits give equal digests, any changed bit a different one.

``yolo-det verify`` fingerprints every input batch and every gradient of every optimizer step, so the
fingerprint must cost little next to a training step and must never miss a one-bit difference:

- CPU tensors are hashed with SHA-256 over their raw bytes (no copy; OpenSSL runs at memory speed).
- Tensors on an accelerator are hashed on the device, so nothing large crosses to the host. Each
  tensor's bits are read as integer words ``x_i`` and reduced to three sums modulo the prime
  ``P = 2**31 - 1``: ``sum(x_i)``, ``sum(x_i * (i+1))`` and ``sum(x_i * (i+1)**2)``. Integer sums are exact
  and independent of summation order, so the digest is deterministic on every device and under any
  determinism setting. A change of one word always changes the first sum; a change that moves values
  between positions (a permutation, a different data order) changes the position-weighted sums. Many
  tensors are processed in a few kernels (concatenated per dtype, segment sums by ``cumsum``).

A digest is 32 hex characters and covers the dtype and shape as well as the values. Digests are only
comparable between tensors on the same kind of device (both runs of a verification use one device).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

import torch

__all__ = ["combine", "device_digests", "tensor_digest", "tensor_digests"]

_P = 2**31 - 1  # Mersenne prime; residues fit in 31 bits, so products of two fit in int64
_GROUP_ELEMENTS = 1 << 23  # bound on the elements hashed in one group on a device (bounds temporaries)


def tensor_digests(tensors: Sequence[torch.Tensor]) -> list[str]:
    """Return one digest (32 hex characters) per tensor, computed on the tensor's own device.

    Args:
        tensors: Any tensors (any dtype, device, layout of strides). Gradients and parameters are read,
            never changed; autograd is not involved.
    """
    out: list[str | None] = [None] * len(tensors)
    device_items: list[tuple[int, torch.Tensor]] = []
    for k, t in enumerate(tensors):
        if t.device.type == "cpu":
            out[k] = _cpu_digest(t)
        else:
            device_items.append((k, t))
    if device_items:
        for (k, _), digest in zip(device_items, device_digests([t for _, t in device_items])):
            out[k] = digest
    return [d for d in out if d is not None]


def tensor_digest(tensor: torch.Tensor) -> str:
    """The digest of one tensor (see :func:`tensor_digests`)."""
    return tensor_digests([tensor])[0]


def combine(digests: Iterable[str]) -> str:
    """One digest for an ordered sequence of digests (or any strings)."""
    h = hashlib.sha256()
    for d in digests:
        h.update(d.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def _header(t: torch.Tensor) -> bytes:
    return f"{t.dtype}\0{tuple(t.shape)}\0".encode()


def _cpu_digest(t: torch.Tensor) -> str:
    t = t.detach()
    if not t.is_contiguous():
        t = t.contiguous()
    h = hashlib.sha256(_header(t))
    if t.numel():
        h.update(t.reshape(-1).view(torch.uint8).numpy().data)
    return h.hexdigest()[:32]


def _words(flat: torch.Tensor) -> torch.Tensor:
    """The bits of a flat contiguous tensor as int64 words (one per 1, 2 or 4 bytes; two per 8 bytes)."""
    if flat.dtype == torch.bool:
        flat = flat.view(torch.uint8)
    size = flat.element_size()
    if size == 1:
        return flat.view(torch.uint8).to(torch.int64)
    if size == 2:
        return flat.view(torch.int16).to(torch.int64)
    if size == 4:
        return flat.view(torch.int32).to(torch.int64)
    return flat.view(torch.int32).to(torch.int64)  # 8 and 16 bytes: 32-bit halves


def device_digests(tensors: Sequence[torch.Tensor]) -> list[str]:
    """Digests computed with integer arithmetic on the tensors' device (any device, CPU included).

    This is the accelerator path of :func:`tensor_digests`; it is public so it can be checked on a CPU.
    """
    out: list[str] = [""] * len(tensors)
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for k, t in enumerate(tensors):
        groups.setdefault((t.device, t.dtype), []).append(k)
    for indices in groups.values():
        batch: list[int] = []
        count = 0
        for k in indices:
            n = tensors[k].numel()
            if batch and count + n > _GROUP_ELEMENTS:
                _hash_group(tensors, batch, out)
                batch, count = [], 0
            batch.append(k)
            count += n
        if batch:
            _hash_group(tensors, batch, out)
    return out


def _hash_group(tensors: Sequence[torch.Tensor], indices: list[int], out: list[str]) -> None:
    """Hash tensors of one device and dtype together: one concatenation, three segment sums."""
    parts = [tensors[k].detach().reshape(-1) for k in indices]
    nonempty = [p for p in parts if p.numel()]
    sums: list[list[int]] = [[0, 0, 0] for _ in indices]
    if nonempty:
        flat = torch.cat(nonempty) if len(nonempty) > 1 else nonempty[0].contiguous()
        words = _words(flat)
        device = words.device
        lengths = [p.numel() * words.numel() // flat.numel() for p in nonempty]  # words per tensor
        starts = torch.tensor([0, *lengths[:-1]], dtype=torch.int64).cumsum(0)
        ends = torch.tensor(lengths, dtype=torch.int64).cumsum(0)
        rep = torch.tensor(lengths, dtype=torch.int64, device=device)
        offsets = torch.repeat_interleave(starts.to(device), rep)
        pos = torch.arange(words.numel(), dtype=torch.int64, device=device).sub_(offsets).remainder_(_P).add_(1)
        x = words.remainder(_P)
        xp = x.mul(pos).remainder_(_P)
        xpp = xp.mul(pos).remainder_(_P)
        del pos, offsets
        terms = torch.stack([x, xp, xpp])  # each term < 2**31: a cumsum over < 2**32 terms stays exact
        del x, xp, xpp
        cums = terms.cumsum(1)
        at_end = cums[:, ends.to(device) - 1]
        before = torch.cat([torch.zeros(3, 1, dtype=torch.int64, device=device), at_end[:, :-1]], dim=1)
        seg = (at_end - before).remainder_(_P).t().tolist()
        it = iter(seg)
        for j, p in enumerate(parts):
            if p.numel():
                sums[j] = next(it)
    for j, k in enumerate(indices):
        h = hashlib.sha256(_header(tensors[k]))
        h.update(b"device-sum\0" + ",".join(str(s) for s in sums[j]).encode())
        out[k] = h.hexdigest()[:32]
