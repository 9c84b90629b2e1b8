"""The common shape of every task: examples with a prompt, choices (or a generation target),
a gold answer, and the character spans of the *segments* a Gather head summarises.

Spans are in characters of ``prompt`` so that tasks stay tokenizer-independent;
``token_spans`` maps them to token indices for a given tokenizer. By convention a segment span
ends *with* its terminating newline, so its last token is the summary token (``\\n``) that an
Aggregate head reads from the final position.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from typing import Any


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

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class Task(ABC):
    """A named source of examples. ``kind`` tells scoring what to do with them:

    * ``"mc"``: pick the choice with the highest summed log-likelihood (lm-eval ``acc``),
    * ``"generate"``: greedy generation with stops, then the task's ``score_generation``.
    """

    name: str = "?"
    kind: str = "mc"

    @abstractmethod
    def examples(self, limit: int | None = None, seed: int = 0) -> list[Example]:
        """The evaluation examples (deterministic for a given seed)."""

    def config(self) -> dict[str, Any]:
        """What defines the examples (recorded in result files so a number can be re-run)."""
        return {"task": self.name}

    def score_generation(self, example: Example, generated: str) -> bool:  # pragma: no cover
        raise NotImplementedError


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
