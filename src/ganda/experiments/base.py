"""A runnable experiment: everything ganda's command line, grid, planner and results need of it.

An experiment is one class, registered by name (:func:`ganda.registry.register_experiment`):

* ``Options``: a dataclass of its own options. Each field is an option declared with
  :func:`option` (its type and default, help text, bounds, choices, command-line flag); the bounds
  and choices are checked for every field, and :meth:`Options.check` adds the rules between
  fields. It is the one place an experiment's options exist: ``ganda NAME``'s flags and help
  (:mod:`ganda.commands.analyses`), ``ganda run NAME --option``, ``ganda plan -e NAME``, a grid
  spec's ``options.NAME`` and Python callers all build it.
* :meth:`Experiment.run`: the examples of one task on one model in, a result out (written into
  its run directory, with ``done_file`` last).
* ``phases``: ``"module:function"`` of its costs for ``ganda plan`` (``costed_options``: the options
  they read; ``paper``: the paper's headline runs of it, :class:`PaperRun`, for ``ganda plan
  --paper``), and ``done_file``, the file that says a run finished (``ganda grid`` skips such jobs). What it wrote is read back by its
  result kind's class (:func:`ganda.registry.register_result`), for :func:`ganda.results.load` and
  ``ganda report`` alike.

An experiment that runs on one model and one task's examples (``on_task``, the default) is run by
``ganda NAME MODEL --task T --its-flags``, ``ganda run NAME MODEL --task T --option KEY=VALUE`` and
by ``ganda grid`` jobs (:mod:`ganda.experiments.runner` prepares the model and examples for all
three); :meth:`Experiment.show` prints its result. docs/extending.md adds one in a file of its own.
"""

from __future__ import annotations

import json
import typing
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

from .. import runio
from ..errors import GandaError
from ..options import Options, option, option_type

if typing.TYPE_CHECKING:  # ganda --help builds the commands' list without torch
    from ..models.base import ModelAdapter
    from ..tasks.base import Example


DEFAULT_LIMIT = 32  # prompts a run on one task scores when --limit is not given
#: what --ablation means, in every command whose heads are ablated one of the three ways
ABLATION_HELP = ("what an ablated head's slice becomes: zero, mean (its mean over every token of the scored "
                 "prompts) or resample (its value at the same position of another scored prompt, aligned from "
                 "the prompt's end); docs/heads.md")
#: what --limit means for mmlu, in every command that takes it
LIMIT_MMLU = ("; mmlu: the first N questions of each subject, as lm-eval's --limit (--sample: a seeded sample of "
              "N across subjects)")


def parse_options(items: list[str] | None, *, per_task: bool = False) -> dict[str, Any]:
    """``--option`` values by key, as text (``-`` in a key reads as ``_``): ``["cot=true", "pairs=10"]``
    -> ``{"cot": "true", "pairs": "10"}``; whatever takes them reads each as the type it declares
    (:func:`ganda.options.read_text`: ``Options.build(..., text=True)``, a task's options). With
    ``per_task`` every key names its task first: ``["bbh.cot=false"]`` -> ``{"bbh": {"cot": "false"}}``."""
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        task, dot, name = key.partition(".") if per_task else ("", ".", key)
        if not sep or not dot or not name.strip() or (per_task and not task.strip()):
            form = "TASK.KEY=VALUE, e.g. bbh.cot=false" if per_task else "KEY=VALUE"
            raise GandaError(f"--option takes {form}, got {item!r}")
        opts = out.setdefault(task.strip(), {}) if per_task else out
        key = name.strip().replace("-", "_")
        if key in opts:  # one rule for a repeated key: refused, never the last one silently
            raise GandaError(f"--option {key} is given twice ({opts[key]!r} and {raw!r}); give it once")
        opts[key] = raw
    return out


class PaperRun(NamedTuple):
    """One of the paper's headline runs of an experiment, as ``ganda plan --paper`` costs it."""

    model: str  # the shipped config it is costed on (bf16)
    workload: dict[str, Any]  # task, n, tokens, and the experiment's options the costs read
    what: str  # one line naming the run
    experiment: str | None = None  # the name it is costed under (default: the experiment's)


class Experiment:
    """Base of a registered experiment (see the module docstring)."""

    name: ClassVar[str] = "?"
    summary: ClassVar[str] = ""  # one line: the command's help, the planner's list
    Options: ClassVar[type[Options]] = Options
    done_file: ClassVar[str] = "result.json"
    phases: ClassVar[str | None] = None  # "module:function" (profile, workload, options) -> (phases, kept, notes)
    aliases: ClassVar[tuple[str, ...]] = ()
    on_task: ClassVar[bool] = True  # runs on one model and one task's examples (ganda grid's jobs)
    #: what a run takes, which picks its runner (:func:`ganda.experiments.runner.run_experiment`) and
    #: its command's inputs: "task" (one task's examples), "tasks" (a task list), "model" (its own
    #: prompts), "models" (several models), "direct" (run once and printed, no run directory)
    inputs: ClassVar[str] = "task"
    #: run inputs beyond the model, the task, its prompts and the run directory: "ray" (``--ray``,
    #: ``--ray-actors``: exact checks on a Ray cluster), "resume" (``--resume/--no-resume``)
    takes: ClassVar[frozenset[str]] = frozenset()
    default_limit: ClassVar[int | None] = DEFAULT_LIMIT  # prompts (or examples per task) when --limit is not given
    default_out: ClassVar[str | None] = None  # the run directory (default: runs/<name>-<task>)
    #: the options its ``phases`` read, each a flag of ``ganda plan`` (None: every option)
    costed_options: ClassVar[tuple[str, ...] | None] = None
    #: the paper's headline runs of this experiment (``ganda plan --paper``)
    paper: ClassVar[tuple[PaperRun, ...]] = ()

    def __init__(self, resume: bool = True) -> None:
        self.resume = resume  # continue a stopped run in its directory (the experiment's own journal)
        self.task: Any = None  # the task the examples were drawn from (set by the runner): a second draw

    def run(self, adapter: ModelAdapter, examples: list[Example], options: Options, *, out_dir: Path,
            config: dict[str, Any], progress: bool = True) -> Any:
        """Run on ``examples`` of one task and write the result into ``out_dir`` (``done_file``
        last, so a run stopped before it is rerun); ``config`` (task, limit, seed) is recorded with
        it. Returns the result."""
        raise GandaError(f"the {self.name} experiment is costed by ganda plan but has no runner")

    @classmethod
    def plan_options(cls, adapter: ModelAdapter, options: Options, opts: dict[str, Any]) -> None:
        """Put into ``opts`` (what ``phases`` read, ``ganda plan``'s options) those only the model can
        read, refused in one line where :meth:`run` refuses them (head ids it checks, counted as its
        costs count them). The default reads nothing beyond ganda.plan's own (``heads``, layer lists)."""

    def check_run(self, options: Options, run: Any) -> None:
        """Refuse (one line, before any model loads) options that the run's inputs rule out
        (``run``: :class:`ganda.experiments.runner.RunInputs`, e.g. ``--ray`` with an option run
        in this process only). The default accepts every combination."""

    def check_examples(self, examples: list[Example], task: str) -> None:
        """Refuse examples this experiment cannot score (the default takes any multiple-choice prompts)."""

    def job_summary(self, result: Any) -> dict[str, Any]:
        """The few numbers ``ganda grid`` and ``ganda run`` list for a finished job (default: the
        result's summary's numbers)."""
        summary = getattr(result, "summary", None) or {}
        return {k: v for k, v in summary.items() if isinstance(v, int | float | str) and not isinstance(v, bool)}

    def job_json(self, result: Any, out_dir: Path | None) -> dict[str, Any]:
        """``ganda run``'s object: the run directory (None for a direct run), the experiment and
        :meth:`job_summary`."""
        return {"out": None if out_dir is None else str(out_dir), "experiment": self.name, **self.job_summary(result)}

    def as_json(self, result: Any, options: Options, out_dir: Path) -> dict[str, Any]:
        """``ganda NAME --json``: one JSON object (default: :meth:`job_json`)."""
        return self.job_json(result, out_dir)

    def show(self, result: Any, options: Options, run: Any, out_dir: Path) -> None:
        """``ganda NAME``'s printed result for a reader (default: the JSON of :meth:`as_json`)."""
        print(json.dumps(runio.rounded(self.as_json(result, options, out_dir)), default=str))

class ScoredExperiment(Experiment):
    """An experiment that scores one model on a list of tasks, the same examples in every condition
    (``ganda NAME MODEL --task mmlu,knowledge``): :meth:`run_tasks` gets a
    :class:`ganda.experiments.common.Scorer` and saves each result with :meth:`finish`."""

    on_task = False
    # "model": one model, the experiment drawing its own prompts (no Scorer); "models": several models
    inputs: ClassVar[str] = "tasks"
    default_tasks: ClassVar[str] = "mmlu,knowledge"
    default_limit: ClassVar[int | None] = 100  # examples per task (None: every example)
    report_html: ClassVar[bool] = True  # --html/--no-html: report.html beside each result it saves
    #: ``--limit`` and ``--out``'s help where the experiment's own words say more than the shared ones
    input_help: ClassVar[dict[str, str]] = {}

    def __init__(self, resume: bool = True) -> None:
        super().__init__(resume)
        self.finished: list[tuple[Path, Any]] = []  # (run directory, result), in the order saved
        self.command = ""  # the command line, recorded with each result

    def out_name(self, options: Options) -> str:
        """The run directory's name before ``-<model>``, and the kind its claim records."""
        return self.name

    def check_tasks(self, options: Options, tasks: list[str]) -> None:
        """Refuse (one line, before the model loads) options that the task list rules out."""

    def run_tasks(self, adapter: ModelAdapter, scorer: Any, options: Options, *, out_dir: Path, run: Any) -> Any:
        """Score the conditions and :meth:`finish` each result; returns the last."""
        raise GandaError(f"the {self.name} experiment has no runner")

    def run_models(self, adapters: dict[str, ModelAdapter], options: Options, *, out_dir: Path, run: Any) -> Any:
        """Inputs "models": run on every model of the command line (name -> adapter)."""
        raise GandaError(f"the {self.name} experiment has no runner for several models")

    def finish(self, result: Any, out_dir: Path) -> Any:
        """Save ``result`` into ``out_dir`` (``result.json``, CSV, PNG; the command adds report.html)."""
        result.save(out_dir, command=self.command)
        self.finished.append((out_dir, result))
        return result

    def as_json(self, result: Any, options: Options, out_dir: Path) -> dict[str, Any]:
        return {"out": str(out_dir), "summary": result.summary}

    def show(self, result: Any, options: Options, run: Any, out_dir: Path) -> None:
        for where, res in self.finished:
            print(runio.json_text({"out": str(where), "summary": res.summary}, indent=2))


class DirectExperiment(Experiment):
    """An experiment run once on one model and printed, with no run directory (``ganda eval``,
    ``ganda attn``): a task of any kind (generation included) or a text of its own; it writes files
    only where its options name them. :meth:`check_run` refuses what it can before the model
    loads; :meth:`run_model` runs on the loaded model
    (:func:`ganda.experiments.runner.run_direct`)."""

    on_task = False
    inputs: ClassVar[str] = "direct"
    default_limit: ClassVar[int | None] = None  # every example of the task
    task_help: ClassVar[str] = "the task"  # --task's help
    #: the :class:`ganda.experiments.runner.TaskInputs` its command takes
    task_inputs: ClassVar[tuple[str, ...]] = ("limit", "sample", "pairs", "shots", "subjects", "seed")

    def run_model(self, adapter: ModelAdapter, options: Options, run: Any) -> Any:
        """Run on the loaded model (``run``: :class:`ganda.experiments.runner.RunInputs`)."""
        raise GandaError(f"the {self.name} experiment has no runner")


__all__ = ["ABLATION_HELP", "DEFAULT_LIMIT", "DirectExperiment", "Experiment", "Options", "ScoredExperiment", "option",
           "option_type", "parse_options"]
