"""A real English word list (the ``wonderwords`` package's nouns), which tasks sample with a seeded RNG.

The paper's KV task draws keys with ``wonderwords.RandomWord``; we read the same word list but
sample it ourselves so that every example is reproducible from a seed.
"""

from __future__ import annotations

import importlib.resources as resources
from functools import lru_cache


@lru_cache(maxsize=4)
def word_list(kind: str = "noun") -> tuple[str, ...]:
    """Lower-case alphabetic words of one part of speech (``noun``, ``verb``, ``adjective``)."""
    text = resources.files("wonderwords").joinpath("assets", f"{kind}list.txt").read_text()
    words = {w.strip().lower() for w in text.splitlines()}
    return tuple(sorted(w for w in words if w.isalpha() and 3 <= len(w) <= 10))
