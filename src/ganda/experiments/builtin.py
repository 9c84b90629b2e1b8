"""ganda's experiments over the heads of one task: the exhaustive sweep and the attribution ranking.

Their engines live below (:mod:`ganda.sweep`, :mod:`ganda.attribution`); these classes say what
the command line, ``ganda grid``, ``ganda plan`` and :func:`ganda.results.load` need of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..ablation import check_batched_ablation
from ..attribution import check_rank_options, rank_heads
from ..errors import GandaError
from ..heads import expand, require_heads
from ..sweep import run_sweep
from .base import Experiment, Options, PaperRun, option
from .cumulative import cumulative_ablation
from .tables import console, print_ranking, print_sweep

ABLATION_HELP = ("what an ablated head's slice becomes: zero or mean (its mean over every token of the scored "
                 "prompts); resample needs a donor per scored row: eval runs it (docs/heads.md)")
MARGIN_HELP = "gold log-likelihood minus the mean or the max of the others'"
HEADS_HELP = "only these heads (default: all), e.g. 'L16H*' or 'L*H0,L17H3'"


def _heads_spec(opts: Options, name: str = "heads") -> None:
    require_heads(opts.flag(name), getattr(opts, name))


def _batched_ablation(opts: Options, what: str) -> None:
    check_batched_ablation(opts.ablation, opts.flag("ablation"), what)


def _layers(text: str | None, flag: str) -> list[int]:
    """``--verify-layers`` as layer numbers ("0,1" -> [0, 1]; not given: none); a list naming no layer
    is refused, as an empty head list is."""
    if text is None:
        return []
    try:
        layers = [int(x) for x in text.split(",") if x.strip() and x.strip().isascii()]
    except ValueError:
        layers = []
    if not layers or len(layers) != len([x for x in text.split(",") if x.strip()]):
        raise GandaError(f"{flag} takes comma-separated layer numbers, not {text!r}")
    return layers


@dataclass
class SweepOptions(Options):
    heads: str | None = option(None, HEADS_HELP)
    batch_heads: int = option(16, "heads of one layer ablated per forward", low=1)
    naive: bool = option(False, "the reference loop (AblateHeads + scoring per head), slow")
    metric: str = option("acc", "rank heads by the drop of acc (accuracy), acc_norm or margin (mean margin) when "
                         "each is ablated", choices=("acc", "acc_norm", "margin"))
    ablation: str = option("zero", ABLATION_HELP)
    top: int = option(15, "rows in each printed table", low=1)
    until_chance: bool = option(False, "then ablate the heads that matter cumulatively, most damaging first, until "
                                "accuracy is at chance: how many heads must go")
    max_heads: int = option(24, "--until-chance: give up after this many heads", low=1)

    def check(self) -> None:
        _heads_spec(self)
        _batched_ablation(self, "the sweep engine")
        if self.ablation != "zero" and self.until_chance:
            raise GandaError(f"{self.flag('ablation')} {self.ablation} runs without {self.flag('until_chance')}; "
                             f"drop {self.flag('until_chance')}")


class Sweep(Experiment):
    """Exhaustive single-head ablation: accuracy with each head zeroed, heat map and top heads.

    A head's effect is the drop of --metric when it is ablated (intact minus ablated). The first
    table holds the heads that matter (positive effect), largest first; the heads whose ablation
    raises the metric are listed apart, as helpful when ablated. Both tables show the accuracy
    and the mean-margin drop. Writes OUT/progress.jsonl (one line per finished head; a killed run
    resumes from it), then OUT/results.jsonl, results.csv and heatmap.png.
    """

    name = "sweep"
    Options = SweepOptions
    done_file = "results.jsonl"
    phases = "ganda.plan:sweep_phases"
    paper = (PaperRun("meta-llama/Llama-3.1-8B", {"task": "mmlu", "n": 1000},
                      "exhaustive single-head sweep, 1,000 MMLU"),)
    takes = frozenset({"resume", "ray"})

    def check_run(self, options: SweepOptions, run: Any) -> None:  # type: ignore[override]
        if options.ablation != "zero" and run.ray is not None:
            raise GandaError(f"--ablation {options.ablation} runs in this process; drop --ray")
        if run.ray is not None and options.naive:
            raise GandaError("--naive runs the reference loop in this process; drop --ray or --naive")

    def run(self, adapter: Any, examples: list[Any], options: SweepOptions, *, out_dir: Path,  # type: ignore[override]
            config: dict[str, Any], progress: bool = True) -> Any:
        heads = expand(options.heads, adapter) if options.heads else adapter.heads()
        res = run_sweep(adapter, examples, heads=heads, out_dir=out_dir, resume=self.resume, progress=progress,
                        config=config, batch_heads=options.batch_heads, naive=options.naive, metric=options.metric,
                        ablation=options.ablation)
        if options.until_chance:
            res.cumulative = cumulative_ablation(adapter, examples, [r["head"] for r in res.matter()],
                                                 max_heads=options.max_heads, out_dir=out_dir, progress=progress)
        return res

    def job_summary(self, result: Any) -> dict[str, Any]:
        top = result.matter()[:1]  # the head whose ablation lowers the ranking metric most, if any does
        return {"acc": result.baseline["acc"], "heads": len(result.records), "metric": result.metric,
                "top_head": top[0]["head"] if top else None, "top_drop": result.drop(top[0]) if top else None}

    def show(self, result: Any, options: SweepOptions, run: Any, out_dir: Path) -> None:  # type: ignore[override]
        print_sweep(console(), result, options, run, out_dir)


@dataclass
class RankOptions(Options):
    method: str = option("atp", "atp (one backward), atp* (adds GradDrop), ig (integrated gradients over --ig-steps) "
                         "or exact (the exhaustive sweep)", short="-m")
    graddrop_blocks: int = option(6, "atp*: GradDrop over this many blocks of layers (0: one per layer, the paper's "
                                  "form; cost grows with it)", low=0, why="0: one block per layer")
    ig_steps: int = option(5, "ig: midpoint steps from every head ablated to the clean model (each costs about one "
                           "AtP pass)")
    verify_top: int = option(10, "verify this many top heads exactly", short="-k")
    verify_layers: str | None = option(None, "also verify every head of these layers, e.g. 0,1 (first-order "
                                       "estimates underrate the first layers' heads)")
    audit: int = option(0, "also verify this many random other heads: the false-negative bound's sample (10 cost "
                        "about 4% of the exhaustive sweep on SmolLM2)")
    widen: int = option(0, "then verify this many more heads by estimate, round after round, until a round leaves "
                        "the reported top --top unchanged (0: off)")
    screen: int = option(0, "also verify the heads whose ablation at the answer's position hurts most, this many "
                         "(exact there, one token per head; 0: off)")
    active: int = option(30, "also verify this many heads with the largest mean |AtP| per prompt (heads whose "
                         "per-prompt effects cancel in the estimate; 0: off)")
    threshold: float | None = option(None, "effect size the bound speaks about (default: the smallest exact effect "
                                     "in the verified top --top)")
    ablation: str = option("zero", ABLATION_HELP)
    margin: str = option("mean", MARGIN_HELP)
    heads: str | None = option(None, HEADS_HELP)
    top: int = option(10, "rows in the printed table; the bound's default threshold")
    batch_heads: int = option(16, "heads of one layer ablated per forward (verification)")

    def check(self) -> None:
        check_rank_options(self.method, self.ablation, self.margin, self.verify_top, self.audit, self.top,
                           self.threshold, batch_heads=self.batch_heads, graddrop_blocks=self.graddrop_blocks or None,
                           name=self.flag, ig_steps=self.ig_steps, widen=self.widen, screen=self.screen,
                           active=self.active)
        _layers(self.verify_layers, self.flag("verify_layers"))
        _heads_spec(self)


class Rank(Experiment):
    """Rank every head by its ablation effect on the task's margin: attribution for all, exact for the top.

    A head's effect is the drop of the mean margin when it is ablated (intact minus ablated). The
    first table holds the verified heads that matter (positive effect), largest first; verified
    heads whose ablation raises the margin are listed apart, as helpful when ablated. Both tables
    show the margin and the accuracy drop.

    Writes OUT/ranking.json, ranking.csv, scatter.png (estimate vs exact), verify_heatmap.png (exact effect
    by layer and head), OUT/attribution.jsonl and OUT/verify/ (both resume a stopped run).
    """

    name = "rank"
    aliases = ("attribution",)
    Options = RankOptions
    done_file = "ranking.json"
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
        opts = options.to_json()
        spec = opts.pop("heads")
        heads = expand(spec, adapter) if spec else None
        opts.update(verify_layers=_layers(options.verify_layers, "verify_layers"),
                    graddrop_blocks=options.graddrop_blocks or None)
        return rank_heads(adapter, examples, out_dir=out_dir, progress=progress, config=config, resume=self.resume,
                          seed=int(config.get("seed", 0)), heads=heads, **opts)

    def job_summary(self, result: Any) -> dict[str, Any]:
        matter = result.matter()
        return {"heads": len(result.heads), "verified": len(result.exact), "metric": result.metric,
                "top_head": matter[0] if matter else None, "sign_flips": len(result.sign_flips())}

    def as_json(self, result: Any, options: RankOptions, out_dir: Path) -> dict[str, Any]:  # type: ignore[override]
        return {**result.to_json(), "out": str(out_dir)}

    def show(self, result: Any, options: RankOptions, run: Any, out_dir: Path) -> None:  # type: ignore[override]
        print_ranking(console(), result, options, run, out_dir)


__all__ = ["Rank", "RankOptions", "Sweep", "SweepOptions"]
