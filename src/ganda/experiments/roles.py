"""Which heads Gather and which Aggregate, decided causally by *where* a head's output matters.

The paper's two roles differ in position: a Gather head writes each segment's summary into the
segment's tokens (positions before the answer), an Aggregate head reads those summaries *at the
final position*. So for each of the heads whose zero-ablation hurts the task most (a single-head
sweep ranks them), three ablations are scored on the same prompts:

* ``all``: the head zeroed at every position (the paper's ablation);
* ``query``: zeroed only at the final prompt position (what an Aggregate head does there);
* ``context``: zeroed everywhere except the final position (what a Gather head writes before it).

A head whose ``query`` ablation costs more than its ``context`` ablation is labelled
**aggregate**, the other way round **gather**; a control task (knowledge) is scored with the full
ablation to show the dissociation. Labels come from causal drops, not from attention maps, so
they also hold for heads whose maps are hard to read (SSM heads, small lab models). A head whose
full ablation costs less than ``min_drop`` is labelled ``-``, and one whose full ablation costs the
control task more than ``max_control_drop`` is labelled ``knowledge``: it carries what the task needs
to know, not how it is retrieved (the paper's G&A heads leave knowledge tasks alone).

Where the task's prompts have segments, each row also carries the head's **label** from the
labeller every command shares (:mod:`ganda.labels`): Gather or Aggregate only where the head's
attention pattern score reaches its minimum, else induction, previous-token, sink or none. The
causal role says where a head's ablation hurts; the label says what its attention does, so a head
that hurts at the final position without reading the gold summary is labelled none (the shipped
lab Transformers' heads, whose pattern scores stay far below the minimum).

The result also records the cumulative ablation of the ranked heads until the task is at chance
(how many heads must go), the measure of how concentrated the mechanism is.

``keep_layers`` finds the roles in a submodel, as the paper does: its heads are found in
Llama-3.1-8B cut to its minimal model (layers 0-17), where no later layer can stand in for them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..discovery import ablate_until_chance, added_heads, pattern_scores
from ..errors import GandaError
from ..figures import bars, curves, heatmap
from ..heads import HeadId
from ..intervals import bounds, ci
from ..interventions import AblateHeads, KeepLayers, apply
from ..labels import Label, label_model
from ..models.base import ModelAdapter
from ..progress import tqdm
from ..scoring import evaluate_examples
from ..stats import overlap
from ..sweep import run_sweep
from ..tasks.base import Example
from .common import ExperimentResult, pct, points

MODES = ("all", "query", "context")
# where a head's ablation hurts, by the causal role it points to
WHERE = {"aggregate": "at the final position", "gather": "before the final position"}


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
        if "heads_to_chance" in s:
            lines.append("Heads ablated together (most damaging first) to reach chance: "
                         f"**{s['heads_to_chance'] or 'more than ' + str(s.get('heads_to_chance_max'))}**.")
        return "\n".join(lines)

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
            x = [0] + [c["n_heads"] for c in cum]
            ys = [self.summary.get("baseline")] + [c["accuracy"] for c in cum]
            paths.append(curves(x, {task: ys}, Path(out_dir) / "cumulative.png", xlabel="heads ablated (ranked by drop)",
                                hlines={"chance": self.summary.get("chance", 0.0)},
                                title=f"Cumulative head ablation ({self.model})", integer_x=True,
                                point_labels={task: added_heads(cum)}))
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


def _acc(adapter: ModelAdapter, examples: Sequence[Example], ivs: list) -> tuple[float, list[float]]:
    r = evaluate_examples(adapter, examples, ivs, progress=False)
    return r.accuracy, [r.ci_low, r.ci_high]


def answers_lost(intact: dict[str, float | None], ablated: dict[str, float | None], drop: float = 0.5) -> list[str]:
    """Answer letters whose accuracy falls by at least ``drop`` under an ablation: the answers the
    head serves. lab-llama-wd's two Aggregate heads split the letters (L3H0: A, B; L3H1: D)."""
    return [k for k, v in ablated.items() if v is not None and intact.get(k) is not None and intact[k] - v >= drop]


def _labels(adapter: ModelAdapter, examples: Sequence[Example], rows: Sequence[dict[str, Any]]) -> dict[str, Label]:
    """The shared labeller's label of each row's head (:mod:`ganda.labels`): pattern scores on the
    task's prompts, and where the positional ablations hurt; none where the prompts have no segments."""
    if not rows or not all(ex.segments for ex in examples):
        return {}
    heads = [HeadId.parse(r["head"]) for r in rows]
    scores = pattern_scores(adapter, examples, heads, progress=False)
    for sc, r in zip(scores, rows, strict=True):
        sc.head = r["head"]  # the name the row uses
    drops = {r["head"]: {k: r[k] for k in ("drop_all", "drop_query", "drop_context")} for r in rows}
    return label_model(adapter, examples, scores, ablations=drops)


def head_roles(
    adapter: ModelAdapter,
    examples: Sequence[Example],
    *,
    control: Sequence[Example] | None = None,
    also: dict[str, Sequence[Example]] | None = None,
    ranked: Sequence[str] | None = None,
    top: int = 6,
    min_drop: float = 0.05,
    max_control_drop: float = 0.1,
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
    kept = None if keep_layers is None else sorted(set(keep_layers))
    with apply(adapter, [KeepLayers(kept)] if kept is not None else []):
        res = _head_roles(adapter, examples, control=control, also=also, ranked=ranked, top=top, min_drop=min_drop,
                          max_control_drop=max_control_drop, until_chance=until_chance, max_heads=max_heads,
                          task_name=task_name, control_name=control_name, progress=progress, kept=kept)
    if kept is not None:
        res.config["keep_layers"] = kept
    return res


def _head_roles(adapter, examples, *, control, also, ranked, top, min_drop, max_control_drop, until_chance,
                max_heads, task_name, control_name, progress, kept: list[int] | None) -> RolesResult:
    if not examples:
        raise GandaError("no examples to find head roles on")
    if any(len(ex.choices) < 2 for ex in examples):
        raise GandaError("head roles need multiple-choice examples")
    chance = sum(1 / len(ex.choices) for ex in examples) / len(examples)
    intact = evaluate_examples(adapter, examples, [], progress=False)
    base, base_ci = intact.accuracy, [intact.ci_low, intact.ci_high]
    base_answers = intact.answer_accuracy()
    sweep_drops: dict[str, float] = {}
    if ranked is None:
        sw = run_sweep(adapter, examples, progress=progress)  # every head of the running (kept) layers
        ranked = [r["head"] for r in sw.top(len(sw.records))]
        sweep_drops = {r["head"]: sw.drop(r) for r in sw.records}
    ranked = list(ranked)
    if kept is not None:
        outside = [h for h in ranked if HeadId.parse(str(h)).layer not in kept]
        if outside:
            raise GandaError(f"head {outside[0]} is in a layer the submodel does not keep ({kept})")
    control_base = _acc(adapter, control, [])[0] if control else None
    also = dict(also or {})
    also_base = {k: _acc(adapter, v, [])[0] for k, v in also.items()}
    rows: list[dict[str, Any]] = []
    for h in tqdm(ranked[:top], desc="head roles", disable=not progress, leave=False):
        row: dict[str, Any] = {"head": h}
        for m in MODES:
            r = evaluate_examples(adapter, examples, [AblateHeads(h, positions=None if m == "all" else m)],
                                  progress=False)
            row.update({m: r.accuracy, **ci((r.ci_low, r.ci_high), m)})
            row[f"drop_{m}"] = base - r.accuracy
            if m == "all":  # which answer letters this head serves
                row["answers"] = r.answer_accuracy()
                row["answers_lost"] = " ".join(answers_lost(base_answers, row["answers"]))
        if control:
            row["control"] = _acc(adapter, control, [AblateHeads(h)])[0]
            row["drop_control"] = control_base - row["control"]
        for k, exs in also.items():
            row[k] = _acc(adapter, exs, [AblateHeads(h)])[0]
            row[f"drop_{k}"] = also_base[k] - row[k]
        if row["drop_all"] < min_drop:
            row["role"] = "-"
        elif control and row["drop_control"] > max_control_drop:
            row["role"] = "knowledge"
        else:
            row["role"] = "aggregate" if row["drop_query"] > row["drop_context"] else "gather"
        rows.append(row)
    labels = _labels(adapter, examples, rows)
    for row in rows:
        lab = labels.get(row["head"])
        row["label"], row["label_reason"] = (lab.label, lab.reason) if lab else (None, None)
        for k in ("aggregate", "gather"):  # the pattern scores the label was given
            row[f"{k}_score"] = lab.scores.get(k) if lab else None
    summary: dict[str, Any] = {"baseline": base, **ci(base_ci, "baseline"), "chance": chance, "n": len(examples),
                               "control_baseline": control_base, **{f"{k}_baseline": v for k, v in also_base.items()},
                               "baseline_answers": base_answers,
                               "labels": {r["head"]: r["label"] for r in rows if r["label"] is not None}}
    for role in ("gather", "aggregate"):
        cands = [r for r in rows if r["role"] == role]
        best = min(cands, key=lambda r: r["all"]) if cands else None
        summary[role] = best["head"] if best else None
        summary[f"{role}_ablated"] = best["all"] if best else None
        summary.update(ci((best["all_ci_low"], best["all_ci_high"]) if best else None, f"{role}_ablated"))
        summary[f"{role}_control_drop"] = best.get("drop_control") if best else None
        summary[f"{role}_answers_lost"] = best["answers_lost"] if best else None
        summary[f"{role}_heads"] = [r["head"] for r in cands]
        if len(cands) > 1:
            # a role split over several heads (lab-llama-wd's two last-layer Aggregate heads: 51.5%
            # and 64.5% alone, 24% together): what removing all of them does
            ivs = [AblateHeads(summary[f"{role}_heads"])]
            together = evaluate_examples(adapter, examples, ivs, progress=False)
            summary[f"{role}_together"] = together.accuracy
            summary[f"{role}_together_answers"] = together.answer_accuracy()
            if control:
                summary[f"{role}_together_control_drop"] = control_base - _acc(adapter, control, ivs)[0]
    extra: dict[str, Any] = {}
    if until_chance:
        cum = ablate_until_chance(adapter, examples, ranked, chance=chance, max_heads=max_heads, progress=progress)
        reached = bool(cum) and cum[-1]["accuracy"] <= chance + 0.05
        summary["heads_to_chance"] = cum[-1]["n_heads"] if reached else None
        summary["heads_to_chance_max"] = max_heads
        extra["cumulative"] = cum
    if sweep_drops:
        extra["sweep_drops"] = sweep_drops
    return RolesResult(
        model=adapter.spec, rows=rows, summary=summary, extra=extra,
        config={"task": task_name, "control": control_name, "also": list(also), "top": top, "min_drop": min_drop,
                "max_control_drop": max_control_drop,
                "ranked": list(ranked[:top])},
    )
