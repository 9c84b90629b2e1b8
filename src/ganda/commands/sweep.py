"""``ganda sweep``: ablate every head alone and rank heads by their effect, the drop of a stated
metric when each is ablated (:mod:`ganda.effects`; resumable)."""

from __future__ import annotations

from pathlib import Path

import typer

from .. import runio
from ..effects import NAMES
from ..errors import GandaError
from ..tasks import get_task
from . import options
from .core import (
    MODEL,
    PAIRS,
    PICKLE,
    QUIET,
    SAMPLE,
    SEED,
    SHOTS,
    SUBJECTS,
    at_least,
    limit_option,
    mmlu_options,
    model_inputs,
    one_of,
    require_heads,
)
from .grid import RAY, RAY_ACTORS


def _heads_table(res, rows: list, title: str):
    """One table of heads: their accuracies and the drops of accuracy and mean margin when ablated."""
    from rich.table import Table

    table = Table(title=title)
    for col in ("rank", "head", "acc", "acc drop", "margin drop", "acc_norm", "drop_norm", "gold logp drop"):
        table.add_column(col, justify="right")
    for i, r in enumerate(rows, 1):
        table.add_row(str(i), r["head"], f"{r['acc']:.3f}", f"{res.drop(r):+.3f}", f"{res.margin_drop(r):+.4f}",
                      f"{r['acc_norm']:.3f}", f"{res.drop(r, 'acc_norm'):+.3f}", f"{res.ll_drop(r):+.3f}")
    return table


def _print_heads(console, res, top: int) -> None:
    """The heads that matter (ablation lowers the ranking metric), then those helpful when ablated."""
    options.print_split(console, lambda rows, title: _heads_table(res, rows, title), res.matter(), res.helpful_when_ablated(),
                top, NAMES[res.metric])


def register(app: typer.Typer) -> None:
    @app.command(short_help="Single-head ablation: accuracy with each head zeroed")
    def sweep(
        model: str = MODEL,
        task: str = typer.Option("kv", "--task", "-t", help="kv, letters, mmlu, or any multiple-choice task "
                                 "(arc_easy, arc_challenge, openbookqa, piqa, hellaswag, winogrande, ...)"),
        limit: int | None = limit_option(None, "number of prompts (default: 32)"),
        sample: bool = SAMPLE,
        pairs: int | None = PAIRS,
        shots: int | None = SHOTS,
        subjects: str | None = SUBJECTS,
        heads: str | None = typer.Option(None, "--heads", help="only these heads (default: all), e.g. 'L16H*' or 'L*H0,L17H3'"),
        seed: int = SEED,
        out: Path = typer.Option(None, "--out", "-o", help="directory (default: runs/sweep-<task>)"),
        resume: bool = typer.Option(True, "--resume/--no-resume", help="continue a stopped sweep in --out"),
        naive: bool = typer.Option(False, "--naive", help="reference loop (AblateHeads + scoring per head), slow"),
        batch_heads: int = typer.Option(16, "--batch-heads", help="heads of one layer ablated per forward"),
        top: int = typer.Option(15, "--top", help="rows in each printed table"),
        metric: str = typer.Option("acc", "--metric", help="rank heads by the drop of acc (accuracy), acc_norm or "
                                   "margin (mean margin) when each is ablated"),
        until_chance: bool = typer.Option(False, "--until-chance", help="then ablate the heads that matter cumulatively, "
                                          "most damaging first, until accuracy is at chance: how many heads must go"),
        max_heads: int = typer.Option(24, "--max-heads", help="--until-chance: give up after this many heads"),
        ablation: str = options.ablation_option("zero|mean (resample needs a donor per scored row: eval runs it)"),
        allow_pickle: bool = PICKLE,
        quiet: bool = QUIET,
        ray: str | None = RAY,
        ray_actors: int | None = RAY_ACTORS,
    ) -> None:
        """Exhaustive single-head ablation: accuracy with each head zeroed, heat map and top heads.

        A head's effect is the drop of --metric when it is ablated (intact minus ablated). The first
        table holds the heads that matter (positive effect), largest first; the heads whose ablation
        raises the metric are listed apart, as helpful when ablated. Both tables show the accuracy
        and the mean-margin drop. Writes OUT/progress.jsonl (one line per finished head; a killed run resumes from it),
        then OUT/results.jsonl, results.csv and heatmap.png.
        """

        from ..distributed import ray_sweeps
        from ..experiments.cumulative import cumulative_ablation
        from ..heads import expand
        from ..models import load_model
        from ..sweep import SWEEP_METRICS, run_sweep
        from ..tasks import task_for_model

        for flag, value in (("--limit", limit), ("--batch-heads", batch_heads), ("--top", top),
                            ("--max-heads", max_heads)):
            at_least(flag, value)
        require_heads("--heads", heads)
        one_of("--metric", metric, SWEEP_METRICS)
        if ablation == "resample":
            raise GandaError("--ablation resample is not run by the sweep engine (it needs a donor per scored row); "
                             "use zero or mean, or eval --ablate HEAD --ablation resample")
        one_of("--ablation", ablation, ("zero", "mean"))
        if ablation != "zero" and (ray is not None or until_chance):
            raise GandaError(f"--ablation {ablation} runs in this process and without --until-chance; "
                             "drop --ray and --until-chance")
        if ray is not None and naive:
            raise GandaError("--naive runs the reference loop in this process; drop --ray or --naive")
        opts = {"pairs": pairs, "shots": shots, "subjects": subjects, **mmlu_options(sample)}
        task_obj = get_task(task, **opts)
        if task_obj.kind != "mc":
            raise GandaError(f"task {task!r} is a generation task; sweep scores multiple-choice tasks only")
        n = limit if limit is not None else 32
        out_dir = runio.claim_run_dir(out if out is not None else Path("runs") / f"sweep-{task}", kind="sweep",
                                         models=model_inputs(model))
        adapter = load_model(model, allow_pickle=allow_pickle)
        task_obj = task_for_model(task, task_obj, adapter, **opts)
        examples = task_obj.examples(limit=n, seed=seed)
        if not examples:
            raise GandaError(f"task {task!r} gave no examples")
        head_list = expand(heads, adapter) if heads else adapter.heads()
        cfg = {"task": task_obj.config(), "limit": n, "n": len(examples), "seed": seed}
        with ray_sweeps(ray, ray_actors, allow_pickle=allow_pickle):
            res = run_sweep(adapter, examples, heads=head_list, out_dir=out_dir, resume=resume, naive=naive,
                            batch_heads=batch_heads, config=cfg, metric=metric, ablation=ablation)

        console = options.console()
        b = res.baseline
        console.print(f"[bold]{model}[/bold] on {task} (n={b['n']}): intact acc {b['acc']:.3f}"
                      f" (acc_norm {b['acc_norm']:.3f}); {len(res.records)} heads {ablation}-ablated in {res.seconds:.1f} s")
        _print_heads(console, res, top)
        console.print(f"wrote {out_dir}/results.jsonl, results.csv, heatmap.png")
        if until_chance:
            cum = cumulative_ablation(adapter, examples, [r["head"] for r in res.matter()],
                                      max_heads=max_heads, out_dir=out_dir, progress=not quiet)
            last = cum["curve"][-1] if cum["curve"] else None
            if cum.get("baseline_at_chance"):
                console.print(f"cumulative ablation: {cum['note']}; wrote {out_dir}/cumulative.json")
            elif last is not None:
                verdict = "reached" if cum["reached_chance"] else "did not reach"
                console.print(f"cumulative ablation {verdict} chance ({cum['chance']:.3f} + {cum['margin']:.2f}) "
                              f"with {last['n_heads']} heads: acc {last['accuracy']:.3f}; wrote {out_dir}/cumulative.json")
