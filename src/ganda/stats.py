"""Small statistics helpers (confidence intervals for accuracies)."""

from __future__ import annotations

import math


def wilson(correct: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson score 95% interval for a binomial proportion (well-behaved at 0% and 100%)."""
    if n == 0:
        return (0.0, 1.0)
    p = correct / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    lo = 0.0 if correct == 0 else max(0.0, centre - half)
    hi = 1.0 if correct == n else min(1.0, centre + half)
    return (lo, hi)
