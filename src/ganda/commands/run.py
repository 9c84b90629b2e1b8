"""``ganda run EXPERIMENT MODEL``: any registered experiment (:mod:`ganda.experiments.base`) on one
task's examples, with the experiment's own options as ``--option KEY=VALUE``."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from .. import runio
from ..errors import GandaError
from .core import MODEL, PICKLE, QUIET, SEED, at_least, limit_option, model_inputs, parse_options

#: the command of a registered experiment that ``ganda run`` does not run, where it is named otherwise
COMMANDS = {"maps": "attn"}


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
        from .. import registry
        from ..models import load_model
        from ..tasks import get_task, task_for_model

        at_least("--limit", limit)
        cls = registry.experiment(experiment)
        if not cls.on_task:
            runs = ", ".join(n for n in registry.experiment_names() if registry.experiment(n).on_task)
            raise GandaError(f"the {cls.name} experiment does not run on one task's examples: its command is ganda "
                             f"{COMMANDS.get(cls.name, cls.name)} (ganda run runs {runs})")
        options = cls.Options.build(parse_options(option))
        task_obj = get_task(task)
        if task_obj.kind != "mc":
            raise GandaError(f"task {task!r} is a generation task; experiments score multiple-choice tasks")
        out_dir = runio.claim_run_dir(out if out is not None else Path("runs") / f"{cls.name}-{task}", kind=cls.name,
                                         models=model_inputs(model))
        adapter = load_model(model, allow_pickle=allow_pickle)
        task_obj = task_for_model(task, task_obj, adapter)
        n = limit if limit is not None else 32
        examples = task_obj.examples(limit=n, seed=seed)
        if not examples:
            raise GandaError(f"task {task!r} gave no examples")
        config = {"task": task_obj.config(), "limit": n, "n": len(examples), "seed": seed, "options": options.to_json()}
        result = cls().run(adapter, examples, options, out_dir=out_dir, config=config, progress=not quiet)
        print(json.dumps(runio.rounded({"out": str(out_dir), "experiment": cls.name, **cls().job_summary(result)}),
                             default=str))
