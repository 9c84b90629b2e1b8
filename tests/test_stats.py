"""``ganda.stats`` on scipy: each interval equal to the hand-written one it replaces (kept here as
the reference), on the same inputs and seeds."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ganda.intervals import bounds
from ganda.stats import bootstrap_paired, bootstrap_rows, pool_sets, t_interval, t_quantile


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


@pytest.mark.parametrize(("n", "seed", "resamples", "chunk"), [(40, 0, 2000, 250), (7, 3, 500, 64), (200, 11, 1000, 1000)])
def test_bootstrap_of_many_rows_at_once_is_each_rows_own_bootstrap(n: int, seed: int, resamples: int, chunk: int) -> None:
    """One shared draw of counts for every row gives each row the interval bootstrap_paired gives
    it alone (the same draw, in chunks of resamples); a row of equal items is its exact value."""
    rng = np.random.default_rng(n)
    base = (rng.random(n) < 0.7).astype(float)
    rows = np.stack([base - (rng.random(n) < q).astype(float) for q in (0.2, 0.5, 0.9)] + [np.full(n, 0.25)])
    low, high = bootstrap_rows(rows, resamples=resamples, seed=seed, chunk=chunk)
    for i, row in enumerate(rows[:3]):
        want = _reference_bootstrap(row, np.zeros(n), resamples, seed)["a"]
        assert [low[i], high[i]] == pytest.approx(want, abs=1e-12)
        assert low[i] <= row.mean() <= high[i] and low[i] < high[i]
    assert (low[3], high[3]) == (0.25, 0.25)


def test_pooled_interval_is_wider_than_every_set_when_the_sets_disagree() -> None:
    est, lows, highs = [0.10, 0.45, 0.30], [0.02, 0.38, 0.22], [0.18, 0.52, 0.38]
    p = pool_sets(est, lows, highs)
    assert p["estimate"] == pytest.approx(sum(est) / 3)
    width = p["ci_high"] - p["ci_low"]
    assert all(width > hi - lo for lo, hi in zip(lows, highs, strict=True))
    assert p["between_sd"] > 0.1 and p["holds_on"] == 3 and p["holds"] == [True, True, True]
    # the spread of the estimates sets the interval: sd / sqrt(K) with t at K - 1 = 2 degrees of freedom
    sd = math.sqrt(sum((x - p["estimate"]) ** 2 for x in est) / 2)
    assert p["ci_high"] - p["estimate"] == pytest.approx(t_quantile(0.975, 2) * sd / math.sqrt(3))


def test_pooled_interval_of_one_set_is_its_own() -> None:
    p = pool_sets([0.25], [0.1], [0.4])
    assert (p["estimate"], p["ci_low"], p["ci_high"], p["holds_on"], p["pooled_holds"]) == (0.25, 0.1, 0.4, 1, True)
    assert pool_sets([0.25], [-0.1], [0.4])["holds_on"] == 0


def test_agreeing_sets_keep_their_within_set_noise() -> None:
    """Sets with equal estimates have no spread: the interval comes from their own intervals."""
    p = pool_sets([0.3, 0.3], [0.2, 0.1], [0.4, 0.5])
    se = [0.1 / 1.959963984540054, 0.2 / 1.959963984540054]
    want = t_quantile(0.975, 1) * math.sqrt((se[0] ** 2 + se[1] ** 2) / 4)
    assert p["ci_high"] - 0.3 == pytest.approx(want) and p["between_sd"] == 0.0


def test_holds_on_counts_the_sets_above_the_criterion() -> None:
    p = pool_sets([0.2, -0.05, 0.1, 0.3], [0.1, -0.2, -0.01, 0.2], [0.3, 0.1, 0.2, 0.4])
    assert p["holds"] == [True, False, False, True] and p["holds_on"] == 2
    assert pool_sets([0.2, 0.3], [0.1, 0.2], [0.3, 0.4], above=0.15)["holds_on"] == 1
    with pytest.raises(ValueError):
        pool_sets([], [], [])


def test_prompt_sets_are_disjoint_where_the_task_allows() -> None:
    from ganda.experiments.common import prompt_set, prompt_sets
    from ganda.tasks import get_task

    kv = get_task("kv")
    sets = prompt_sets(kv.examples, 6, 3, 3)
    assert [len(s) for s, _ in sets] == [6, 6, 6] and all(d for _, d in sets)
    prompts = [ex.prompt for s, _ in sets for ex in s]
    assert len(set(prompts)) == 18 and sets[0][0][0].prompt == kv.examples(6, 3)[0].prompt
    assert [ex.prompt for ex in prompt_set(kv.examples, 6, 3, 2)[0]] == [ex.prompt for ex in sets[2][0]]

    def fixed(limit, seed):  # a fixed pool of 4 prompts that ignores the seed: no disjoint second set
        return kv.examples(4, 0)[:limit]

    assert [d for _, d in prompt_sets(fixed, 4, 0, 2)] == [True, False]


def test_a_pooled_accuracy_interval_stays_within_0_and_1() -> None:
    p = pool_sets([0.9, 0.5], [0.8, 0.3], [1.0, 0.7], within=(0.0, 1.0))
    assert (p["ci_low"], p["ci_high"]) == (0.0, 1.0) and not p["pooled_holds"]
