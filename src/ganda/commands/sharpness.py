"""``ganda sharpness``: how sharp the top G&A heads' maps are, per model and between models, with CIs."""

from __future__ import annotations

from pathlib import Path

import typer

from .. import runio
from ..errors import GandaError
from ..tasks import get_task
from .core import MODEL_HELP, PICKLE, QUIET, SEED, SUMMARIES, at_least, limit_option, model_inputs, one_of


def register(app: typer.Typer) -> None:
    @app.command(short_help="Sharpness of the top-k Aggregate and Gather heads of models")
    def sharpness(
        models: list[str] = typer.Argument(..., help="two or more models, each " + MODEL_HELP
                                           + "; differences are the first minus each other"),
        task: str = typer.Option("lab-mmlu", "--task", "-t", help="a task with segments (lab-mmlu, letters, kv, ...)"),
        limit: int = limit_option(100, "prompts the metrics are measured on (seed --seed)"),
        top: int = typer.Option(3, "--top", "-k", help="heads per role and model"),
        select: str = typer.Option("pattern", "--select", help="choose heads by 'pattern' score or causal 'drop'"),
        select_n: int | None = typer.Option(None, "--select-n", help="prompts for choosing heads (seed --seed+1; "
                                            "default --limit)"),
        resamples: int = typer.Option(2000, "--resamples", help="bootstrap draws"),
        prompt_sets: int = typer.Option(1, "--prompt-sets", help="run on K prompt sets (seeds --seed, +2, +4, ...) "
                                        "and pool every difference over them"),
        seed: int = SEED,
        out: Path = typer.Option(Path("runs/sharpness"), "--out", "-o", help="directory for JSON, CSV and PNG"),
        summary: str = typer.Option("end", "--summary", help="the token scored as a segment's summary: 'end' (the "
                                    "\\n, as in the paper) or 'last' (the last token before it)"),
        allow_pickle: bool = PICKLE,
        quiet: bool = QUIET,
    ) -> None:
        """Sharpness of the top-k Aggregate/Gather heads of each model (softmax or implicit maps), with
        95% bootstrap intervals over prompts and the paired difference between models."""
        from ..experiments.sharpness import (
            compare_sharpness,
            pooled_sharpness_lines,
            save_sharpness,
            sharpness_sets,
        )
        from ..models import load_model

        if select not in ("pattern", "drop"):
            raise GandaError(f"--select must be 'pattern' or 'drop', not {select!r}")
        if len(models) < 2:
            raise GandaError("give at least two models to compare")
        for flag, value in (("--limit", limit), ("--top", top), ("--select-n", select_n), ("--resamples", resamples),
                            ("--prompt-sets", prompt_sets)):
            at_least(flag, value)
        one_of("--summary", summary, SUMMARIES)
        get_task(task)  # an unknown task fails before the models load
        runio.claim_run_dir(out, kind="sharpness", models=[p for m in models for p in model_inputs(m)])
        adapters = {m: load_model(m, allow_pickle=allow_pickle) for m in models}
        kw = dict(k=top, n=limit, select=select, select_n=select_n, resamples=resamples, progress=not quiet,
                  summary=summary)
        res = (sharpness_sets(adapters, task, prompt_sets=prompt_sets, seed=seed, **kw) if prompt_sets > 1
               else compare_sharpness(adapters, task, seed=seed, **kw))
        rows = save_sharpness(res, out)
        for r in rows:
            print(f"{r['model']:>40}  {r['metric']:<18} {r['value']:9.4f}  [{r['ci_low']:.4f}, {r['ci_high']:.4f}]  {r['heads']}")
        if prompt_sets > 1:
            print(f"pooled over {prompt_sets} prompt sets (seeds {', '.join(map(str, res['seeds']))}; the rows above are set 1's):")
            for line in pooled_sharpness_lines(res["pooled"]):
                print("  " + line)
        print(f"wrote {out}/result.json, sharpness.csv" + (", prompt_sets.csv" if prompt_sets > 1 else "")
              + " and sharpness.png")
