"""An analysis's options, each declared once: its type and default, help text, command-line flag,
bounds and choices (:func:`option`), checked for every field and by the rules between fields
(:meth:`Options.check`). The engines take their settings as one such object (``rank_heads``'s
:class:`~ganda.attribution.ranking.RankOptions`, ``run_sweep``'s, ``rank_edges``'s), and the
command line, ``ganda grid``, ``ganda plan`` and Python callers build it
(:mod:`ganda.experiments.base`).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any

from .errors import FALSE_WORDS, TRUE_WORDS, GandaError


def option(default: Any, help: str, *, flag: str | None = None, short: str | None = None,
           low: float | None = None, high: float | None = None, choices: tuple[str, ...] | None = None,
           why: str = "", hidden: bool = False, required: bool = False, journal: bool = True) -> Any:
    """One option of an experiment, declared once: its default, ``help`` text, command-line ``flag``
    (default ``--name``; ``--no-x`` for a switch on by default that the flag turns off) and ``short`` flag,
    the bounds ``low``/``high`` of a number (``why``: a few words on the bound) and the ``choices``
    of a text; ``required``: the command line asks for it (the default stands for "not given");
    ``journal=False``: the run's journaled units do not depend on it (rows printed, a step run after
    them), so a run resumes whatever its value (:meth:`Options.journal_json`). Everything that reads an experiment's options reads them from here."""
    meta = {"help": help, "flag": flag, "short": short, "low": low, "high": high, "choices": choices, "why": why,
            "hidden": hidden, "required": required, "journal": journal}
    return field(default=default, metadata=meta)


@dataclass
class Options:
    """Base of an experiment's options (a dataclass; see the module docstring)."""

    def check(self) -> None:
        """Refuse (one line) a combination of values that the fields' own bounds allow but the
        experiment does not (the default accepts every combination)."""

    def check_fields(self) -> None:
        """Each field's bounds and choices, as declared by :func:`option`."""
        for f in self.fields():
            value, meta = getattr(self, f.name), f.metadata
            if value is None or isinstance(value, bool):
                continue
            why = f" ({meta['why']})" if meta.get("why") else ""  # explains the upper bound where there is one
            if meta.get("low") is not None and value < meta["low"]:
                low_why = "" if meta.get("high") is not None else why
                raise GandaError(f"{self.flag(f.name)} must be at least {_num(meta['low'])}{low_why}, got {value}")
            if meta.get("high") is not None and value > meta["high"]:
                raise GandaError(f"{self.flag(f.name)} must be at most {_num(meta['high'])}{why}, got {value}")
            if meta.get("choices") and value not in meta["choices"]:
                raise GandaError(f"{self.flag(f.name)} must be {_either(meta['choices'])}, not {value!r}")

    def changed(self, name: str) -> bool:
        """Whether option ``name`` differs from its default: a value given, which a rule of
        :meth:`check` refuses where nothing would read it (an option of another option left out)."""
        f = next(f for f in self.fields() if f.name == name)
        return getattr(self, name) != f.default

    def needs(self, name: str, other: str, what: str) -> None:
        """Refuse ``name`` changed from its default while ``other`` is off: it ``what`` (its use)."""
        if self.changed(name) and not getattr(self, other):
            raise GandaError(f"{self.flag(name)} {what} {self.flag(other)}: give {self.flag(other)} too, or drop "
                             f"{self.flag(name)}")

    @classmethod
    def cli_flag(cls, name: str) -> str:
        """The command-line flag of option ``name`` (``verify_top`` -> ``--verify-top``; a switch's
        ``--x/--no-x`` gives ``--x``)."""
        f = next((f for f in cls.fields() if f.name == name), None)
        return flag_name(f).split("/")[0] if f is not None else "--" + name.replace("_", "-")

    def flag(self, name: str) -> str:
        """How an option is named in an error: ``--verify-top`` given as a flag, else ``verify_top``."""
        return self.cli_flag(name) if name in getattr(self, "_cli", ()) else name

    @classmethod
    def fields(cls) -> list[dataclasses.Field]:
        return [f for f in dataclasses.fields(cls) if not f.name.startswith("_")]

    @classmethod
    def build(cls, values: Mapping[str, Any] | None = None, *, where: str = "", cli: bool | Collection[str] = False,
              text: bool = False) -> Options:
        """The options from a mapping (a grid spec's ``options.<experiment>``, keyword arguments):
        an unknown key or a value of the wrong type is one line naming it (``where`` says where it
        was written), then :meth:`check`. ``cli``: the values are command-line flags (True), or
        those of the keys named are, and an error names them by their flag. ``text``: the text
        values are ``--option KEY=VALUE`` text, each read as its field's type (:func:`read_text`)."""
        values = dict(values or {})
        known = {f.name: f for f in cls.fields()}
        for key in values:
            if key not in known:
                takes = ", ".join(known) or "no options"
                raise GandaError(f"{where}unknown option {key!r} (takes {takes})")
        hints = typing.get_type_hints(cls)
        if text:
            values = {k: read_text(v, [option_type(hints[k])]) if isinstance(v, str) else v for k, v in values.items()}
        flags = frozenset(known) if cli is True else frozenset(cli or ())
        out = {k: _coerce(v, hints[k], cls.cli_flag(k) if k in flags else f"{where}{k}") for k, v in values.items()}
        opts = cls(**out)
        object.__setattr__(opts, "_cli", flags)
        try:
            opts.check_fields()
            opts.check()
        except GandaError as exc:
            raise GandaError(f"{where}{exc}") from None
        return opts

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in self.fields()}

    def journal_json(self) -> dict[str, Any]:
        """The options a run's journal records and a resume compares: those its units depend on."""
        return {f.name: getattr(self, f.name) for f in self.fields() if f.metadata.get("journal", True)}


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
    if typing.get_origin(base) is list:  # a list of text; one --option KEY=VALUE gives one item
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not all(isinstance(v, str) for v in items):
            raise GandaError(f"{name} must be a list of text, not {value!r}")
        return list(items)
    if isinstance(base, type) and issubclass(base, PurePath) and not isinstance(value, str | PurePath):
        raise GandaError(f"{name} must be a path, not {value!r}")
    return value


def read_text(text: str, allowed: Sequence[Any]) -> Any:
    """``--option KEY=VALUE`` text as the first of the ``allowed`` types it spells: itself for a
    text option, ``true/yes/on/1`` or ``false/no/off/0`` for a switch, else an integer, else a
    number; the text unchanged where none fits (the type check then names it). The one reading of
    such text, for an experiment's options and a task's alike."""
    if str in allowed:
        return text
    low = text.strip().lower()
    if bool in allowed and low in TRUE_WORDS + FALSE_WORDS:
        return low in TRUE_WORDS
    for kind in (whole_number, float):
        if (int if kind is whole_number else kind) in allowed:
            try:
                return kind(text)
            except ValueError:
                pass
    return text


def whole_number(text: Any) -> Any:
    """Integer text as an int: ASCII digits after an optional sign, nothing else, for a flag and an
    ``--option`` alike. typer reads an ``int`` through pydantic, which takes ``0-5`` for -5 and ``3.0``
    for 3 (``--seed 0-5`` would run seed -5), and ``int()`` takes ``1_000`` and Arabic-Indic digits
    (a default, already a number, passes as it is)."""
    if not isinstance(text, str):
        return text
    digits = text.strip().removeprefix("-").removeprefix("+")
    if not (digits.isascii() and digits.isdigit()):
        raise ValueError(f"not a whole number: {text!r}")
    return int(text)


def option_values(fields: Any, given: Mapping[str, Any]) -> dict[str, Any]:
    """The flags given for ``fields`` as option values, in the order given: a ``--no-x`` flag given
    turns its option off."""
    by_name = {f.name: f for f in fields}
    return {k: (not v if turns_off(by_name[k]) else v) for k, v in given.items() if k in by_name}


def flag_name(f: dataclasses.Field) -> str:
    """An option's flag as declared (``--x/--no-x`` whole), else ``--`` and its name in dashes."""
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def turns_off(f: dataclasses.Field) -> bool:
    """A switch on by default whose flag turns it off (``roles`` as ``--no-roles``): the command
    takes the flag, the option gets its opposite."""
    return f.default is True and (f.metadata.get("flag") or "").startswith("--no-")


def _either(choices: tuple[str, ...]) -> str:
    return " or ".join(choices) if len(choices) == 2 else "one of " + ", ".join(choices)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def option_type(hint: Any) -> type:
    """The plain type of an option's annotation (``int | None`` -> ``int``)."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return next(a for a in typing.get_args(hint) if a is not type(None))
    return hint
