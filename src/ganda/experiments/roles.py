"""Which heads Gather and which Aggregate, decided causally by *where* a head's output matters.

The paper's two roles differ in position: a Gather head writes each segment's summary into the
segment's tokens (positions before the answer), an Aggregate head reads those summaries *at the
final position*. So for each of the heads whose zero-ablation hurts the task most (a single-head
sweep ranks them), three ablations are scored on the same prompts:

* ``all``: the head zeroed at every position (the paper's ablation);
* ``query``: zeroed only at the final prompt position (what an Aggregate head does there);
* ``context``: zeroed everywhere except the final position (what a Gather head writes before it).

A head whose ``query`` ablation costs more than its ``context`` ablation has the causal role
**aggregate**, the other way round **gather**; a control task (knowledge) is scored with the full
ablation to show the dissociation. The rule is the labeller's (:func:`ganda.labels.causal_role`,
the one it applies where both G&A patterns qualify): causal roles come from drops, not from
attention maps, so they also hold for heads whose maps are hard to read (SSM heads, small lab
models). A head whose full ablation costs less than ``min_drop`` has the role ``-``, and one whose
full ablation costs the control task more than ``max_control_drop`` the role ``knowledge``: it
carries what the task needs to know, not how it is retrieved (the paper's G&A heads leave
knowledge tasks alone).

Where the task's prompts have segments, each row also carries the head's **label** from the
labeller every command shares (:mod:`ganda.labels`): every role whose rule its scores meet
(Gather, Aggregate at the summary token the model reads; induction, previous-token, sink on
repeated random tokens), or none. The causal role says where a head's ablation hurts; the label
says what its attention does, so a head that hurts at the final position without reading the gold
segment is not labelled Aggregate (lab-hybrid-late-7k5's L3H3, whose final row reads the
question's entity: docs/heads.md).

The result also records the cumulative ablation of the ranked heads until the task is at chance
(how many heads must go), the measure of how concentrated the mechanism is.

``keep_layers`` finds the roles in a submodel, as the paper does: its heads are found in
Llama-3.1-8B cut to its minimal model (layers 0-17), where no later layer can stand in for them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from .. import runio
from ..errors import GandaError
from ..figures import bars, heatmap
from ..heads import HeadId
from ..intervals import bounds, ci
from ..interventions import AblateHeads, KeepLayers, apply, parse_layers
from ..labels import MAX_CONTROL_DROP, MIN_DROP, WHERE, Label, causal_role, label_model
from ..models.base import ModelAdapter
from ..patterns import AUTO, pattern_scores
from ..progress import tqdm
from ..scoring import EvalResult, evaluate_examples
from ..stats import overlap
from ..sweep import run_sweep
from ..tasks import get_task
from ..tasks.base import Example
from .base import Options, ScoredExperiment, option
from .common import (
    ExperimentResult,
    paired_difference,
    paired_drop,
    pct,
    per_prompt,
    points,
    points_ci,
    pool_over,
    prompt_sets,
)
from .cumulative import cumulative_ablation, curve_figure

#: where a mode ablates: everywhere, at the final position (the last prompt token and the answer's own
#: tokens after it: every position that predicts an answer token, ganda.sites' ``final``) and every
#: position before it; the last two split each scored row
MODES = {"all": None, "query": "final", "context": "context"}


@dataclass
class RolesResult(ExperimentResult):
    kind: str = "roles"

    def headline(self) -> str:
        s, lines = self.summary, []
        for role in ("gather", "aggregate"):
            if s.get(role):
                a, b = bounds(s, "baseline"), bounds(s, f"{role}_ablated")
                weak = (" — *weak*: its 95% interval overlaps the intact one"
                        if None not in (*a, *b) and overlap(a, b) else "")
                label = (s.get("labels") or {}).get(s[role])
                lines.append(f"Hurts most {WHERE[role]}: **{s[role]}**"
                             + (f" (label: {label})" if label else "") + f": {pct(s.get('baseline'))} → "
                             f"**{pct(s.get(f'{role}_ablated'))}**{weak} (control task "
                             f"{points(-(s.get(f'{role}_control_drop') or 0))} change); heads that hurt there: "
                             f"{', '.join(s.get(f'{role}_heads') or [])}.")
        if s.get("baseline_at_chance"):
            lines.append("Heads ablated together to reach chance: none measured: the intact model is already at "
                         f"chance ({pct(s.get('baseline'))}).")
        elif "heads_to_chance" in s:
            lines.append("Heads ablated together (most damaging first) to reach chance: "
                         f"**{s['heads_to_chance'] or 'more than ' + str(s.get('heads_to_chance_max'))}**.")
        lines += sets_lines(self.extra)
        return "\n".join(lines)

    def save(self, out_dir: str | Path, command: str | None = None) -> Path:
        """:meth:`ExperimentResult.save`, and ``prompt_sets.csv`` when the run has several prompt sets."""
        out = super().save(out_dir, command)
        if self.extra.get("sets"):
            runio.write_csv(out / "prompt_sets.csv", set_rows(self.extra))
        return out

    def draw(self, out_dir: Path) -> list[Path]:
        task = self.config.get("task", "task")
        control = self.config.get("control")
        rows = self.rows
        labels = [f"{r['head']} ({r.get('label') or r['role']})" for r in rows]
        series = {f"{task}, ablated at {m}": [r[f"{m}"] for r in rows] for m in MODES}
        if control:
            series[f"{control}, ablated at all"] = [r.get("control") for r in rows]
        hl = {f"{task} intact": self.summary.get("baseline"), "chance": self.summary.get("chance")}
        paths = [bars(labels, series, Path(out_dir) / "roles.png", hlines={k: v for k, v in hl.items() if v is not None},
                      rotate=45 if len(labels) > 4 else 0,
                      title=f"Where each head matters ({self.model}): all / final position only / before it")]
        cum = self.extra.get("cumulative") or []
        if cum:
            s = self.summary
            base = SimpleNamespace(accuracy=s.get("baseline"), ci_low=s.get("baseline_ci_low"),
                                   ci_high=s.get("baseline_ci_high"))
            paths.append(curve_figure(cum, base, s.get("chance", 0.0), Path(out_dir) / "cumulative.png", series=task,
                                      xlabel="heads ablated (ranked by drop)", title=f"Cumulative head ablation ({self.model})"))
        base_answers = self.summary.get("baseline_answers")
        if base_answers and rows and all(r.get("answers") for r in rows):
            letters = list(base_answers)
            grid = [[base_answers[k] for k in letters]] + [[r["answers"].get(k) for k in letters] for r in rows]
            grid = [[float("nan") if v is None else v for v in line] for line in grid]
            paths.append(heatmap(grid, Path(out_dir) / "roles_by_answer.png", xlabels=letters,
                                 ylabels=["intact"] + labels, xlabel="gold answer", cmap="viridis",
                                 colorbar_label=f"{task} accuracy",
                                 title=f"Which answers each head serves ({self.model})"))
        return paths


def _acc(adapter: ModelAdapter, examples: Sequence[Example], ivs: list) -> float:
    return evaluate_examples(adapter, examples, ivs, progress=False).accuracy


def answers_lost(intact: dict[str, float | None], ablated: dict[str, float | None], drop: float = 0.5) -> list[str]:
    """Answer letters whose accuracy falls by at least ``drop`` under an ablation: the answers the
    head serves. lab-llama-wd's two Aggregate heads split the letters (L3H0: A, B; L3H1: D)."""
    return [k for k, v in ablated.items() if v is not None and intact.get(k) is not None and intact[k] - v >= drop]


def _labels(adapter: ModelAdapter, examples: Sequence[Example], rows: Sequence[dict[str, Any]],
            min_drop: float = MIN_DROP) -> dict[str, Label]:
    """The shared labeller's label of each row's head (:mod:`ganda.labels`): pattern scores on the
    task's prompts, and where the positional ablations hurt; none where the prompts have no segments."""
    if not rows or not all(ex.segments for ex in examples):
        return {}
    heads = [HeadId.parse(r["head"]) for r in rows]
    scores = pattern_scores(adapter, examples, heads, progress=False, summary=AUTO)
    for sc, r in zip(scores, rows, strict=True):
        sc.head = r["head"]  # the name the row uses
    drops = {r["head"]: {k: r[k] for k in ("drop_all", "drop_query", "drop_context")} for r in rows}
    return label_model(adapter, scores, ablations=drops, min_drop=min_drop)


def head_roles(
    adapter: ModelAdapter,
    examples: Sequence[Example],
    *,
    control: Sequence[Example] | None = None,
    also: dict[str, Sequence[Example]] | None = None,
    ranked: Sequence[str] | None = None,
    top: int = 6,
    min_drop: float = MIN_DROP,
    max_control_drop: float = MAX_CONTROL_DROP,
    until_chance: bool = True,
    max_heads: int = 24,
    task_name: str = "task",
    control_name: str | None = None,
    progress: bool = True,
    keep_layers: Sequence[int] | None = None,
) -> RolesResult:
    """Label the ``top`` most damaging heads Gather or Aggregate (module docstring).

    ``ranked``: heads in order of damage (default: a single-head sweep on ``examples``);
    ``also``: further tasks scored with the full ablation (e.g. the letters task);
    ``keep_layers``: run every evaluation on the submodel of these layers (e.g. the minimal model
    ``range(18)``); heads keep their layer indices and only the kept layers' heads are ranked."""
    if not examples:
        raise GandaError("no examples to find head roles on")
    if any(len(ex.choices) < 2 for ex in examples):
        raise GandaError("head roles need multiple-choice examples")
    kept = None if keep_layers is None else sorted(set(keep_layers))
    also = dict(also or {})
    with apply(adapter, [KeepLayers(kept)] if kept is not None else []):
        chance = sum(1 / len(ex.choices) for ex in examples) / len(examples)
        intact = evaluate_examples(adapter, examples, [], progress=False)
        ranked, sweep_drops = _ranked(adapter, examples, ranked, kept, progress)
        control_base = _acc(adapter, control, []) if control else None
        also_base = {k: _acc(adapter, v, []) for k, v in also.items()}
        rows = [_role_row(adapter, examples, h, intact, control, control_base, also, also_base, min_drop,
                          max_control_drop) for h in tqdm(ranked[:top], desc="head roles", disable=not progress,
                                                          leave=False)]
        _add_labels(rows, _labels(adapter, examples, rows, min_drop))
        summary: dict[str, Any] = {
            "baseline": intact.accuracy, **ci((intact.ci_low, intact.ci_high), "baseline"), "chance": chance,
            "n": len(examples), "control_baseline": control_base, **{f"{k}_baseline": v for k, v in also_base.items()},
            "baseline_answers": intact.answer_accuracy(),
            "labels": {r["head"]: r["label"] for r in rows if r["label"] is not None}}
        for role in ("gather", "aggregate"):
            summary.update(_role_summary(adapter, examples, role, rows, control, control_base))
        extra: dict[str, Any] = {}
        if until_chance:
            to_chance, extra = _to_chance(adapter, examples, ranked, intact, max_heads, progress)
            summary.update(to_chance)
    if sweep_drops:
        extra["sweep_drops"] = sweep_drops
    return RolesResult(
        model=adapter.spec, rows=rows, summary=summary, extra=extra,
        config={"task": task_name, "control": control_name, "also": list(also), "top": top, "min_drop": min_drop,
                "max_control_drop": max_control_drop, "ranked": list(ranked[:top]),
                **({"keep_layers": kept} if kept is not None else {})},
    )


def _to_chance(adapter: ModelAdapter, examples: Sequence[Example], ranked: Sequence[str], intact: Any,
               max_heads: int, progress: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """How many heads, ablated together in ranked order, take the task to chance
    (:func:`ganda.experiments.cumulative.cumulative_ablation`, from ``intact``, the intact model's
    result already scored): the summary's entries, and the curve (none where the intact model is
    already at chance: there is no head count to chance)."""
    cum = cumulative_ablation(adapter, examples, ranked, max_heads=max_heads, progress=progress, base=intact)
    if cum["baseline_at_chance"]:
        return {"baseline_at_chance": True, "heads_to_chance_max": max_heads}, {}
    return {"heads_to_chance": cum["heads_to_chance"], "heads_to_chance_max": max_heads}, {"cumulative": cum["curve"]}


def _ranked(adapter: ModelAdapter, examples: Sequence[Example], ranked: Sequence[str] | None,
            kept: list[int] | None, progress: bool) -> tuple[list[str], dict[str, float]]:
    """The heads in order of damage: ``ranked``, or a single-head sweep's order (with each head's
    drop) over every head of the running (kept) layers; a head outside the kept layers is refused."""
    sweep_drops: dict[str, float] = {}
    if ranked is None:
        sw = run_sweep(adapter, examples, progress=progress)
        ranked = [r["head"] for r in sw.top(len(sw.records))]
        sweep_drops = {r["head"]: sw.drop(r) for r in sw.records}
    if kept is not None:
        outside = [h for h in ranked if HeadId.parse(str(h)).layer not in kept]
        if outside:
            raise GandaError(f"head {outside[0]} is in a layer the submodel does not keep ({kept})")
    return list(ranked), sweep_drops


def _role_row(adapter: ModelAdapter, examples: Sequence[Example], h: str, intact: Any,
              control: Sequence[Example] | None, control_base: float | None, also: dict[str, Sequence[Example]],
              also_base: dict[str, float], min_drop: float, max_control_drop: float) -> dict[str, Any]:
    """One head's row: its three positional ablations on the task (accuracy, interval, drop, and
    under the full one the answer letters it serves), the control and further tasks under the full
    ablation, and its causal role."""
    base, base_answers = intact.accuracy, intact.answer_accuracy()
    row: dict[str, Any] = {"head": h}
    for m, r in _mode_runs(adapter, examples, h).items():
        row.update({m: r.accuracy, **ci((r.ci_low, r.ci_high), m)})
        row[f"drop_{m}"] = base - r.accuracy
        if m == "all":  # which answer letters this head serves
            row["answers"] = r.answer_accuracy()
            row["answers_lost"] = " ".join(answers_lost(base_answers, row["answers"]))
    if control:
        row["control"] = _acc(adapter, control, [AblateHeads(h)])
        row["drop_control"] = control_base - row["control"]
    for k, exs in also.items():
        row[k] = _acc(adapter, exs, [AblateHeads(h)])
        row[f"drop_{k}"] = also_base[k] - row[k]
    row["role"] = causal_role(row, control_drop=row["drop_control"] if control else None, min_drop=min_drop,
                              max_control_drop=max_control_drop)
    return row


def _add_labels(rows: list[dict[str, Any]], labels: dict[str, Label]) -> None:
    """Each row's label, its reason and the pattern scores it was given (None where unlabelled)."""
    for row in rows:
        lab = labels.get(row["head"])
        row["label"], row["label_reason"] = (lab.label, lab.reason) if lab else (None, None)
        for k in ("aggregate", "gather"):  # the pattern scores the label was given
            row[f"{k}_score"] = lab.scores.get(k) if lab else None
        for k in ("gather_evidence", "induction", "previous_token", "sink"):
            row[k] = lab.scores.get(k) if lab else None


def _role_summary(adapter: ModelAdapter, examples: Sequence[Example], role: str, rows: list[dict[str, Any]],
                  control: Sequence[Example] | None, control_base: float | None) -> dict[str, Any]:
    """A role's entries of the summary: its most damaging head and what ablating it costs, every
    head with the role, and, where several share it, all of them ablated together."""
    cands = [r for r in rows if r["role"] == role]
    best = min(cands, key=lambda r: r["all"]) if cands else None
    out: dict[str, Any] = {
        role: best["head"] if best else None, f"{role}_ablated": best["all"] if best else None,
        **ci((best["all_ci_low"], best["all_ci_high"]) if best else None, f"{role}_ablated"),
        f"{role}_control_drop": best.get("drop_control") if best else None,
        f"{role}_answers_lost": best["answers_lost"] if best else None, f"{role}_heads": [r["head"] for r in cands]}
    if len(cands) > 1:
        # a role split over several heads (lab-llama-wd's two last-layer Aggregate heads: 51.5%
        # and 64.5% alone, 24% together): what removing all of them does
        ivs = [AblateHeads(out[f"{role}_heads"])]
        together = evaluate_examples(adapter, examples, ivs, progress=False)
        out[f"{role}_together"] = together.accuracy
        out[f"{role}_together_answers"] = together.answer_accuracy()
        if control:
            out[f"{role}_together_control_drop"] = control_base - _acc(adapter, control, ivs)
    return out


FINDING = ("the head's ablation costs accuracy (paired drop, 95% interval above 0) and costs more where its role "
           "says (Aggregate: at the final position; Gather: before it)")


def _mode_runs(adapter: ModelAdapter, examples: Sequence[Example], head: str) -> dict[str, EvalResult]:
    """The head ablated in each of :data:`MODES`: at every position, only at the final one, and
    everywhere before it."""
    return {m: evaluate_examples(adapter, examples, [AblateHeads(head, positions=at)], progress=False)
            for m, at in MODES.items()}


def _mode_rows(adapter: ModelAdapter, examples: Sequence[Example], head: str, base: EvalResult, seed: int
               ) -> dict[str, dict[str, Any]]:
    """Each of the head's :func:`_mode_runs`: its accuracy and paired drop from the intact ``base``
    (bootstrap over prompts), and ``where``: the query-minus-context cost."""
    runs = _mode_runs(adapter, examples, head)
    out = {m: {"n": r.n, **paired_drop(base, r, seed)} for m, r in runs.items()}
    # query drop minus context drop
    out["where"] = paired_difference(per_prompt(runs["context"]), per_prompt(runs["query"]), seed)
    return out


def _holds(role: str, modes: dict[str, dict[str, Any]]) -> bool:
    """:data:`FINDING` on one prompt set."""
    sign = 1 if role == "aggregate" else -1
    low, high = bounds(modes["where"], "drop")
    return modes["all"]["drop_ci_low"] > 0 and (low > 0 if sign > 0 else high < 0)


def role_sets(adapter: ModelAdapter, draw: Callable[[int | None, int], list[Example]], summary: dict[str, Any], *,
              limit: int | None, seed: int, count: int, keep_layers: Sequence[int] | None = None) -> dict[str, Any]:
    """The roles found on prompt set 1 measured again on ``count`` prompt sets (set k: seed
    ``seed + k``, prompts disjoint from earlier sets where the task allows:
    :func:`ganda.experiments.common.prompt_sets`): per set and role head, its three ablations'
    accuracy and paired drop, and whether :data:`FINDING` holds; per role, the drops pooled over
    the sets (:func:`ganda.stats.pool_sets`) and on how many sets the finding holds. ``draw`` is the
    task's ``examples``, ``(limit, seed) -> examples``."""
    heads = {role: summary[role] for role in ("gather", "aggregate") if summary.get(role)}
    sets = []
    with apply(adapter, [KeepLayers(sorted(set(keep_layers)))] if keep_layers is not None else []):
        for k, (examples, disjoint) in enumerate(prompt_sets(draw, limit, seed, count)):
            base = evaluate_examples(adapter, examples, progress=False)
            measured = {role: _mode_rows(adapter, examples, h, base, seed + k) for role, h in heads.items()}
            sets.append({"set": k + 1, "seed": seed + k, "disjoint": disjoint, "n": len(examples),
                         "roles": {role: {"head": heads[role], "holds": _holds(role, m), **m}
                                   for role, m in measured.items()}})
    return {"sets": sets, "seeds": [seed + k for k in range(count)], **_pool_roles(sets, heads)}


def _pool_roles(sets: list[dict[str, Any]], heads: dict[str, str]) -> dict[str, Any]:
    """Each role head's drops pooled over the sets, and on how many sets its finding holds."""
    pooled, findings = [], {}
    for role, head in heads.items():
        for mode in (*MODES, "where"):
            each = [s["roles"][role][mode] for s in sets]
            p = pool_over(each, "drop", within=(-1.0, 1.0))
            row = {"role": role, "head": head, "mode": mode, "n": sum(s["n"] for s in sets),
                   "drop": p["estimate"], **ci(bounds(p), "drop"), "between_sd": p["between_sd"]}
            if mode != "where":
                a = pool_over(each, "accuracy", within=(0.0, 1.0), interval="")
                row.update({"accuracy": a["estimate"], **ci(bounds(a))})
            pooled.append(row)
        holds = [s["roles"][role]["holds"] for s in sets]
        findings[role] = {"head": head, "criterion": FINDING, "holds": holds, "holds_on": sum(holds), "k": len(sets)}
    return {"pooled": pooled, "findings": findings}


def sets_lines(extra: dict[str, Any]) -> list[str]:
    """Per role, on how many prompt sets its finding holds, where it does not, and the pooled drop."""
    sets = extra.get("sets") or []
    if len(sets) < 2:
        return []
    lines = []
    for role, f in (extra.get("findings") or {}).items():
        p = next(r for r in extra["pooled"] if r["role"] == role and r["mode"] == "all")
        misses = [f"set {s['set']} (seed {s['seed']}): drop {points_ci(s['roles'][role]['all'])}, final position minus "
                  f"before it {points_ci(s['roles'][role]['where'])}" for s, ok in zip(sets, f["holds"], strict=True) if not ok]
        lines.append(f"{role.capitalize()} head {f['head']}: holds on **{f['holds_on']} of {f['k']}** prompt sets "
                     f"(seeds {extra['seeds'][0]}-{extra['seeds'][-1]})" + (f"; not on {'; '.join(misses)}" if misses else "")
                     + f"; pooled drop {points_ci(p)}.")
    return lines


def set_rows(extra: dict[str, Any]) -> list[dict[str, Any]]:
    """``prompt_sets.csv``: one row per prompt set, role head and ablation, then a pooled row for each."""
    rows = [{"set": s["set"], "seed": s["seed"], "disjoint": s["disjoint"], "role": role, "head": r["head"], "mode": m,
             "n": s["n"], **{k: v for k, v in r[m].items() if k != "n"}, "holds": r["holds"]}
            for s in extra["sets"] for role, r in s["roles"].items() for m in (*MODES, "where")]
    return rows + [{"set": "pooled", "seed": ",".join(map(str, extra["seeds"])), "disjoint": "",
                    **r, "holds": extra["findings"][r["role"]]["holds_on"]} for r in extra["pooled"]]


@dataclass
class RolesOptions(Options):
    task: str = option("lab-mmlu", "multiple-choice task the heads are ranked on", short="-t")
    control: str | None = option("lab-knowledge", "control task scored with the full ablation (knowledge); 'none' "
                                 "to skip")
    also: str | None = option(None, "further tasks scored with the full ablation, e.g. lab-letters")
    top: int = option(6, "heads labelled (the most damaging of a single-head sweep)", low=1)
    max_heads: int = option(24, "cumulative ablation gives up after this many heads", low=1)
    keep_layers: str | None = option(None, "find the roles in a submodel, e.g. the minimal model 0-17 (the paper's "
                                     "protocol)")
    sample: bool = option(False, "mmlu: --limit N draws a seeded sample (--seed) of N questions across the subjects "
                          "instead of lm-eval's first N of each subject")
    prompt_sets: int = option(1, "prompt sets the roles found on set 1 are measured on (set k: seed seed+k, prompts "
                              "disjoint where the task allows), pooled and counted", low=1, high=100,
                              why="each one repeats the whole measurement")

    def controls(self) -> tuple[str | None, list[str]]:
        """The control task (None: none) and the further tasks."""
        ctrl = None if self.control in (None, "", "none") else self.control
        return ctrl, [t.strip() for t in (self.also or "").split(",") if t.strip()]

    def check(self) -> None:
        if self.keep_layers:
            parse_layers(self.keep_layers)
        ctrl, more = self.controls()
        for name in [self.task, *([ctrl] if ctrl else []), *more]:
            get_task(name)  # an unknown task name fails before the model loads


class Roles(ScoredExperiment):
    """Where ablating each of the most damaging heads hurts (final position or before it) and each
    head's label (docs/heads.md), with a control task and the number of heads it takes to reach chance."""

    name = "roles"
    inputs = "model"  # its task, control and further tasks are options of its own
    Options = RolesOptions

    def run_tasks(self, adapter: ModelAdapter, scorer: Any, options: RolesOptions, *, out_dir: Path,  # type: ignore[override]
                  run: Any) -> RolesResult:
        def task(name: str) -> Any:
            t = get_task(name, adapter=adapter, **({"sample": True} if options.sample and name == "mmlu" else {}))
            if t.kind != "mc":
                raise GandaError(f"task {name!r} is not multiple-choice")
            return t

        def exs(name: str) -> list[Example]:
            return task(name).examples(limit=run.limit, seed=run.seed)

        ctrl, more = options.controls()
        keep = parse_layers(options.keep_layers) if options.keep_layers else None
        result = head_roles(adapter, exs(options.task), control=exs(ctrl) if ctrl else None,
                            also={t: exs(t) for t in more}, top=options.top, max_heads=options.max_heads,
                            task_name=options.task, control_name=ctrl, progress=run.progress, keep_layers=keep)
        result.config.update({"limit": run.limit, "seed": run.seed})
        if options.prompt_sets > 1:
            t = task(options.task)
            sets = role_sets(adapter, lambda n, s: t.examples(limit=n, seed=s), result.summary, limit=run.limit,
                             seed=run.seed, count=options.prompt_sets, keep_layers=keep)
            result.extra.update(sets)
            result.config["prompt_sets"] = options.prompt_sets
            result.summary.update({"seeds": sets["seeds"],
                                   "holds_on": {r: f["holds_on"] for r, f in sets["findings"].items()}})
        return self.finish(result, out_dir)

    def show(self, result: RolesResult, options: RolesOptions, run: Any, out_dir: Path) -> None:  # type: ignore[override]
        super().show(result, options, run, out_dir)
        s, (ctrl, _) = result.summary, options.controls()
        for role in ("gather", "aggregate"):
            if s.get(role):
                label = (s.get("labels") or {}).get(s[role])
                print(f"hurts most {WHERE[role]}: {s[role]}" + (f" (label {label})" if label else "")
                      + f": {options.task} {s['baseline']:.3f} -> {s[f'{role}_ablated']:.3f}"
                      + (f", {ctrl} drop {s[f'{role}_control_drop']:+.3f}" if ctrl else "")
                      + (f"; answers it serves: {s[f'{role}_answers_lost']}" if s.get(f"{role}_answers_lost") else ""))
        if "heads_to_chance" in s:
            n_heads = s["heads_to_chance"] or f"more than {s['heads_to_chance_max']}"
            print(f"heads to chance: {n_heads}")
        for line in sets_lines(result.extra):
            print(line.replace("**", ""))

