"""The common shape of every task: examples with a prompt, choices (or a generation target),
a gold answer, and the character spans of the *segments* a Gather head summarises.

Spans are in characters of ``prompt`` so that tasks stay tokenizer-independent;
``token_spans`` maps them to token indices for a given tokenizer. By convention a segment span
ends *with* its terminating newline, so its last token is the summary token (``\\n``) that an
Aggregate head reads from the final position.
"""

from __future__ import annotations

import functools
import gzip
import inspect
import json
import random
import types
import typing
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..errors import GandaError
from ..options import read_text


class OptionError(GandaError, ValueError):
    """A task option that the task does not take, of the wrong type or out of range."""


@dataclass
class Example:
    prompt: str
    choices: list[str] = field(default_factory=list)  # continuations, delimiter included (" A", " 42")
    gold: int = 0
    segments: list[tuple[int, int]] = field(default_factory=list)  # char spans [start, end) in prompt
    gold_segment: int | None = None  # index into segments of the segment holding the answer
    target: str | None = None  # generation tasks: the reference answer
    stop: list[str] | None = None  # generation tasks: stop sequences
    meta: dict[str, Any] = field(default_factory=dict)

    def key(self, task: str, position: int) -> dict[str, Any]:
        """``{"task", "subject", "doc_id"}``: what joins this example's scores with another run's.

        ``doc_id`` is the example's index in its source file (``meta["index"]``, lm-eval's ``doc_id``
        for the same split) and ``subject`` its MMLU subject or BBH subtask; a generated task (kv,
        letters, the lab's) has no file, and its ``doc_id`` is the position in ``examples(limit,
        seed)``, which is the same for every limit of one seed."""
        subject = self.meta.get("subject", self.meta.get("subtask"))
        return {"task": task, "subject": subject, "doc_id": self.meta.get("index", position)}


class Task(ABC):
    """A named source of examples. ``kind`` tells scoring what to do with them:

    * ``"mc"``: pick the choice with the highest summed log-likelihood (lm-eval ``acc``),
    * ``"generate"``: greedy generation with stops, then the task's ``score_generation``.
    """

    name: str = "?"
    kind: str = "mc"
    #: inclusive ``(low, high)`` bounds of integer options (None: open on that side); with the
    #: options' names and types (the constructor's keyword arguments) they are checked by
    #: :meth:`check_options` before the task is built. Checks that involve several options or the
    #: data stay in the constructor and raise :class:`OptionError`.
    bounds: ClassVar[dict[str, tuple[int | None, int | None]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Check ``bounds`` on every construction, so a task built from Python (``KVTask(pairs=0)``)
        is refused exactly as ``get_task`` refuses it; and ``limit`` on every call of ``examples``
        (``limit=-1`` would slice off the last example, ``1.7`` would become 1)."""
        super().__init_subclass__(**kwargs)
        examples = cls.__dict__.get("examples")
        if examples is not None and getattr(examples, "__wrapped__", None) is None:
            cls.examples = _checked_examples(examples)  # type: ignore[method-assign]
        init = cls.__dict__.get("__init__")
        if init is None or getattr(init, "__wrapped__", None) is not None:
            return
        signature = inspect.signature(init)

        @functools.wraps(init)
        def checked_init(self: Task, *args: Any, **kw: Any) -> None:
            given = signature.bind(self, *args, **kw).arguments
            bounded = {k: v for k, v in given.items() if k in type(self).bounds and v is not None}
            type(self).check_options(bounded)
            init(self, *args, **kw)

        cls.__init__ = checked_init  # type: ignore[method-assign]

    @classmethod
    def option_types(cls) -> dict[str, Any]:
        """The options the task takes (its constructor's keyword arguments) and their types."""
        return keyword_types(cls.__init__)

    @classmethod
    def chance(cls, options: dict[str, Any] | None = None) -> float:
        """Accuracy of a blind guess at the task built with ``options`` (0.0: the task declares no
        chance level). Experiments measure how far an ablation takes a score towards it."""
        return 0.0

    @classmethod
    def check_options(cls, options: dict[str, Any], task: str | None = None) -> dict[str, Any]:
        """``options`` checked against the task's declaration: every name known, every value of
        its type (text such as ``"10"`` or ``"true"`` is converted) and within ``bounds``."""
        label = f"task {task or cls.name!r}"
        types_ = cls.option_types()
        out: dict[str, Any] = {}
        for key, value in options.items():
            if key not in types_:
                known = ", ".join(sorted(types_)) or "none"
                raise OptionError(f"{label} has no option {key!r} (its options: {known})")
            value = _coerce(value, types_[key], f"{label}: option {key}")
            lo, hi = cls.bounds.get(key, (None, None))
            if isinstance(value, int) and not isinstance(value, bool) and (
                    (lo is not None and value < lo) or (hi is not None and value > hi)):
                want = (f"between {lo} and {hi}" if lo is not None and hi is not None
                        else f"at least {lo}" if lo is not None else f"at most {hi}")
                raise OptionError(f"{label}: {key} must be {want}, got {value}")
            out[key] = value
        return out

    @abstractmethod
    def examples(self, limit: int | None = None, seed: int = 0) -> list[Example]:
        """The evaluation examples (deterministic for a given seed)."""

    def config(self) -> dict[str, Any]:
        """What defines the examples (recorded in result files so a number can be re-run). A task
        that makes a set number of examples records it as ``size`` (the examples scored when no
        ``limit`` caps them): ``n`` in a run's config is the number of examples scored."""
        return {"task": self.name}

    def run_config(self, limit: int | None, n: int, seed: int) -> dict[str, Any]:
        """:meth:`config` with a run's ``limit`` (the cap asked for, None: none), ``n`` (the examples
        scored) and ``seed``."""
        return {**self.config(), "limit": limit, "n": n, "seed": seed}

    def score_generation(self, example: Example, generated: str) -> bool:  # pragma: no cover
        raise NotImplementedError

    #: for a task whose data come from the model it scores (its class has ``for_model``): the
    #: options that name those data explicitly (the lab's ``world``, ``world_seed``)
    model_options: ClassVar[tuple[str, ...]] = ()
    #: the spec of the model the task was built for (:func:`ganda.tasks.get_task` with ``adapter``),
    #: ``"*"`` when its data were named explicitly, None when neither
    built_for: str | None = None

    def check_model(self, adapter: Any) -> None:
        """Refuse to score ``adapter`` with a task whose data come from a model (the lab's world, from
        a lab model's ``lab.json``) when the task was built for no model or for another one: a lab
        model scores chance on a world it never learned."""
        if not hasattr(type(self), "for_model") or self.built_for in ("*", adapter.spec):
            return
        named = " or ".join(f"{k}=..." for k in self.model_options)
        built = f"for {self.built_for}" if self.built_for else "for no model"
        raise GandaError(f"task {self.name!r} takes its data from the model it scores, and this one was built "
                         f"{built}, not {adapter.spec}: build it with get_task({self.name!r}, adapter=model)"
                         + (f" or name its data with {named}" if named else ""))


def check_limit(limit: Any, what: str = "limit") -> None:
    """Refuse a ``limit`` that is not None or a whole number of at least 0 (0 gives no examples,
    which whoever scores them refuses: an accuracy over nothing is no number)."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise OptionError(f"{what} must be a whole number of at least 1, got {limit!r}")


def _checked_examples(examples: Any) -> Any:
    @functools.wraps(examples)
    def checked(self: Task, limit: int | None = None, *args: Any, **kw: Any) -> list[Example]:
        check_limit(limit, f"task {self.name!r}: limit")
        return examples(self, limit, *args, **kw)

    return checked


def chosen_names(given: str | list[str] | None, known: list[str], what: str, hint: str) -> list[str]:
    """The names ``given`` (a list, or text with commas), each one of ``known``; None: all of them. No
    name, or one not known, is refused (``hint`` says which exist)."""
    if isinstance(given, str):
        given = [s.strip() for s in given.split(",") if s.strip()]
    if given is not None and not given:
        raise GandaError(f"no {what} given")
    bad = [s for s in given or () if s not in known]
    if bad:
        raise GandaError(f"unknown {what} {bad[0]!r}; {hint}")
    return list(given or known)


def add_lines(text: str, lines: Iterable[str]) -> tuple[str, list[tuple[int, int]]]:
    """``text`` followed by ``lines``, and each line's character span in the result: a prompt's
    segments (each line ends with the newline that is its summary token)."""
    spans = []
    for line in lines:
        spans.append((len(text), len(text) + len(line)))
        text += line
    return text, spans


def read_jsonl(path: Any) -> list[dict[str, Any]]:
    """The records of a JSON-lines file (gzip-compressed where its name ends in ``.gz``), blank lines skipped."""
    with (gzip.open if str(path).endswith(".gz") else open)(str(path), "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def seeded_indices(n: int, limit: int | None, seed: Any) -> list[int]:
    """Every index below ``n``, or, for a ``limit`` below ``n``, a sample of that many drawn with
    ``random.Random(seed)``, in order: one seed gives the same examples on every run."""
    if limit is None or limit >= n:
        return list(range(n))
    return sorted(random.Random(seed).sample(range(n), limit))


def token_spans(offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Map character spans to token spans ``[first, last]`` (inclusive) using offset mappings.

    A token belongs to a span when its characters overlap it.
    """
    out = []
    for s, e in spans:
        toks = [i for i, (a, b) in enumerate(offsets) if b > s and a < e and b > a]
        if not toks:
            raise ValueError(f"span {s}-{e} covers no token")
        out.append((toks[0], toks[-1]))
    return out


def keyword_types(func: Any) -> dict[str, Any]:
    """``func``'s keyword parameters (not ``self``, ``*args``, ``**kw``) -> annotated type (Any if none)."""
    try:
        hints = typing.get_type_hints(func)
    except Exception:  # noqa: BLE001 - an annotation that does not resolve constrains nothing
        hints = {}
    return {p.name: hints.get(p.name, Any) for p in list(inspect.signature(func).parameters.values())[1:]
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def _coerce(value: Any, hint: Any, label: str) -> Any:
    """``value`` as type ``hint`` (a class or a union of classes); text is parsed, anything else
    must already be of the type (an int is accepted for a float, a number for text)."""
    if hint is Any:
        return value
    allowed = [typing.get_origin(a) or a for a in _union_args(hint) if a is not type(None)]
    if any(a is Any for a in allowed):
        return value
    if isinstance(value, str):
        value = read_text(value, allowed)
        if isinstance(value, str) and str not in allowed:
            raise OptionError(f"{label} takes {_type_text(allowed)}, got {value!r}")
        return value
    if type(value) in allowed or (not isinstance(value, bool) and any(
            isinstance(value, a) for a in allowed if a is not bool and isinstance(a, type))):
        return value
    elif isinstance(value, bool) and bool not in allowed:
        pass
    elif isinstance(value, int) and float in allowed:
        return float(value)
    elif isinstance(value, int) and bool in allowed and value in (0, 1):
        return bool(value)
    elif isinstance(value, int | float) and str in allowed:
        return str(value)
    raise OptionError(f"{label} takes {_type_text(allowed)}, got {value!r}")


def _union_args(hint: Any) -> tuple[Any, ...]:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return typing.get_args(hint)
    return (hint,)


def _type_text(allowed: list[Any]) -> str:
    names = {bool: "true or false", int: "an integer", float: "a number", str: "text", list: "a list",
             dict: "a record"}
    return " or ".join(dict.fromkeys(names.get(a, getattr(a, "__name__", str(a))) for a in allowed))
