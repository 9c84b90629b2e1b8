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

The demo is the registered experiment ``demo`` (:class:`Demo`, its options :class:`DemoOptions`):
``ganda demo`` is built from it as every analysis's command is. It sits above the experiments'
layer because it writes ``report.html`` (:mod:`ganda.report`) as part of its run. The defaults take
1,253 CPU seconds on SmolLM2-135M (BENCHMARKS.md §9), the profiles 596 of them and the two further
prompt sets 328.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from . import runio
from .acts import head_profile, position_evidence, verdict, where
from .attention import draw_attention
from .attribution import rank_heads
from .effects import matters
from .errors import GandaError
from .experiments.base import ABLATION_HELP, Options, ScoredExperiment, option
from .experiments.common import ExperimentResult, paired_drop, pool_over
from .experiments.cumulative import at_chance, chance_sentence, cumulative_ablation, curve_figure
from .intervals import bounds, ci
from .interventions import ABLATIONS, AblateHeads
from .labels import label_model, role_of
from .models import load_model
from .models.base import ModelAdapter
from .patterns import AUTO, HeadScore, pattern_scores, standard_scores
from .progress import is_quiet
from .report.html import write_report
from .scoring import EvalResult, evaluate_examples
from .tasks import check_representable, get_task
from .tasks.base import Example


class DemoResult(ExperimentResult):
    """A saved demo run; its headline is the finding paragraph (:func:`finding`)."""

    def headline(self) -> str:
        return self.summary.get("finding") or finding(self.summary)



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
    its paired drop from ``base`` with a bootstrap CI (:func:`ganda.experiments.common.paired_drop`)."""
    r = evaluate_examples(adapter, examples, [AblateHeads(heads, how=ablation, seed=seed)], progress=False)
    return {"heads": ",".join(heads), **paired_drop(base, r, seed)}


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


#: the ranking's exact check: the top heads by estimate, and every head of the first two layers,
#: which first-order estimates underrate (docs/attribution.md)
VERIFY_TOP, VERIFY_LAYERS = 20, (0, 1)


@dataclass
class DemoOptions(Options):
    """The demo's options. Its pattern prompts and their seed are the run's ``-n/--limit`` and
    ``--seed``; the hidden options are sizes the command line leaves at their defaults. The ranking
    verifies :data:`VERIFY_TOP` heads and every head of :data:`VERIFY_LAYERS` exactly."""

    pairs: int = option(5, "key-value pairs per prompt")
    verify_n: int = option(40, "prompts for the accuracy measurements", low=1)
    top: int = option(4, "top causal heads the finding names and draws", low=1)
    prompt_sets: int = option(3, "prompt sets the finding is checked on (set k: seeds seed+3k, +1, +2), each "
                              "reported with whether the finding holds", low=1, high=100,
                              why="each one repeats the whole measurement")
    ablation: str = option("zero", f"zero|mean|resample (the ranking of a resample demo runs mean): {ABLATION_HELP}",
                           choices=ABLATIONS)
    profile: bool = option(True, "skip ablating the top causal and Gather heads zero, mean and resample and at each "
                           "position class (where they act)", flag="--no-profile")
    rank_n: int = option(16, "ranking prompts", low=1, hidden=True)
    max_heads: int = option(8, "longest cumulative ablation", low=1, hidden=True)

    def check(self) -> None:
        get_task("kv", pairs=self.pairs)  # a bad --pairs fails here, before the model loads


class Demo(ScoredExperiment):
    """The main job: KV baseline -> causal head ranking -> ablate the top G&A heads -> figures -> HTML report."""

    name = "demo"
    inputs = "model"  # its three prompt draws per set are its own: -n/--limit pattern prompts
    Options = DemoOptions
    default_limit = 8
    default_out = "runs/demo"
    report_html = False  # it writes report.html itself: the finding, then its ranking (ranking/)
    input_help = {"limit": "prompts for the pattern scores", "out": "run directory: report.html, JSON, CSV, PNG"}

    def __init__(self, resume: bool = True) -> None:
        super().__init__(resume)
        self.clock = Clock()  # started before the model loads: the run's seconds include loading it

    def run_tasks(self, adapter: ModelAdapter, scorer: Any, options: DemoOptions, *, out_dir: Path,  # type: ignore[override]
                  run: Any) -> DemoResult:
        return demo(adapter, options, out_dir, n=run.limit, seed=run.seed, clock=self.clock)

    def show(self, result: DemoResult, options: DemoOptions, run: Any, out_dir: Path) -> None:  # type: ignore[override]
        print(f"report: {out_dir / 'report.html'}")


def run_demo(model: str, out: str | Path, *, n: int = 8, seed: int = 0, allow_pickle: bool = False,
             **options: Any) -> Path:
    """``ganda demo`` from Python: the demo of ``model`` into ``out``, its report.html returned.
    ``n``: pattern prompts; ``options``: :class:`DemoOptions` by name (``rank_n=8``, ``profile=False``),
    checked as the command checks them."""
    opts = DemoOptions.build(options)
    clock = Clock()
    adapter = load_model(model, allow_pickle=allow_pickle)
    demo(adapter, opts, Path(out), n=n, seed=seed, clock=clock)
    return Path(out) / "report.html"


class Clock:
    """The run's wall and CPU seconds since it started, and the CPU seconds of each phase."""

    def __init__(self) -> None:
        self.t0, self.c0 = time.perf_counter(), time.process_time()
        self.since = self.c0
        self.phases: dict[str, float] = {}

    def lap(self, name: str | None = None) -> None:
        """End the phase ``name`` (None: the time since the last lap belongs to no phase)."""
        if name is not None:
            self.phases[name] = round(time.process_time() - self.since, 1)
        self.since = time.process_time()

    def totals(self) -> dict[str, Any]:
        return {"seconds": round(time.perf_counter() - self.t0, 1), "cpu_seconds": round(time.process_time() - self.c0, 1),
                "cpu_seconds_by_phase": self.phases}


@dataclass
class Prompts:
    """One prompt set's three disjoint draws: pattern prompts (roles; seed ``seed``), ranking
    prompts (``seed + 1``) and measurement prompts (``seed + 2``, every accuracy reported)."""

    pattern: list[Example]
    rank: list[Example]
    measure: list[Example]

    @classmethod
    def draw(cls, task: Any, n: int, o: DemoOptions, seed: int) -> Prompts:
        return cls(task.examples(limit=n, seed=seed), task.examples(limit=o.rank_n, seed=seed + 1),
                   task.examples(limit=o.verify_n, seed=seed + 2))


@dataclass
class Found:
    """What one prompt set found: the causal ranking and each head's scores and role (step 1), the
    intact run and the G&A heads' ablations (step 2); on the first set also the top heads' profiles
    (step 3) and the cumulative curve (step 4)."""

    ranked: Any  # ganda.attribution.RankResult
    order: list[str]
    scores: list[HeadScore]
    role: dict[str, str]
    base: EvalResult | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)
    gather: str | None = None
    aggregate: str | None = None
    profiles: list[dict[str, Any]] = field(default_factory=list)
    cumulative: dict[str, Any] = field(default_factory=dict)  # step 4: cumulative_ablation's record

    @property
    def top(self) -> str | None:
        """The top causal head: the first verified head in causal order whose ablation lowers the
        margin (None where no verified head's does)."""
        return next((h for h in self.order if matters(self.ranked.exact.get(h))), None)

    def record(self, k: int, seed: int) -> dict[str, Any]:
        """Prompt set ``k`` (0-based) as ``summary["prompt_sets"]`` lists it."""
        return {"set": k + 1, "seeds": {"pattern": seed, "rank": seed + 1, "measure": seed + 2}, "top_head": self.top,
                "gather_head": self.gather, "aggregate_head": self.aggregate,
                "baseline_accuracy": self.base.accuracy if self.base else None,
                "conditions": {r["condition"]: {"heads": r["heads"], "drop": r["drop"], **ci(bounds(r, "drop"), "drop")}
                               for r in self.rows[1:]}}


def demo(adapter: ModelAdapter, o: DemoOptions, out: Path, *, n: int, seed: int, clock: Clock | None = None
         ) -> DemoResult:
    """The demo of a loaded model into ``out`` (``n`` pattern prompts, prompt set 1 drawn with
    ``seed``): its five steps, the further prompt sets, then every file and the finding printed."""
    con = Console(stderr=True, quiet=is_quiet())  # -q: only the command's summary line
    clock = clock or Clock()
    out.mkdir(parents=True, exist_ok=True)
    con.print(f"[bold]ganda demo[/] on {adapter.spec}: KV retrieval with {o.pairs} pairs")
    task = get_task("kv", pairs=o.pairs)
    prompts = Prompts.draw(task, n, o, seed)
    intact = _check_retrieves(adapter, task, prompts.measure, o.pairs)
    clock.lap()
    found, standard = _find(adapter, task, prompts, intact, o, out, seed, con, clock)
    con.print("5/5 figures and report")
    _figures(adapter, found, prompts.pattern[0], o, out)
    clock.lap("figures")
    summary = _summary(adapter.spec, task.config(), found, o.top, 1.0 / o.pairs, len(prompts.measure))
    summary.update(_profile_summary(found.profiles, o.ablation))
    if o.prompt_sets > 1:
        summary.update(_further_sets(adapter, task, found, o, n, seed, standard, con))
        clock.lap("prompt_sets")
    summary.update(clock.totals())
    summary["finding"] = finding(summary)
    result = _result(adapter.spec, task.config(), found, summary, o, n, seed)
    _write(out, result)
    con.print(summary["finding"].replace("**", ""))
    con.print(f"done in {summary['seconds']:.0f} s ({summary['cpu_seconds']:.0f} CPU s)")
    return result


def _check_retrieves(adapter: ModelAdapter, task: Any, measure: Sequence[Example], pairs: int) -> EvalResult:
    """Refuse a model with no finding to write: a tokenizer that reads the keys as <unk>, or
    retrieval at chance on the measurement prompts; returns the intact run on them."""
    check_representable("kv", task, adapter)
    intact, chance = evaluate_examples(adapter, measure, progress=False), 1.0 / pairs
    if at_chance(intact.accuracy, chance):
        raise GandaError(f"{adapter.spec} on KV with {pairs} pairs: {chance_sentence(intact.accuracy, chance)}; "
                         "the demo needs a model that retrieves (fewer --pairs, or another model)")
    return intact


def _find(adapter: ModelAdapter, task: Any, prompts: Prompts, intact: EvalResult, o: DemoOptions, out: Path,
          seed: int, con: Console, clock: Clock) -> tuple[Found, dict[str, dict[str, float]]]:
    """Steps 1-4 on prompt set 1 (``intact``: the intact run on its measurement prompts): every head
    ranked causally and labelled, the best Gather and Aggregate heads ablated, the top causal and
    Gather heads profiled (and labelled again with where they act), the cumulative curve. Returns
    what they found and the model's standard scores."""
    con.print(f"1/5 ranking every head causally (AtP, {rank_ablation(o.ablation)}-ablation, top {VERIFY_TOP} and "
              f"every head of layers {', '.join(map(str, VERIFY_LAYERS))} verified exactly on {len(prompts.rank)} prompts)")
    standard = standard_scores(adapter)  # task-free: once for every prompt set
    found = _rank_and_label(adapter, task, prompts, o, out / "ranking", standard)
    clock.lap("rank")

    con.print(f"2/5 {o.ablation}-ablating the best Gather and Aggregate heads")
    _ablate(adapter, prompts.measure, found, seed, o.ablation, base=intact)
    clock.lap("ablate")

    profiled = list(dict.fromkeys(h for h in (found.top, found.gather) if h)) if o.profile else []
    con.print(f"3/5 {', '.join(profiled) or 'no head'}: zero, mean and resample ablation, and where each acts")
    found.profiles = [r for h in profiled for r in head_profile(adapter, prompts.measure, h, base=found.base, seed=seed)]
    by = {s.head: s for s in found.scores}
    _label_where(adapter, [by[h] for h in profiled], found.profiles, standard, found.role)
    clock.lap("profile")

    con.print("4/5 cumulative ablation in causal order until chance")
    found.cumulative = cumulative_ablation(adapter, prompts.measure, found.order, max_heads=o.max_heads,
                                           progress=False, base=found.base, ablation=o.ablation, chance=1.0 / o.pairs)
    clock.lap("curve")
    return found, standard


def _rank_and_label(adapter: ModelAdapter, task: Any, prompts: Prompts, o: DemoOptions, out_dir: Path | None,
                    standard: dict[str, dict[str, float]] | None = None) -> Found:
    """Step 1: every head ranked causally on the ranking prompts and labelled by its pattern on the
    pattern prompts and its ``standard`` scores (task-free: measured once per model,
    :func:`ganda.patterns.standard_scores`)."""
    ranked = rank_heads(adapter, prompts.rank, method="atp", verify_top=VERIFY_TOP, verify_layers=VERIFY_LAYERS,
                        audit=0, active=0, progress=False, out_dir=out_dir, resume=False,
                        config={"task": task.config()}, ablation=rank_ablation(o.ablation))
    scores = pattern_scores(adapter, prompts.pattern, progress=False, summary=AUTO)
    label_model(adapter, scores, standard=standard)
    return Found(ranked, ranked.order(), scores, roles(scores))


def _label_where(adapter: ModelAdapter, scores: Sequence[HeadScore], profiles: Sequence[dict[str, Any]],
                 standard: dict[str, dict[str, float]], role: dict[str, str]) -> None:
    """The profiled heads labelled again with where their ablation hurts (:func:`ganda.acts.position_evidence`):
    the labeller's rule 3 keeps Aggregate or Gather by that position where both patterns qualify,
    and every label's reason says whether the position agrees (:mod:`ganda.labels`)."""
    evidence = {s.head: position_evidence([r for r in profiles if r["heads"] == s.head]) for s in scores}
    label_model(adapter, scores, ablations={h: e for h, e in evidence.items() if e}, standard=standard)
    role.update(roles(scores))


def _ablate(adapter: ModelAdapter, measure: Sequence[Example], found: Found, seed: int, ablation: str = "zero",
           base: EvalResult | None = None) -> None:
    """Step 2: the intact run (``base`` where it was scored already) and the top, best Gather and
    best Aggregate heads ablated alone and together, into ``found``."""
    base = base if base is not None else evaluate_examples(adapter, measure, progress=False)
    exact = found.ranked.exact
    found.gather = _first(found.order, found.role, "gather", exact)
    found.aggregate = _first(found.order, found.role, "aggregate", exact)
    found.base = base
    found.rows = [{"condition": "intact", "heads": "", "accuracy": base.accuracy, **ci((base.ci_low, base.ci_high)),
                   "drop": 0.0, **ci((0.0, 0.0), "drop")}]
    top = found.top
    singles = {"top": top if top not in (found.gather, found.aggregate) else None, "gather": found.gather,
               "aggregate": found.aggregate}
    together = [h for h in singles.values() if h]
    for label, heads in (*((k, [h]) for k, h in singles.items()), ("together", together)):
        if heads and all(heads) and (label != "together" or len(heads) > 1):
            found.rows.append({"condition": label, **_condition(adapter, measure, heads, base, seed, ablation)})


def _further_sets(adapter: ModelAdapter, task: Any, found: Found, o: DemoOptions, n: int, seed: int,
                  standard: dict[str, dict[str, float]], con: Console) -> dict[str, Any]:
    """The finding checked on prompt sets 2 to ``o.prompt_sets`` (set k: seeds ``seed + 3k`` to
    ``seed + 3k + 2``), each with whether it holds (:func:`_holds`), each ablation's drop pooled."""
    con.print(f"the finding on {o.prompt_sets - 1} more prompt set(s)")
    sets = [found.record(0, seed)]
    for k in range(1, o.prompt_sets):
        sets.append(_replicate(adapter, task, k, seed + 3 * k, n, o, standard))
        sets[-1].update(_holds(sets[0], sets[-1]))
    return {"prompt_sets": sets, "holds_on": sum(r["holds"] for r in sets[1:]), "pooled": _pooled(sets)}


def _replicate(adapter: ModelAdapter, task: Any, k: int, seed: int, n: int, o: DemoOptions,
               standard: dict[str, dict[str, float]] | None = None) -> dict[str, Any]:
    """The finding's steps again (ranking, roles, ablations; not the cumulative curve) on prompt set
    ``k``, drawn with seeds ``seed``, ``seed + 1``, ``seed + 2``."""
    prompts = Prompts.draw(task, n, o, seed)
    found = _rank_and_label(adapter, task, prompts, o, None, standard)
    _ablate(adapter, prompts.measure, found, seed, o.ablation)
    return found.record(k, seed)


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
        out[label] = pool_over(cs, "drop", within=(-1.0, 1.0))
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
        o = _condition_of(other, label)  # the top head's, under its role where it has one there
        if c["drop_ci_low"] <= 0:
            continue
        if o is None:  # e.g. together, where the set's top head is its Gather head: one head, no pair
            why.append(f"{label} ablation not run there")
        elif o["drop_ci_low"] <= 0:
            why.append(f"{label} ablation cost not established ({100 * o['drop']:+.0f} points "
                       f"[{100 * o['drop_ci_low']:.0f}, {100 * o['drop_ci_high']:.0f}])")
    return {"holds": not why, "why_not": why}


def _figures(adapter: ModelAdapter, found: Found, example: Example, o: DemoOptions, out: Path) -> None:
    """Step 5's figures: the maps of the top causal and the G&A heads on the first pattern prompt
    (ga_heads.png, its maps as JSON beside it) and the cumulative curve (ablation_curve.png)."""
    shown = list(dict.fromkeys([*found.ranked.matter()[:o.top], *(h for h in (found.gather, found.aggregate) if h)]))
    draw_attention(adapter, example, shown, out / "ga_heads.png", title=f"{adapter.spec}: the top causal heads",
                   roles={h: found.role[h] for h in shown})
    curve_figure(found.cumulative["curve"], found.base, 1.0 / o.pairs, out / "ablation_curve.png", series="kv accuracy",
                 xlabel="heads ablated (cumulative, causal order)", title="How many heads must go")


def _summary(model: str, task_cfg: dict[str, Any], found: Found, top: int, chance: float, n_measure: int
             ) -> dict[str, Any]:
    """The numbers the finding states (:func:`finding`), from prompt set 1."""
    ranked, role, base = found.ranked, found.role, found.base
    labels = {h.head: h.label for h in found.scores}
    scores = {h.head: h.aggregate for h in found.scores}
    s: dict[str, Any] = {
        "model": model, "pairs": task_cfg.get("pairs"), "n_measure": n_measure, "n_rank": ranked.config.get("n"),
        "n_heads": len(ranked.heads), "verified": len(ranked.verified), "rank_method": ranked.method,
        "baseline_accuracy": base.accuracy, **ci((base.ci_low, base.ci_high), "baseline"), "chance": chance,
        "metric": f"{ranked.margin} margin",
        "top_heads": [_head(h, role, ranked, labels) for h in ranked.matter()[:top]],
        "helpful_when_ablated": [_head(h, role, ranked, labels) for h in ranked.helpful_when_ablated()],
        "roles_in_top": {r: sum(role[h] == r for h in ranked.matter()[:10]) for r in ("gather", "aggregate", "neither")},
        "gather_head": found.gather, "aggregate_head": found.aggregate, "top_head": found.top,
        "max_aggregate": max(scores.values()), "max_aggregate_head": max(scores, key=scores.get),
    }
    for r in found.rows[1:]:
        key = {"together": "both"}.get(r["condition"], r["condition"])
        if key == "both":
            s["together"] = r["heads"]
        s.update({f"{key}_accuracy": r["accuracy"], **ci(bounds(r), key), f"{key}_drop": r["drop"],
                  **ci(bounds(r, "drop"), f"{key}_drop")})
    return {**s, **_curve_summary(found.cumulative)}


def _curve_summary(cumulative: dict[str, Any]) -> dict[str, Any]:
    """How many heads the cumulative ablation (:func:`ganda.experiments.cumulative.cumulative_ablation`)
    took to reach chance (within 5 points), or how far its longest run got."""
    curve, reached = cumulative["curve"], cumulative["reached_chance"]
    s: dict[str, Any] = {"heads_to_chance": cumulative["heads_to_chance"]}
    if curve:
        key = "chance" if reached else "curve"
        s.update({f"{key}_accuracy": curve[-1]["accuracy"], **ci(bounds(curve[-1]), key)})
        if not reached:
            s["curve_heads"] = curve[-1]["n_heads"]
    return s


def _result(model: str, task_cfg: dict[str, Any], found: Found, summary: dict[str, Any], o: DemoOptions, n: int,
            seed: int) -> DemoResult:
    """The run as a result: its summary, the ablations as rows, the curve, the ranked heads and the
    profiles, and every setting."""
    by = {s.head: s for s in found.scores}
    ranked = found.ranked
    heads = [{"head": h, "role": found.role[h], "label": by[h].label, "rank": i + 1, "exact": ranked.exact.get(h),
              "acc_drop": ranked.exact_acc.get(h), "estimate": ranked.estimate.get(h), "aggregate": by[h].aggregate,
              "gather": by[h].gather, "gather_evidence": by[h].gather_evidence, "induction": by[h].induction,
              "previous_token": by[h].previous_token, "sink": by[h].sink}
             for i, h in enumerate(found.order[:max(VERIFY_TOP, o.top)])]
    config = {**task_cfg, "n_pattern": n, "n_rank": o.rank_n, "n_verify": o.verify_n, "verify_top": VERIFY_TOP,
              "verify_layers": list(VERIFY_LAYERS), "top": o.top, "max_heads": o.max_heads, "seed": seed,
              "prompt_sets": o.prompt_sets, "rank_method": "atp", "ablation": o.ablation,
              "rank_ablation": rank_ablation(o.ablation)}
    return DemoResult(kind="demo", model=model, summary=summary, rows=found.rows, config=config,
                      extra={"cumulative_ablation": found.cumulative["curve"], "heads": heads, "head_profiles": found.profiles})


def _write(out: Path, result: DemoResult) -> Path:
    """result.json, the CSVs and report.html (the finding first, then the ranking in ranking/)."""
    runio.write_json(out / "result.json", result.to_json())
    runio.write_csv(out / "ablations.csv", result.rows)
    if result.extra["head_profiles"]:
        runio.write_csv(out / "ablation_kinds.csv", result.extra["head_profiles"])
    runio.write_csv(out / "cumulative_ablation.csv", result.extra["cumulative_ablation"])
    runio.write_csv(out / "heads.csv", result.extra["heads"])
    if sets := result.summary.get("prompt_sets"):
        runio.write_csv(out / "prompt_sets.csv", [*(_set_row(r) for r in sets),
                                                  _pooled_row(result.summary["pooled"], len(sets))])
    return write_report([out, out / "ranking"], out / "report.html", title=f"ganda demo: {result.model}")


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
