"""Helpers for the deterministic-layer tests: inputs with tie patterns, and op-vs-op comparison."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from hypothesis import strategies as st

#: Input patterns: plain normal values, small integers (many exact ties), ReLU output (many zeros),
#: a constant tensor (every window is one big tie).
PATTERNS = ("normal", "ints", "relu", "const")

patterns = st.sampled_from(PATTERNS)
seeds = st.integers(0, 2**31 - 1)
float_dtypes = st.sampled_from([torch.float64, torch.float32])


def make_input(pattern: str, shape: Sequence[int], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """A tensor of ``shape`` following ``pattern`` (see :data:`PATTERNS`), reproducible from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    if pattern == "normal":
        x = torch.randn(*shape, generator=g, dtype=torch.float64)
    elif pattern == "ints":
        x = torch.randint(0, 3, tuple(shape), generator=g).to(torch.float64)
    elif pattern == "relu":
        x = torch.randn(*shape, generator=g, dtype=torch.float64).clamp_min(0)
    elif pattern == "const":
        x = torch.full(tuple(shape), 0.5, dtype=torch.float64)
    else:  # pragma: no cover - a typo in a test
        raise ValueError(pattern)
    return x.to(dtype)


def outputs_and_grads(
    fn: Callable[..., torch.Tensor], inputs: Sequence[torch.Tensor], seed: int, grad_mask: Sequence[bool] | None = None
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Run ``fn`` on fresh leaf copies of ``inputs``; backpropagate a random upstream gradient.

    Returns the output and the gradients of the inputs selected by ``grad_mask`` (floating inputs by
    default).
    """
    if grad_mask is None:
        grad_mask = [t.is_floating_point() for t in inputs]
    leaves = [t.detach().clone().requires_grad_(m) for t, m in zip(inputs, grad_mask)]
    out = fn(*leaves)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(out.dtype)
    wanted = [t for t, m in zip(leaves, grad_mask) if m]
    grads = list(torch.autograd.grad(out, wanted, g)) if wanted else []
    return out.detach(), grads


def assert_same_function(
    ours: Callable[..., torch.Tensor],
    native: Callable[..., torch.Tensor],
    inputs: Sequence[torch.Tensor],
    *,
    atol: float,
    rtol: float = 0.0,
    seed: int = 0,
    grad_mask: Sequence[bool] | None = None,
) -> None:
    """Assert ``ours`` and ``native`` agree on the output and on every input gradient (same shapes and dtypes)."""
    y1, g1 = outputs_and_grads(ours, inputs, seed, grad_mask)
    y2, g2 = outputs_and_grads(native, inputs, seed, grad_mask)
    torch.testing.assert_close(y1, y2, atol=atol, rtol=rtol, equal_nan=True, msg=lambda m: f"forward: {m}")
    for i, (a, b) in enumerate(zip(g1, g2)):
        torch.testing.assert_close(a, b, atol=atol, rtol=rtol, equal_nan=True, msg=lambda m, i=i: f"grad {i}: {m}")


def graph_node_names(t: torch.Tensor) -> set[str]:
    """Names of every autograd node reachable from ``t.grad_fn``."""
    seen: set[object] = set()
    names: set[str] = set()
    stack = [t.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.add(type(node).__name__)
        stack.extend(fn for fn, _ in node.next_functions)
    return names


def _max_abs(t: torch.Tensor) -> float:
    return float(t.abs().max()) if t.numel() else 0.0


def assert_float32_as_accurate(
    ours: Callable[..., torch.Tensor],
    native: Callable[..., torch.Tensor],
    inputs: Sequence[torch.Tensor],
    *,
    seed: int = 0,
    ulps: float = 4.0,
    truth: Callable[..., torch.Tensor] | None = None,
    grad_mask: Sequence[bool] | None = None,
) -> None:
    """Assert ``ours`` in float32 is as accurate as ``native`` in float32, forward and gradients.

    Both are compared with the float64 result of the native op on the same (float32-representable)
    values (``truth``, the native op by default). Summation order and the precision of interpolation
    weights legitimately differ between two float32 implementations, so they cannot be compared
    bit for bit; instead our error must not exceed PyTorch's own float32 error by more than ``ulps``
    units of ``eps * max(1, max|truth|)``.
    """
    truth = truth or native
    inputs32 = [t.to(torch.float32) if t.is_floating_point() else t for t in inputs]
    inputs64 = [t.to(torch.float64) if t.is_floating_point() else t for t in inputs32]
    y, g = outputs_and_grads(ours, inputs32, seed, grad_mask)
    yn, gn = outputs_and_grads(native, inputs32, seed, grad_mask)
    yt, gt = outputs_and_grads(truth, inputs64, seed, grad_mask)
    eps = torch.finfo(torch.float32).eps
    assert y.dtype == yn.dtype
    assert y.shape == yn.shape
    for name, a, b, t in [("forward", y, yn, yt)] + [(f"grad {i}", *v) for i, v in enumerate(zip(g, gn, gt))]:
        nan = torch.isnan(t)  # e.g. a mean over no element: NaN in every implementation
        assert torch.equal(torch.isnan(a), nan), f"{name}: NaN where the float64 result has none (or vice versa)"
        a, b, t = a.double()[~nan], b.double()[~nan], t[~nan]
        err = _max_abs(a - t)
        err_native = _max_abs(b - t)
        bound = err_native + ulps * eps * max(1.0, _max_abs(t))
        assert err <= bound, f"{name}: float32 error {err:.3g} > PyTorch's {err_native:.3g} + {ulps} ulps ({bound:.3g})"


def check_matches(
    ours: Callable[..., torch.Tensor],
    native: Callable[..., torch.Tensor],
    inputs: Sequence[torch.Tensor],
    dtype: torch.dtype,
    *,
    seed: int = 0,
    ulps: float = 4.0,
    truth: Callable[..., torch.Tensor] | None = None,
    grad_mask: Sequence[bool] | None = None,
) -> None:
    """float64: forward and gradients within 1e-10 of the native op; float32: see :func:`assert_float32_as_accurate`."""
    if dtype == torch.float64:
        inputs64 = [t.to(torch.float64) if t.is_floating_point() else t for t in inputs]
        assert_same_function(ours, truth or native, inputs64, atol=1e-10, seed=seed, grad_mask=grad_mask)
    else:
        assert_float32_as_accurate(ours, native, inputs, seed=seed, ulps=ulps, truth=truth, grad_mask=grad_mask)
