"""DREAM: multiple-choice reading comprehension over a dialogue (3 options per question).

**Licence: non-commercial research only.** The data is *not* shipped with ganda. It is read from
the task option ``data_dir`` (``ganda eval --option data_dir=DIR``, ``ganda extends --data-dir DIR``),
else ``$GANDA_DREAM_DIR``, else ``/work/shared/data/dream``; the directory holds the upstream
``test.json`` / ``dev.json`` (nlpdata/dream ``data/``). A directory named by the option or the
variable must hold ``test.json``: ganda never falls back to another one.

Two scorings, both 0-shot by default (``shots`` prepends the first questions of ``dev.json``):

* ``dream`` - log-likelihood of each answer text (lm-eval ``acc``; ``acc_norm`` recorded)::

      Dialogue:
      W: ...
      M: ...

      Question: <question>
      Answer: <choice text>

* ``dream-letters`` - the options are listed and the answer is a letter, the MMLU-style format
  where a Gather/Aggregate head must retrieve the right letter from context::

      Dialogue:
      ...

      Question: <question>
      A. <choice 0>
      B. <choice 1>
      C. <choice 2>
      Answer: <letter>

Segments are the option lines (``dream-letters``, ending with their ``\\n``) or the dialogue
turns (``dream``); ``gold_segment`` is the gold option's line in the letter format.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..errors import GandaError
from .base import Example, Task, add_lines, seeded_indices

LETTERS = "ABC"
SHARED_DIR = Path("/work/shared/data/dream")
ENV = "GANDA_DREAM_DIR"


HOW = (f"pass the task option data_dir=DIR (ganda eval --option data_dir=DIR, ganda extends --data-dir DIR) "
       f"or set {ENV}=DIR")


def find_data_dir(data_dir: str | None = None) -> Path:
    """The DREAM directory: ``data_dir``, else ``$GANDA_DREAM_DIR``, else the shared copy. A
    directory that is named but holds no ``test.json`` is an error, not a reason to look elsewhere."""
    for named, where in ((data_dir, "data_dir"), (os.environ.get(ENV), ENV)):
        if named:
            if not (Path(named) / "test.json").is_file():
                what = "is not a directory" if not Path(named).is_dir() else "has no test.json"
                raise GandaError(f"DREAM data: {where}={named} {what} (DREAM is licensed for non-commercial "
                                 "research only and not shipped with ganda; the directory holds the upstream "
                                 "test.json/dev.json from github.com/nlpdata/dream, data/)")
            return Path(named)
    if (SHARED_DIR / "test.json").is_file():
        return SHARED_DIR
    raise GandaError(
        "DREAM data not found: it is licensed for non-commercial research only and not shipped with "
        f"ganda. Download test.json/dev.json from github.com/nlpdata/dream (data/) and {HOW} "
        f"(looked in: {SHARED_DIR})"
    )


@lru_cache(maxsize=8)
def read_split(data_dir: str, split: str) -> tuple[tuple[tuple[str, ...], str, tuple[str, ...], int, str], ...]:
    """Flattened questions: (turns, question, choices, gold index, dialogue id)."""
    path = Path(data_dir) / f"{split}.json"
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise GandaError(f"{path}: cannot read DREAM data: {exc}") from None
    if not isinstance(data, list) or not data:
        raise GandaError(f"{path}: not DREAM data (expected a non-empty list of [turns, questions, id])")
    out = []
    for k, item in enumerate(data):
        try:
            turns, questions, did = item
            for q in questions:
                choices = tuple(str(c) for c in q["choice"])
                question, answer = str(q["question"]), q["answer"]
                if len(choices) != len(LETTERS) or not all(isinstance(t, str) for t in turns):
                    raise TypeError
                if answer not in choices:
                    raise GandaError(f"{path}: dialogue {did}: answer is not one of the choices")
                out.append((tuple(turns), question, choices, choices.index(answer), did))
        except (TypeError, ValueError, KeyError):
            raise GandaError(f"{path}: entry {k} is not a DREAM dialogue ([turns, [{{question, choice: 3 "
                             "options, answer}}, ...], id])") from None
    return tuple(out)


def render(turns: tuple[str, ...], question: str, choices: tuple[str, ...], letters: bool, before: str = ""
           ) -> tuple[str, list[tuple[int, int]], list[tuple[int, int]]]:
    """``before``, then the question block (no answer); the char spans of dialogue turns and of option lines."""
    text, turn_spans = add_lines(before + "Dialogue:\n", (t.strip() + "\n" for t in turns))
    options = (f"{letter}. {c.strip()}\n" for letter, c in zip(LETTERS, choices, strict=True)) if letters else ()
    text, opt_spans = add_lines(text + f"\nQuestion: {question.strip()}\n", options)
    return text + "Answer:", turn_spans, opt_spans


class DreamTask(Task):
    name = "dream"
    kind = "mc"
    letters = False
    bounds = {"shots": (0, None)}

    def __init__(self, split: str = "test", shots: int = 0, data_dir: str | None = None) -> None:
        if split not in ("test", "dev"):
            raise GandaError("dream: split must be 'test' or 'dev'")
        self.dir = find_data_dir(data_dir)
        if shots and not (self.dir / "dev.json").is_file():
            raise GandaError(f"dream: shots need dev.json in {self.dir}")
        self.split, self.shots = split, int(shots)
        read_split(str(self.dir), split)  # a malformed file fails here, before any model runs
        if shots:
            read_split(str(self.dir), "dev")

    def config(self) -> dict[str, Any]:
        return {"task": self.name, "split": self.split, "shots": self.shots, "letters": self.letters}

    def _answer(self, choices: tuple[str, ...], gold: int) -> str:
        return f" {LETTERS[gold]}" if self.letters else f" {choices[gold].strip()}"

    def build(self, turns, question, choices, gold) -> Example:
        prompt = ""
        for t, q, ch, g, _ in read_split(str(self.dir), "dev")[: self.shots]:
            text, _, _ = render(t, q, ch, self.letters)
            prompt += text + self._answer(ch, g) + "\n\n"
        prompt, turn_spans, opt_spans = render(turns, question, choices, self.letters, prompt)
        return Example(
            prompt=prompt,
            choices=[self._answer(choices, i) for i in range(len(choices))],
            gold=gold,
            segments=opt_spans if self.letters else turn_spans,
            gold_segment=gold if self.letters else None,
        )

    def examples(self, limit: int | None = None, seed: int = 0) -> list[Example]:
        rows = read_split(str(self.dir), self.split)
        out = []
        for i in seeded_indices(len(rows), limit, f"dream-{self.split}-{seed}"):
            turns, q, ch, g, did = rows[i]
            ex = self.build(turns, q, ch, g)
            ex.meta = {"index": i, "dialogue": did}
            out.append(ex)
        return out


class DreamLettersTask(DreamTask):
    name = "dream-letters"
    letters = True
