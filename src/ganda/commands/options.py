"""Options every command shares that the command modules import from one another without a circle
(``ganda.commands.core`` re-exports them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from .. import progress
from ..errors import AT_MOST, GandaError, at_least  # noqa: F401  (the commands' shared checks)
from ..heads import require_heads  # noqa: F401

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


def model_inputs(spec: str) -> list[Path]:
    """:func:`ganda.models.loading.model_inputs`, imported when a command runs (not at ``--help``)."""
    from ..models.loading import model_inputs as inputs

    return inputs(spec)


def _option_value(raw: str) -> Any:
    low = raw.strip().lower()
    if low in ("true", "yes", "on"):
        return True
    if low in ("false", "no", "off"):
        return False
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            pass
    return raw


def parse_options(items: list[str] | None, *, per_task: bool = False) -> dict[str, Any]:
    """``--option`` values as typed task options (booleans, integers, floats, else text; ``-`` in a
    key reads as ``_``): ``["cot=true", "pairs=10"]`` -> ``{"cot": True, "pairs": 10}``. With
    ``per_task`` every key names its task first: ``["bbh.cot=false"]`` -> ``{"bbh": {"cot": False}}``."""
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
            raise GandaError(f"--option {key} is given twice ({opts[key]!r} and {_option_value(raw)!r}); give it once")
        opts[key] = _option_value(raw)
    return out
