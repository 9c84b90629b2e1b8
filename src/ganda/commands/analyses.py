"""``ganda NAME`` for every registered experiment: its command is built from the experiment alone
(no command body per analysis).

The flags are the run's inputs (:func:`run_inputs` for a run on one task, :func:`scored_inputs`
for one model on a task list, its own prompts or several models, :func:`direct_inputs` for a run
printed with no run directory; the prompts' options are :class:`ganda.experiments.runner.TaskInputs`,
the inputs an experiment ``takes`` :data:`OPTIONAL_INPUTS`), and the experiment's own options, read
from its ``Options`` dataclass (:func:`ganda.experiments.base.option`: type, default, help, flag,
bounds, choices). typer builds the command from a signature made of both, so that help, types and
usage errors are typer's as for every hand-written command; values are then checked by
``Options.build``, the same check ``ganda run``, ``ganda grid`` and Python callers get, and the run
goes through the runner of its inputs (:mod:`ganda.experiments.runner`).

:class:`AnalysisGroup` lists these commands beside the hand-written ones without importing an
experiment (``ganda --help`` needs no torch) and builds one when it is called.
"""

from __future__ import annotations

import inspect
import json
import typing
from pathlib import Path
from typing import Any

import click
import typer
import typer.core
import typer.main

from .. import registry
from ..experiments.base import DEFAULT_LIMIT
from ..options import flag_name, option_values, turns_off
from .grid import RAY, RAY_ACTORS
from .options import (
    FORCE,
    MODEL,
    MODEL_HELP,
    PICKLE,
    QUIET,
    TASKS_ALIAS,
    int_option,
    limit_option,
    task_list,
    task_list_option,
)


def param(name: str, default: Any, annotation: Any) -> inspect.Parameter:
    """A keyword parameter of a generated command (typer reads its default and annotation)."""
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


def _task_inputs(cls: Any) -> dict[str, tuple[Any, Any]]:
    """:class:`ganda.experiments.runner.TaskInputs` as typer options (declared there once); ``-n/--limit``
    states the experiment's own default where it is not TaskInputs' usual one."""
    from ..experiments.runner import TaskInputs

    hints = typing.get_type_hints(TaskInputs)
    inputs = {f.name: (p.default, p.annotation) for f in TaskInputs.fields()
              for p in [option_parameter(f, hints[f.name])]}
    if cls.default_limit != DEFAULT_LIMIT:
        inputs["limit"] = (limit_option(None, "number of examples (default: every example of the task)"
                                        if cls.default_limit is None else
                                        f"number of prompts (default: {cls.default_limit})"), int | None)
    return inputs


def run_inputs(cls: Any) -> dict[str, tuple[Any, Any]]:
    """The inputs of a run on one task, in the order of ``--help``: name -> (typer default, type)."""
    inputs = {
        "model": (MODEL, str),
        "task": (typer.Option("kv", "--task", "-t", help="any multiple-choice task (kv, letters, lab-mmlu, mmlu, "
                              "arc_easy, arc_challenge, openbookqa, piqa, hellaswag, winogrande, ...)"), str),
        **_task_inputs(cls),
        "out": (typer.Option(None, "--out", "-o", help="run directory (default: "
                             f"{cls.default_out or 'runs/<experiment>-<task>'})"), Path | None),
        "as_json": (typer.Option(False, "--json", help="print one JSON object instead of tables"), bool),
        "allow_pickle": (PICKLE, bool),
        "quiet": (QUIET, bool),
    }
    return inputs


def direct_inputs(cls: Any) -> dict[str, tuple[Any, Any]]:
    """The inputs of a :class:`ganda.experiments.base.DirectExperiment` (run once, no run directory):
    the model, a task of any kind and the :class:`ganda.experiments.runner.TaskInputs` it names."""
    prompts = _task_inputs(cls)
    inputs = {"model": (MODEL, str), "task": (typer.Option("kv", "--task", "-t", help=cls.task_help), str),
              **{name: prompts[name] for name in cls.task_inputs}}
    return {**inputs, "allow_pickle": (PICKLE, bool), "quiet": (QUIET, bool)}


def scored_inputs(cls: Any) -> dict[str, tuple[Any, Any]]:
    """The inputs of a :class:`ganda.experiments.base.ScoredExperiment`: one model scored on a list
    of tasks (its default the experiment's), the same examples in every condition."""
    prompts = _task_inputs(cls)
    own = cls.input_help
    limit = own.get("limit") or ("examples per task (the same examples in every condition" +
                                 ("" if cls.default_limit is not None else "; default: every example") + ")")
    return {
        "model": (MODEL, str),
        "task": (task_list_option(cls.default_tasks, "mmlu, knowledge, letters, kv20, lab-mmlu, ..."), str | None),
        "tasks": (TASKS_ALIAS, str | None),
        "limit": (limit_option(cls.default_limit, limit, mmlu="limit" not in own), int | None),
        "sample": prompts["sample"],
        "knowledge_limit": (int_option(None, "--knowledge-limit", help="examples per knowledge task (default: "
                                         "--limit)"), int | None),
        "seed": prompts["seed"],
        "out": (typer.Option(None, "--out", "-o", help=f"{own.get('out', 'run directory')} (default: "
                             f"{cls.default_out or 'runs/<experiment>-<model>'})"), Path | None),
        "html": (typer.Option(True, "--html/--no-html", help="also write report.html into the run directory"), bool),
        "allow_pickle": (PICKLE, bool),
        "quiet": (QUIET, bool),
    }


#: inputs an experiment takes by naming them in ``Experiment.takes``
OPTIONAL_INPUTS: dict[str, dict[str, tuple[Any, Any]]] = {
    "resume": {"resume": (typer.Option(True, "--resume/--no-resume", help="continue a stopped run in --out"), bool)},
    "ray": {"ray": (RAY, str | None), "ray_actors": (RAY_ACTORS, int | None)},
    "json": {"as_json": (typer.Option(False, "--json", help="print one JSON object"), bool)},
    "option": {"option": (typer.Option(None, "--option", help="any task option, KEY=VALUE (repeatable), e.g. --option "
                                       "cot=true --option subtask=date_understanding"), list[str] | None)},
    "force": {"force": (FORCE, bool)},
}


def option_parameter(f: Any, hint: Any) -> inspect.Parameter:
    """One ``Options`` field as a typer option: its flag(s), default and help from :func:`option`."""
    from ..experiments.base import option_type

    meta = f.metadata
    if turns_off(f):
        return param(f.name, typer.Option(False, meta["flag"], help=meta.get("help", "")), bool)
    names = [flag_name(f)]
    default = ... if meta.get("required") else f.default
    if meta.get("short"):
        names.append(meta["short"])
    help_text = meta.get("help", "")
    if meta.get("choices") and not any(c in help_text for c in meta["choices"]):
        help_text += f" ({', '.join(meta['choices'])})"
    base = option_type(hint)
    annotation = base | None if f.default is None else base
    make = int_option if base is int else typer.Option
    return param(f.name, make(default, *names, help=help_text, hidden=meta.get("hidden", False)), annotation)


def _signature(cls: Any) -> tuple[inspect.Signature, list[Any]]:
    """The command's parameters: the model argument, the experiment's options, the other inputs."""
    profile = cls.inputs
    inputs = {"task": run_inputs, "direct": direct_inputs}.get(profile, scored_inputs)(cls)
    if profile in ("model", "models"):  # its own prompts: no task list
        for name in ("task", "tasks", "sample", "knowledge_limit"):
            del inputs[name]
    if profile == "models":  # two or more models, the same prompts for each
        del inputs["model"]
        inputs = {"models": (typer.Argument(..., help="two or more models, each " + MODEL_HELP + "; differences are "
                                            "the first minus each other"), list[str]), **inputs}
    if "html" in inputs and not cls.report_html:
        del inputs["html"]
    for what in sorted(cls.takes):
        inputs.update(OPTIONAL_INPUTS[what])
    hints = typing.get_type_hints(cls.Options)
    fields = cls.Options.fields()
    clash = [f.name for f in fields if f.name in inputs]
    if clash:
        raise TypeError(f"{cls.__name__}.Options declares {clash[0]!r}, an input every run takes")
    first = "models" if "models" in inputs else "model"
    params = [param(first, *inputs.pop(first))]
    if profile == "direct":  # which prompts, then what is done to them (as ganda eval has always listed them)
        params += [param(name, *inputs.pop(name)) for name in ("task", *cls.task_inputs)]
    params += [option_parameter(f, hints[f.name]) for f in fields]
    params += [param(name, default, annotation) for name, (default, annotation) in inputs.items()]
    return inspect.Signature(params), fields


def build_command(name: str) -> click.Command:
    """``ganda NAME`` for the registered experiment ``name``."""
    from ..experiments.runner import RunInputs

    cls = registry.experiment(name)
    signature, fields = _signature(cls)

    def command(**values: Any) -> None:
        from .. import runio
        from ..experiments.runner import run_experiment

        as_json, quiet, html = values.pop("as_json", False), values.pop("quiet"), values.pop("html", False)
        given = option_values(fields, {f.name: values.pop(f.name) for f in fields})
        options = cls.Options.build(given, cli=True)
        if "tasks" in values:  # a ScoredExperiment: --task is a list, --tasks its other spelling
            values["tasks"] = task_list(values.pop("task"), values.pop("tasks"), cls.default_tasks)
        if "models" in values:
            values["model"] = values["models"][0]
        run = RunInputs(**values, progress=not (quiet or as_json), command=runio.command_line(), announce=True)
        done = run_experiment(cls, run, options)
        if html:
            write_reports(done.experiment.finished)
        if as_json:
            from ..finite import finite_json

            print(json.dumps(runio.rounded(finite_json(done.experiment.as_json(done.result, options, done.out_dir))),
                             default=str))
        else:
            done.experiment.show(done.result, options, run, done.out_dir)

    command.__signature__ = signature  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in signature.parameters.values()}
    command.__doc__ = inspect.getdoc(cls) or cls.summary
    app = typer.Typer(rich_markup_mode=None, add_completion=False)
    app.command(name, short_help=registry.experiment_summary(name))(command)
    return typer.main.get_command(app)


def write_reports(finished: list[tuple[Path, Any]]) -> None:
    """report.html in each run directory a ScoredExperiment saved."""
    from ..report import write_report

    for out_dir, result in finished:
        write_report([out_dir], out_dir / "report.html", title=f"ganda {result.kind}: {result.model}")


class AnalysisGroup(typer.core.TyperGroup):
    """ganda's commands: the hand-written ones, one per registered experiment, and those whose
    flags are read from the experiments (``plan``); the last two are built when called."""

    #: a hand-written command built when called: name -> (its one-line summary, the builder)
    lazy: typing.ClassVar[dict[str, tuple[str, Any]]] = {}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(self.commands) | set(self.lazy) | set(registry.command_experiments()))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in self.lazy:
            self.commands[cmd_name] = self.lazy[cmd_name][1]()
        elif cmd_name not in self.commands and cmd_name in registry.command_experiments():
            self.commands[cmd_name] = build_command(cmd_name)
        return self.commands.get(cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The list of ``ganda --help``, each experiment's line from the registry (nothing imported)."""
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.commands.get(name)
            if cmd is None:
                rows.append((name, self.lazy[name][0] if name in self.lazy else registry.experiment_summary(name)))
            elif not cmd.hidden:
                rows.append((name, cmd.get_short_help_str(formatter.width - 6 - len(name))))
        with formatter.section("Commands"):
            formatter.write_dl(rows)


__all__ = ["OPTIONAL_INPUTS", "run_inputs", "AnalysisGroup", "build_command", "option_parameter",
           "param", "turns_off", "flag_name", "option_values", "write_reports"]
