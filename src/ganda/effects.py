"""A head's effect: how much a stated metric drops when the head is ablated (intact minus ablated).

One sign everywhere: a positive effect means the ablation hurts, so the head helps the task; a
negative effect means the ablation helps. Two metrics are measured from the same choice
log-likelihoods:

* ``"acc"``: accuracy (the choice of largest summed log-likelihood is the prediction);
* ``"margin"``: the mean over prompts of the gold choice's log-likelihood minus the mean
  (``kind="mean"``) or the best (``kind="max"``) of the other choices'.

A head *matters* when its effect on the ranking metric is positive and, where the effect has an
interval, the interval's low end is above zero. A head is *helpful when ablated* when its effect is
negative (the interval's high end below zero). Every command that ranks or reports heads
(``ganda sweep``, ``ganda rank``, ``ganda demo``) orders them with :func:`ordered` and splits them
with :func:`split`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from .errors import GandaError

NAMES = {"acc": "accuracy", "acc_norm": "length-normalised accuracy", "margin": "mean margin"}


def effect(intact: float, ablated: float) -> float:
    """The drop of a metric when a head is ablated: ``intact - ablated`` (positive: the head helps)."""
    return intact - ablated


def margin(loglik: Sequence[float], gold: int, kind: str = "mean") -> float:
    """One prompt's margin: the gold choice's log-likelihood minus the mean (or the best) of the others'."""
    others = [v for i, v in enumerate(loglik) if i != gold]
    if not others:
        raise GandaError("a margin needs at least two choices")
    return float(loglik[gold]) - (sum(others) / len(others) if kind == "mean" else max(others))


def mean_margin(logliks: Sequence[Sequence[float]], golds: Sequence[int], kind: str = "mean") -> float:
    """The margin metric: :func:`margin` averaged over prompts."""
    vals = [margin(ll, g, kind) for ll, g in zip(logliks, golds, strict=True)]
    return sum(vals) / max(1, len(vals))


def mean_margin_or_nan(logliks: Sequence[Sequence[float]], golds: Sequence[int], kind: str = "mean") -> float:
    """:func:`mean_margin`, NaN where a prompt has fewer than two choices (the margin is undefined)."""
    return mean_margin(logliks, golds, kind) if all(len(ll) > 1 for ll in logliks) else math.nan


def predicted(logliks: Sequence[float]) -> int:
    """The choice a model picks: the one of largest log-likelihood, ties to the first (lm-eval's
    rule, and every accuracy ganda reports)."""
    return max(range(len(logliks)), key=lambda i: logliks[i])


def accuracy(logliks: Sequence[Sequence[float]], golds: Sequence[int]) -> float:
    """The accuracy metric: the share of prompts whose largest log-likelihood is the gold choice's
    (ties: the first choice, as the sweep predicts)."""
    right = [predicted(ll) == g for ll, g in zip(logliks, golds, strict=True)]
    return sum(right) / max(1, len(right))


def matters(value: float | None, ci_low: float | None = None) -> bool:
    """Whether ablating the head hurts: a positive effect, beyond its interval where it has one."""
    return value is not None and value > 0 and (ci_low is None or ci_low > 0)


def helpful_when_ablated(value: float | None, ci_high: float | None = None) -> bool:
    """Whether ablating the head helps: a negative effect, beyond its interval where it has one."""
    return value is not None and value < 0 and (ci_high is None or ci_high < 0)


def ordered(effects: Mapping[str, float], tie: Mapping[str, float] | None = None, by_name: bool = False) -> list[str]:
    """Heads by signed effect, largest first: heads that matter most, then neutral ones, then those
    whose ablation helps most last. Ties: larger ``tie`` effect first, then the mapping's order
    (``by_name``: the heads' names)."""
    tie = tie or {}
    heads = sorted(effects) if by_name else list(effects)
    return sorted(heads, key=lambda h: (-effects[h], -tie.get(h, 0.0)))


def split(effects: Mapping[str, float], tie: Mapping[str, float] | None = None,
          lows: Mapping[str, float] | None = None, highs: Mapping[str, float] | None = None, by_name: bool = False
          ) -> tuple[list[str], list[str]]:
    """``(matter, helpful)``: the heads that matter, largest effect first, and the heads that are
    helpful when ablated, most negative effect first (``lows``/``highs``: the effects' intervals;
    ties as :func:`ordered`)."""
    order = ordered(effects, tie, by_name)
    lows, highs = lows or {}, highs or {}
    matter = [h for h in order if matters(effects[h], lows.get(h))]
    helpful = sorted((h for h in order if helpful_when_ablated(effects[h], highs.get(h))), key=lambda h: effects[h])
    return matter, helpful


__all__ = ["NAMES", "accuracy", "effect", "helpful_when_ablated", "margin", "matters",
           "mean_margin", "mean_margin_or_nan", "ordered", "split"]
