"""Spread and confidence of benchmark comparisons: is a difference between two timings real or noise?

A bench compares configurations measured in interleaved blocks. Each configuration's step times have a
spread (their interquartile range); the ratio of two medians has an uncertainty that a single number hides.
:func:`ratio_interval` estimates it with a percentile bootstrap of the ratio of medians (each sample
resamples both configurations' step times, with a fixed seed, so the report is reproducible), and
:func:`verdict` calls a difference "within noise" when that interval contains 1 or when the difference is
smaller than a floor (default 1%), below which no machine resolves a training step.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence

__all__ = ["NOISE_FLOOR", "iqr", "ratio_interval", "verdict"]

#: Relative differences below this are reported as within noise whatever the interval says.
NOISE_FLOOR = 0.01


def iqr(values: Sequence[float]) -> tuple[float, float]:
    """``(q1, q3)`` of ``values`` (both the value itself for fewer than two)."""
    if not values:
        raise ValueError("iqr needs at least one value")
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]


def ratio_interval(
    numerator: Sequence[float], denominator: Sequence[float], *, samples: int = 1000, level: float = 0.95, seed: int = 0
) -> tuple[float, float, float]:
    """``(ratio, low, high)``: the ratio of the medians and its bootstrap confidence interval.

    Args:
        numerator: Step times of the configuration being compared.
        denominator: Step times of the reference configuration.
        samples: Bootstrap resamples.
        level: Confidence level of the interval (0 < level < 1).
        seed: Seed of the resampling (the interval is reproducible).

    Raises:
        ValueError: An empty sample, a non-positive median or a bad ``level``/``samples``.
    """
    if not numerator or not denominator:
        raise ValueError("ratio_interval needs step times on both sides")
    if not 0.0 < level < 1.0 or samples < 1:
        raise ValueError(f"level must be in (0, 1) and samples >= 1, got level={level}, samples={samples}")
    base = statistics.median(denominator)
    if base <= 0:
        raise ValueError("the reference median must be positive")
    ratio = statistics.median(numerator) / base
    rng = random.Random(seed)
    n, d = list(numerator), list(denominator)
    boots = []
    for _ in range(samples):
        num = statistics.median(rng.choices(n, k=len(n)))
        den = statistics.median(rng.choices(d, k=len(d)))
        if den > 0:
            boots.append(num / den)
    boots.sort()
    lo_i = int((1.0 - level) / 2.0 * (len(boots) - 1))
    hi_i = int((1.0 + level) / 2.0 * (len(boots) - 1) + 0.5)
    return ratio, boots[lo_i], boots[hi_i]


def verdict(ratio: float, low: float, high: float, *, floor: float = NOISE_FLOOR) -> str:
    """``"slower"``, ``"faster"`` or ``"within noise"`` for a ratio and its confidence interval."""
    if low <= 1.0 <= high or abs(ratio - 1.0) < floor:
        return "within noise"
    return "slower" if ratio > 1.0 else "faster"
