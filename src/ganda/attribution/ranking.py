"""Rank every head by attribution, verify the top K exactly, bound the false negatives among the rest.

Verification runs the exact sweep engine (:func:`ganda.sweep.run_sweep`, zero- or mean-ablation) on
the chosen heads, so a verified head's number is the sweep's number; it resumes from ``OUT/verify``.

The bound follows AtP*'s diagnostic: besides the top K, a uniform random *audit* of the unverified
heads is verified too. With θ the smallest exact effect the reported top list needs, the number
of audited heads at or above θ gives (hypergeometric, exact) an upper confidence bound on how many
unverified heads are at or above θ; the largest ``|exact| / |estimate|`` ratio on the audit, applied
to every unverified estimate, names the heads that could still reach θ ("at risk").
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import runio
from ..effects import accuracy, effect, margin, mean_margin, ordered, predicted, split
from ..errors import GandaError
from ..figures import heatmap, pyplot, save_figure
from ..finite import check_scores, finite_json
from ..heads import HeadId, expand, require_heads, running_heads
from ..interventions import check_layers, parse_layers
from ..models.base import ModelAdapter
from ..options import Options, option
from ..scoring import encode
from ..stats import paired_intervals
from ..sweep import ABLATION_HELP, HEADS_HELP, run_sweep
from ..tasks.base import Example
from .engine import (
    ACTIVE,
    AUDIT,
    GRADDROP_BLOCKS,
    IG_STEPS,
    RANK_METHOD,
    VERIFY_TOP,
    Attribution,
    attribute,
    check_options,
)
from .screen import answer_screen

RANK_METHODS = ("atp", "atp*", "ig", "exact")


# ---------------------------------------------------------------------------------------------
# statistics


def _ranks(xs: Sequence[float]) -> list[float]:
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    r = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            r[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return r


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman rank correlation (average ranks for ties)."""
    if len(a) != len(b) or len(a) < 2:
        raise GandaError("spearman needs two equally long lists of at least two values")
    ra, rb = _ranks(a), _ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True))
    va = math.sqrt(sum((x - ma) ** 2 for x in ra))
    vb = math.sqrt(sum((y - mb) ** 2 for y in rb))
    return cov / (va * vb) if va and vb else float("nan")


def spearman_verified(estimate: dict[str, float], exact: dict[str, float]) -> float | None:
    """How well the estimate ranks what was measured exactly: Spearman of the magnitudes over the
    heads (or edges) known both ways, None below three."""
    known = [h for h in exact if h in estimate]
    return spearman([abs(estimate[h]) for h in known], [abs(exact[h]) for h in known]) if len(known) > 2 else None


def top_by_magnitude(values: dict[str, float], k: int) -> list[str]:
    """The ``k`` heads of largest ``|value|`` (ties: name order)."""
    return [h for h, _ in sorted(values.items(), key=lambda kv: (-abs(kv[1]), kv[0]))[:k]]


def most_active(values: dict[str, float], k: int) -> list[str]:
    """The ``k`` heads (or edges) of largest signed value (ties: name order): the most active, the
    answer screen's most damaging."""
    return sorted(values, key=lambda h: (-values[h], h))[:k]


def quality(estimate: dict[str, float], exact: dict[str, float], k: int = 10, within: Sequence[int] = (10, 30)
            ) -> dict[str, Any]:
    """How well an estimate ranks heads against exhaustive exact effects (same heads, same metric):
    Spearman of the magnitudes, and which of the exact top ``k`` the estimate's top ``n`` holds."""
    heads = sorted(exact)
    top = top_by_magnitude(exact, k)
    out: dict[str, Any] = {
        "spearman_abs": spearman([abs(estimate[h]) for h in heads], [abs(exact[h]) for h in heads]),
        "spearman_signed": spearman([estimate[h] for h in heads], [exact[h] for h in heads]),
        "exact_top": top,
    }
    for n in within:
        mine = set(top_by_magnitude(estimate, n))
        out[f"recall_top{k}_in_{n}"] = sum(h in mine for h in top) / max(1, len(top))
        out[f"missed_in_{n}"] = [h for h in top if h not in mine]
    return out


def hypergeom_cdf(x: int, population: int, successes: int, draws: int) -> float:
    """P(X ≤ x) for X ~ Hypergeometric(population, successes, draws)."""
    total = math.comb(population, draws)
    return sum(math.comb(successes, i) * math.comb(population - successes, draws - i)
               for i in range(0, min(x, successes, draws) + 1)) / total


def upper_count(observed: int, population: int, draws: int, confidence: float) -> int:
    """Largest number of "successes" in ``population`` still consistent (at ``confidence``) with
    ``observed`` successes in ``draws`` drawn without replacement (exact one-sided bound)."""
    delta = 1.0 - confidence
    best = observed
    for f in range(observed, population - (draws - observed) + 1):
        if hypergeom_cdf(observed, population, f, draws) > delta:
            best = f
        else:
            break
    return best


@dataclass
class Bound:
    """How many unverified heads could have an exact effect of at least ``threshold``."""

    threshold: float
    confidence: float
    audited: list[str]
    audit_above: list[str]  # audited heads at or above θ: false negatives the audit caught
    pool: int  # unverified heads the audit was drawn from
    max_above: int  # at ``confidence``, at most this many heads of the pool are at or above θ
    max_missed: int  # ... of which not audited (max_above minus those the audit found)
    ratio_max: float | None  # largest |exact| / |estimate| on the audit
    at_risk: list[str]  # unaudited, unverified heads with |estimate| · ratio_max ≥ θ

    @property
    def fraction_above(self) -> float:
        return self.max_above / self.pool if self.pool else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"threshold": self.threshold, "confidence": self.confidence, "audited": self.audited,
                "audit_above": self.audit_above, "pool": self.pool, "max_above": self.max_above,
                "max_missed": self.max_missed, "fraction_above": self.fraction_above,
                "ratio_max": self.ratio_max, "at_risk": self.at_risk}

    def sentence(self) -> str:
        s = (f"with {100 * self.confidence:.0f}% confidence at most {self.max_missed} of the {self.pool - len(self.audited)} "
             f"unaudited unverified heads have |effect| >= {self.threshold:.4g} (audit of {len(self.audited)}: "
             f"{len(self.audit_above)} above)")
        if self.ratio_max is not None:
            s += f"; ratio |exact|/|estimate| <= {self.ratio_max:.3g} on the audit puts {len(self.at_risk)} head(s) at risk"
            if self.at_risk:
                s += f" ({', '.join(self.at_risk[:8])}{', ...' if len(self.at_risk) > 8 else ''})"
        return s


def false_negative_bound(estimate: dict[str, float], exact: dict[str, float], verified: Sequence[str],
                         audited: Sequence[str], threshold: float, confidence: float = 0.95) -> Bound:
    """The bound described in the module docstring (``exact`` covers the verified and audited heads)."""
    vset, aset = set(verified), set(audited)
    pool = [h for h in estimate if h not in vset]
    above = [h for h in audited if abs(exact[h]) >= threshold]
    max_above = upper_count(len(above), len(pool), len(audited), confidence) if pool else 0
    ratio = None
    at_risk: list[str] = []
    if audited:
        ratio = max(abs(exact[h]) / max(abs(estimate[h]), 1e-12) for h in audited)
        at_risk = [h for h in top_by_magnitude({h: estimate[h] for h in pool if h not in aset}, len(pool))
                   if abs(estimate[h]) * ratio >= threshold]
    return Bound(threshold, confidence, list(audited), above, len(pool), max_above, max(0, max_above - len(above)),
                 ratio, at_risk)


def bound_at_top(estimate: dict[str, float], exact: dict[str, float], verified: Sequence[str],
                 audited: Sequence[str], threshold: float | None, top: int, confidence: float = 0.95) -> Bound | None:
    """:func:`false_negative_bound` at ``threshold``, by default the smallest |exact| effect among the
    verified top ``top`` (the effect an item must reach to belong in the reported top); None when
    nothing was verified. Heads and edges are bounded alike."""
    if not verified:
        return None
    known = sorted((abs(exact[h]) for h in verified), reverse=True)
    theta = threshold if threshold is not None else known[min(top, len(known)) - 1]
    return false_negative_bound(estimate, exact, verified, audited, theta, confidence)


# ---------------------------------------------------------------------------------------------
# exact effects


def _require_finite(adapter: ModelAdapter, examples: Sequence[Example], att: Attribution) -> None:
    """Refuse an attribution with a non-finite score (a NaN ranking would be written as a result);
    the first prompt whose log-likelihoods are not finite names where they first appear."""
    for i, ll in enumerate(att.clean_logliks):
        if not all(math.isfinite(v) for v in ll):
            check_scores(ll, f"prompt {i}", adapter, encode(adapter, examples[i].prompt))
    check_scores([att.clean, *att.estimate], f"the {att.method} estimates", adapter)


# ---------------------------------------------------------------------------------------------
# the result


#: a ranking row's paired 95% intervals of its exact margin drop and its accuracy drop
CI_KEYS = ("exact_ci_low", "exact_ci_high", "acc_drop_ci_low", "acc_drop_ci_high")


@dataclass
class RankResult:
    """Every head with its estimate and, where verified, its exact effect: the drop of the mean
    ``margin`` margin when it is ablated (the metric heads are ranked by), and of accuracy."""

    method: str
    ablation: str
    margin: str
    heads: list[str]  # every head, model order
    estimate: dict[str, float]  # empty for method "exact"
    exact: dict[str, float]  # verified and audited heads (every head for "exact")
    verified: list[str]  # the top K by estimate (every head for "exact")
    audited: list[str]
    clean: float
    bound: Bound | None
    attribution: Attribution | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    out_dir: Path | None = None
    exact_acc: dict[str, float] = field(default_factory=dict)  # accuracy drop of every exactly known head
    clean_acc: float | None = None
    screen: dict[str, float] = field(default_factory=dict)  # answer-screen effects (rank_heads(screen=K))
    activity: dict[str, float] = field(default_factory=dict)  # mean |AtP| per prompt (Attribution.activity)
    #: each exactly known head's paired 95% intervals: exact_ci_low/high, acc_drop_ci_low/high
    intervals: dict[str, dict[str, float]] = field(default_factory=dict)

    metric = "margin"  # what heads are ranked by: the drop of the mean margin (ganda.effects)

    def order(self) -> list[str]:
        """Verified (and audited) heads first by signed exact effect, largest first, then the rest by
        signed estimate: heads whose ablation lowers the margin lead, those whose ablation raises it trail."""
        known = ordered(self.exact, self.exact_acc, by_name=True)
        seen = set(known)
        rest = [h for h in ordered(self.estimate, by_name=True) if h not in seen]
        return known + rest

    def matter(self) -> list[str]:
        """Exactly known heads whose ablation lowers the margin (positive effect), largest first."""
        return split(self.exact, self.exact_acc, by_name=True)[0]

    def helpful_when_ablated(self) -> list[str]:
        """Exactly known heads whose ablation raises the margin (negative effect), most negative first."""
        return split(self.exact, self.exact_acc, by_name=True)[1]

    def ranking(self) -> list[dict[str, Any]]:
        """Every head in final order: its estimate and, where measured exactly, its margin drop
        (``exact``) and accuracy drop (``acc_drop``)."""
        return [{"head": h, "estimate": self.estimate.get(h), "exact": self.exact.get(h),
                 "acc_drop": self.exact_acc.get(h), **self.intervals.get(h, {})} for h in self.order()]

    def sign_flips(self) -> list[dict[str, Any]]:
        """Verified heads whose exact effect has the estimate's opposite sign, largest |exact| first:
        there the estimate says the head helps where it hurts (or the reverse), whatever its rank."""
        flips = [h for h in self.verified if h in self.estimate and h in self.exact
                 and self.estimate[h] * self.exact[h] < 0]
        return [{"head": h, "estimate": self.estimate[h], "exact": self.exact[h]}
                for h in sorted(flips, key=lambda h: (-abs(self.exact[h]), h))]

    def rows(self) -> list[dict[str, Any]]:
        """One row per head in final order with both ranks (1 = largest signed effect)."""
        r_est = {h: i + 1 for i, h in enumerate(ordered(self.estimate, by_name=True))}
        r_ex = {h: i + 1 for i, h in enumerate(ordered(self.exact, self.exact_acc, by_name=True))}
        att = self.attribution
        atp = dict(zip([str(h) for h in att.heads], att.atp, strict=True)) if att else {}
        gd = dict(zip([str(h) for h in att.heads], att.graddrop, strict=True)) if att and att.graddrop else {}
        flipped = {f["head"] for f in self.sign_flips()}
        out = []
        for h in self.order():
            hid = HeadId.parse(h)
            out.append({"head": h, "layer": hid.layer, "index": hid.head, "kind": hid.kind or "",
                        "estimate": self.estimate.get(h), "exact": self.exact.get(h),
                        "acc_drop": self.exact_acc.get(h), "rank_estimate": r_est.get(h),
                        "rank_exact": r_ex.get(h), "atp": atp.get(h), "graddrop": gd.get(h),
                        "activity": self.activity.get(h),
                        "verified": h in set(self.verified), "audited": h in set(self.audited),
                        "sign_flip": h in flipped, **{k: self.intervals.get(h, {}).get(k) for k in CI_KEYS}})
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.config.get("model"), "task": self.config.get("task"), "n": self.config.get("n"),
            "method": self.method, "ablation": self.ablation, "margin": self.margin, "metric": self.metric,
            "clean": self.clean, "clean_acc": self.clean_acc, "verified": len(self.verified), "audited": self.audited,
            "matter": self.matter(), "helpful_when_ablated": self.helpful_when_ablated(),
            "spearman_verified": spearman_verified(self.estimate, self.exact),
            "bound": self.bound.to_json() if self.bound else None, "sign_flips": self.sign_flips(),
            "seconds": self.seconds, "ranking": self.ranking(),
            **({"screen": self.screen} if self.screen else {}),
        }

    def written(self) -> dict[str, Any]:
        """What ``ranking.json`` holds: :meth:`to_json` with the config, an undefined statistic
        (NaN) as null so that the file stays JSON."""
        return finite_json({**self.to_json(), "config": self.config})

    def write(self, out_dir: str | Path) -> None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        runio.write_json(out / "ranking.json", self.written(), indent=1)
        runio.write_csv(out / "ranking.csv", self.rows())
        if self.estimate and self.exact:
            self.scatter(out / "scatter.png")
        if self.exact:
            self.verify_heatmap(out / "verify_heatmap.png")

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RankResult:
        """The ranking a ``ranking.json`` holds (:meth:`write`), enough to draw its figures: the
        verified heads are the exactly known ones outside the audit."""
        rows = [r for r in d.get("ranking") or [] if isinstance(r, dict) and "head" in r]
        est, exact, acc = ({r["head"]: r[k] for r in rows if isinstance(r.get(k), int | float)}
                           for k in ("estimate", "exact", "acc_drop"))
        audited = [h for h in d.get("audited") or [] if h in exact]
        cis = {r["head"]: {k: r[k] for k in CI_KEYS if isinstance(r.get(k), int | float)} for r in rows}
        return cls(method=str(d.get("method", "?")), ablation=str(d.get("ablation", "?")), margin=str(d.get("margin", "?")),
                   heads=[r["head"] for r in rows], estimate=est, exact=exact,
                   verified=[h for h in exact if h not in set(audited)], audited=audited, clean=d.get("clean"),
                   bound=None, config=d.get("config") or {}, exact_acc=acc, clean_acc=d.get("clean_acc"),
                   intervals={h: c for h, c in cis.items() if c})

    def verify_heatmap(self, path: str | Path) -> Path:
        """The exact effect of every exactly known head on a layers x heads grid (blank: not verified)."""
        ids = {h: HeadId.parse(h) for h in [*self.heads, *self.exact]}
        cols = sorted({(i.kind or "", i.head) for i in ids.values()})
        grid = [[math.nan] * len(cols) for _ in range(1 + max(i.layer for i in ids.values()))]
        for h, v in self.exact.items():
            grid[ids[h].layer][cols.index((ids[h].kind or "", ids[h].head))] = v
        return heatmap(grid, path, xlabels=[f"{k} H{j}".strip() for k, j in cols], ylabels=[f"L{n}" for n in range(len(grid))],
                       xlabel="head", ylabel="layer", center=0.0, colorbar_label=f"exact drop ({self.ablation}-ablation)",
                       title=f"Exact effect of the {len(self.exact)} verified heads of {len(ids)} (blank: not verified)")

    def scatter(self, path: str | Path) -> None:
        """Estimate against exact effect for every exactly known head."""
        fig, ax = pyplot().subplots(figsize=(5.5, 5))
        for group, color, label in ((self.verified, "C0", "top by estimate"), (self.audited, "C1", "random audit")):
            hs = [h for h in group if h in self.exact and h in self.estimate]
            if hs:  # a group with no points has no legend entry
                ax.scatter([self.estimate[h] for h in hs], [self.exact[h] for h in hs], s=18, c=color, label=label)
        vals = [v for h in self.exact if h in self.estimate for v in (self.estimate[h], self.exact[h])]
        lim = max([abs(v) for v in vals] + [1e-9]) * 1.05
        ax.plot([-lim, lim], [-lim, lim], lw=0.8, c="grey", ls="--")
        if self.method == "atp*":
            ax.plot([-lim, lim], [lim, -lim], lw=0.5, c="grey", ls=":")
        ax.set_xlim(-lim, lim)
        ax.set_ylim(-lim, lim)
        ax.axhline(0, lw=0.5, c="k")
        ax.axvline(0, lw=0.5, c="k")
        ax.set_xlabel(f"{self.method} estimate (drop of the {self.margin} margin)")
        ax.set_ylabel(f"exact drop ({self.ablation}-ablation)")
        for h in top_by_magnitude(self.exact, 5):
            if h in self.estimate:
                ax.annotate(h, (self.estimate[h], self.exact[h]), fontsize=7, xytext=(3, 3), textcoords="offset points")
        model = self.config.get("model", "")
        task = self.config.get("task")
        tname = task.get("task", "?") if isinstance(task, dict) else task
        ax.set_title(f"{model} {tname or ''} (n={self.config.get('n')})", fontsize=9)
        ax.legend(fontsize=8, loc="upper left")
        fig.tight_layout()
        save_figure(fig, path, dpi=120, tight=False)


def sign_flip_sentence(flips: Sequence[dict[str, Any]], shown: int = 5) -> str:
    """``"2 verified heads have the estimate's opposite sign: L16H0 (est -0.65, exact +0.74), ..."``
    (empty where there are none)."""
    if not flips:
        return ""
    n = len(flips)
    each = ", ".join(f"{f['head']} (est {f['estimate']:+.3g}, exact {f['exact']:+.3g})" for f in flips[:shown])
    more = f" and {n - shown} more" if n > shown else ""
    return f"{n} verified head{'s have' if n != 1 else ' has'} the estimate's opposite sign: {each}{more}"


MARGIN_HELP = "gold log-likelihood minus the mean or the max of the others'"


def layer_list(text: str | None, flag: str) -> list[int]:
    """``--verify-layers`` as layer numbers by the one layer-list rule (:func:`ganda.interventions.parse_layers`:
    "0,1" or "0-1" -> [0, 1]; not given: none), a list naming no layer refused under ``flag``."""
    try:
        return parse_layers(text) if text is not None else []
    except GandaError as exc:
        raise GandaError(f"{flag}: {exc}") from None


@dataclass
class RankOptions(Options):
    """How :func:`rank_heads` (``ganda rank``, a grid's ``rank`` jobs) chooses the heads it verifies.

    Besides the estimate's top ``verify_top``, three lists catch heads a first-order estimate
    misses (docs/attribution.md). ``verify_layers``: heads of the first layers act mostly through
    later heads' attention patterns, which the estimate underrates; on SmolLM2 KV the AtP top 20
    plus layers 0 and 1 holds the exhaustive top 10 on three prompt sets where the AtP top 30
    misses one to three. ``screen``: heads acting where the answer is read
    (:func:`ganda.attribution.screen.answer_screen`, exact there), whatever their rank. ``active``:
    heads that move every prompt's margin but whose mean estimate is small or of the wrong sign
    (:meth:`Attribution.activity`); on SmolLM2 KV the top 30 by activity holds the exhaustive top
    10 on five of seven prompt sets, including the one where L18H6 (exact +0.48) has AtP* rank 104.
    ``widen`` makes the answer independent of where the estimate's list was cut.
    """

    method: str = option(RANK_METHOD, "atp (one backward), atp* (adds GradDrop), ig (integrated gradients over "
                         "--ig-steps) or exact (the exhaustive sweep)", short="-m", choices=RANK_METHODS)
    graddrop_blocks: int = option(GRADDROP_BLOCKS, "atp*: GradDrop over this many blocks of layers (0: one per "
                                  "layer, the paper's form; cost grows with it)", low=0, why="0: one block per layer")
    ig_steps: int = option(IG_STEPS, "ig: midpoint steps from every head ablated to the clean model (each costs "
                           "about one AtP pass)", low=1)
    verify_top: int = option(VERIFY_TOP, "verify this many top heads exactly", short="-k", low=0)
    verify_layers: str | None = option(None, "also verify every head of these layers, e.g. 0,1 (first-order "
                                       "estimates underrate the first layers' heads)")
    audit: int = option(AUDIT, "also verify this many random other heads: the false-negative bound's sample (10 "
                        "cost about 4% of the exhaustive sweep on SmolLM2)", low=0)
    widen: int = option(0, "then verify this many more heads by estimate, round after round, until a round leaves "
                        "the reported top --top unchanged (0: off)", low=0)
    screen: int = option(0, "also verify the heads whose ablation at the answer's position hurts most, this many "
                         "(exact there, one token per head; 0: off)", low=0)
    active: int = option(ACTIVE, "also verify this many heads with the largest mean |AtP| per prompt (heads whose "
                         "per-prompt effects cancel in the estimate; 0: off)", low=0)
    threshold: float | None = option(None, "effect size the bound speaks about (default: the smallest exact effect "
                                     "in the verified top --top)")
    ablation: str = option("zero", ABLATION_HELP)
    margin: str = option("mean", MARGIN_HELP)
    heads: str | None = option(None, HEADS_HELP)
    top: int = option(10, "rows in the printed table; the bound's default threshold", low=1)
    batch_heads: int = option(16, "heads of one layer ablated per forward (verification)", low=1)

    def check(self) -> None:
        """The rules beside each field's bounds: the one place a ranking option is checked, for
        ``ganda rank``, a grid's ``rank`` jobs and :func:`rank_heads`."""
        check_options("atp", self.ablation, self.margin, None, self.graddrop_blocks or None, self.flag)
        if self.threshold is not None and not (math.isfinite(self.threshold) and self.threshold > 0):
            raise GandaError(f"{self.flag('threshold')} must be a positive finite number, got {self.threshold}")
        if self.screen and self.ablation != "zero":
            raise GandaError(f"{self.flag('screen')} measures zero-ablation at the answer; it does not apply to "
                             f"{self.ablation}-ablation")
        layer_list(self.verify_layers, self.flag("verify_layers"))
        require_heads(self.flag("heads"), self.heads)
        self._method_reads_them()

    def _method_reads_them(self) -> None:
        """An option the method never reads is refused, not ignored: the steps of ig, GradDrop's
        blocks of atp*, and what an estimate chooses to verify, which ``exact`` (every head) has not."""
        for name, method in (("ig_steps", "ig"), ("graddrop_blocks", "atp*")):
            if self.changed(name) and self.method != method:
                raise GandaError(f"{self.flag(name)} is read by {self.flag('method')} {method} only, not "
                                 f"{self.method}: drop it")
        chosen = [n for n in ("verify_top", "verify_layers", "audit", "widen", "screen", "active", "threshold")
                  if self.changed(n)]
        if self.method == "exact" and chosen:
            raise GandaError(f"{self.flag('method')} exact measures every head exactly, so {self.flag(chosen[0])} "
                             "has nothing to choose or bound: drop it")


def reported_top(exact: dict[str, float], top: int) -> set[str]:
    """The ``top`` heads whose ablation hurts most (signed exact effect, largest first)."""
    return set(most_active(exact, top))


def widen_until_stable(order: Sequence[str], exact: dict[str, float], widen: int, top: int,
                       measure: Callable[[list[str], int], None],
                       top_of: Callable[[dict[str, float], int], set[str]] = reported_top) -> list[str]:
    """``rank --widen``: the next ``widen`` items of ``order`` not yet in ``exact``, round ``k`` = 1, 2, ...,
    each ``measure(batch, k)``-d (which adds their exact effects to ``exact``), until a round leaves
    ``top_of(exact, top)`` (default :func:`reported_top`) unchanged or nothing is left; returns the
    items it measured, in order."""
    rest = [h for h in order if h not in exact]
    widened: list[str] = []
    while rest:
        before = top_of(exact, top)
        batch, rest = rest[:widen], rest[widen:]
        measure(batch, len(widened) // widen + 1)
        widened += batch
        if top_of(exact, top) == before:
            break
    return widened


def choose_verified(order: list[str], top: int, audit: int, seed: int, also: Sequence[str] = (),
                    by_estimate: bool = True) -> tuple[list[str], list[str]]:
    """What ``rank`` and ``edges`` verify exactly, from heads (or edges) in estimate order: the top
    ``top``, then those of ``also`` not among them, in ``also``'s order; and a seeded uniform audit
    of the rest (the false-negative bound's sample), in estimate order (``by_estimate``) or by name."""
    chosen = list(dict.fromkeys([*order[:top], *also]))
    picked = set(chosen)
    pool = [h for h in order if h not in picked]
    audited = random.Random(seed).sample(pool, min(audit, len(pool)))
    return chosen, sorted(audited, key=order.index if by_estimate else None)


def _screened(adapter: ModelAdapter, examples: Sequence[Example], heads: list[HeadId], margin: str, progress: bool, secs: dict[str, float]) -> dict[str, float]:
    """Every head's answer-screen effect (``secs`` gets its time)."""
    sc = answer_screen(adapter, examples, heads, margin=margin, progress=progress)
    secs.update({"screen": sc.seconds, "screen_cpu": sc.cpu_seconds})
    return sc.by_head


def rank_heads(
    adapter: ModelAdapter,
    examples: Sequence[Example],
    options: RankOptions | None = None,
    *,
    heads: Sequence[HeadId] | None = None,
    seed: int = 0,
    confidence: float = 0.95,
    batch_tokens: int | None = None,
    out_dir: str | Path | None = None,
    resume: bool = True,
    progress: bool = True,
    config: dict[str, Any] | None = None,
    **overrides: Any,
) -> RankResult:
    """Rank every head: attribution (``"atp"``/``"atp*"``/``"ig"``) then exact verification of the top
    ``verify_top``, of the lists :class:`RankOptions` adds and of a seeded random ``audit`` of the
    rest, or the exhaustive sweep (``"exact"``).

    ``options`` (default :class:`RankOptions`' defaults, ``rank``'s rule) may be given field by
    field as keywords instead, e.g. ``rank_heads(ad, exs, method="atp*", verify_top=30)``;
    ``verify_layers`` then also takes a list of layers. ``heads`` (default: the ``heads`` option's,
    else every head) are the heads ranked. ``threshold`` (default: the smallest |exact| effect among
    the verified top ``top``) is the effect size the false-negative bound speaks about, at
    ``confidence``. With ``out_dir`` everything resumes and ``ranking.json``, ``ranking.csv``,
    ``scatter.png`` and ``verify_heatmap.png`` are written there.
    """
    o = _rank_options(options, overrides)
    t0, c0 = time.perf_counter(), time.process_time()
    head_list, verify_layers = _ranked_heads(adapter, examples, o, heads, confidence, batch_tokens)
    out = Path(out_dir) if out_dir is not None else None
    names = [str(h) for h in head_list]
    cfg = {"model": adapter.spec, "n": len(examples), **(config or {}), "verify_top": o.verify_top,
           "verify_layers": sorted(set(verify_layers)), "audit": o.audit, "graddrop_blocks": None,
           "ig_steps": o.ig_steps if o.method == "ig" else None, "screen": o.screen if o.method != "exact" else 0,
           "active": o.active if o.method != "exact" else 0}
    secs: dict[str, float] = {}
    att, screened, activity, chosen, audited = _to_verify(adapter, examples, head_list, verify_layers, o, seed,
                                                          batch_tokens=batch_tokens, out=out, resume=resume,
                                                          progress=progress, secs=secs)
    estimate = att.by_head() if att is not None else {}
    cfg["graddrop_blocks"] = att.config["graddrop_blocks"] if att is not None else None
    checks = _ExactChecks(adapter, examples, head_list, att, o, resume=resume, progress=progress, task=cfg.get("task"),
                          secs=secs, seed=seed)
    widened = checks.rounds([*chosen, *audited], o.widen, o.top, out / "verify" if out is not None else None)
    cfg["widened"] = len(widened)
    verified = chosen + widened
    bound = bound_at_top(estimate, checks.exact, verified, audited, o.threshold, o.top, confidence) if o.method != "exact" else None
    secs.update({"total": time.perf_counter() - t0, "total_cpu": time.process_time() - c0})
    res = RankResult(o.method, o.ablation, o.margin, names, estimate, checks.exact, verified, audited, checks.clean, bound, att,
                     secs, cfg, out, checks.exact_acc, checks.clean_acc, screened, activity, checks.intervals)
    if out is not None:
        res.write(out)
    return res


def _to_verify(adapter: ModelAdapter, examples: Sequence[Example], head_list: list[HeadId], verify_layers: list[int],
               o: RankOptions, seed: int, *, batch_tokens: int | None, out: Path | None, resume: bool, progress: bool,
               secs: dict[str, float]) -> tuple[Attribution | None, dict[str, float], dict[str, float], list[str], list[str]]:
    """The estimate phase of :func:`rank_heads` (none for ``"exact"``, which verifies every head):
    the attribution, the screen's and the activity's effects, and the heads to verify exactly
    (chosen, audited)."""
    names = [str(h) for h in head_list]
    if o.method == "exact":
        return None, {}, {}, names, []
    att, screened, activity, also = _estimated(adapter, examples, head_list, o, batch_tokens=batch_tokens, out=out,
                                               resume=resume, progress=progress, secs=secs)
    order = [names[i] for i in att.order()]
    also = {*also, *(str(h) for h in head_list if h.layer in verify_layers)}  # in estimate order below
    chosen, audited = choose_verified(order, o.verify_top, o.audit, seed, [h for h in order if h in also])
    return att, screened, activity, chosen, audited


def _ranked_heads(adapter: ModelAdapter, examples: Sequence[Example], o: RankOptions, heads: Sequence[HeadId] | None,
                  confidence: float, batch_tokens: int | None) -> tuple[list[HeadId], list[int]]:
    """The heads :func:`rank_heads` ranks (``heads``, else the ``heads`` option's, else every head;
    canonical, in order) and the layers ``verify_layers`` names, once the arguments beside the
    options are checked."""
    if not 0.0 < confidence < 1.0:
        raise GandaError("confidence must be between 0 and 1")
    if batch_tokens is not None and batch_tokens < 1:
        raise GandaError("batch_tokens must be at least 1")
    verify_layers = layer_list(o.verify_layers, "verify_layers")
    if heads is None and o.heads:
        heads = expand(o.heads, adapter)
    if not examples:
        raise GandaError("no examples to rank heads on")
    head_list = running_heads(adapter, heads, "rank")
    return head_list, check_layers("--verify-layers", verify_layers, len(adapter.original_layers()))


def _rank_options(options: RankOptions | None, overrides: dict[str, Any]) -> RankOptions:
    """``options`` with ``overrides`` (fields given as keywords) applied and checked; a list of
    ``verify_layers`` is read as the command line's "0,1"."""
    values = {**(options.to_json() if options is not None else {}), **overrides}
    layers = values.get("verify_layers")
    if layers is not None and not isinstance(layers, str):
        values["verify_layers"] = ",".join(map(str, layers)) if len(layers) else None
    return RankOptions.build(values)


def _estimated(adapter: ModelAdapter, examples: Sequence[Example], head_list: list[HeadId], o: RankOptions, *,
               batch_tokens: int | None, out: Path | None, resume: bool, progress: bool, secs: dict[str, float]
               ) -> tuple[Attribution, dict[str, float], dict[str, float], list[str]]:
    """Attribution's estimate of every head (refused when not finite), the answer screen's effects
    (with ``screen``), each head's activity, and the heads singled out beside the estimate's order:
    the screen's top ``screen`` and the ``active`` most active (``secs`` gets the times)."""
    att = attribute(adapter, examples, method=o.method, ablation=o.ablation, margin=o.margin, heads=head_list,
                    batch_tokens=batch_tokens, graddrop_blocks=o.graddrop_blocks or None, ig_steps=o.ig_steps,
                    out_dir=out, resume=resume, progress=progress)
    _require_finite(adapter, examples, att)
    secs.update({"attribution": att.seconds, "attribution_cpu": att.cpu_seconds})
    screened = _screened(adapter, examples, head_list, o.margin, progress, secs) if o.screen else {}
    activity = att.activity()
    also = most_active(screened, o.screen) + most_active(activity, o.active)
    return att, screened, activity, also


class _ExactChecks:
    """The exact effects of the verified heads on the margin and on the accuracy, measured in rounds
    (the first choice, then each ``widen`` round), each resumable in its own directory. Every round
    scores the intact model too, so ``clean`` is the exact pass's baseline, not attribution's."""

    def __init__(self, adapter: ModelAdapter, examples: Sequence[Example], head_list: list[HeadId],
                 att: Attribution | None, o: RankOptions, *, resume: bool, progress: bool, task: Any,
                 secs: dict[str, float], seed: int = 0) -> None:
        self.adapter, self.examples, self.head_list, self.att = adapter, examples, head_list, att
        self.ablation, self.margin, self.batch_heads = o.ablation, o.margin, o.batch_heads
        self.resume, self.progress, self.secs = resume, progress, secs
        self.vcfg = {"task": task, "ablation": o.ablation}
        self.golds = [ex.gold for ex in examples]
        self.exact: dict[str, float] = {}
        self.exact_acc: dict[str, float] = {}
        self.intervals: dict[str, dict[str, float]] = {}
        self.seed = seed
        self.clean = att.clean if att is not None else float("nan")
        self.clean_acc: float | None = None

    def rounds(self, heads: list[str], widen: int, top: int, where: Path | None) -> list[str]:
        """The exact effects of ``heads`` (resumable in ``where``), then with ``widen`` of the next
        ``widen`` heads by estimate, round after round, until the reported top holds
        (:func:`widen_until_stable`, round k in ``where/widen-k``); returns the heads those rounds added."""
        if not heads:
            return []
        by_name = {str(h): h for h in self.head_list}
        self.measure(sorted(by_name[h] for h in heads), where)
        if not widen or self.att is None:
            return []
        order = [str(self.att.heads[i]) for i in self.att.order()]
        return widen_until_stable(order, self.exact, widen, top, lambda batch, k: self.measure(
            [by_name[h] for h in batch], where / f"widen-{k}" if where else None))

    def _intervals(self, base: list[list[float]], lls: dict[str, list[list[float]]]) -> None:
        """The paired 95% intervals of each head's margin and accuracy drops: a percentile bootstrap
        over the prompts, intact minus ablated prompt by prompt, seeded by the run's seed
        (:func:`ganda.stats.paired_intervals`, as a sweep's)."""
        for name, per in (("exact", lambda ll, g: margin(ll, g, self.margin)),
                          ("acc_drop", lambda ll, g: float(predicted(ll) == g))):
            intact = [per(ll, g) for ll, g in zip(base, self.golds, strict=True)]
            ablated = {h: [per(x, g) for x, g in zip(ll, self.golds, strict=True)] for h, ll in lls.items()}
            for h, ci in paired_intervals(intact, ablated, name, self.seed).items():
                self.intervals.setdefault(h, {}).update(ci)

    def measure(self, hs: list[HeadId], where: Path | None) -> None:
        """Exact effects of ``hs`` into ``exact`` and ``exact_acc`` (resumable in ``where``)."""
        t1, c1 = time.perf_counter(), time.process_time()
        res = run_sweep(self.adapter, self.examples, heads=hs, out_dir=where, resume=self.resume, progress=self.progress,
                        config=self.vcfg, batch_heads=self.batch_heads, seed=self.seed, ablation=self.ablation)
        base, lls = res.baseline["loglik"], {r["head"]: r["loglik"] for r in res.records}
        golds, kind = self.golds, self.margin
        self.clean, self.clean_acc = mean_margin(base, golds, kind), accuracy(base, golds)
        self.exact.update({h: effect(self.clean, mean_margin(ll, golds, kind)) for h, ll in lls.items()})
        self.exact_acc.update({h: effect(self.clean_acc, accuracy(ll, golds)) for h, ll in lls.items()})
        self._intervals(base, lls)
        self.secs["verification"] = self.secs.get("verification", 0.0) + time.perf_counter() - t1
        self.secs["verification_cpu"] = self.secs.get("verification_cpu", 0.0) + time.process_time() - c1
