"""Options every command shares that the command modules import from one another without a circle
(``ganda.commands.core`` re-exports them)."""

from __future__ import annotations

import typer

from .. import progress


def _set_quiet(value: bool) -> bool:
    if value:
        progress.set_quiet(True)
    return value


QUIET = typer.Option(False, "--quiet", "-q", callback=_set_quiet,
                     help="no progress bars or notes on stderr: the results and the final summary line only")

FORCE = typer.Option(False, "--force", help="replace an existing output file that ganda did not write (never a "
                     "file the command reads)")
