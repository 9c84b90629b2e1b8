"""``ganda demo``: one complete path from a real model to a measured G&A finding.

KV retrieval -> every head ranked *causally* (attribution patching over every head, the top K
verified by exact single-head ablation: :func:`ganda.attribution.rank_heads`) -> the causal
heads labelled by the labeller every command shares (:mod:`ganda.labels`) -> the best Gather and the best
Aggregate head ablated alone and together -> heads ablated cumulatively in causal order until
accuracy reaches chance -> attention maps -> ``result.json``, CSVs, PNGs and one self-contained
``report.html`` that opens with the finding in one paragraph and shows the ranking (``ranking/``)
after it, with its estimate-vs-exact scatter and the verified heads' heat map.

Three disjoint prompt sets (seeds ``seed``, ``seed + 1``, ``seed + 2``): the pattern prompts label
roles, the ranking prompts order heads, the measurement prompts give every accuracy reported, so
no reported accuracy is measured on the prompts that chose the heads.

One such triple states the finding; with ``prompt_sets=K`` the ranking, roles and ablations run
again on K - 1 further triples (set k: seeds ``seed + 3k`` to ``seed + 3k + 2``), each recorded in
``summary["prompt_sets"]`` and ``prompt_sets.csv``, and the finding says on how many of them it
holds (the same heads named, every established ablation cost established again) and where not, why.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from . import registry, runio
from .acts import head_profile, position_evidence, verdict, where
from .attention import draw_attention
from .attribution import rank_heads
from .effects import matters
from .errors import GandaError
from .experiments.common import ExperimentResult
from .experiments.cumulative import ablate_until_chance, added_heads, at_chance, chance_sentence
from .figures import curves
from .intervals import bounds, ci
from .interventions import AblateHeads
from .labels import label_model, role_of
from .models import load_model
from .models.base import ModelAdapter
from .patterns import AUTO, HeadScore, pattern_scores, standard_scores
from .progress import is_quiet
from .report.html import write_report
from .scoring import EvalResult, evaluate_examples
from .stats import bootstrap_paired, pool_sets
from .tasks import check_representable, get_task
from .tasks.base import Example


class DemoResult(ExperimentResult):
    """A saved demo run; its headline is the finding paragraph (:func:`finding`)."""

    def headline(self) -> str:
        return self.summary.get("finding") or finding(self.summary)


registry.register_result("demo", DemoResult)


def roles(scores: Sequence[HeadScore]) -> dict[str, str]:
    """Each head's G&A role by the labeller every command shares (:func:`ganda.labels.role_of` of
    the label :func:`ganda.labels.label_model` gave it): ``"aggregate"``, ``"gather"`` or ``"neither"``."""
    return {s.head: role_of(s.label) for s in scores}


def whole_percent(x: float) -> int:
    """``100 x`` to the nearest whole number, halves up (0.525 -> 53): one rule for every number a
    sentence shows, so that a drop computed from them adds up (53% leaves 45%: it costs 8 points)."""
    return math.floor(round(100 * x, 6) + 0.5)  # round(.., 6): 28.499999999999996 is 28.5


def _pct(x: float) -> str:
    return f"{whole_percent(x)}%"


def _pair(s: dict[str, Any], name: str) -> tuple[float, float] | None:
    """The interval ``name`` of a summary, or None where it has none."""
    low, high = bounds(s, name)
    return None if low is None or high is None else (low, high)


def _ci(s: dict[str, Any], name: str) -> str:
    pair = _pair(s, name)
    return f" [{_pct(pair[0])}, {_pct(pair[1])}]" if pair else ""


def _cost(base: float, acc: float, ci: Sequence[float] | None) -> str:
    """The drop from ``base`` to ``acc`` in points, as the difference of the two percentages shown,
    with the drop's interval, in words that read right for either sign."""
    points = whole_percent(base) - whole_percent(acc)
    span = f" [{whole_percent(ci[0])}, {whole_percent(ci[1])}]" if ci else ""
    unit = "point" if abs(points) == 1 else "points"
    if points >= 0:
        return f"it costs **{points} {unit}**{span}"
    return f"accuracy rises by {-points} {unit} (drop{span})"


LABEL = {"gather": "Gather", "aggregate": "Aggregate", "neither": "no G&A pattern"}


def finding(s: dict[str, Any]) -> str:
    """The demo's finding in one paragraph of words and numbers with 95% intervals."""
    if "baseline_accuracy" not in s:
        return ""
    n = s.get("n_measure", "?")
    parts = [f"{s.get('model', 'The model')} retrieves the right value in KV retrieval with "
             f"{s.get('pairs', '?')} pairs on **{_pct(s['baseline_accuracy'])}**{_ci(s, 'baseline')} of "
             f"{n} prompts (chance {_pct(s['chance'])})."]
    top = s.get("top_heads") or []
    if top:
        named = ", ".join(f"**{h['head']}** ({h.get('label') or LABEL[h['role']]})" for h in top)
        parts.append(f"Ranked causally (AtP over all {s.get('n_heads', '?')} heads, {s.get('verified', '?')} of them "
                     f"verified by exact ablation, on {s.get('n_rank', '?')} other prompts), the heads that matter "
                     f"most (their ablation lowers the margin most) are {named}.")
    if helped := s.get("helpful_when_ablated"):
        named = ", ".join(f"**{h['head']}**" for h in helped[:3]) + (f" and {len(helped) - 3} more" if len(helped) > 3 else "")
        parts.append(f"Ablating {named} raises the margin instead: helpful when ablated, not among the heads that matter.")
    counts = s.get("roles_in_top")
    if counts:
        parts.append(f"Of the heads that matter most ({sum(counts.values())}), {counts.get('gather', 0)} show the Gather "
                     f"pattern, {counts.get('aggregate', 0)} the Aggregate pattern and {counts.get('neither', 0)} "
                     "neither.")
    if s.get("aggregate_head") is None and "max_aggregate" in s:
        parts.append(f"No head shows the Aggregate pattern (the largest aggregate score of all heads is "
                     f"{s['max_aggregate']:.3f}, {s.get('max_aggregate_head')}).")
    if s.get("ablation", "zero") != "zero":
        parts.append(f"Every ablation here is {s['ablation']}-ablation (docs/heads.md).")
    for key, what in (("top", f"the top causal head **{s.get('top_head')}**"),
                      ("gather", f"the Gather head **{s.get('gather_head')}**"),
                      ("aggregate", f"the Aggregate head **{s.get('aggregate_head')}**"),
                      ("both", f"{s.get('together', 'these heads').replace(',', ', ')} together")):
        if f"{key}_accuracy" in s:
            parts.append(f"Ablating {what} leaves {_pct(s[f'{key}_accuracy'])}{_ci(s, f'{key}')}: "
                         f"{_cost(s['baseline_accuracy'], s[f'{key}_accuracy'], _pair(s, f'{key}_drop'))}.")
    for h in s.get("survives") or {}:
        parts.append(" ".join(x for x in (s["survives"][h], (s.get("acts_at") or {}).get(h, "")) if x))
    k = s.get("heads_to_chance")
    if k:
        parts.append(f"Ablating heads cumulatively in causal order reaches chance after **{k} heads** "
                     f"({_pct(s['chance_accuracy'])}{_ci(s, 'chance')}): retrieval runs through a few heads, "
                     "not one bottleneck." if k > 2 else
                     f"Ablating heads cumulatively in causal order reaches chance after **{k} head(s)** "
                     f"({_pct(s['chance_accuracy'])}{_ci(s, 'chance')}).")
    elif s.get("curve_heads"):
        parts.append(f"Ablating the top {s['curve_heads']} heads in causal order leaves "
                     f"{_pct(s['curve_accuracy'])}{_ci(s, 'curve')}, still above chance.")
    sets = s.get("prompt_sets") or []
    if len(sets) > 1:
        parts.append(_sets_sentence(sets, s.get("holds_on", 0)))
    return " ".join(parts)


def _sets_sentence(sets: Sequence[dict[str, Any]], holds_on: int) -> str:
    """How many further prompt sets repeat the finding, and where one does not, why."""
    def seeds(r: dict[str, Any]) -> str:
        return f"seeds {r['seeds']['pattern']}-{r['seeds']['measure']}"

    each = "; ".join(f"set {r['set']} ({seeds(r)}): " + ("holds" if r["holds"] else ", ".join(r["why_not"]))
                     for r in sets[1:])
    return (f"Stated on prompt set 1 ({seeds(sets[0])}), the finding holds on **{holds_on} of {len(sets) - 1}** "
            f"further prompt sets: {each}." + _pooled_sentence(sets))


def _pooled_sentence(sets: Sequence[dict[str, Any]]) -> str:
    p = _pooled(sets).get("together")
    if p is None or p.get("ci_low") is None:
        return ""
    return (f" Pooled over the {len(sets)} sets (each with the heads it picks), ablating the top and Gather heads "
            f"together costs {100 * p['estimate']:.0f} points [{100 * p['ci_low']:.0f}, {100 * p['ci_high']:.0f}] "
            f"(an interval that includes the between-set variation).")


def _condition(adapter: ModelAdapter, examples: Sequence[Example], heads: list[str], base: EvalResult,
               seed: int, ablation: str = "zero") -> dict[str, Any]:
    """Accuracy with ``heads`` ablated (``ablation``: :mod:`ganda.ablation`, over ``examples``), and
    its paired drop from ``base`` with a bootstrap CI."""
    iv = AblateHeads(heads, how=ablation, reference=examples if ablation != "zero" else None, seed=seed)
    r = evaluate_examples(adapter, examples, [iv], progress=False)
    a = [float(p["correct"]) for p in base.predictions]
    b = [float(p["correct"]) for p in r.predictions]
    bs = bootstrap_paired(a, b, seed=seed)
    return {"heads": ",".join(heads), "accuracy": r.accuracy, **ci((r.ci_low, r.ci_high)), "drop": bs["diff"],
            **ci(bounds(bs, "diff"), "drop")}


def top_head(order: Sequence[str], exact: dict[str, float]) -> str | None:
    """The top causal head: the first verified head in causal order whose ablation lowers the margin
    (None where no verified head's does)."""
    return next((h for h in order if matters(exact.get(h))), None)


def _first(order: Sequence[str], role: dict[str, str], want: str, exact: dict[str, float]) -> str | None:
    """The highest-ranked head of a role, preferring verified heads that matter (their ablation hurts)."""
    for h in order:
        if role.get(h) == want and matters(exact.get(h)):
            return h
    return next((h for h in order if role.get(h) == want), None)


def rank_ablation(ablation: str) -> str:
    """The ablation the demo's causal ranking runs: the demo's own, except resample, which
    attribution does not estimate (the ranking then runs mean ablation, the nearest kind)."""
    return "mean" if ablation == "resample" else ablation


def _rank_and_label(adapter: ModelAdapter, task: Any, pattern_ex: Sequence[Example], rank_ex: Sequence[Example],
                    verify_top: int, verify_layers: Sequence[int], out_dir: Path | None,
                    standard: dict[str, dict[str, float]] | None = None, ablation: str = "zero"
                    ) -> tuple[Any, list[str], list[HeadScore], dict[str, str]]:
    """Every head ranked causally on ``rank_ex`` and labelled by its pattern on ``pattern_ex`` and
    its ``standard`` scores (task-free: measured once per model, :func:`ganda.patterns.standard_scores`)."""
    ranked = rank_heads(adapter, rank_ex, method="atp", verify_top=verify_top, verify_layers=verify_layers, audit=0,
                        active=0, progress=False, out_dir=out_dir, resume=False, config={"task": task.config()},
                        ablation=rank_ablation(ablation))
    scores = pattern_scores(adapter, pattern_ex, progress=False, summary=AUTO)
    label_model(adapter, scores, standard=standard)
    return ranked, ranked.order(), scores, roles(scores)


def _label_where(adapter: ModelAdapter, scores: Sequence[HeadScore], profiles: Sequence[dict[str, Any]],
                 standard: dict[str, dict[str, float]], role: dict[str, str]) -> None:
    """The profiled heads labelled again with where their ablation hurts (:func:`ganda.acts.position_evidence`):
    the labeller's rule 3 keeps Aggregate or Gather by that position where both patterns qualify,
    and every label's reason says whether the position agrees (:mod:`ganda.labels`)."""
    evidence = {s.head: position_evidence([r for r in profiles if r["heads"] == s.head]) for s in scores}
    label_model(adapter, scores, ablations={h: e for h, e in evidence.items() if e}, standard=standard)
    role.update(roles(scores))


def _ablations(adapter: ModelAdapter, measure_ex: Sequence[Example], order: list[str], role: dict[str, str],
               exact: dict[str, float], seed: int, ablation: str = "zero"
               ) -> tuple[EvalResult, list[dict[str, Any]], str | None, str | None]:
    """The intact run and the top, best Gather and best Aggregate heads ablated alone and together."""
    base = evaluate_examples(adapter, measure_ex, progress=False)
    g_head, a_head = _first(order, role, "gather", exact), _first(order, role, "aggregate", exact)
    rows: list[dict[str, Any]] = [{"condition": "intact", "heads": "", "accuracy": base.accuracy,
                                   **ci((base.ci_low, base.ci_high)), "drop": 0.0, **ci((0.0, 0.0), "drop")}]
    top = top_head(order, exact)
    singles = {"top": top if top not in (g_head, a_head) else None, "gather": g_head, "aggregate": a_head}
    together = [h for h in singles.values() if h]
    for label, heads in (*((k, [h]) for k, h in singles.items()), ("together", together)):
        if heads and all(heads) and (label != "together" or len(heads) > 1):
            rows.append({"condition": label, **_condition(adapter, measure_ex, heads, base, seed, ablation)})
    return base, rows, g_head, a_head


def _set_record(k: int, seed: int, top: str | None, g_head: str | None, a_head: str | None, base: EvalResult,
                rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"set": k + 1, "seeds": {"pattern": seed, "rank": seed + 1, "measure": seed + 2}, "top_head": top,
            "gather_head": g_head, "aggregate_head": a_head, "baseline_accuracy": base.accuracy,
            "conditions": {r["condition"]: {"heads": r["heads"], "drop": r["drop"], **ci(bounds(r, "drop"), "drop")}
                           for r in rows[1:]}}


def _replicate(adapter: ModelAdapter, task: Any, k: int, seed: int, n: int, rank_n: int, verify_n: int,
               verify_top: int, verify_layers: Sequence[int], standard: dict[str, dict[str, float]] | None = None,
               ablation: str = "zero") -> dict[str, Any]:
    """The finding's steps again (ranking, roles, ablations; not the cumulative curve) on prompt set
    ``k``, drawn with seeds ``seed``, ``seed + 1``, ``seed + 2``."""
    pattern_ex, rank_ex = task.examples(limit=n, seed=seed), task.examples(limit=rank_n, seed=seed + 1)
    measure_ex = task.examples(limit=verify_n, seed=seed + 2)
    ranked, order, _, role = _rank_and_label(adapter, task, pattern_ex, rank_ex, verify_top, verify_layers, None,
                                             standard, ablation)
    base, rows, g_head, a_head = _ablations(adapter, measure_ex, order, role, ranked.exact, seed, ablation)
    return _set_record(k, seed, top_head(order, ranked.exact), g_head, a_head, base, rows)


def _set_row(r: dict[str, Any]) -> dict[str, Any]:
    """One prompt set as a CSV row: its seeds, the heads it names, each ablation's drop."""
    row = {"set": r["set"], **{f"seed_{k}": v for k, v in r["seeds"].items()},
           **{k: r[k] for k in ("top_head", "gather_head", "aggregate_head", "baseline_accuracy")}}
    for label, c in r["conditions"].items():
        row.update({f"{label}_drop": c["drop"], **ci(bounds(c, "drop"), f"{label}_drop")})
    return {**row, "holds": r.get("holds", ""), "why_not": "; ".join(r.get("why_not", []))}


def _pooled(sets: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each ablation's drop pooled over the prompt sets (:func:`ganda.stats.pool_sets`: the interval
    includes the between-set variation), the heads as each set picks them."""
    out = {}
    for label in dict.fromkeys(["top", *sets[0]["conditions"]]):
        cs = [_condition_of(r, label) for r in sets]
        if any(c is None or c.get("drop") is None for c in cs):
            continue
        out[label] = pool_sets([c["drop"] for c in cs], [c.get("drop_ci_low") for c in cs],
                               [c.get("drop_ci_high") for c in cs], within=(-1.0, 1.0))
    return out


def _condition_of(r: dict[str, Any], label: str) -> dict[str, Any] | None:
    """A set's condition; the top head's is filed under its role where it has one (Gather or
    Aggregate), so ``top`` is looked up by the head too."""
    c = r["conditions"].get(label)
    if c is None and label == "top":
        c = next((c for c in r["conditions"].values() if c["heads"] == r.get("top_head")), None)
    return c


def _pooled_row(pooled: dict[str, dict[str, Any]], k: int) -> dict[str, Any]:
    row: dict[str, Any] = {"set": f"pooled over {k}"}
    for label, p in pooled.items():
        row.update({f"{label}_drop": p["estimate"], f"{label}_drop_ci_low": p.get("ci_low"),
                    f"{label}_drop_ci_high": p.get("ci_high")})
    return row


def _holds(first: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """Whether another prompt set repeats the finding: it names the same top, Gather and Aggregate
    heads, and every ablation whose cost was established on the first set (drop interval above 0)
    is established there too."""
    why = [f"{key.split('_')[0]} head {other[key] or 'none'} (not {first[key] or 'none'})"
           for key in ("top_head", "gather_head", "aggregate_head") if other[key] != first[key]]
    for label, c in first["conditions"].items():
        o = other["conditions"].get(label)
        if c["drop_ci_low"] > 0 and (o is None or o["drop_ci_low"] <= 0):
            why.append(f"{label} ablation cost not established" + ("" if o is None else
                       f" ({100 * o['drop']:+.0f} points [{100 * o['drop_ci_low']:.0f}, {100 * o['drop_ci_high']:.0f}])"))
    return {"holds": not why, "why_not": why}


def run_demo(
    model: str, out: str | Path, *, pairs: int = 5, n: int = 8, verify_n: int = 40, top: int = 4,
    seed: int = 0, max_heads: int = 8, rank_n: int = 16, verify_top: int = 20, verify_layers: Sequence[int] = (0, 1),
    allow_pickle: bool = False, prompt_sets: int = 3, ablation: str = "zero", profile: bool = True,
) -> Path:
    """Run the demo into ``out`` and return its ``report.html``. ``n``: pattern prompts (roles);
    ``rank_n``: ranking prompts; ``verify_top``: heads verified exactly, with every head of
    ``verify_layers`` (first-order estimates underrate heads of the first two layers, docs/attribution.md);
    ``verify_n``: measurement prompts; ``top``: causal heads the finding names and draws;
    ``max_heads``: longest cumulative ablation; ``prompt_sets``: how many prompt sets the finding
    is checked on (:func:`_replicate`); ``ablation``: what an ablated head's slice becomes in every
    measured ablation and the ranking (:mod:`ganda.ablation`; resample ranks by mean, :func:`rank_ablation`);
    ``profile``: the top causal and Gather heads also ablated zero, mean and resample and at each
    position class (:func:`ganda.acts.head_profile`, step 3). The defaults take 1,342 CPU seconds on
    SmolLM2-135M (README.md), the profiles 652 of them; each further prompt set adds most of the rest."""
    con = Console(stderr=True, quiet=is_quiet())  # -q: only the command's summary line
    t0, c0 = time.perf_counter(), time.process_time()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    con.print(f"[bold]ganda demo[/] on {model}: KV retrieval with {pairs} pairs")
    adapter = load_model(model, allow_pickle=allow_pickle)
    task = get_task("kv", pairs=pairs)
    pattern_ex = task.examples(limit=n, seed=seed)
    rank_ex = task.examples(limit=rank_n, seed=seed + 1)
    measure_ex = task.examples(limit=verify_n, seed=seed + 2)
    chance = 1.0 / pairs
    check_representable("kv", task, adapter)  # a tokenizer that reads the keys as <unk>: no finding to write
    intact = evaluate_examples(adapter, measure_ex, progress=False)
    if at_chance(intact.accuracy, chance):
        raise GandaError(f"{adapter.spec} on KV with {pairs} pairs: {chance_sentence(intact.accuracy, chance)}; "
                         "the demo needs a model that retrieves (fewer --pairs, or another model)")
    phases: dict[str, float] = {}

    def lap(name: str, since: float) -> float:
        phases[name] = round(time.process_time() - since, 1)
        return time.process_time()

    c = time.process_time()
    early = f" and every head of layer{'s' if len(verify_layers) > 1 else ''} {', '.join(map(str, verify_layers))}" \
        if verify_layers else ""
    con.print(f"1/5 ranking every head causally (AtP, {rank_ablation(ablation)}-ablation, top {verify_top}{early} "
              f"verified exactly on {len(rank_ex)} prompts)")
    standard = standard_scores(adapter)  # task-free: once for every prompt set
    ranked, order, scores, role = _rank_and_label(adapter, task, pattern_ex, rank_ex, verify_top, verify_layers,
                                                  out / "ranking", standard, ablation)
    by = {s.head: s for s in scores}
    c = lap("rank", c)

    con.print(f"2/5 {ablation}-ablating the best Gather and Aggregate heads")
    base, rows, g_head, a_head = _ablations(adapter, measure_ex, order, role, ranked.exact, seed, ablation)
    c = lap("ablate", c)

    profiled = list(dict.fromkeys(h for h in (top_head(order, ranked.exact), g_head) if h)) if profile else []
    con.print(f"3/5 {', '.join(profiled) or 'no head'}: zero, mean and resample ablation, and where each acts")
    profiles = [r for h in profiled for r in head_profile(adapter, measure_ex, h, base=base, seed=seed)]
    _label_where(adapter, [by[h] for h in profiled], profiles, standard, role)
    c = lap("profile", c)

    con.print("4/5 cumulative ablation in causal order until chance")
    curve = ablate_until_chance(adapter, measure_ex, order, chance=chance, max_heads=max_heads, progress=False,
                                ablation=ablation)
    c = lap("curve", c)

    con.print("5/5 figures and report")
    shown = list(dict.fromkeys([*ranked.matter()[:top], *(h for h in (g_head, a_head) if h)]))
    draw_attention(adapter, pattern_ex[0], shown, out / "ga_heads.png",
                   title=f"{adapter.spec}: the top causal heads", roles={h: role[h] for h in shown})
    _curve_png(curve, base, chance, out / "ablation_curve.png")
    lap("figures", c)
    summary = _summary(adapter, task.config(), base, rows, curve, ranked, role, order, top, chance,
                       len(measure_ex), g_head, a_head, {h.head: h.aggregate for h in scores},
                       {h.head: h.label for h in scores})
    summary.update(_profile_summary(profiles, ablation))
    if prompt_sets > 1:
        con.print(f"the finding on {prompt_sets - 1} more prompt set(s)")
        sets = [_set_record(0, seed, top_head(order, ranked.exact), g_head, a_head, base, rows)]
        for k in range(1, prompt_sets):
            sets.append(_replicate(adapter, task, k, seed + 3 * k, n, rank_n, verify_n, verify_top, verify_layers,
                                   standard, ablation))
            sets[-1].update(_holds(sets[0], sets[-1]))
        summary.update({"prompt_sets": sets, "holds_on": sum(r["holds"] for r in sets[1:]), "pooled": _pooled(sets)})
        c = lap("prompt_sets", c)
    summary.update({"seconds": round(time.perf_counter() - t0, 1), "cpu_seconds": round(time.process_time() - c0, 1),
                    "cpu_seconds_by_phase": phases})
    summary["finding"] = finding(summary)
    heads = [{"head": h, "role": role[h], "label": by[h].label, "rank": i + 1, "exact": ranked.exact.get(h),
              "acc_drop": ranked.exact_acc.get(h), "estimate": ranked.estimate.get(h), "aggregate": by[h].aggregate,
              "gather": by[h].gather, "gather_evidence": by[h].gather_evidence, "induction": by[h].induction,
              "previous_token": by[h].previous_token, "sink": by[h].sink}
             for i, h in enumerate(order[:max(verify_top, top)])]
    result = DemoResult(
        kind="demo", model=adapter.spec, summary=summary, rows=rows,
        config={**task.config(), "n_pattern": n, "n_rank": rank_n, "n_verify": verify_n, "verify_top": verify_top,
                "verify_layers": list(verify_layers), "top": top, "max_heads": max_heads, "seed": seed,
                "prompt_sets": prompt_sets, "rank_method": "atp", "ablation": ablation,
                "rank_ablation": rank_ablation(ablation)},
        extra={"cumulative_ablation": curve, "heads": heads, "head_profiles": profiles})
    runio.write_json(out / "result.json", result.to_json())
    runio.write_csv(out / "ablations.csv", rows)
    if profiles:
        runio.write_csv(out / "ablation_kinds.csv", profiles)
    runio.write_csv(out / "cumulative_ablation.csv", curve)
    runio.write_csv(out / "heads.csv", heads)
    if prompt_sets > 1:
        runio.write_csv(out / "prompt_sets.csv", [*(_set_row(r) for r in summary["prompt_sets"]),
                                                  _pooled_row(summary["pooled"], prompt_sets)])
    report = write_report([out, out / "ranking"], out / "report.html", title=f"ganda demo: {adapter.spec}")
    con.print(summary["finding"].replace("**", ""))
    con.print(f"done in {summary['seconds']:.0f} s ({summary['cpu_seconds']:.0f} CPU s)")
    return report


def _summary(adapter: ModelAdapter, task_cfg: dict[str, Any], base: EvalResult, rows: list[dict[str, Any]],
             curve: list[dict[str, Any]], ranked: Any, role: dict[str, str], order: list[str], top: int,
             chance: float, n_measure: int, g_head: str | None, a_head: str | None,
             scores: dict[str, float], labels: dict[str, str | None] | None = None) -> dict[str, Any]:
    s: dict[str, Any] = {
        "model": adapter.spec, "pairs": task_cfg.get("pairs"), "n_measure": n_measure, "n_rank": ranked.config.get("n"),
        "n_heads": len(ranked.heads), "verified": len(ranked.verified), "rank_method": ranked.method,
        "baseline_accuracy": base.accuracy, **ci((base.ci_low, base.ci_high), "baseline"), "chance": chance,
        "metric": f"{ranked.margin} margin",
        "top_heads": [_head(h, role, ranked, labels) for h in ranked.matter()[:top]],
        "helpful_when_ablated": [_head(h, role, ranked, labels) for h in ranked.helpful_when_ablated()],
        "roles_in_top": {r: sum(role[h] == r for h in ranked.matter()[:10]) for r in ("gather", "aggregate", "neither")},
        "gather_head": g_head, "aggregate_head": a_head, "top_head": top_head(order, ranked.exact),
        "max_aggregate": max(scores.values()), "max_aggregate_head": max(scores, key=scores.get),
    }
    for r in rows[1:]:
        key = {"together": "both"}.get(r["condition"], r["condition"])
        if key == "both":
            s["together"] = r["heads"]
        s.update({f"{key}_accuracy": r["accuracy"], **ci(bounds(r), key), f"{key}_drop": r["drop"],
                  **ci(bounds(r, "drop"), f"{key}_drop")})
    last = curve[-1] if curve else None
    reached = last is not None and last["accuracy"] <= chance + 0.05
    s["heads_to_chance"] = last["n_heads"] if reached else None
    if last is not None:
        key = "chance" if reached else "curve"
        s.update({f"{key}_accuracy": last["accuracy"], **ci(bounds(last), key)})
        if not reached:
            s["curve_heads"] = last["n_heads"]
    return s


def _profile_summary(profiles: list[dict[str, Any]], ablation: str) -> dict[str, Any]:
    """The profiled heads' sentences (:func:`ganda.acts.verdict`, :func:`ganda.acts.where`) by head."""
    heads = list(dict.fromkeys(r["heads"] for r in profiles))
    mine = {h: [r for r in profiles if r["heads"] == h] for h in heads}
    return {"ablation": ablation, "survives": {h: verdict(rs) for h, rs in mine.items()},
            "acts_at": {h: where(rs) for h, rs in mine.items()}}


def _head(h: str, role: dict[str, str], ranked: Any, labels: dict[str, str | None] | None = None) -> dict[str, Any]:
    """A verified head as the summary lists it: its role, its label (:mod:`ganda.labels`) and its
    exact margin and accuracy drops."""
    return {"head": h, "role": role[h], "label": (labels or {}).get(h), "exact": ranked.exact.get(h),
            "acc_drop": ranked.exact_acc.get(h)}


def _curve_png(curve: list[dict[str, Any]], base: EvalResult, chance: float, path: Path) -> Path:
    xs = [0] + [c["n_heads"] for c in curve]
    ys = [base.accuracy] + [c["accuracy"] for c in curve]
    los = [base.ci_low] + [c["ci_low"] for c in curve]
    his = [base.ci_high] + [c["ci_high"] for c in curve]
    return curves(xs, {"kv accuracy": ys}, path, bands={"kv accuracy": (los, his)},
                  xlabel="heads ablated (cumulative, causal order)", hlines={"chance": chance},
                  title="How many heads must go", integer_x=True, point_labels={"kv accuracy": added_heads(curve)})
