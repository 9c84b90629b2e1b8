"""``ganda.stats`` on scipy: each interval equal to the hand-written one it replaces (kept here as
the reference), on the same inputs and seeds."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ganda.intervals import bounds
from ganda.stats import bootstrap_paired, t_interval, t_quantile


def _reference_t_quantile(p: float, df: int) -> float:
    """The replaced quantile: closed forms for df 1-2, Simpson + bisection to df 199, Cornish-Fisher after."""
    if df == 1:
        return math.tan(math.pi * (p - 0.5))
    if df == 2:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    if p < 0.5:
        return -_reference_t_quantile(1 - p, df)
    if df >= 200:
        lo, hi = -40.0, 40.0
        for _ in range(100):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if 0.5 * (1 + math.erf(mid / math.sqrt(2))) < p else (lo, mid)
        z = (lo + hi) / 2
        g = [(z**3 + z) / 4, (5 * z**5 + 16 * z**3 + 3 * z) / 96, (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384,
             (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160]
        return z + sum(gk / df ** (k + 1) for k, gk in enumerate(g))
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


@pytest.mark.parametrize("df", [1, 2, 3, 4, 7, 19, 39, 120, 199, 200, 500, 5000])
@pytest.mark.parametrize("p", [0.025, 0.9, 0.975, 0.995])
def test_t_quantile_equals_the_replaced_one(p: float, df: int) -> None:
    assert t_quantile(p, df) == pytest.approx(_reference_t_quantile(p, df), abs=2e-6)


def test_t_quantile_matches_printed_tables_and_refuses_bad_input() -> None:
    # Student's t, two-sided 95% (p = 0.975), from any printed table
    for df, want in {1: 12.706, 2: 4.303, 5: 2.571, 10: 2.228, 39: 2.023, 100: 1.984}.items():
        assert t_quantile(0.975, df) == pytest.approx(want, abs=5e-4)
    with pytest.raises(ValueError):
        t_quantile(0.975, 0)
    with pytest.raises(ValueError):
        t_quantile(1.0, 5)
    lo, hi = t_interval([1.0, 2.0, 3.0, 4.0])
    assert (lo + hi) / 2 == pytest.approx(2.5) and hi - 2.5 == pytest.approx(3.182446 * math.sqrt(5 / 3) / 2, abs=1e-5)


def _reference_bootstrap(a, b, resamples: int, seed: int, level: float = 0.95) -> dict[str, list[float]]:
    """The replaced bootstrap: one index draw ``default_rng(seed).integers(0, n, (resamples, n))``."""
    xa, xb = np.asarray(a, float), np.asarray(b, float)
    idx = np.random.default_rng(seed).integers(0, len(xa), size=(resamples, len(xa)))
    q = [(1 - level) / 2 * 100, (1 + level) / 2 * 100]
    return {k: [float(v) for v in np.percentile(x[idx].mean(axis=1), q)]
            for k, x in (("a", xa), ("b", xb), ("diff", xa - xb))}


@pytest.mark.parametrize(("n", "seed", "resamples"), [(40, 0, 2000), (7, 3, 500), (200, 11, 1000), (2, 1, 300)])
def test_bootstrap_equals_the_replaced_one(n: int, seed: int, resamples: int) -> None:
    rng = np.random.default_rng(n)
    a = rng.normal(size=n)
    b = a + rng.normal(scale=0.3, size=n) - 0.2
    got = bootstrap_paired(a, b, resamples=resamples, seed=seed)
    want = _reference_bootstrap(a, b, resamples, seed)
    for key, interval in want.items():
        assert [got[f"{key}_ci_low"], got[f"{key}_ci_high"]] == pytest.approx(interval, abs=1e-12), key
    assert got["diff"] == pytest.approx(float(np.mean(a - b)))


def test_bootstrap_of_one_item_or_equal_items_is_a_point() -> None:
    assert bounds(bootstrap_paired([0.5]), "a") == (0.5, 0.5)
    r = bootstrap_paired([1.0, 1.0, 1.0], [0.0, 0.5, 1.0], seed=2)
    assert bounds(r, "a") == (1.0, 1.0)
    assert list(bounds(r, "b")) == _reference_bootstrap([1, 1, 1], [0, 0.5, 1], 2000, 2)["b"]
