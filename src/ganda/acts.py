"""One head's effect under each kind of ablation, and at each class of positions.

:func:`head_profile` ablates a head on the same prompts several ways and reports each drop
(accuracy and margin, intact minus ablated) with a paired bootstrap interval over the prompts:

* under zero, mean and resample ablation at every position (:mod:`ganda.ablation`): whether an
  effect found by zero-ablation *survives* a mean ablation (an effect that is only the cost of
  putting the head's slice far off its usual values, e.g. for a sink head, does not);
* zero-ablated at one position class only (:mod:`ganda.sites`: segment ends, the queried key,
  the final position, elsewhere): *where* the head acts.

:func:`verdict` and :func:`where` turn the rows into the sentences the demo and its report print;
:func:`position_evidence` into the ablation evidence the labeller takes (:mod:`ganda.labels`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .ablation import ABLATIONS
from .effects import margin
from .intervals import ci
from .interventions import AblateHeads
from .models.base import ModelAdapter
from .scoring import EvalResult, evaluate_examples
from .sites import CLASSES
from .stats import paired_difference
from .tasks.base import Example


def _margins(res: EvalResult) -> list[float]:
    return [margin(p["loglik"], p["gold"]) if len(p["loglik"]) > 1 else 0.0 for p in res.predictions]


def _row(base: EvalResult, res: EvalResult, seed: int, **what: Any) -> dict[str, Any]:
    """A condition's accuracy and its paired drops (accuracy and margin) from ``base``."""
    acc = paired_difference([float(p["correct"]) for p in base.predictions],
                            [float(p["correct"]) for p in res.predictions], seed)
    return {**what, "accuracy": res.accuracy, **ci((res.ci_low, res.ci_high)), **acc,
            **paired_difference(_margins(base), _margins(res), seed, name="margin_drop")}


def head_profile(adapter: ModelAdapter, examples: Sequence[Example], heads: Sequence[str] | str, *,
                 base: EvalResult | None = None, seed: int = 0, kinds: Sequence[str] = ABLATIONS,
                 classes: Sequence[str] = CLASSES) -> list[dict[str, Any]]:
    """Rows ``{heads, ablation, positions, accuracy, drop, margin_drop}`` (with 95% intervals) for
    ``heads`` ablated each of ``kinds`` ways at every position, then zero-ablated at each of
    ``classes`` alone. The reference prompts of mean and resample are ``examples``; ``seed`` seeds
    the resample draw and the bootstrap."""
    base = base if base is not None else evaluate_examples(adapter, examples, progress=False)
    name = heads if isinstance(heads, str) else ",".join(heads)
    rows = []
    for how in kinds:
        iv = AblateHeads(name, how=how, reference=examples, seed=seed)
        rows.append(_row(base, evaluate_examples(adapter, examples, [iv], progress=False), seed,
                         heads=name, ablation=how, positions="all"))
    for where in classes:
        iv = AblateHeads(name, positions=where)
        rows.append(_row(base, evaluate_examples(adapter, examples, [iv], progress=False), seed,
                         heads=name, ablation="zero", positions=where))
    return rows


def _established(row: dict[str, Any] | None) -> bool:
    """A drop whose interval lies above 0 (accuracy or margin)."""
    if row is None:
        return False
    return any((row.get(f"{k}_ci_low") or 0) > 0 for k in ("drop", "margin_drop"))


def verdict(rows: Sequence[dict[str, Any]]) -> str:
    """Whether the zero-ablation effect survives mean ablation, in one sentence."""
    by = {r["ablation"]: r for r in rows if r["positions"] == "all"}
    zero, mean = by.get("zero"), by.get("mean")
    if zero is None or mean is None:
        return ""
    head = zero["heads"]
    nums = (f"zero {100 * zero['drop']:.1f} points (margin {zero['margin_drop']:.2f}), "
            f"mean {100 * mean['drop']:.1f} points (margin {mean['margin_drop']:.2f})")
    if not _established(zero):
        return f"{head}'s zero-ablation effect is not established on these prompts ({nums})."
    if _established(mean):
        return f"{head}'s effect survives mean ablation ({nums})."
    return f"{head}'s effect does not survive mean ablation: its interval reaches 0 ({nums})."


WHERE_SHARE = 0.1  # a class the head acts at carries at least this share of its whole margin drop


def where(rows: Sequence[dict[str, Any]]) -> str:
    """The position classes where the head acts, in one sentence: those at which ablating it alone
    costs margin (interval above 0) and at least :data:`WHERE_SHARE` of what ablating it everywhere
    (zero) costs; each class's share of the whole drop."""
    sited = [r for r in rows if r["positions"] != "all"]
    whole = next((r for r in rows if r["positions"] == "all" and r["ablation"] == "zero"), None)
    if not sited or whole is None:
        return ""
    head, total = sited[0]["heads"], whole["margin_drop"]
    share = {r["positions"]: r["margin_drop"] / total if abs(total) > 1e-12 else 0.0 for r in sited}
    hits = [r["positions"] for r in sited if _established(r) and share[r["positions"]] >= WHERE_SHARE]
    parts = ", ".join(f"{c} {100 * v:.0f}%" for c, v in share.items())
    if not _established(whole) or not hits:
        return f"No one class of positions carries {head}'s effect alone (share of its margin drop: {parts})."
    return (f"{head} acts at the {' and '.join(hits)} position{'s' if len(hits) > 1 else ''} "
            f"(share of its margin drop, ablated at one class alone: {parts}).")


def position_evidence(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """A profile's accuracy drops as :func:`ganda.labels.label_head` takes them: ``drop_all`` (zero
    at every position), ``drop_query`` (at the final position alone) and ``drop_context`` (the
    largest drop of a position class before it: segment ends, queried key, elsewhere); empty where
    the profile has no zero-ablation at every position or at the final position."""
    zero = next((r for r in rows if r["positions"] == "all" and r["ablation"] == "zero"), None)
    sited = {r["positions"]: r["drop"] for r in rows if r["positions"] != "all"}
    if zero is None or "final" not in sited:
        return {}
    before = [d for c, d in sited.items() if c != "final"]
    return {"drop_all": zero["drop"], "drop_query": sited["final"], "drop_context": max(before, default=0.0)}


__all__ = ["head_profile", "position_evidence", "verdict", "where"]
