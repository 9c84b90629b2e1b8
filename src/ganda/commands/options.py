"""Options every command shares that the command modules import from one another without a circle
(``ganda.commands.core`` re-exports them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from .. import progress
from ..errors import GandaError
from ..heads import split_spec

ACTIVE_EDGES = 100  # ganda.attribution.engine.ACTIVE_EDGES, spelled here so that --help needs no torch


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


#: the width of a table printed to a file or pipe (a log): wide enough that no cell wraps or is cut
LOG_WIDTH = 1000


def console() -> Any:
    """A rich Console for a command's tables on stdout: the terminal's width on a terminal, and
    :data:`LOG_WIDTH` columns in a file or pipe, where rich would otherwise wrap at 80."""
    import sys

    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=LOG_WIDTH)


def print_split(con: Any, table: Any, matter: list[Any], helpful: list[Any], top: int, what: str,
                heads: str = "head") -> None:
    """The heads that matter (ablation lowers ``what``), then those helpful when ablated, each as
    ``table(rows, title)``; one line where no ``heads`` qualifies. Shared by ``sweep`` and ``rank``."""
    if matter:
        con.print(table(matter[:top], f"heads that matter: top {min(top, len(matter))} of {len(matter)}, "
                                      f"by {what} drop when ablated"))
    else:
        con.print(f"no {heads}'s ablation lowers the {what}")
    if helpful:
        con.print(table(helpful[:top], f"helpful when ablated: {len(helpful)} head(s) whose ablation raises the {what}"))


def require_heads(flag: str, spec: str | None) -> None:
    """A head list that names no head (``--heads ","``) is refused: read as "none" it would record
    an empty intervention, read as "all" it would run every head."""
    if spec is not None and not split_spec(spec):
        raise GandaError(f"{flag}: no head ids in {spec!r} (expected e.g. L17H24, L3H0-2 or 'L16H*')")


def model_inputs(spec: str) -> list[Path]:
    """The file or directory a model spec loads from (nothing when it names none): what an output path
    must never be, or be inside (:func:`ganda.runio.check_output_file`)."""
    from ..models.loading import model_path

    try:
        path = model_path(spec)
    except GandaError:
        return []
    return [path] if path is not None else []


#: counts bounded above, by flag: each prompt set repeats the whole measurement
AT_MOST = {"--prompt-sets": 100}


def at_least(flag: str, value: int | None, low: int = 1) -> None:
    """A count option (``--limit``, ``--n``, ...) below ``low`` is an error, not an empty run;
    a count in :data:`AT_MOST` is also bounded above."""
    if value is not None and value < low:
        raise GandaError(f"{flag} must be at least {low}, got {value}")
    if value is not None and flag in AT_MOST and value > AT_MOST[flag]:
        raise GandaError(f"{flag} must be at most {AT_MOST[flag]} (each one repeats the whole measurement), got {value}")
