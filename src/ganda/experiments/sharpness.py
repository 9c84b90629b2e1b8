"""``ganda sharpness``: how sharp two models' top G&A heads are, and the difference between the
models with paired bootstrap intervals over prompts (the paper's "Transformers' G&A maps are
sharper than SSMs'"), on one or several prompt sets.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import runio
from ..errors import GandaError
from ..figures import pyplot, save_figure
from ..heads import expand
from ..intervals import bounds, ci, split_all
from ..models.base import ModelAdapter
from ..patterns import (
    AGGREGATE_METRICS,
    METRICS,
    RATIO_METRICS,
    SUMMARIES,
    pattern_scores,
    pattern_scores_by_summary,
)
from ..stats import bootstrap_paired, pool_sets
from ..sweep import single_ablations
from ..tasks import get_task
from ..tasks.base import Example
from .base import Options, ScoredExperiment, option
from .common import ExperimentResult


def _select_heads(adapter: ModelAdapter, examples: Sequence[Example], k: int, select: str,
                  progress: bool, summary: str = "end") -> tuple[list[str], list[str], dict[str, float]]:
    """Top-``k`` Aggregate-role and Gather-role heads of a model, chosen on ``examples``:

    * ``select="pattern"``: the Aggregate-role heads are the top ``k`` by Aggregate score, the
      Gather-role heads the top ``k`` by Gather score;
    * ``select="drop"``: the top ``k`` heads by accuracy drop when each head alone is zero-ablated
      (both roles use the same heads)."""
    if select == "pattern":
        sc = pattern_scores(adapter, examples, progress=progress, summary=summary)
        agg = [s.head for s in sorted(sc, key=lambda s: -s.aggregate)[:k]]
        gat = [s.head for s in sorted(sc, key=lambda s: -s.gather)[:k]]
        return agg, gat, {s.head: s.aggregate for s in sc}
    if select == "drop":  # each head zero-ablated alone (:func:`ganda.sweep.single_ablations`)
        drops = single_ablations(adapter, examples, adapter.heads()).effects()
        top = sorted(drops, key=lambda h: -drops[h])[:k]
        return top, list(top), drops
    raise ValueError(f"select must be 'pattern' or 'drop', not {select!r}")


def compare_sharpness(adapters: Mapping[str, ModelAdapter] | Sequence[ModelAdapter], task: Any = "lab-mmlu", *,
                      summary: str | Mapping[str, str] = "end", **kw: Any) -> dict[str, Any]:
    """:func:`compare_sharpness_summaries` for one ``summary``: how sharp each model's top G&A heads
    are, and the differences between models, with CIs."""
    return compare_sharpness_summaries(adapters, task, summaries=[summary], **kw)[0]


def compare_sharpness_summaries(
    adapters: Mapping[str, ModelAdapter] | Sequence[ModelAdapter],
    task: Any = "lab-mmlu",
    *,
    k: int = 3,
    n: int = 100,
    seed: int = 0,
    select: str = "pattern",
    select_n: int | None = None,
    resamples: int = 2000,
    progress: bool = True,
    heads: Mapping[str, tuple[Sequence[str], Sequence[str]]] | None = None,
    summaries: Sequence[str | Mapping[str, str]] = SUMMARIES,
) -> list[dict[str, Any]]:
    """How sharp each model's top G&A heads are, and the differences between models, with CIs: one
    result per entry of ``summaries``, every model's maps read once for all of them
    (:func:`pattern_scores_by_summary`).

    A summary: the token scored as each segment's summary (``"end"``, the paper's ``\\n``, or
    ``"last"``), for every model or per model name: each model is measured at the token it
    summarises into (see the read profile), which need not be the same token for both.

    ``heads`` (model name -> (Aggregate-role heads, Gather-role heads)) skips the selection and
    measures these heads, e.g. the ones :func:`ganda.experiments.roles.head_roles` labelled
    causally (chosen on other prompts than ``seed``'s).

    Heads are **chosen on other prompts** (``select_n`` prompts, seed ``seed + 1``) than those they
    are measured on (``n`` prompts, seed ``seed``), so selection does not inflate the scores
    (``select``: :func:`_select_heads`). Aggregate metrics (``aggregate``, ``aggregate_segment``,
    ``aggregate_peak``, ``aggregate_hit``) are read from the Aggregate-role heads, Gather metrics
    from the Gather-role heads (:func:`_head_means`). Every model sees the same prompts, so
    differences are paired: the 95% intervals are percentile bootstraps over prompts
    (``resamples`` draws, seeded with ``seed``), the same draw for both models. Differences are
    first model minus each other model (for the ratios: the first model's geometric mean divided by
    the other's). Positive means the first model is sharper: every metric grows with sharpness.
    """
    named = dict(adapters) if isinstance(adapters, Mapping) else {a.spec: a for a in adapters}
    if len(named) < 1:
        raise ValueError("give at least one model")
    t = _paired_task(named, task) if isinstance(task, str) else task
    measure = t.examples(limit=n, seed=seed)
    chooser = t.examples(limit=select_n or n, seed=seed + 1)
    per_model = {name: _model_sharpness(name, adapter, summaries, measure=measure, chooser=chooser,
                                        given=(heads or {}).get(name), k=k, select=select, progress=progress,
                                        resamples=resamples, seed=seed)
                 for name, adapter in named.items()}
    names = list(named)
    out = []
    for i in range(len(summaries)):
        per_prompt = {name: per_model[name][i][0] for name in names}
        diffs = [_difference(per_prompt, names[0], other, metric, resamples, seed)
                 for other in names[1:] for metric in METRICS]
        out.append({
            "kind": "sharpness", "task": t.config(), "n": len(measure), "seed": seed, "k": k,
            "select": "given" if heads is not None else select,
            "select_n": len(chooser), "select_seed": seed + 1, "resamples": resamples,
            "ci_method": "percentile bootstrap over prompts (paired: one draw for all models), seeded",
            "models": {name: per_model[name][i][1] for name in names}, "differences": diffs,
        })
    return out


def _model_sharpness(name: str, adapter: ModelAdapter, summaries: Sequence[str | Mapping[str, str]], *,
                     measure: Sequence[Example], chooser: Sequence[Example],
                     given: tuple[Sequence[str], Sequence[str]] | None, k: int, select: str, progress: bool,
                     resamples: int, seed: int) -> list[tuple[dict[str, list[float]], dict[str, Any]]]:
    """One model's part of :func:`compare_sharpness_summaries`, per summary: each metric's value on
    every prompt of ``measure`` and the model's record (its heads, chosen on ``chooser`` unless
    ``given``, and each metric's summary). Every chosen head's maps are read once for all summaries."""
    summs = [s.get(name, "end") if isinstance(s, Mapping) else s for s in summaries]  # this model's
    picks = [_given_heads(name, given) if given is not None else _select_heads(adapter, chooser, k, select, progress, s)
             for s in summs]  # (Aggregate heads, Gather heads, selection scores) per summary
    chosen = list(dict.fromkeys(h for agg, gat, _ in picks for h in agg + gat))
    by_summary = pattern_scores_by_summary(adapter, measure, [expand([h], adapter)[0] for h in chosen], progress,
                                           summs)
    out = []
    for summ, (agg, gat, sel_scores) in zip(summs, picks, strict=True):
        scored = dict(zip(chosen, by_summary[summ], strict=True))
        values = {metric: _head_means(scored, agg if metric in AGGREGATE_METRICS else gat, metric, len(measure))
                  for metric in METRICS}
        metrics = {metric: _summary(xs, metric in RATIO_METRICS, resamples, seed) for metric, xs in values.items()}
        out.append((values, {
            "spec": adapter.spec, "summary": summ, "aggregate_heads": agg, "gather_heads": gat,
            "selection_scores": {h: sel_scores[h] for h in dict.fromkeys(agg + gat)},
            "heads": [scored[h].to_json() for h in dict.fromkeys(agg + gat)], "metrics": metrics,
        }))
    return out


def _given_heads(name: str, given: tuple[Sequence[str], Sequence[str]]) -> tuple[list[str], list[str], dict[str, float]]:
    """Heads given for a model instead of chosen: its Aggregate-role and Gather-role heads, with no
    selection scores."""
    agg, gat = list(given[0]), list(given[1])
    if not agg or not gat:
        raise GandaError(f"{name}: give at least one Aggregate-role and one Gather-role head")
    return agg, gat, {h: float("nan") for h in agg + gat}


def _head_means(scored: Mapping[str, Any], heads: Sequence[str], metric: str, n: int) -> list[float]:
    """A model's value of ``metric`` on each of ``n`` prompts: the mean over its ``k`` heads (of
    ``log x`` for the ratio metrics such as ``aggregate_peak`` and ``gather_contrast``); its
    summary is then the mean over prompts (exponentiated for the ratios: a geometric mean)."""
    f = (lambda x: math.log(max(x, 1e-30))) if metric in RATIO_METRICS else (lambda x: x)
    return [sum(f(scored[h].samples[metric][j]) for h in heads) / len(heads) for j in range(n)]


def _paired_task(named: Mapping[str, ModelAdapter], task: str) -> Any:
    """The task every model reads: paired comparisons need the same prompts, so every model must
    read them in the same world (a lab model's task is built from its own)."""
    built = {name: get_task(task, adapter=a) for name, a in named.items()}
    configs = {name: t.config() for name, t in built.items()}
    first = next(iter(configs.values()))
    odd = [name for name, c in configs.items() if c != first]
    if odd:
        raise GandaError(f"{task}: {', '.join(odd)} was trained on another world than {next(iter(named))}; "
                         "a paired comparison needs the same prompts for every model")
    return next(iter(built.values()))


def _summary(xs: list[float], ratio: bool, resamples: int, seed: int) -> dict[str, Any]:
    """One model's metric over prompts with its bootstrap interval: the mean, or for a ratio metric
    (``xs`` its logs) the geometric mean."""
    b = bootstrap_paired(xs, resamples=resamples, seed=seed)
    if ratio:
        return {"value": math.exp(b["a"]), **ci([math.exp(v) for v in bounds(b, "a")]), "scale": "geometric mean"}
    return {"value": b["a"], **ci(bounds(b, "a")), "scale": "mean"}


def _difference(per_prompt: dict[str, dict[str, list[float]]], first: str, other: str, metric: str, resamples: int,
                seed: int) -> dict[str, Any]:
    """``first`` minus ``other`` on ``metric`` (for a ratio metric, the ratio of geometric means), a
    paired bootstrap over prompts, and which model the interval says is sharper."""
    b = bootstrap_paired(per_prompt[first][metric], per_prompt[other][metric], resamples=resamples, seed=seed)
    if metric in RATIO_METRICS:
        row = {"value": math.exp(b["diff"]), **ci([math.exp(v) for v in bounds(b, "diff")]),
               "scale": f"ratio {first} / {other} of geometric means"}
    else:
        row = {"value": b["diff"], **ci(bounds(b, "diff")), "scale": f"difference {first} - {other}"}
    lo, hi = bounds(row)
    neutral = 1.0 if metric in RATIO_METRICS else 0.0
    row["sharper"] = first if lo > neutral else other if hi < neutral else "undecided (CI covers no difference)"
    return {"a": first, "b": other, "metric": metric, **row}


def sharpness_sets(adapters: Mapping[str, ModelAdapter] | Sequence[ModelAdapter], task: Any = "lab-mmlu", *,
                   prompt_sets: int = 3, seed: int = 0, **kw: Any) -> dict[str, Any]:
    """:func:`compare_sharpness` on ``prompt_sets`` prompt sets (set ``i``: heads chosen on seed
    ``seed + 2i + 1``, measured on ``seed + 2i``), then every difference pooled over the sets
    (:func:`pool_sharpness`). The result is set 1's, with ``sets``, ``seeds`` and ``pooled`` added."""
    sets = [compare_sharpness(adapters, task, seed=seed + 2 * i, **kw) for i in range(prompt_sets)]
    return {**sets[0], "prompt_sets": prompt_sets, "seeds": [seed + 2 * i for i in range(prompt_sets)],
            "sets": sets, "pooled": pool_sharpness(sets)}


def pool_sharpness(sets: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each between-model difference of K :func:`compare_sharpness` results pooled
    (:func:`ganda.stats.pool_sets`; ratios on the log scale): the pooled value and interval, on
    how many sets the first model is sharper (its set interval clear of no difference), on how many
    the other is, and which one the pooled interval names (``undecided`` where it covers none)."""
    out = []
    for j, first in enumerate(sets[0]["differences"]):
        rows = [s["differences"][j] for s in sets]
        ratio = first["metric"] in RATIO_METRICS
        f = math.log if ratio else float
        pooled = pool_sets([f(r["value"]) for r in rows], [f(bounds(r)[0]) for r in rows],
                           [f(bounds(r)[1]) for r in rows])
        back = math.exp if ratio else float
        lo, hi = (back(x) for x in bounds(pooled))
        a, b = first["a"], first["b"]
        out.append({"a": a, "b": b, "metric": first["metric"], "value": back(pooled["estimate"]), **ci((lo, hi)),
                    "scale": first["scale"], "k": len(sets),
                    "a_sharper_on": sum(str(r["sharper"]) == a for r in rows),
                    "b_sharper_on": sum(str(r["sharper"]) == b for r in rows),
                    "sharper": a if pooled["pooled_holds"] else b if bounds(pooled)[1] < 0 else
                    "undecided (pooled CI covers no difference)",
                    "between_sd": pooled["between_sd"], "method": pooled["method"]})
    return out


def pooled_sharpness_lines(pooled: Sequence[dict[str, Any]]) -> list[str]:
    """One line per metric: the pooled difference, its interval and how many sets agree."""
    return [f"{r['metric']:<18} {r['value']:9.4f} [{r['ci_low']:.4f}, {r['ci_high']:.4f}]  {r['a']} sharper on "
            f"{r['a_sharper_on']} of {r['k']} sets, {r['b']} on {r['b_sharper_on']}; pooled: {r['sharper']}"
            for r in pooled]


def sharpness_rows(res: dict[str, Any]) -> list[dict[str, Any]]:
    """``sharpness.csv``: every model's metrics with their heads, then every between-model difference."""
    rows = [{"model": m, "metric": k, "value": v["value"], **ci(bounds(v)),
             "scale": v["scale"], "heads": ",".join(d["aggregate_heads"] if k.startswith("aggregate")
                                                    else d["gather_heads"])}
            for m, d in (res.get("models") or {}).items() for k, v in d["metrics"].items()]
    return rows + [{"model": f"{r['a']} vs {r['b']}", "metric": r["metric"], "value": r["value"], **ci(bounds(r)),
                    "scale": r["scale"], "heads": r["sharper"]} for r in res.get("differences") or []]


def prompt_set_rows(res: dict[str, Any]) -> list[dict[str, Any]]:
    """``prompt_sets.csv``: each set's differences, then the pooled ones (none without prompt sets)."""
    def row(which: Any, seed: Any, r: dict[str, Any]) -> dict[str, Any]:
        return {"set": which, "seed": seed, "model": f"{r['a']} vs {r['b']}", "metric": r["metric"],
                "value": r["value"], **ci(bounds(r)), "sharper": r["sharper"]}

    if not res.get("pooled"):
        return []
    return ([row(i + 1, st["seed"], r) for i, st in enumerate(res["sets"]) for r in st["differences"]]
            + [row("pooled", "", r) for r in res["pooled"]])


def _forest(diffs: list[dict[str, Any]], path: Any) -> None:
    """One row per metric: ratio (log axis) or difference with its interval; right of the line
    means the first model is sharper."""
    plt = pyplot()
    ratios = [d for d in diffs if d["metric"] in RATIO_METRICS]
    plain = [d for d in diffs if d["metric"] not in RATIO_METRICS]
    fig, axes = plt.subplots(1, 2, figsize=(10, 0.45 * max(len(ratios), len(plain)) + 1.6))
    for ax, group, neutral, log in ((axes[0], ratios, 1.0, True), (axes[1], plain, 0.0, False)):
        for i, d in enumerate(group):
            lo, hi = bounds(d)
            color = "C0" if lo > neutral else "C3" if hi < neutral else "0.5"
            ax.errorbar([d["value"]], [i], xerr=[[d["value"] - lo], [hi - d["value"]]], fmt="o", color=color,
                        capsize=3)
        ax.axvline(neutral, color="k", lw=0.8, ls="--")
        ax.set_yticks(range(len(group)), [f"{d['metric']} ({d['b']})" if len(diffs) > len(METRICS) else d["metric"]
                                          for d in group], fontsize=8)
        if log:
            ax.set_xscale("log")
        ax.set_title(("ratio" if log else "difference") + f": {group[0]['a']} vs other" if group else "", fontsize=9)
        ax.grid(alpha=0.3)
    fig.suptitle("Sharpness, first model vs the other (blue: first sharper, red: other sharper, grey: undecided)",
                 fontsize=9)
    fig.tight_layout()
    save_figure(fig, path, tight=False)


#: what a sharpness result holds beside its settings (``config``): the measurement itself
MEASURED = ("models", "differences", "prompt_sets", "seeds", "sets", "pooled")


@dataclass
class SharpnessResult(ExperimentResult):
    """A ``sharpness`` comparison: each model's heads and metrics (``models``), the differences
    between the first model and each other (``differences``; with prompt sets also ``sets``,
    ``seeds`` and ``pooled``), the run's settings as ``config`` and ``sharpness.csv`` as ``rows``.
    The summary holds the first comparison's differences, each with its interval."""

    kind: str = "sharpness"
    title = "G&A map sharpness compared"  # ganda report's section
    table = "differences"  # ganda.results.load's rows

    @classmethod
    def of(cls, res: dict[str, Any]) -> SharpnessResult:
        """The result of :func:`compare_sharpness` or :func:`sharpness_sets` (a dict)."""
        res = split_all(res)
        diffs = res.get("differences") or []
        first = [r for r in diffs if r["b"] == diffs[0]["b"]]  # the first model against the second
        summary: dict[str, Any] = {"n": res.get("n"), "compared": f"{first[0]['a']} vs {first[0]['b']}" if first else None}
        for r in first:
            summary.update({r["metric"]: r["value"], **ci(bounds(r), r["metric"]),
                            r["metric"] + "_sharper": r["sharper"]})
        return cls(model=",".join(res.get("models") or {}), summary=summary, rows=sharpness_rows(res),
                   config={k: v for k, v in res.items() if k not in (*MEASURED, "kind")},
                   extra={k: res[k] for k in MEASURED if k in res})

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SharpnessResult:
        """A saved result; one that keeps its settings at the top level, without ``config``, too."""
        if "config" not in d:
            return cls.of(d)
        return super().from_json(d)  # type: ignore[return-value]

    def page(self) -> dict[str, Any]:
        """The ``result.json`` as written; one of the older layout as this class writes it (with no
        ``created``: that file does not say when it was)."""
        if self.written is None or "config" in self.written:
            return super().page()
        return {k: v for k, v in self.to_json().items() if k != "created"}

    def save(self, out_dir: str | Path, command: str | None = None) -> Path:
        """``result.json``, ``sharpness.csv``, ``sharpness.png`` and, with prompt sets, ``prompt_sets.csv``."""
        out = super().save(out_dir, command)
        if sets := prompt_set_rows(self.extra):
            runio.write_csv(out / "prompt_sets.csv", sets)
        return out

    def draw(self, out_dir: Path) -> list[Path]:
        """The forest plot of every between-model difference with its 95% interval."""
        diffs = self.extra.get("differences") or []
        if not diffs:
            return []
        _forest(diffs, Path(out_dir) / "sharpness.png")
        return [Path(out_dir) / "sharpness.png"]

    def headline(self) -> str:
        lines = []
        for r in self.extra.get("differences") or []:
            if r.get("metric") not in ("aggregate", "gather", "aggregate_peak", "gather_contrast"):
                continue
            lo, hi = bounds(r)
            decided = not str(r.get("sharper", "")).startswith("undecided")
            verdict = f"**{r['sharper']}** sharper" if decided else "**undecided** (the 95% interval covers no difference)"
            lines.append(f"{r['metric']}: {verdict}; {r.get('scale', '')} {r['value']:.3g} "
                         f"(95% CI {lo:.3g} to {hi:.3g}, n={self.config.get('n')}).")
        return "\n".join(lines)


@dataclass
class SharpnessOptions(Options):
    task: str = option("lab-mmlu", "a task with segments (lab-mmlu, letters, kv, ...)", short="-t")
    top: int = option(3, "heads per role and model", short="-k", low=1)
    select: str = option("pattern", "choose heads by 'pattern' score or causal 'drop'", choices=("pattern", "drop"))
    select_n: int | None = option(None, "prompts for choosing heads (seed --seed+1; default --limit)", low=1)
    resamples: int = option(2000, "bootstrap draws", low=1)
    prompt_sets: int = option(1, "run on K prompt sets (seeds --seed, +2, +4, ...) and pool every difference over "
                              "them", low=1, high=100, why="each one repeats the whole measurement")
    summary: str = option("end", "the token scored as a segment's summary: 'end' (the \\n, as in the paper) or "
                          "'last' (the last token before it)", choices=tuple(SUMMARIES))

    def check(self) -> None:
        get_task(self.task)  # an unknown task fails before the models load


class Sharpness(ScoredExperiment):
    """Sharpness of the top-k Aggregate/Gather heads of each model (softmax or implicit maps), with
    95% bootstrap intervals over prompts and the paired difference between models (MODELS: the first
    minus each other)."""

    name = "sharpness"
    inputs = "models"  # two or more models, the same prompts for each
    Options = SharpnessOptions
    default_out = "runs/sharpness"
    report_html = False  # result.json, sharpness.csv, sharpness.png

    def run_models(self, adapters: dict[str, ModelAdapter], options: SharpnessOptions, *, out_dir: Path,
                   run: Any) -> SharpnessResult:
        kw = dict(k=options.top, n=run.limit, select=options.select, select_n=options.select_n,
                  resamples=options.resamples, progress=run.progress, summary=options.summary)
        res = (sharpness_sets(adapters, options.task, prompt_sets=options.prompt_sets, seed=run.seed, **kw)
               if options.prompt_sets > 1 else compare_sharpness(adapters, options.task, seed=run.seed, **kw))
        return self.finish(SharpnessResult.of(res), out_dir)

    def show(self, result: SharpnessResult, options: SharpnessOptions, run: Any, out_dir: Path) -> None:  # type: ignore[override]
        for r in result.rows:
            print(f"{r['model']:>40}  {r['metric']:<18} {r['value']:9.4f}  [{r['ci_low']:.4f}, {r['ci_high']:.4f}]  "
                  f"{r['heads']}")
        if options.prompt_sets > 1:
            print(f"pooled over {options.prompt_sets} prompt sets (seeds {', '.join(map(str, result.extra['seeds']))}; "
                  "the rows above are set 1's):")
            for line in pooled_sharpness_lines(result.extra["pooled"]):
                print("  " + line)
        print(f"wrote {out_dir}/result.json, sharpness.csv" + (", prompt_sets.csv" if options.prompt_sets > 1 else "")
              + " and sharpness.png")

