"""Options every command shares that the command modules import from one another without a circle
(``ganda.commands.core`` re-exports them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from .. import progress
from ..errors import AT_MOST, GandaError, at_least  # noqa: F401  (the commands' shared checks)
from ..experiments.base import parse_options  # noqa: F401
from ..heads import require_heads  # noqa: F401


def _set_quiet(value: bool) -> bool:
    if value:
        progress.set_quiet(True)
    return value


QUIET = typer.Option(False, "--quiet", "-q", callback=_set_quiet,
                     help="no progress bars or notes on stderr: the results and the final summary line only")

FORCE = typer.Option(False, "--force", help="replace an existing output file that ganda did not write (never a "
                     "file the command reads)")


ABLATIONS = ("zero", "mean", "resample")  # ganda.ablation.ABLATIONS, spelled here so that --help needs no torch
ABLATE_AT = ("ends", "key", "final", "elsewhere")  # ganda.sites.CLASSES
ABLATION_HELP = ("what an ablated head's slice becomes: zero, mean (its mean over every token of the scored "
                 "prompts) or resample (its value at the same position of another scored prompt, aligned from "
                 "the prompt's end); docs/heads.md")


def ablation_option(kinds: str = "zero|mean|resample") -> Any:
    """``--ablation``, naming the kinds the command runs."""
    return typer.Option("zero", "--ablation", help=f"{kinds}: {ABLATION_HELP}")


def model_inputs(spec: str) -> list[Path]:
    """:func:`ganda.models.loading.model_inputs`, imported when a command runs (not at ``--help``)."""
    from ..models.loading import model_inputs as inputs

    return inputs(spec)
