"""Key-value retrieval: the paper's dictionary prompt (its Fig. 4 probe).

    Memorize the following dictionary:
    apple:42
    river:7
    ...
    The value of the key 'river' is

Scored as multiple choice over the dictionary's values by full-sequence log-likelihood: each
candidate ``" 7"`` is appended to the prompt and *all* its tokens' log-probs are summed (SmolLM2
splits digits, so ``" 42"`` is three tokens). Each ``key:value\\n`` line is a segment; the gold
segment is the queried key's line, whose ``\\n`` is the summary token an Aggregate head should read.

Difference from the paper's code: it appends the bare value (``is42``); we use lm-eval's target
delimiter (``is 42``), the natural continuation, which tokenizes cleanly.
"""

from __future__ import annotations

import random
from typing import Any

from .base import Example, OptionError, Task, add_lines
from .words import word_list


class KVTask(Task):
    name = "kv"
    kind = "mc"
    bounds = {"pairs": (2, None), "n": (1, None), "max_value": (2, None)}

    def __init__(self, pairs: int = 10, n: int = 100, max_value: int = 100) -> None:
        if pairs > max_value:
            raise OptionError(f"task 'kv': pairs ({pairs}) cannot exceed the number of distinct values "
                              f"(max_value {max_value})")
        if pairs > len(word_list("noun")):
            raise OptionError(f"task 'kv': pairs ({pairs}) cannot exceed the number of distinct keys "
                              f"({len(word_list('noun'))})")
        self.pairs, self.n, self.max_value = pairs, n, max_value

    @classmethod
    def chance(cls, options: dict[str, Any] | None = None) -> float:
        """One value in ``pairs`` (10 unless given)."""
        return 1 / int((options or {}).get("pairs") or 10)

    def config(self) -> dict[str, Any]:
        return {"task": self.name, "pairs": self.pairs, "size": self.n, "max_value": self.max_value}

    def make_example(self, rng: random.Random) -> Example:
        keys = rng.sample(word_list("noun"), self.pairs)
        values = rng.sample(range(self.max_value), self.pairs)
        gold = rng.randrange(self.pairs)
        prompt, segments = add_lines("Memorize the following dictionary:\n",
                                     (f"{k}:{v}\n" for k, v in zip(keys, values, strict=True)))
        prompt += f"The value of the key '{keys[gold]}' is"
        return Example(
            prompt=prompt,
            choices=[f" {v}" for v in values],
            gold=gold,
            segments=segments,
            gold_segment=gold,
            meta={"key": keys[gold], "value": values[gold]},
        )

    def examples(self, limit: int | None = None, seed: int = 0) -> list[Example]:
        rng = random.Random(f"kv-{self.pairs}-{seed}")
        n = self.n if limit is None else limit
        return [self.make_example(rng) for _ in range(n)]
