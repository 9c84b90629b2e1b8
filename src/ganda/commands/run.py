"""``ganda run EXPERIMENT MODEL``: any registered experiment (:mod:`ganda.experiments.base`), with its
own options as ``--option KEY=VALUE``: the same run as ``ganda EXPERIMENT``, through the runner of
its inputs (:func:`ganda.experiments.runner.run_experiment`), for scripts that hold an experiment's
name and options as data."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from ..errors import GandaError
from .analyses import write_reports
from .options import MODEL_HELP, PICKLE, QUIET, SEED, limit_option, parse_options


def register(app: typer.Typer) -> None:
    @app.command(short_help="Run any registered experiment by name, its options as data")
    def run(
        experiment: str = typer.Argument(..., help="a registered experiment (an unknown name lists them)"),
        models: list[str] = typer.Argument(..., help=f"the model: {MODEL_HELP} (two or more for an experiment "
                                           "that compares models)"),
        task: str | None = typer.Option(None, "--task", "-t", help="the task (kv by default), or the comma list of an "
                                        "experiment scored on several (default: the experiment's)"),
        limit: int | None = limit_option(None, "number of prompts, or examples per task (default: the experiment's)"),
        seed: int = SEED,
        option: list[str] = typer.Option(None, "--option", help="the experiment's option KEY=VALUE (repeatable)"),
        out: Path = typer.Option(None, "--out", "-o", help="run directory (default: the experiment's)"),
        allow_pickle: bool = PICKLE,
        quiet: bool = QUIET,
    ) -> None:
        """Run any registered experiment (ganda's or a plugin's); its options as --option KEY=VALUE.

        Writes the experiment's files into OUT and prints its summary as JSON.
        """
        from .. import registry, runio
        from ..experiments.runner import RunInputs, run_experiment

        cls = registry.experiment(experiment)
        if cls.inputs != "models" and len(models) != 1:
            raise GandaError(f"ganda run {cls.name} takes one MODEL, not {len(models)}")
        if cls.inputs in ("model", "models") and task is not None:
            raise GandaError(f"the {cls.name} experiment draws its own prompts: drop --task")
        options = cls.Options.build(parse_options(option), text=True)
        run_inputs = RunInputs(model=models[0], models=list(models), task=task or "kv", tasks=task, limit=limit,
                               seed=seed, out=out, allow_pickle=allow_pickle, progress=not quiet, command=runio.command_line())
        done = run_experiment(cls, run_inputs, options)
        if getattr(cls, "report_html", False):  # as ganda NAME writes it (--html is its default)
            write_reports(done.experiment.finished)
        print(json.dumps(runio.rounded(done.experiment.job_json(done.result, done.out_dir)), default=str))
