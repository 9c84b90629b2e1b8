"""``ganda eval``: the accuracy of one model on one task (Wilson 95% interval), optionally under
interventions (heads ablated zero, mean or resample, at chosen positions; layers kept or removed;
attention's last row masked). It writes no run directory: the result is printed as one line (or
``--json``), and ``--predictions`` writes each example's prediction as JSONL.

The scoring is :func:`ganda.evaluation.evaluate`; this module says what the command line and
``ganda plan -e eval`` need of it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import runio
from ..ablation import ABLATIONS
from ..errors import GandaError
from ..evaluation import evaluate
from ..heads import require_heads
from ..interventions import AblateHeads, Intervention, KeepLayers, RemoveLayers, apply, parse_layers
from ..interventions import mask_last_row as masked_last_row
from ..models.base import ModelAdapter
from ..models.loading import model_inputs
from ..plan import announce
from ..scoring import EvalResult, answers_text
from ..sites import CLASSES
from ..tasks import get_task, task_for_model
from .base import ABLATION_HELP, DirectExperiment, Options, option

MASK_RULES = ("query", "last")


@dataclass
class EvalOptions(Options):
    ablate: str | None = option(None, "heads to ablate, e.g. L3H1,L4H2")
    ablation: str = option("zero", f"zero|mean|resample: {ABLATION_HELP}", choices=ABLATIONS)
    ablate_at: str | None = option(None, "ablate --ablate's heads only at these positions: ends (segment ends), key "
                                   "(the queried key), final (the last prompt token and the answer), elsewhere; "
                                   "default everywhere", choices=CLASSES)
    keep_layers: str | None = option(None, "run only these layers, e.g. 0-17")
    remove_layers: str | None = option(None, "skip these layers")
    mask_last_row: str | None = option(None, "attention heads whose last row is zeroed")
    mask_rule: str = option("query", "--mask-last-row's row: query (last prompt token) or last (last scored "
                            "position, as the authors' Zamba2 code)", choices=MASK_RULES)
    predictions: Path | None = option(None, "write per-example predictions (JSONL): id (task, subject, doc_id: "
                                      "lm-eval's doc_id), every choice's loglik, pred (acc), pred_norm (acc_norm), "
                                      "correct, correct_norm")
    no_prefix_cache: bool = option(False, "run every prompt whole instead of reusing shared prompt prefixes (same as "
                                   "GANDA_PREFIX_CACHE=0)")

    def check(self) -> None:
        if self.shaped() and self.ablate is None:
            raise GandaError(f"{self.flag('ablation')} and {self.flag('ablate_at')} need {self.flag('ablate')} HEADS")
        require_heads(self.flag("ablate"), self.ablate)
        require_heads(self.flag("mask_last_row"), self.mask_last_row)
        self.needs("mask_rule", "mask_last_row", "chooses the row of")
        for name in ("keep_layers", "remove_layers"):
            if getattr(self, name) is not None:
                parse_layers(getattr(self, name))

    def shaped(self) -> bool:
        """Whether the ablation needs the scored prompts (mean, resample) or their positions (--ablate-at)."""
        return self.ablation != "zero" or self.ablate_at is not None

    def interventions(self, seed: int = 0, *, zeroed: bool = False) -> list[Intervention]:
        """The interventions, layer edits first (so head ids keep their original layers); --ablate's
        heads ablated the --ablation way at --ablate-at (the mean and the resample donors come from
        the scored prompts), or with ``zeroed`` zeroed everywhere: what checks the head ids before
        any reference prompt runs."""
        out: list[Intervention] = []
        if self.keep_layers is not None:
            out.append(KeepLayers(parse_layers(self.keep_layers)))
        if self.remove_layers is not None:
            out.append(RemoveLayers(parse_layers(self.remove_layers)))
        if self.ablate is not None:
            out.append(AblateHeads(self.ablate, positions=None if zeroed else self.ablate_at,
                                   how="zero" if zeroed else self.ablation, seed=0 if zeroed else seed))
        if self.mask_last_row is not None:
            out.append(masked_last_row(self.mask_last_row, self.mask_rule))
        return out


class Evaluation(DirectExperiment):
    """Accuracy of MODEL on a task (Wilson 95% CI), optionally under interventions."""

    name = "eval"
    Options = EvalOptions
    phases = "ganda.plan:eval_phases"
    costed_options = ()  # every example scored once, whatever the interventions
    takes = frozenset({"json", "option", "force"})
    task_help = "kv, letters, mmlu, arc_easy, gsm8k, bbh, lab-mmlu, ..."

    def check_run(self, options: EvalOptions, run: Any) -> None:  # type: ignore[override]
        self.task = get_task(run.task, **run.task_options())
        if options.predictions:
            runio.check_output_file(options.predictions, "--predictions", inputs=model_inputs(run.model),
                                    kind="predictions", force=run.force)

    def run_model(self, adapter: ModelAdapter, options: EvalOptions, run: Any) -> EvalResult:  # type: ignore[override]
        task = task_for_model(run.task, self.task, adapter, **run.task_options())
        if task.kind != "mc" and (options.ablation == "resample" or options.ablate_at is not None):
            raise GandaError(f"--ablation resample and --ablate-at score multiple-choice tasks only; {run.task!r} "
                             "generates")
        ivs = options.interventions(zeroed=True)
        with apply(adapter, ivs):  # a bad head id or layer fails here, before any long run
            pass
        if options.shaped():
            ivs = options.interventions(run.seed)
        if task.kind == "mc" and run.announce:
            announce(adapter, task.examples(limit=run.limit, seed=run.seed), shared_prefix=not options.no_prefix_cache)
        res = evaluate(adapter, task, ivs, limit=run.limit, seed=run.seed, progress=run.progress,
                       prefix_cache=False if options.no_prefix_cache else None)
        if options.predictions:
            with runio.atomic_open(options.predictions) as f:
                for p in res.predictions:
                    f.write(json.dumps(p, allow_nan=False) + "\n")
        return res

    def job_summary(self, result: EvalResult) -> dict[str, Any]:
        return {"task": result.task, "accuracy": result.accuracy, "ci_low": result.ci_low, "ci_high": result.ci_high,
                "n": result.n}

    def as_json(self, result: EvalResult, options: Options, out_dir: Path | None) -> dict[str, Any]:  # type: ignore[override]
        return result.to_json()  # every score is finite (ganda.finite)

    def show(self, result: EvalResult, options: Options, run: Any, out_dir: Path | None) -> None:  # type: ignore[override]
        ivs = "; ".join(json.dumps(i) for i in result.interventions) or "none"
        print(f"{result.task} on {result.model}: accuracy {result.accuracy:.3f} (95% CI {result.ci_low:.3f}-"
              f"{result.ci_high:.3f}), n={result.n}, {result.seconds:.1f} s, interventions: {ivs}")
        if answers := result.by_answer():
            print("  " + answers_text(answers))


__all__ = ["EvalOptions", "Evaluation"]
