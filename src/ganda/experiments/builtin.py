"""ganda's experiments over the heads of one task: the exhaustive sweep and the attribution ranking.

Their engines live below (:mod:`ganda.sweep`, :mod:`ganda.attribution`); these classes say what
the command line, ``ganda grid``, ``ganda plan`` and :func:`ganda.results.load` need of them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..attribution.ranking import RankOptions, rank_heads
from ..errors import GandaError
from ..sweep import SweepOptions, run_sweep
from .base import Experiment, PaperRun
from .cumulative import cumulative_ablation
from .head_effects import HeadSweepResult, RankingResult
from .tables import console, print_ranking, print_sweep


class Sweep(Experiment):
    """Exhaustive single-head ablation: accuracy with each head zeroed, heat map and top heads.

    A head's effect is the drop of --metric when it is ablated (intact minus ablated). The first
    table holds the heads that matter (positive effect), largest first; the heads whose ablation
    raises the metric are listed apart, as helpful when ablated. Both tables show the accuracy
    and the mean-margin drop. Writes OUT/progress.jsonl (one line per finished head; a killed run
    resumes from it), then OUT/results.jsonl, results.csv, heatmap.png and result.json (kind, model,
    options, summary, every head's row with its intervals).
    """

    name = "sweep"
    Options = SweepOptions
    phases = "ganda.plan:sweep_phases"
    paper = (PaperRun("meta-llama/Llama-3.1-8B", {"task": "mmlu", "n": 1000},
                      "exhaustive single-head sweep, 1,000 MMLU"),)
    takes = frozenset({"resume", "ray"})

    def check_run(self, options: SweepOptions, run: Any) -> None:  # type: ignore[override]
        if options.ablation != "zero" and run.ray is not None:
            raise GandaError(f"{options.flag('ablation')} {options.ablation} runs in this process; drop --ray")
        if run.ray is not None and options.naive:
            raise GandaError(f"{options.flag('naive')} runs the reference loop in this process; drop --ray or "
                             f"{options.flag('naive')}")

    def run(self, adapter: Any, examples: list[Any], options: SweepOptions, *, out_dir: Path,  # type: ignore[override]
            config: dict[str, Any], progress: bool = True) -> Any:
        res = run_sweep(adapter, examples, options, out_dir=out_dir, resume=self.resume, progress=progress,
                        config=config)
        if options.until_chance:
            res.cumulative = cumulative_ablation(adapter, examples, [r["head"] for r in res.matter()],
                                                 max_heads=options.max_heads, out_dir=out_dir, progress=progress)
        HeadSweepResult.of(res, out_dir).save_json(out_dir)
        return res

    def job_summary(self, result: Any) -> dict[str, Any]:
        top = result.matter()[:1]  # the head whose ablation lowers the ranking metric most, if any does
        return {"acc": result.baseline["acc"], "heads": len(result.records), "metric": result.metric,
                "top_head": top[0]["head"] if top else None, "top_drop": result.drop(top[0]) if top else None}

    def show(self, result: Any, options: SweepOptions, run: Any, out_dir: Path) -> None:  # type: ignore[override]
        print_sweep(console(), result, options, run, out_dir)


class Rank(Experiment):
    """Rank every head by its ablation effect on the task's margin: attribution for all, exact for the top.

    A head's effect is the drop of the mean margin when it is ablated (intact minus ablated). The
    first table holds the verified heads that matter (positive effect), largest first; verified
    heads whose ablation raises the margin are listed apart, as helpful when ablated. Both tables
    show the margin and the accuracy drop.

    Writes OUT/ranking.json, ranking.csv, scatter.png (estimate vs exact), verify_heatmap.png (exact effect
    by layer and head), result.json (kind, model, options, summary, every head's row), OUT/attribution.jsonl
    and OUT/verify/ (both resume a stopped run).
    """

    name = "rank"
    aliases = ("attribution",)
    Options = RankOptions
    phases = "ganda.plan:attribution_phases"
    paper = (PaperRun("meta-llama/Llama-3.1-8B", {"task": "mmlu", "n": 1000, "method": "atp*", "verify_top": 30,
                                                  "active": 0, "audit": 10},
                      "the same ranked by attribution (AtP*)", "attribution"),)
    takes = frozenset({"resume", "ray"})

    def check_examples(self, examples: list[Any], task: str) -> None:
        if any(len(ex.choices) < 2 for ex in examples):
            raise GandaError(f"task {task!r} has examples with fewer than two choices; a margin needs two")

    def run(self, adapter: Any, examples: list[Any], options: RankOptions, *, out_dir: Path,  # type: ignore[override]
            config: dict[str, Any], progress: bool = True) -> Any:
        res = rank_heads(adapter, examples, options, out_dir=out_dir, progress=progress, config=config,
                         resume=self.resume, seed=int(config.get("seed", 0)))
        RankingResult.of(res.written()).save_json(out_dir)
        return res

    def job_summary(self, result: Any) -> dict[str, Any]:
        matter = result.matter()
        return {"heads": len(result.heads), "verified": len(result.exact), "metric": result.metric,
                "top_head": matter[0] if matter else None, "sign_flips": len(result.sign_flips())}

    def as_json(self, result: Any, options: RankOptions, out_dir: Path) -> dict[str, Any]:  # type: ignore[override]
        return {**result.to_json(), "out": str(out_dir)}

    def show(self, result: Any, options: RankOptions, run: Any, out_dir: Path) -> None:  # type: ignore[override]
        print_ranking(console(), result, options, run, out_dir)


__all__ = ["Rank", "RankOptions", "Sweep", "SweepOptions"]
