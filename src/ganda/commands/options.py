"""What the hand-written commands share: the model argument, one vocabulary of options (``-n/--limit``,
``-t/--task``, ``--seed``, ``--allow-pickle``, ``--force``, ``-q/--quiet``) and their checks.
The commands generated from registered experiments take theirs from the experiments' declarations
(:mod:`ganda.commands.analyses`).

Nothing here imports torch, so that ``ganda --help`` and a bad flag answer at once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from .. import progress
from ..errors import GandaError, at_least  # noqa: F401  (the commands' shared checks)
from ..experiments.base import LIMIT_MMLU, parse_options  # noqa: F401
from ..options import whole_number

DEFAULT_MODEL = "smollm2-135m"  # ganda.models.DEFAULT_MODEL, spelled here so that --help needs no torch
MODEL_HELP = ("smollm2-135m, gemma3-270m, a lab model (lab-llama-h1, lab-mamba2-9k, lab-hybrid-late-7k5, "
              "lab-distilled-h1, ...), a .gguf file, a local HF directory or a hub id")
MODEL = typer.Argument(DEFAULT_MODEL, help=MODEL_HELP)


def int_option(default: Any, *names: str, **kw: Any) -> Any:
    """``typer.Option`` of an integer (or None), its text read by :func:`ganda.options.whole_number`:
    every integer flag of every command is declared through it."""
    return typer.Option(default, *names, parser=whole_number, **kw)
PICKLE = typer.Option(False, "--allow-pickle", help="allow *.bin/*.pt weights (unpickling runs code)")
SEED = int_option(0, "--seed", help="seed of the prompt sample")


def _set_quiet(value: bool) -> bool:
    if value:
        progress.set_quiet(True)
    return value


QUIET = typer.Option(False, "--quiet", "-q", callback=_set_quiet,
                     help="no progress bars or notes on stderr: the results and the final summary line only")

FORCE = typer.Option(False, "--force", help="replace an existing output file that ganda did not write (never a "
                     "file the command reads)")


def limit_option(default: int | None, what: str = "examples per task", mmlu: bool = True) -> Any:
    """``-n/--limit``: one name and one meaning in every command (how many examples or prompts)."""
    return int_option(default, "--limit", "-n", help=what + (LIMIT_MMLU if mmlu else ""))


TASKS_ALIAS = typer.Option(None, "--tasks", hidden=True, help="another spelling of --task")


def task_list_option(default: str, examples: str) -> Any:
    """``-t/--task`` of a command that scores several tasks: the one task option, a comma list."""
    return typer.Option(None, "--task", "-t", help=f"comma-separated tasks: {examples} (default {default})")


def task_list(task: str | None, tasks: str | None, default: str) -> str:
    """The tasks of ``--task`` or of its other spelling ``--tasks`` (kept so that written command
    lines still run); the two naming different lists is an error, not a silent choice."""
    if task is not None and tasks is not None and task != tasks:
        raise GandaError(f"--task {task} and --tasks {tasks}: --tasks is another spelling of --task, give one")
    return task if task is not None else tasks if tasks is not None else default


def model_inputs(spec: str) -> list[Path]:
    """:func:`ganda.models.loading.model_inputs`, imported when a command runs (not at ``--help``)."""
    from ..models.loading import model_inputs as inputs

    return inputs(spec)
