"""MMLU with lm-eval's template and scoring (the paper's main benchmark).

Prompt (0-shot)::

    The following are multiple choice questions (with answers) about abstract algebra.

    <question>
    A. <choice A>
    B. <choice B>
    C. <choice C>
    D. <choice D>
    Answer:

k-shot prepends the first k dev questions of the same subject, each followed by ``" <letter>\\n\\n"``
(lm-eval's ``first_n`` sampler, target delimiter ``" "``, fewshot delimiter ``"\\n\\n"``). The answer
is the argmax of the log-likelihoods of ``" A"``..``" D"`` after ``Answer:``. Each option line
(``B. ...\\n``) is a segment; its ``\\n`` is the summary token of the Gather/Aggregate pattern.

``limit`` is lm-eval's ``--limit``: the first N test questions of each selected subject (the
``mmlu`` group runs one task per subject, and lm-eval's limit caps each), so accuracies compare
with lm-eval's at the same N. With ``sample=True`` it is a seeded random sample of N questions
across the selected subjects instead (``--sample``); with no limit every test question is used.
"""

from __future__ import annotations

import csv
import random
import string
from collections.abc import Iterable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..errors import GandaError
from .base import Example, Task, add_lines, chosen_names

LETTERS = "ABCD"
DATA_DIR = Path(__file__).resolve().parent.parent / "data" / "mmlu"


@lru_cache(maxsize=256)
def read_split(data_dir: str, split: str, subject: str) -> tuple[tuple[str, tuple[str, ...], int], ...]:
    path = Path(data_dir) / split / f"{subject}_{split}.csv"
    rows = []
    with open(path, newline="", encoding="utf-8") as f:
        for row in csv.reader(f):
            if len(row) != 6:
                raise GandaError(f"{path}: malformed row with {len(row)} fields")
            rows.append((row[0], tuple(row[1:5]), LETTERS.index(row[5].strip())))
    return tuple(rows)


def subjects(data_dir: Path = DATA_DIR) -> list[str]:
    return sorted(p.name[: -len("_test.csv")] for p in (data_dir / "test").glob("*_test.csv"))


def question_text(question: str, choices: Sequence[str], before: str = "") -> tuple[str, list[tuple[int, int]]]:
    """``before``, then lm-eval's ``doc_to_text`` (the question, one option line per choice lettered
    A, B, ..., ``Answer:``), and the char spans of the option lines in it."""
    lines = (f"{L}. {c}\n" for L, c in zip(string.ascii_uppercase[: len(choices)], choices, strict=True))
    text, spans = add_lines(before + question.strip() + "\n", lines)
    return text + "Answer:", spans


def lettered_example(before: str, shots: Iterable[tuple[str, Sequence[str], int]], question: str,
                     choices: Sequence[str], gold: int, meta: dict[str, Any]) -> Example:
    """MMLU's format: ``before``, each solved shot followed by its letter and a blank line (lm-eval's
    target and fewshot delimiters), then the question; the choices are the letters, and each option
    line is a segment (the gold one holds the answer)."""
    for q, ch, g in shots:
        before = question_text(q, ch, before)[0] + f" {string.ascii_uppercase[g]}\n\n"
    prompt, spans = question_text(question, choices, before)
    return Example(prompt=prompt, choices=[f" {L}" for L in string.ascii_uppercase[: len(choices)]], gold=gold,
                   segments=spans, gold_segment=gold, meta=meta)


def description(subject: str) -> str:
    return f"The following are multiple choice questions (with answers) about {subject.replace('_', ' ')}.\n\n"


class MMLUTask(Task):
    name = "mmlu"
    kind = "mc"
    bounds = {"shots": (0, 5)}  # 5 dev exemplars per subject

    def __init__(self, shots: int = 0, subjects: str | list[str] | None = None, data_dir: str | None = None,
                 sample: bool = False) -> None:
        self.data_dir = Path(data_dir) if data_dir else DATA_DIR
        if not (self.data_dir / "test").is_dir():
            raise GandaError(f"no MMLU data in {self.data_dir} (expected test/<subject>_test.csv)")
        known = globals()["subjects"](self.data_dir)
        chosen = chosen_names(subjects, known, "MMLU subject", f"e.g. {', '.join(known[:4])}, ... ({len(known)} in all)")
        twice = [s for i, s in enumerate(chosen) if s in chosen[:i]]
        if twice:  # its questions would count twice and narrow the confidence interval
            raise GandaError(f"MMLU subject {twice[0]!r} is named twice; name each subject once")
        self.shots, self.subjects, self.sample = shots, chosen, bool(sample)

    @classmethod
    def chance(cls, options: dict[str, Any] | None = None) -> float:
        """One letter in four (every MMLU question has four options)."""
        return 0.25

    def config(self) -> dict[str, Any]:
        subj = "all" if len(self.subjects) == 57 else self.subjects
        out: dict[str, Any] = {"task": self.name, "shots": self.shots, "subjects": subj}
        if self.sample:
            out["sample"] = True  # --limit drew a seeded sample across subjects, not the first N of each
        return out

    def build(self, subject: str, question: str, choices: tuple[str, ...], gold: int) -> Example:
        shots = read_split(str(self.data_dir), "dev", subject)[: self.shots]
        return lettered_example(description(subject), shots, question, choices, gold, {"subject": subject})

    def examples(self, limit: int | None = None, seed: int = 0) -> list[Example]:
        """The first ``limit`` questions of each subject (lm-eval's ``--limit``; ``seed`` unused), or
        with ``sample`` a seeded sample of ``limit`` questions across the subjects."""
        sizes = {s: len(read_split(str(self.data_dir), "test", s)) for s in self.subjects}
        first = None if self.sample else limit
        items = [(s, i) for s in self.subjects for i in range(sizes[s])[:first]]
        if self.sample and limit is not None and limit < len(items):
            items = sorted(random.Random(f"mmlu-{seed}").sample(items, limit))
        out = []
        for s, i in items:
            q, ch, g = read_split(str(self.data_dir), "test", s)[i]
            ex = self.build(s, q, ch, g)
            ex.meta["index"] = i
            out.append(ex)
        return out
