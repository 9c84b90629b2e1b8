"""``ganda demo``, the main job; and, for the modules that import them from here, the options every
command shares (:mod:`ganda.commands.options`).

Commands import the library (and with it torch) inside their bodies, so that ``ganda --help`` and
a bad flag answer at once."""

from __future__ import annotations

from pathlib import Path

import typer

from .. import runio
from ..tasks import get_task
from .options import (  # noqa: F401  (DEFAULT_MODEL, parse_options: the shared vocabulary, read from here too)
    ABLATIONS,
    DEFAULT_MODEL,
    MODEL,
    PICKLE,
    QUIET,
    SEED,
    ablation_option,
    at_least,
    limit_option,
    model_inputs,
    one_of,
    parse_options,
)


def register(app: typer.Typer) -> None:
    @app.command(short_help="The main job: KV's G&A heads found, ablated and reported")
    def demo(
        model: str = MODEL,
        out: Path = typer.Option(Path("runs/demo"), "--out", "-o", help="run directory (report.html, JSON, CSV, PNG)"),
        pairs: int = typer.Option(5, "--pairs", help="key-value pairs per prompt"),
        limit: int = limit_option(8, "prompts for the pattern scores", mmlu=False),
        verify_n: int = typer.Option(40, "--verify-n", help="prompts for the accuracy measurements"),
        top: int = typer.Option(4, "--top", help="top causal heads the finding names and draws"),
        seed: int = SEED,
        prompt_sets: int = typer.Option(3, "--prompt-sets", help="prompt sets the finding is checked on (set k: seeds "
                                        "seed+3k, +1, +2), each reported with whether the finding holds"),
        ablation: str = ablation_option("zero|mean|resample (the ranking of a resample demo runs mean)"),
        no_profile: bool = typer.Option(False, "--no-profile", help="skip ablating the top causal and Gather heads "
                                        "zero, mean and resample and at each position class (where they act)"),
        allow_pickle: bool = PICKLE,
        quiet: bool = QUIET,
    ) -> None:
        """The main job: KV baseline -> causal head ranking -> ablate the top G&A heads -> figures -> HTML report."""
        from ..demo import run_demo

        for flag, value in (("--limit", limit), ("--verify-n", verify_n), ("--top", top), ("--prompt-sets", prompt_sets)):
            at_least(flag, value)
        one_of("--ablation", ablation, ABLATIONS)
        get_task("kv", pairs=pairs)  # a bad --pairs fails here, before the model loads
        runio.claim_run_dir(out, kind="demo", models=model_inputs(model))
        report = run_demo(model, out, pairs=pairs, n=limit, verify_n=verify_n, top=top, seed=seed,
                          allow_pickle=allow_pickle, prompt_sets=prompt_sets, ablation=ablation, profile=not no_profile)
        print(f"report: {report}")
