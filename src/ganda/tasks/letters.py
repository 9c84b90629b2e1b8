"""Knowledge-free letter retrieval in MMLU format: isolates the Gather-and-Aggregate step.

    The following are multiple choice questions (with answers).

    Which option is "velvet harbor"?
    A. copper lantern
    B. velvet harbor
    C. silent meadow
    D. frozen candle
    Answer: B

The question states the right option's content, so no stored knowledge is needed: the model
must gather each option line into its ``\\n`` and aggregate the matching one into the letter.
Options are ``words`` random nouns/adjectives (multi-token), ``options`` of them (A, B, ...).
``shots`` solved examples can precede the question (small models need the format shown).
"""

from __future__ import annotations

import random
from typing import Any

from .base import Example, Task
from .mmlu import lettered_example
from .words import word_list

HEADER = "The following are multiple choice questions (with answers).\n\n"


class LettersTask(Task):
    name = "letters"
    kind = "mc"
    bounds = {"options": (2, 26), "words": (1, None), "shots": (0, None), "n": (1, None)}

    def __init__(self, options: int = 4, words: int = 2, shots: int = 0, n: int = 100) -> None:
        self.options, self.words, self.shots, self.n = options, words, shots, n

    @classmethod
    def chance(cls, options: dict[str, Any] | None = None) -> float:
        """One letter in ``options`` (4 unless given)."""
        return 1 / int((options or {}).get("options") or 4)

    def config(self) -> dict[str, Any]:
        return {"task": self.name, "options": self.options, "words": self.words, "shots": self.shots, "size": self.n}

    def _phrase(self, rng: random.Random) -> str:
        adjs, nouns = word_list("adjective"), word_list("noun")
        return " ".join([*(rng.choice(adjs) for _ in range(self.words - 1)), rng.choice(nouns)])

    def _question(self, rng: random.Random) -> tuple[str, list[str], int]:
        opts: list[str] = []
        while len(opts) < self.options:
            p = self._phrase(rng)
            if p not in opts:
                opts.append(p)
        gold = rng.randrange(self.options)
        return f'Which option is "{opts[gold]}"?\n', opts, gold

    def make_example(self, rng: random.Random) -> Example:
        shots = [self._question(rng) for _ in range(self.shots)]
        q, opts, gold = self._question(rng)
        return lettered_example(HEADER, shots, q, opts, gold, {"options": opts})

    def examples(self, limit: int | None = None, seed: int = 0) -> list[Example]:
        rng = random.Random(f"letters-{self.options}-{self.words}-{self.shots}-{seed}")
        n = self.n if limit is None else limit
        return [self.make_example(rng) for _ in range(n)]
