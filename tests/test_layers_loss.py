"""Deterministic dense cross-entropy / NLL equal PyTorch's for every argument combination."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from layer_helpers import check_matches, float_dtypes, make_input, patterns, seeds

from yolo_det.layers import loss as L


@st.composite
def loss_case(draw: st.DrawFn) -> dict:
    n, c = draw(st.integers(1, 3)), draw(st.integers(1, 5))
    spatial = tuple(draw(st.integers(1, 5)) for _ in range(draw(st.integers(1, 3))))
    seed = draw(seeds)
    gen = torch.Generator().manual_seed(seed)
    probabilities = draw(st.booleans())
    if probabilities:
        target = torch.rand((n, c) + spatial, generator=gen, dtype=torch.float64).softmax(1)
    else:
        target = torch.randint(0, c, (n,) + spatial, generator=gen)
    ignore = -100 if probabilities else draw(st.sampled_from([-100, 0, c - 1]))  # torch: no ignore_index for them
    if not probabilities and draw(st.booleans()):  # some ignored targets (sometimes all of them)
        target = torch.where(
            torch.rand(target.shape, generator=gen) < draw(st.sampled_from([0.3, 1.0])),
            torch.full_like(target, ignore),
            target,
        )
    weight = torch.rand(c, generator=gen, dtype=torch.float64) + 0.1 if draw(st.booleans()) else None
    return {
        "shape": (n, c) + spatial,
        "target": target,
        "weight": weight,
        "ignore_index": ignore,
        "reduction": draw(st.sampled_from(["mean", "sum", "none"])),
        "label_smoothing": draw(st.sampled_from([0.0, 0.0, 0.1, 0.35])),
    }


@settings(max_examples=80, deadline=None)
@given(case=loss_case(), pattern=patterns, dtype=float_dtypes, seed=seeds)
def test_cross_entropy_matches_torch(case, pattern, dtype, seed):
    x = make_input(pattern, case["shape"], dtype, seed)
    target = case["target"].to(dtype) if case["target"].is_floating_point() else case["target"]
    weight = None if case["weight"] is None else case["weight"].to(dtype)
    kwargs = {
        "ignore_index": case["ignore_index"],
        "reduction": case["reduction"],
        "label_smoothing": case["label_smoothing"],
    }
    # float32: the same PyTorch kernels on a flattened layout; only the order of the final reduction
    # over the N*d1*... positions differs
    # the weight is an input too, so the float64 reference gets a float64 copy
    inputs = [x, target] + ([] if weight is None else [weight])
    check_matches(
        lambda t, y, *w: L.cross_entropy(t, y, *w, **kwargs),
        lambda t, y, *w: F.cross_entropy(t, y, *w, **kwargs),
        inputs,
        dtype,
        seed=seed,
        grad_mask=[True, False, False][: len(inputs)],
    )


@settings(max_examples=50, deadline=None)
@given(case=loss_case(), pattern=patterns, dtype=float_dtypes, seed=seeds)
def test_nll_loss_matches_torch(case, pattern, dtype, seed):
    x = make_input(pattern, case["shape"], dtype, seed).log_softmax(1)
    target = case["target"]
    if target.is_floating_point():
        target = target.argmax(1)
    weight = None if case["weight"] is None else case["weight"].to(dtype)
    kwargs = {"ignore_index": case["ignore_index"], "reduction": case["reduction"]}
    inputs = [x, target] + ([] if weight is None else [weight])
    check_matches(
        lambda t, y, *w: L.nll_loss(t, y, *w, **kwargs),
        lambda t, y, *w: F.nll_loss(t, y, *w, **kwargs),
        inputs,
        dtype,
        seed=seed,
        grad_mask=[True, False, False][: len(inputs)],
    )


@pytest.mark.filterwarnings("ignore:size_average and reduce args will be deprecated")
def test_legacy_reduction_arguments():
    x = torch.randn(2, 4, 3, 3, dtype=torch.float64)
    t = torch.randint(0, 4, (2, 3, 3))
    for size_average, reduce in [(False, None), (None, False), (True, True)]:
        torch.testing.assert_close(
            L.cross_entropy(x, t, size_average=size_average, reduce=reduce),
            F.cross_entropy(x, t, size_average=size_average, reduce=reduce),
        )
        torch.testing.assert_close(
            L.nll_loss(x, t, size_average=size_average, reduce=reduce),
            F.nll_loss(x, t, size_average=size_average, reduce=reduce),
        )


def test_two_dimensional_input_passes_through():
    x, t = torch.randn(5, 4), torch.randint(0, 4, (5,))
    assert torch.equal(L.cross_entropy(x, t), F.cross_entropy(x, t))
    assert torch.equal(L.nll_loss(x.log_softmax(1), t), F.nll_loss(x.log_softmax(1), t))


def test_bad_target_raises_torch_error():
    x = torch.randn(2, 4, 3, 3)
    with pytest.raises(RuntimeError):
        L.cross_entropy(x, torch.randint(0, 4, (2, 3, 2)))
    with pytest.raises(RuntimeError):
        F.cross_entropy(x, torch.randint(0, 4, (2, 3, 2)))


def test_modules_keep_weight_buffer_and_arguments():
    w = torch.rand(4, dtype=torch.float64)
    det = L.DetCrossEntropyLoss(weight=w, ignore_index=1, reduction="sum", label_smoothing=0.2)
    ref = torch.nn.CrossEntropyLoss(weight=w, ignore_index=1, reduction="sum", label_smoothing=0.2)
    assert det.state_dict().keys() == ref.state_dict().keys() == {"weight"}
    x, t = torch.randn(2, 4, 3, 5, dtype=torch.float64), torch.randint(0, 4, (2, 3, 5))
    torch.testing.assert_close(det(x, t), ref(x, t), rtol=0, atol=1e-12)
    nll, nll_ref = L.DetNLLLoss(weight=w, reduction="none"), torch.nn.NLLLoss(weight=w, reduction="none")
    torch.testing.assert_close(nll(x.log_softmax(1), t), nll_ref(x.log_softmax(1), t), rtol=0, atol=1e-12)
