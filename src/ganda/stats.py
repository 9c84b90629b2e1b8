"""Small statistics helpers: confidence intervals for accuracies (Wilson), for means over prompts
(Student t, quantiles from ``scipy.stats``) and for paired differences (percentile bootstrap over
prompts, one draw shared by every row). scipy loads with the first interval that needs it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from .intervals import bounds
from .intervals import ci as interval

Z95 = 1.959963984540054  # the normal quantile of a two-sided 95% interval


def wilson(correct: int, n: int, z: float = Z95) -> tuple[float, float]:
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
    """Quantile of Student's t with ``df`` degrees of freedom (``scipy.stats.t.ppf``). Cached: the
    prompts of one run all share one df."""
    if df < 1:
        raise ValueError("df must be >= 1")
    if not 0 < p < 1:
        raise ValueError("p must be in (0, 1)")
    from scipy import stats  # ~0.3 s to import: loaded with the first interval, not with ganda

    return float(stats.t.ppf(p, df))


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
    """Percentile bootstrap over items (prompts) of mean(a), mean(b) and the paired mean(a - b):
    ``a``, ``b`` and ``diff`` with their intervals ``<name>_ci_low`` and ``<name>_ci_high``.

    ``a[i]`` and ``b[i]`` belong to the same item; every resample draws items with replacement
    and uses the same draw for a, b and a - b (:func:`bootstrap_rows` on the three rows: the draw
    of ``scipy.stats.bootstrap`` with ``numpy.random.default_rng(seed)``).
    """
    xa = np.asarray(a, dtype=float)
    n = len(xa)
    if n == 0:
        raise ValueError("no items to bootstrap")
    xb = np.asarray(b if b is not None else xa, dtype=float)
    if len(xb) != n:
        raise ValueError("paired bootstrap needs a and b of the same length")
    rows = np.stack([xa, xb, xa - xb])
    low, high = bootstrap_rows(rows, resamples=resamples, seed=seed, level=level)
    names = ("a", "b", "diff") if b is not None else ("a",)
    out: dict[str, Any] = {"n": n, "resamples": resamples, "seed": seed}
    for i, name in enumerate(names):
        out.update({name: float(rows[i].mean()), **interval([float(low[i]), float(high[i])], name)})
    return out


def bootstrap_rows(x: Any, *, resamples: int = 2000, seed: int = 0, level: float = 0.95,
                   chunk: int = 250) -> tuple[np.ndarray, np.ndarray]:
    """Percentile bootstrap intervals of the mean of every row of ``x`` (``[rows, items]``), with
    one draw of items shared by every row: each resample is a count per item, so all the rows'
    resampled means are one matrix product. What a sweep of a thousand heads needs, where one
    :func:`bootstrap_paired` a head would take a minute. A row whose items are all equal gets the
    interval ``[mean, mean]``."""
    x = np.asarray(x, dtype=float)
    k, n = x.shape
    if n == 0:
        raise ValueError("no items to bootstrap")
    rng = np.random.default_rng(seed)
    means = np.empty((k, resamples))
    for start in range(0, resamples, chunk):  # counts of at most chunk x n at a time
        r = min(chunk, resamples - start)
        picks = rng.integers(0, n, size=(r, n)) + n * np.arange(r)[:, None]
        counts = np.bincount(picks.ravel(), minlength=r * n).reshape(r, n)
        means[:, start:start + r] = x @ counts.T / n
    tail = 50 * (1 - level)
    low, high = np.percentile(means, [tail, 100 - tail], axis=1)
    flat = np.ptp(x, axis=1) == 0  # the exact mean, not a float sum's rounding of it
    low[flat] = high[flat] = x[flat, 0]
    return low, high


def paired_intervals(intact: Sequence[float], ablated: dict[str, Sequence[float]], name: str, seed: int = 0
                     ) -> dict[str, dict[str, float]]:
    """Each key of ``ablated`` (a head) with the paired 95% interval of ``name``, the mean of
    ``intact - ablated`` over the same items: ``{<name>_ci_low, <name>_ci_high}``, one
    :func:`bootstrap_rows` draw for every head (what :func:`paired_difference` gives one head)."""
    if not ablated:
        return {}
    diffs = [[a - b for a, b in zip(intact, per, strict=True)] for per in ablated.values()]
    low, high = bootstrap_rows(diffs, seed=seed)
    return {h: interval((lo, hi), name) for h, lo, hi in zip(ablated, low.tolist(), high.tolist(), strict=True)}


def paired_difference(a: Sequence[float], b: Sequence[float], seed: int, name: str = "drop", resamples: int = 2000
                      ) -> dict[str, Any]:
    """``name`` (default ``drop``): the mean of ``a - b`` over the same prompts, with its paired
    bootstrap interval (:func:`bootstrap_paired`); one record key per drop, so an accuracy drop and
    a margin drop sit side by side."""
    bs = bootstrap_paired(a, b, resamples=resamples, seed=seed)
    return {name: bs["diff"], **interval(bounds(bs, "diff"), name)}


def overlap(a: Sequence[float], b: Sequence[float]) -> bool:
    """Whether two intervals share a point: the difference they bracket is not established."""
    return a[0] <= b[1] and b[0] <= a[1]


def weak_note(acc_a: float | None, acc_b: float | None, n: int | None) -> str:
    """A headline's warning when two accuracies on the same ``n`` prompts are not told apart by
    their Wilson 95% intervals: ``" (weak: the 95% intervals overlap at n=40)"``; else ``""``."""
    if acc_a is None or acc_b is None or not n:
        return ""
    if overlap(wilson(round(acc_a * n), n), wilson(round(acc_b * n), n)):
        return f" (weak: the 95% intervals overlap at n={n}; more prompts would tell)"
    return ""


def pool_sets(estimates: Sequence[float], lows: Sequence[float | None], highs: Sequence[float | None],
              level: float = 0.95, above: float = 0.0, within: tuple[float, float] | None = None) -> dict[str, Any]:
    """One estimate from K prompt sets, with an interval that includes between-set variation.

    Each set gives an estimate and its own interval (a Wilson, t or bootstrap interval over its
    prompts); its standard error is read back from the interval's width, ``(high - low) / (2 z)``.
    Sets have equal weight (they have equal size). The pooled estimate is the mean of the set
    estimates; its variance is the larger of two (the modified Hartung-Knapp random-effects
    interval): the spread of the set estimates, ``sd^2 / K``, which holds both the between-set
    variation and each set's sampling noise, and the within-set variance alone, ``sum(se^2) / K^2``,
    so sets that happen to agree do not shrink the interval below what their prompts support. The
    interval is the estimate +- the t quantile with K - 1 degrees of freedom times its square root
    (K = 2 has one degree of freedom, t = 12.7: two sets give a wide interval). With K = 1 the
    pooled estimate and interval are the set's own.

    ``between_sd`` is the between-set standard deviation beyond sampling noise (the moment estimate
    ``sqrt(max(0, sd^2 - mean se^2))``). A set holds when its interval lies above ``above`` (its
    ``low > above``); ``holds_on`` counts them and ``pooled_holds`` says whether the pooled interval does.
    ``within``: the range the quantity cannot leave (``(0, 1)`` for an accuracy), the pooled interval cut to it.
    """
    k = len(estimates)
    if k == 0 or not len(lows) == len(highs) == k:
        raise ValueError("pool_sets needs one estimate, low and high per set")
    holds = [lo is not None and lo > above for lo in lows]
    out: dict[str, Any] = {"k": k, "holds_on": sum(holds), "holds": holds, "method": "modified Hartung-Knapp, equal weights"}
    if k == 1:
        lo, hi = lows[0], highs[0]
        return {**out, "estimate": float(estimates[0]), **interval((lo, hi) if lo is not None else None),
                "between_sd": None, "pooled_holds": holds[0]}
    mean = sum(estimates) / k
    spread = sum((x - mean) ** 2 for x in estimates) / (k - 1)
    ses = [None if lo is None or hi is None else (hi - lo) / (2 * Z95) for lo, hi in zip(lows, highs, strict=True)]
    noise = None if None in ses else sum(s * s for s in ses) / k  # mean se^2
    var = max(spread / k, (noise or 0.0) / k)
    half = t_quantile(0.5 + level / 2, k - 1) * math.sqrt(var)
    between = None if noise is None else math.sqrt(max(0.0, spread - noise))
    lo, hi = mean - half, mean + half
    if within is not None:
        lo, hi = max(lo, within[0]), min(hi, within[1])
    return {**out, "estimate": mean, **interval((lo, hi)), "between_sd": between, "pooled_holds": lo > above}
