"""Small statistics helpers: confidence intervals for accuracies (Wilson), for means over prompts
(Student t) and for paired differences (percentile bootstrap over prompts)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np


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


@lru_cache(maxsize=256)
def t_quantile(p: float, df: int) -> float:
    """Quantile of Student's t with ``df`` degrees of freedom (no scipy).

    Exact closed forms for df 1 and 2; for df 3-199, bisection on the CDF integrated with Simpson's
    rule (error < 1e-6); from df 200 on, the Cornish-Fisher expansion of Abramowitz & Stegun 26.7.5
    (error < 1e-7). Cached: the prompts of one run all share one df.
    """
    if df < 1:
        raise ValueError("df must be >= 1")
    if not 0 < p < 1:
        raise ValueError("p must be in (0, 1)")
    if df == 1:
        return math.tan(math.pi * (p - 0.5))
    if df == 2:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    if p < 0.5:
        return -t_quantile(1 - p, df)
    if df >= 200:
        z = _normal_quantile(p)
        g1 = (z**3 + z) / 4
        g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
        g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
        g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
        return z + g1 / df + g2 / df**2 + g3 / df**3 + g4 / df**4
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)

    def cdf(x: float, steps: int = 400) -> float:
        h = x / steps
        f = [c * (1 + (h * i) ** 2 / df) ** (-(df + 1) / 2) for i in range(steps + 1)]
        return 0.5 + h / 3 * (f[0] + f[-1] + 4 * sum(f[1:-1:2]) + 2 * sum(f[2:-1:2]))

    lo, hi = 0.0, 1.0
    while cdf(hi) < p:
        lo, hi = hi, hi * 2
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


def _normal_quantile(p: float) -> float:
    """Inverse standard normal CDF (bisection on erf: exact to 1e-12, fast enough here)."""
    lo, hi = -40.0, 40.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if 0.5 * (1 + math.erf(mid / math.sqrt(2))) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def t_interval(xs: Sequence[float], level: float = 0.95) -> tuple[float, float] | None:
    """Student-t interval for the mean of ``xs`` (prompts as independent draws); None for n < 2."""
    n = len(xs)
    if n < 2:
        return None
    mean = sum(xs) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    half = t_quantile(0.5 + level / 2, n - 1) * sd / math.sqrt(n)
    return (mean - half, mean + half)


def geo_t_interval(xs: Sequence[float], level: float = 0.95, floor: float = 1e-30) -> tuple[float, float] | None:
    """Interval for the geometric mean of positive ratios: the t interval of ``log x``, exponentiated."""
    ci = t_interval([math.log(max(x, floor)) for x in xs], level)
    return None if ci is None else (math.exp(ci[0]), math.exp(ci[1]))


def bootstrap_paired(a: Sequence[float], b: Sequence[float] | None = None, *, resamples: int = 2000, seed: int = 0,
                     level: float = 0.95) -> dict[str, Any]:
    """Percentile bootstrap over items (prompts) of mean(a), mean(b) and the paired mean(a - b).

    ``a[i]`` and ``b[i]`` belong to the same item; every resample draws items with replacement
    and uses the same draw for a, b and a - b. Seeded (numpy ``default_rng(seed)``).
    """

    xa = np.asarray(a, dtype=float)
    n = len(xa)
    if n == 0:
        raise ValueError("no items to bootstrap")
    idx = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    q = [(1 - level) / 2 * 100, (1 + level) / 2 * 100]

    def ci(x):
        lo, hi = np.percentile(x[idx].mean(axis=1), q)
        return [float(lo), float(hi)]

    out: dict[str, Any] = {"n": n, "resamples": resamples, "seed": seed, "a": float(xa.mean()), "a_ci95": ci(xa)}
    if b is not None:
        xb = np.asarray(b, dtype=float)
        if len(xb) != n:
            raise ValueError("paired bootstrap needs a and b of the same length")
        d = xa - xb
        out.update({"b": float(xb.mean()), "b_ci95": ci(xb), "diff": float(d.mean()), "diff_ci95": ci(d)})
    return out
