"""The ``ganda`` command line: a thin typer layer over the library (parse, call, print).

Commands live in ``ganda/commands/<area>.py``; each module defines ``register(app)`` and is
discovered automatically, so areas can be added without editing this file.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

import typer

from .errors import GandaError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="ganda: find, measure, disable and transplant Gather-and-Aggregate heads.",
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """ganda: find, measure, disable and transplant Gather-and-Aggregate heads."""


def _register_commands() -> None:
    from . import commands

    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        if hasattr(module, "register"):
            module.register(app)


_register_commands()


def main(argv: list[str] | None = None) -> int:
    """Entry point: user errors print one line and exit 2, never a traceback."""
    try:
        app(args=argv, standalone_mode=False)
    except GandaError as exc:
        print(f"ganda: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ganda: interrupted", file=sys.stderr)
        return 130
    except SystemExit as exc:  # typer/click exit
        return int(exc.code or 0)
    except Exception as exc:  # usage errors from typer's click layer: show them like click does
        if hasattr(exc, "show") and hasattr(exc, "exit_code"):
            exc.show()
            return int(exc.exit_code)
        if type(exc).__name__ == "Abort":
            return 1
        raise
    return 0
