"""``ganda heads``: every head scored by its G&A patterns (:mod:`ganda.patterns`, at the summary
token the model reads) and labelled by the one labeller (:mod:`ganda.labels`), the top candidates
of each role verified by ablation.

Causal verification zero-ablates the top candidates one at a time and measures the drop in task
accuracy, which is what decides whether a head matters; the pattern says what it does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import runio
from ..errors import GandaError
from ..heads import HeadId
from ..labels import label_model
from ..models.base import ModelAdapter
from ..patterns import (
    AUTO,
    CI_METHOD,
    METRICS,
    MIN_AGGREGATE,
    SUMMARY_TOKENS,
    HeadScore,
    standard_protocol,
    summary_scores,
)
from ..stats import weak_note
from ..sweep import run_sweep
from ..tasks.base import Example
from .base import Experiment, Options, option
from .common import ExperimentResult, pct
from .tables import console, print_heads


@dataclass
class Discovery:
    task: dict[str, Any]
    baseline_accuracy: float
    n_pattern: int
    n_verify: int
    scores: list[HeadScore]
    top_aggregate: list[str]
    top_gather: list[str]
    summary: str = "end"  # the summary token scored (chosen where "auto" was asked)
    # per candidate summary token, its best head's Aggregate score (where "auto" chose)
    summary_choice: dict[str, Any] = field(default_factory=dict)
    standard: dict[str, Any] = field(default_factory=dict)  # the standard scores' protocol


def discover(
    adapter: ModelAdapter,
    pattern_examples: Sequence[Example],
    verify_examples: Sequence[Example],
    *,
    top: int = 5,
    task_config: dict[str, Any] | None = None,
    progress: bool = True,
    summary: str = AUTO,
) -> Discovery:
    """Rank heads by pattern scores (at the summary token the model reads, unless ``summary``
    names one), then verify the top ``top`` of each list by ablation; every head is labelled by
    :func:`ganda.labels.label_model` with its standard scores (a candidate is not a Gather or
    Aggregate head unless its rule is met)."""
    scores, chosen, choice = summary_scores(adapter, pattern_examples, progress=progress, summary=summary)
    label_model(adapter, scores)
    by_name = {s.head: s for s in scores}
    top_agg = [s.head for s in sorted(scores, key=lambda s: -s.aggregate)[:top]]
    top_gat = [s.head for s in sorted(scores, key=lambda s: -s.gather)[:top]]
    # gather heads must sit before some aggregate candidate to feed it; we still verify them all.
    # Single-head ablations through the sweep engine: the same numbers as
    # ``evaluate_examples(..., [AblateHeads([h])])`` per head (tested), several times faster.
    to_verify = list(dict.fromkeys(top_agg + top_gat))
    sw = run_sweep(adapter, verify_examples, heads=[HeadId.parse(h) for h in to_verify], progress=progress)
    by_str = {rec["head"]: rec for rec in sw.records}
    for name in to_verify:
        rec = by_str[str(adapter.canonical(HeadId.parse(name)))]
        by_name[name].ablated_accuracy = rec["acc"]
        by_name[name].drop = sw.drop(rec)
    return Discovery(
        task=task_config or {}, baseline_accuracy=sw.baseline["acc"], n_pattern=len(pattern_examples),
        n_verify=len(verify_examples), scores=scores, top_aggregate=top_agg, top_gather=top_gat,
        summary=chosen, summary_choice=choice, standard=standard_protocol(adapter),
    )


def save_discovery(d: Discovery, out: Any, model: str) -> None:
    """``result.json`` (kind ``heads``), ``heads.csv`` (every head, sorted by aggregate score, with
    ``<metric>_ci_low`` / ``<metric>_ci_high`` intervals, its standard scores and label) and
    ``per_prompt.csv`` (every head's metrics on every prompt)."""
    ordered = sorted(d.scores, key=lambda s: -s.aggregate)
    rows = [s.to_json() for s in ordered]
    verified = [r for r in rows if r["drop"] is not None]
    summary = {
        "baseline_accuracy": d.baseline_accuracy, "n_pattern": d.n_pattern, "n_verify": d.n_verify,
        "top_aggregate": d.top_aggregate, "top_gather": d.top_gather, "ci_method": CI_METHOD,
        "summary_token": d.summary, "summary_choice": d.summary_choice, "standard_protocol": d.standard,
        "labels": {s.head: s.label for s in ordered if s.label not in (None, "none")},
    }
    out = HeadsResult(model=model, config=d.task, summary=summary, rows=verified, extra={"all_heads": rows}).save_json(out)
    runio.write_csv(out / "heads.csv", [s.csv_row() for s in ordered])
    runio.write_csv(out / "per_prompt.csv", [{"head": s.head, "prompt": i, **{k: s.samples[k][i] for k in METRICS}}
                                       for s in ordered if s.samples for i in range(s.n_prompts)])


@dataclass
class HeadsResult(ExperimentResult):
    """A saved ``heads`` run (:func:`save_discovery`) as ``ganda report`` shows it: what was found
    (``rows``: the verified heads; ``extra["all_heads"]``: every head)."""

    kind: str = "heads"

    title = "Heads ranked by Gather and Aggregate pattern scores"  # ganda report's section

    def headline(self) -> str:
        s, lines = self.summary, []
        base, n = s.get("baseline_accuracy"), s.get("n_verify")
        by = {r["head"]: r for r in self.rows if r.get("drop") is not None}
        for role in ("gather", "aggregate"):
            cands = [by[h] for h in s.get(f"top_{role}") or [] if h in by]
            if not cands:
                continue
            best = max(cands, key=lambda r: r["drop"])
            lines.append(f"{role.capitalize()} head **{best['head']}** ({role} score {best[role]:.3g}, best of "
                         f"{len(cands)} verified): ablating it alone takes accuracy from {pct(base)} to "
                         f"**{pct(best.get('ablated_accuracy'))}** on {n} prompts"
                         f"{weak_note(base, best.get('ablated_accuracy'), n)}.")
        if lines:
            lines.append(f"Every head ranked by its pattern scores on {s.get('n_pattern')} prompts; the table lists "
                         "the verified ones, heads.csv all of them.")
        lines += self.label_lines()
        return "\n".join(lines)

    def label_lines(self) -> list[str]:
        """The summary token scored, and how many heads take each role (:mod:`ganda.labels`),
        with the standard protocol the task-free scores were measured by."""
        s = self.summary
        if "summary_token" not in s:
            return []
        labels = [str(h.get("label") or "none") for h in self.extra.get("all_heads") or self.rows]
        counts = {r: sum(r in lab.split("+") for lab in labels) for r in ("Gather", "Aggregate", "induction",
                                                                          "previous-token")}
        p = s.get("standard_protocol") or {}
        choice = (s.get("summary_choice") or {}).get(s["summary_token"]) or {}
        why = ("" if not choice else f" (the token the final rows read: {choice['head']}'s aggregate score "
               f"{choice['aggregate']:.3f})" if choice.get("reads_gold", choice["aggregate"] >= MIN_AGGREGATE) else
               " (no head's final row reads any candidate token of the gold segment: the paper's `\\n`)")
        return [f"Summary token: **{s['summary_token']}**{why}.",
                f"Labels of {len(labels)} heads: " + ", ".join(f"{n} {r}" for r, n in counts.items())
                + f", {labels.count('sink')} sink alone, {labels.count('none')} none (induction, previous-token "
                f"and sink on {p.get('batch')} sequences of {p.get('length')} random tokens shown twice, seed "
                f"{p.get('seed')})."]


@dataclass
class HeadsOptions(Options):
    verify_n: int = option(50, "prompts for the causal verification (seed --seed+1)", low=1)
    top: int = option(5, "candidates verified per role", low=1)
    summary: str = option(AUTO, "the token scored as a segment's summary: 'auto' (the one the heads' final rows read: "
                          "docs/heads.md), 'end' (the \\n, as in the paper), 'last' (the token before it), 'first', "
                          "'first+1', ... (counted from the segment's start)", choices=(AUTO, *SUMMARY_TOKENS))


class Heads(Experiment):
    """Rank every head by Gather and Aggregate pattern scores, then verify the top ones by ablation.
    heads.csv also holds each head's read profile (where its final row lands), its standard
    induction, previous-token and sink scores (repeated random tokens) and its label."""

    name = "heads"
    Options = HeadsOptions
    default_limit = 16  # prompts for the pattern scores
    default_out = "runs/heads"

    def check_examples(self, examples: list[Example], task: str) -> None:
        if not examples[0].segments:
            raise GandaError(f"task {task!r} has no segments to score heads on")

    def run(self, adapter: ModelAdapter, examples: list[Example], options: HeadsOptions, *, out_dir: Path,  # type: ignore[override]
            config: dict[str, Any], progress: bool = True) -> Discovery:
        seed = int(config.get("seed", 0))
        verify = self.task.examples(limit=options.verify_n, seed=seed + 1)
        task_config = {**self.task.run_config(config["limit"], len(examples), seed), "summary": options.summary,
                       "options": options.to_json()}
        d = discover(adapter, examples, verify, top=options.top, task_config=task_config, summary=options.summary)
        save_discovery(d, out_dir, model=adapter.spec)
        return d

    def job_summary(self, result: Discovery) -> dict[str, Any]:  # type: ignore[override]
        return {"baseline": result.baseline_accuracy, "summary_token": result.summary,
                "top_gather": (result.top_gather or [None])[0], "top_aggregate": (result.top_aggregate or [None])[0]}

    def show(self, result: Discovery, options: HeadsOptions, run: Any, out_dir: Path) -> None:  # type: ignore[override]
        print_heads(console(), result)
        print(f"wrote {out_dir}/result.json and {out_dir}/heads.csv")

