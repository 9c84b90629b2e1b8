"""The one runner of an experiment on one model and one task: ``ganda NAME``, ``ganda run NAME``
and Python callers all come through :func:`run_on_task`, so that every experiment gets the same
checks (before any model loads), the same run directory policy (:func:`ganda.runio.claim_run_dir`),
the same examples for the same ``--task/--limit/--seed`` and the same recorded ``config``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import registry, runio
from ..distributed import ray_sweeps
from ..errors import GandaError, at_least
from ..models import load_model
from ..models.loading import model_inputs
from ..tasks import get_task, task_for_model
from .base import DEFAULT_LIMIT, LIMIT_MMLU, Experiment, Options, ScoredExperiment, option, parse_options
from .common import Scorer, parse_tasks


@dataclass
class TaskInputs(Options):
    """Which prompts a run on one task scores: the inputs ``ganda NAME``, ``ganda run`` and every
    job of a grid spec (its ``options.limit``, ``options.seed``, ...) share, declared once."""

    limit: int | None = option(None, "number of prompts (default: 32)" + LIMIT_MMLU, short="-n", low=1)
    sample: bool = option(False, "mmlu: --limit N draws a seeded sample (--seed) of N questions across the subjects "
                          "instead of lm-eval's first N of each subject")
    pairs: int | None = option(None, "kv: number of key-value pairs")
    shots: int | None = option(None, "few-shot exemplars (mmlu, letters)")
    subjects: str | None = option(None, "mmlu: comma-separated subjects")
    seed: int = option(0, "seed of the prompt sample", low=0)

    def task_options(self) -> dict[str, Any]:
        opts: dict[str, Any] = {"pairs": self.pairs, "shots": self.shots, "subjects": self.subjects}
        if self.sample:
            opts["sample"] = True
        return opts


@dataclass
class RunInputs(TaskInputs):
    """What a run reads besides the experiment's own options: one model, one multiple-choice task
    and its prompts (:class:`TaskInputs`), where the files go, and how the work is spread."""

    model: str = ""
    task: str = "kv"
    out: Path | None = None  # default runs/<experiment>-<task>
    resume: bool = True
    ray: str | None = None
    ray_actors: int | None = None
    allow_pickle: bool = False
    progress: bool = True
    # a list of tasks scored with the same examples in every condition (ScoredExperiment)
    tasks: str | None = None
    knowledge_limit: int | None = None
    command: str = ""  # the command line recorded with the results
    models: list[str] | None = None  # several models, the same prompts for each (inputs "models")
    option: list[str] | None = None  # --option KEY=VALUE: any option of the task
    force: bool = False  # replace an output file that ganda did not write
    announce: bool = False  # before a long run, say how long it will take (ganda.plan.announce; the command line)

    def task_options(self) -> dict[str, Any]:
        return {**super().task_options(), **parse_options(self.option)}

    def check_counts(self) -> None:
        """The counts and the seed, refused before anything loads: a negative seed has no numpy
        generator, and it would fail at the first interval, after the model had run."""
        for flag, value in (("--limit", self.limit), ("--knowledge-limit", self.knowledge_limit),
                            ("--ray-actors", self.ray_actors)):
            at_least(flag, value)
        at_least("--seed", self.seed, 0)

    def out_dir(self, default: str | Path) -> Path:
        """``--out``, else ``default`` (the experiment's own, else one named after what it runs on)."""
        return self.out if self.out is not None else Path(default)


@dataclass
class Run:
    """A finished run: its result, where its files are, and what it ran on."""

    experiment: Experiment
    result: Any
    out_dir: Path | None  # None: a direct run, which has no run directory
    adapter: Any
    examples: list[Any]
    options: Options


def check_inputs(cls: type[Experiment], run: RunInputs, options: Options) -> Any:
    """Everything that can be refused before the model loads: counts, the task and its options,
    the experiment's own rules between options and inputs. Returns the task."""
    run.check_counts()
    task = get_task(run.task, **run.task_options())
    if task.kind != "mc":
        raise GandaError(f"task {run.task!r} is a generation task; {cls.name} scores multiple-choice tasks only")
    cls().check_run(options, run)
    return task


def run_on_task(cls: type[Experiment], run: RunInputs, options: Options) -> Run:
    """Check, claim the run directory, load the model, draw the examples and run ``cls``."""
    task = check_inputs(cls, run, options)
    out_dir = runio.claim_run_dir(run.out_dir(cls.default_out or Path("runs") / f"{cls.name}-{run.task}"), kind=cls.name,
                                  models=model_inputs(run.model))
    adapter = load_model(run.model, allow_pickle=run.allow_pickle)
    with ray_sweeps(run.ray, run.ray_actors, allow_pickle=run.allow_pickle):
        return run_loaded(cls, run, options, adapter, task, out_dir)


def run_loaded(cls: type[Experiment], run: RunInputs, options: Options, adapter: Any, task: Any,
               out_dir: Path) -> Run:
    """Draw the examples of ``task`` (checked by :func:`check_inputs`) for the loaded model and run
    ``cls`` into ``out_dir``: what follows the model's load in :func:`run_on_task` and in every
    ``ganda grid`` job, so both record the same ``config`` and refuse the same examples."""
    task = task_for_model(run.task, task, adapter, **run.task_options())
    n = run.limit if run.limit is not None else cls.default_limit
    examples = task.examples(limit=n, seed=run.seed)
    if not examples:
        raise GandaError(f"task {run.task!r} gave no examples")
    exp = cls(resume=run.resume)
    exp.task = task
    exp.check_examples(examples, run.task)
    config = {"task": task.config(), "limit": n, "n": len(examples), "seed": run.seed, "options": options.journal_json()}
    result = exp.run(adapter, examples, options, out_dir=out_dir, config=config, progress=run.progress)
    return Run(exp, result, out_dir, adapter, examples, options)


def run_on_tasks(cls: type[ScoredExperiment], run: RunInputs, options: Options) -> Run:
    """Check, claim the run directory (``runs/<name>-<model>``), load the model and run ``cls`` on
    its task list, scored by one :class:`ganda.experiments.common.Scorer`."""
    run.check_counts()
    scored = cls.inputs == "tasks"  # "model": the experiment draws its own prompts
    names = parse_tasks(run.tasks or cls.default_tasks) if scored else []  # kv1, lab-kv999: refused by the task's bounds
    exp = cls(resume=run.resume)
    exp.command = run.command
    exp.check_tasks(options, names)
    exp.check_run(options, run)
    name = exp.out_name(options)
    default = cls.default_out or Path("runs") / f"{name}-{Path(run.model).stem or run.model}"
    out_dir = runio.claim_run_dir(run.out_dir(default), kind=registry.writer(name), models=model_inputs(run.model))
    adapter = load_model(run.model, allow_pickle=run.allow_pickle)
    run.limit = run.limit if run.limit is not None else cls.default_limit
    scorer = Scorer(adapter, names, limit=run.limit, knowledge_limit=run.knowledge_limit, seed=run.seed,
                    progress=run.progress, sample=run.sample) if scored else None
    with ray_sweeps(run.ray, run.ray_actors, allow_pickle=run.allow_pickle):
        result = exp.run_tasks(adapter, scorer, options, out_dir=out_dir, run=run)
    return Run(exp, result, out_dir, adapter, [], options)


def run_on_models(cls: type[ScoredExperiment], run: RunInputs, options: Options) -> Run:
    """Check, claim the run directory, load every model of ``run.models`` and run ``cls`` on them."""
    models = run.models or []
    if len(models) < 2:
        raise GandaError("give at least two models to compare")
    run.check_counts()
    exp = cls(resume=run.resume)
    exp.check_run(options, run)
    out_dir = runio.claim_run_dir(run.out_dir(cls.default_out or f"runs/{cls.name}"), kind=cls.name,
                                  models=[p for m in models for p in model_inputs(m)])
    adapters = {m: load_model(m, allow_pickle=run.allow_pickle) for m in models}
    run.limit = run.limit if run.limit is not None else cls.default_limit
    result = exp.run_models(adapters, options, out_dir=out_dir, run=run)
    return Run(exp, result, out_dir, adapters, [], options)


def run_direct(cls: type[Experiment], run: RunInputs, options: Options) -> Run:
    """Check what can be refused before the model loads (the counts, then the experiment's own
    inputs: its task, its output files), load the model and run ``cls`` (a
    :class:`ganda.experiments.base.DirectExperiment`) once: no run directory."""
    run.check_counts()
    if run.out is not None:  # it would be ignored, and the caller would look for files that never come
        own = "; its file is the out option (--option out=FILE)" if any(f.name == "out" for f in cls.Options.fields()) else ""
        raise GandaError(f"{cls.name} writes no run directory: drop --out{own}")
    exp = cls(resume=False)
    exp.check_run(options, run)
    adapter = load_model(run.model, allow_pickle=run.allow_pickle)
    return Run(exp, exp.run_model(adapter, options, run), None, adapter, [], options)


def run_experiment(cls: type[Experiment], run: RunInputs, options: Options) -> Run:
    """Run ``cls`` through the runner of its inputs (``inputs``: one task's examples, a task list or
    its own prompts, several models, or a direct run with no run directory)."""
    runner = {"task": run_on_task, "models": run_on_models, "direct": run_direct}
    return runner.get(cls.inputs, run_on_tasks)(cls, run, options)  # type: ignore[arg-type]


__all__ = ["DEFAULT_LIMIT", "Run", "RunInputs", "TaskInputs", "check_inputs", "run_direct", "run_experiment",
           "run_loaded", "run_on_models", "run_on_task", "run_on_tasks"]
