"""``ganda run EXPERIMENT MODEL``: any registered experiment (:mod:`ganda.experiments.base`) on one
task's examples, with the experiment's own options as ``--option KEY=VALUE``: the same run as
``ganda EXPERIMENT`` (:func:`ganda.experiments.runner.run_on_task`), for scripts that hold an
experiment's name and options as data."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from ..errors import GandaError
from .options import MODEL, PICKLE, QUIET, SEED, limit_option, parse_options


def register(app: typer.Typer) -> None:
    @app.command(short_help="Run any registered experiment on one task")
    def run(
        experiment: str = typer.Argument(..., help="a registered experiment (an unknown name lists them)"),
        model: str = MODEL,
        task: str = typer.Option("kv", "--task", "-t", help="the multiple-choice task the experiment runs on"),
        limit: int | None = limit_option(None, "number of prompts (default: 32)"),
        seed: int = SEED,
        option: list[str] = typer.Option(None, "--option", help="the experiment's option KEY=VALUE (repeatable)"),
        out: Path = typer.Option(None, "--out", "-o", help="run directory (default: runs/<experiment>-<task>)"),
        allow_pickle: bool = PICKLE,
        quiet: bool = QUIET,
    ) -> None:
        """Run any registered experiment (ganda's or a plugin's) on one task; its options as --option KEY=VALUE.

        Writes the experiment's files into OUT and prints its summary as JSON.
        """
        from .. import registry, runio
        from ..experiments.runner import RunInputs, run_on_task

        cls = registry.experiment(experiment)
        if not cls.on_task:
            runs = ", ".join(n for n in registry.experiment_names() if registry.experiment(n).on_task)
            raise GandaError(f"the {cls.name} experiment does not run on one task's examples: its command is ganda "
                             f"{cls.name} (ganda run runs {runs})")
        options = cls.Options.build(parse_options(option))
        run_inputs = RunInputs(model=model, task=task, limit=limit, seed=seed, out=out, allow_pickle=allow_pickle,
                               progress=not quiet)
        done = run_on_task(cls, run_inputs, options)
        print(json.dumps(runio.rounded({"out": str(done.out_dir), "experiment": cls.name,
                                        **done.experiment.job_summary(done.result)}), default=str))
