"""A runnable experiment: everything ganda's command line, grid, planner and results need of it.

An experiment is one class, registered by name (:func:`ganda.registry.register_experiment`):

* ``Options``: a dataclass of its own options. Each field is an option (its type and default, its
  help text in ``field(metadata={"help": ...})``); :meth:`Options.check` refuses a value out of
  range in one line. It is the one place an experiment's options are checked: the command line,
  a grid spec and Python callers all build it.
* :meth:`Experiment.run`: the examples of one task on one model in, a result out (written into
  its run directory, with ``done_file`` last).
* ``phases``: ``"module:function"`` of its costs for ``ganda plan``, and ``done_file``, the file
  that says a run finished (``ganda grid`` skips such jobs). What it wrote is read back by its
  result kind's class (:func:`ganda.registry.register_result`), for :func:`ganda.results.load` and
  ``ganda report`` alike.

An experiment that runs on one model and one task's examples (``on_task``, the default) is run by
``ganda run NAME MODEL --task T --option KEY=VALUE`` and by ``ganda grid`` jobs; one that needs other
inputs (a donor, several task lists) has a command of its own in ``ganda/commands``.
docs/extending.md has an example.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from ..errors import GandaError
from ..models.base import ModelAdapter
from ..tasks.base import Example


@dataclass
class Options:
    """Base of an experiment's options (a dataclass; see the module docstring)."""

    def check(self) -> None:
        """Refuse a value out of range with one line (the default accepts everything)."""

    #: command-line flags spelled other than ``--<name>`` (``ganda path``'s ``--from`` for ``sender``)
    CLI_FLAGS: ClassVar[dict[str, str]] = {}

    def flag(self, name: str) -> str:
        """How an option is named in an error: ``--verify-top`` from the command line, else ``verify_top``."""
        if not getattr(self, "_cli", False):
            return name
        return self.CLI_FLAGS.get(name) or "--" + name.replace("_", "-")

    @classmethod
    def fields(cls) -> list[dataclasses.Field]:
        return [f for f in dataclasses.fields(cls) if not f.name.startswith("_")]

    @classmethod
    def build(cls, values: Mapping[str, Any] | None = None, *, where: str = "", cli: bool = False) -> Options:
        """The options from a mapping (a grid spec's ``options.<experiment>``, keyword arguments):
        an unknown key or a value of the wrong type is one line naming it (``where`` says where it
        was written), then :meth:`check`."""
        values = dict(values or {})
        known = {f.name: f for f in cls.fields()}
        for key in values:
            if key not in known:
                takes = ", ".join(known) or "no options"
                raise GandaError(f"{where}unknown option {key!r} (takes {takes})")
        hints = typing.get_type_hints(cls)
        out = {k: _coerce(v, hints[k], "--" + k.replace("_", "-") if cli else f"{where}{k}") for k, v in values.items()}
        opts = cls(**out)
        object.__setattr__(opts, "_cli", cli)
        try:
            opts.check()
        except GandaError as exc:
            raise GandaError(f"{where}{exc}") from None
        return opts

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in self.fields()}


def _coerce(value: Any, hint: Any, name: str) -> Any:
    """``value`` as the field's type (``int``, ``float``, ``str``, ``bool`` or one of them or None)."""
    args = typing.get_args(hint)
    optional = type(None) in args
    base = next((a for a in args if a is not type(None)), hint) if args else hint
    if value is None:
        if optional:
            return None
        raise GandaError(f"{name} must be {base.__name__}, not empty")
    if base is bool:
        if isinstance(value, bool):
            return value
        raise GandaError(f"{name} must be true or false, not {value!r}")
    if base is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise GandaError(f"{name} must be an integer, not {value!r}")
        return value
    if base is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise GandaError(f"{name} must be a number, not {value!r}")
        if not math.isfinite(value):  # nan or inf: every comparison with it is false, every result null
            raise GandaError(f"{name} must be a finite number, not {value}")
        return float(value)
    if base is str:
        if not isinstance(value, str):
            raise GandaError(f"{name} must be text, not {value!r}")
        return value
    return value


def option_type(hint: Any) -> type:
    """The plain type of an option's annotation (``int | None`` -> ``int``)."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return next(a for a in typing.get_args(hint) if a is not type(None))
    return hint


class Experiment:
    """Base of a registered experiment (see the module docstring)."""

    name: ClassVar[str] = "?"
    summary: ClassVar[str] = ""  # one line: the command's help, the planner's list
    Options: ClassVar[type[Options]] = Options
    done_file: ClassVar[str] = "result.json"
    phases: ClassVar[str | None] = None  # "module:function" (profile, workload, options) -> (phases, kept, notes)
    aliases: ClassVar[tuple[str, ...]] = ()
    on_task: ClassVar[bool] = True  # runs on one model and one task's examples (ganda run, ganda grid)

    def run(self, adapter: ModelAdapter, examples: list[Example], options: Options, *, out_dir: Path,
            config: dict[str, Any], progress: bool = True) -> Any:
        """Run on ``examples`` of one task and write the result into ``out_dir`` (``done_file``
        last, so a run stopped before it is rerun); ``config`` (task, limit, seed) is recorded with
        it. Returns the result."""
        raise GandaError(f"the {self.name} experiment is costed by ganda plan but has no runner")

    def job_summary(self, result: Any) -> dict[str, Any]:
        """The few numbers ``ganda grid`` lists for a finished job (default: the result's summary's numbers)."""
        summary = getattr(result, "summary", None) or {}
        return {k: v for k, v in summary.items() if isinstance(v, int | float | str) and not isinstance(v, bool)}


__all__ = ["Experiment", "Options", "option_type"]
