"""Deterministic cross-entropy and NLL loss for ``(N, C, d1, ...)`` inputs (dense prediction).

With three or more input dimensions PyTorch uses the ``nll_loss2d`` CUDA kernel, whose forward (for
``reduction='mean'``/``'sum'``) accumulates with atomics and raises under the deterministic flag. The
same loss is computed here by moving the class axis last and flattening to ``(N*d1*..., C)``, which
uses the 1-D kernels (a fixed-order reduction forward, unique writes backward), then reshaping a
``reduction='none'`` result back to ``(N, d1, ...)``. Weights, ``ignore_index``, ``label_smoothing``
and probability targets keep PyTorch's semantics because the flattened call *is* PyTorch's loss: a
weighted mean divides by the summed weights of the non-ignored targets in both layouts. Inputs with
fewer than three dimensions pass straight through. For channels_last input the flattening is a view;
otherwise it copies the logits once.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn
from torch.nn import _reduction

from . import _native

__all__ = ["DetCrossEntropyLoss", "DetNLLLoss", "cross_entropy", "nll_loss"]


def _flatten_input(input: Tensor) -> Tensor:
    return input.movedim(1, -1).reshape(-1, input.shape[1])


def _spatial_target_ok(input: Tensor, target: Tensor) -> bool:
    return tuple(target.shape) == (input.shape[0],) + tuple(input.shape[2:])


def _flat_loss(loss_fn: Any, input: Tensor, flat_target: Tensor, reduction: str, **kwargs: Any) -> Tensor:
    """``loss_fn`` over the flattened ``(N*d1*..., C)`` logits; a ``none`` reduction shaped ``(N, d1, ...)``."""
    loss = loss_fn(_flatten_input(input), flat_target, reduction=reduction, **kwargs)
    return loss.view((input.shape[0],) + tuple(input.shape[2:])) if reduction == "none" else loss


def cross_entropy(
    input: Tensor,
    target: Tensor,
    weight: Tensor | None = None,
    size_average: bool | None = None,
    ignore_index: int = -100,
    reduce: bool | None = None,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
) -> Tensor:
    """Deterministic ``torch.nn.functional.cross_entropy`` (same signature and result).

    Args:
        input: Logits ``(N, C, d1, ...)`` (or ``(N, C)``/``(C,)``, passed through).
        target: Class indices ``(N, d1, ...)`` or class probabilities shaped like ``input``.
        weight: Per-class weights ``(C,)``.
        size_average: Deprecated (see PyTorch).
        ignore_index: Target value that contributes neither loss nor gradient.
        reduce: Deprecated (see PyTorch).
        reduction: ``'none'``, ``'mean'`` or ``'sum'``.
        label_smoothing: Amount of smoothing in ``[0, 1]``.

    Returns:
        The loss: a scalar, or ``(N, d1, ...)`` for ``reduction='none'``.
    """
    if size_average is not None or reduce is not None:
        reduction = _reduction.legacy_get_string(size_average, reduce)
    probabilities = target.is_floating_point()
    bad_target = target.shape != input.shape if probabilities else not _spatial_target_ok(input, target)
    if input.dim() < 3 or input.numel() == 0 or bad_target:
        return _native.cross_entropy(
            input, target, weight, ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing
        )
    flat_target = _flatten_input(target) if probabilities else target.reshape(-1)
    return _flat_loss(
        _native.cross_entropy,
        input,
        flat_target,
        reduction,
        weight=weight,
        ignore_index=ignore_index,
        label_smoothing=label_smoothing,
    )


def nll_loss(
    input: Tensor,
    target: Tensor,
    weight: Tensor | None = None,
    size_average: bool | None = None,
    ignore_index: int = -100,
    reduce: bool | None = None,
    reduction: str = "mean",
) -> Tensor:
    """Deterministic ``torch.nn.functional.nll_loss`` (same signature and result).

    Args:
        input: Log-probabilities ``(N, C, d1, ...)`` (or ``(N, C)``/``(C,)``, passed through).
        target: Class indices ``(N, d1, ...)``.
        weight: Per-class weights ``(C,)``.
        size_average: Deprecated (see PyTorch).
        ignore_index: Target value that contributes neither loss nor gradient.
        reduce: Deprecated (see PyTorch).
        reduction: ``'none'``, ``'mean'`` or ``'sum'``.

    Returns:
        The loss: a scalar, or ``(N, d1, ...)`` for ``reduction='none'``.
    """
    if size_average is not None or reduce is not None:
        reduction = _reduction.legacy_get_string(size_average, reduce)
    if input.dim() < 3 or input.numel() == 0 or not _spatial_target_ok(input, target):
        return _native.nll_loss(input, target, weight, ignore_index=ignore_index, reduction=reduction)
    return _flat_loss(_native.nll_loss, input, target.reshape(-1), reduction, weight=weight, ignore_index=ignore_index)


class DetCrossEntropyLoss(nn.CrossEntropyLoss):
    """Deterministic drop-in for :class:`torch.nn.CrossEntropyLoss` (same arguments, repr, ``weight`` buffer)."""

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return cross_entropy(
            input,
            target,
            weight=self.weight,
            ignore_index=self.ignore_index,
            reduction=self.reduction,
            label_smoothing=self.label_smoothing,
        )


class DetNLLLoss(nn.NLLLoss):
    """Deterministic drop-in for :class:`torch.nn.NLLLoss` (same arguments, repr, ``weight`` buffer)."""

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return nll_loss(input, target, weight=self.weight, ignore_index=self.ignore_index, reduction=self.reduction)
