"""ganda's experiments over the heads of one task: the exhaustive sweep and the attribution ranking,
and the two workloads the planner costs without a runner of their own (evaluation and maps).

Their engines live below (:mod:`ganda.sweep`, :mod:`ganda.attribution`); these classes say what
the command line, ``ganda grid``, ``ganda plan`` and :func:`ganda.results.load` need of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..attribution import GRADDROP_BLOCKS, IG_STEPS, check_rank_options, rank_heads
from ..attribution.engine import ACTIVE, AUDIT, RANK_METHOD, VERIFY_TOP
from ..errors import GandaError
from ..models.base import ModelAdapter
from ..sweep import run_sweep
from ..tasks.base import Example
from .base import Experiment, Options


@dataclass
class SweepOptions(Options):
    batch_heads: int = field(default=16, metadata={"help": "heads of one layer ablated per forward"})
    naive: bool = field(default=False, metadata={"help": "the reference loop (AblateHeads + scoring per head), slow"})

    def check(self) -> None:
        if self.batch_heads < 1:
            raise GandaError(f"{self.flag('batch_heads')} must be at least 1, got {self.batch_heads}")


class Sweep(Experiment):
    name = "sweep"
    summary = "Exhaustive single-head ablation: accuracy with each head zeroed"
    Options = SweepOptions
    done_file = "results.jsonl"
    phases = "ganda.plan:sweep_phases"

    def run(self, adapter: ModelAdapter, examples: list[Example], options: SweepOptions, *, out_dir: Path,  # type: ignore[override]
            config: dict[str, Any], progress: bool = True) -> Any:
        return run_sweep(adapter, examples, out_dir=out_dir, progress=progress, config=config,
                         batch_heads=options.batch_heads, naive=options.naive)

    def job_summary(self, result: Any) -> dict[str, Any]:
        top = result.matter()[:1]  # the head whose ablation lowers the ranking metric most, if any does
        return {"acc": result.baseline["acc"], "heads": len(result.records), "metric": result.metric,
                "top_head": top[0]["head"] if top else None, "top_drop": result.drop(top[0]) if top else None}


@dataclass
class RankOptions(Options):
    method: str = field(default=RANK_METHOD, metadata={"help": "atp, atp*, ig or exact"})
    ablation: str = field(default="zero", metadata={"help": "zero or mean"})
    margin: str = field(default="mean", metadata={"help": "gold log-likelihood minus the mean or the max of the others'"})
    verify_top: int = field(default=VERIFY_TOP, metadata={"help": "verify this many top heads exactly"})
    audit: int = field(default=AUDIT, metadata={"help": "also verify this many random other heads"})
    active: int = field(default=ACTIVE, metadata={"help": "also verify this many heads with the largest mean |AtP| per prompt"})
    threshold: float | None = field(default=None, metadata={"help": "effect size the false-negative bound speaks about"})
    top: int = field(default=10, metadata={"help": "the bound's default threshold: the verified top TOP"})
    batch_heads: int = field(default=16, metadata={"help": "heads of one layer ablated per forward (verification)"})
    graddrop_blocks: int | None = field(default=GRADDROP_BLOCKS, metadata={"help": "atp*: GradDrop blocks of layers"})
    ig_steps: int = field(default=IG_STEPS, metadata={"help": "ig: integrated gradients' midpoint steps"})

    def check(self) -> None:
        check_rank_options(self.method, self.ablation, self.margin, self.verify_top, self.audit, self.top,
                           self.threshold, batch_heads=self.batch_heads, graddrop_blocks=self.graddrop_blocks,
                           name=self.flag, ig_steps=self.ig_steps, active=self.active)


class Rank(Experiment):
    name = "rank"
    aliases = ("attribution",)
    summary = "Rank every head by attribution (AtP / AtP* / IG), verify the top exactly, bound the rest"
    Options = RankOptions
    done_file = "ranking.json"
    phases = "ganda.plan:attribution_phases"

    def run(self, adapter: ModelAdapter, examples: list[Example], options: RankOptions, *, out_dir: Path,  # type: ignore[override]
            config: dict[str, Any], progress: bool = True) -> Any:
        return rank_heads(adapter, examples, out_dir=out_dir, progress=progress, config=config,
                          seed=int(config.get("seed", 0)), **options.to_json())

    def job_summary(self, result: Any) -> dict[str, Any]:
        matter = result.matter()
        return {"heads": len(result.heads), "verified": len(result.exact), "metric": result.metric,
                "top_head": matter[0] if matter else None, "sign_flips": len(result.sign_flips())}


class Evaluation(Experiment):
    name = "eval"
    summary = "Score every example once (ganda eval)"
    phases = "ganda.plan:eval_phases"
    on_task = False  # costed only: ganda eval and ganda attn run it


class Maps(Experiment):
    name = "maps"
    summary = "Attention and exact implicit maps of chosen heads (ganda attn)"
    phases = "ganda.plan:maps_phases"
    on_task = False  # costed only: ganda eval and ganda attn run it


__all__ = ["Evaluation", "Maps", "Rank", "RankOptions", "Sweep", "SweepOptions"]
