"""The paper's knowledge tasks, scored like lm-eval 0-shot: ARC-Easy, ARC-Challenge, OpenBookQA,
PIQA, HellaSwag, Winogrande. The "knowledge score" is the mean ``acc`` over the six.

Prompts follow lm-evaluation-harness's task YAMLs (``lm_eval/tasks/...``), with its default
``target_delimiter`` of one space before every choice:

============  ====================================  ==========================  =============
task          context (doc_to_text)                 choices (doc_to_choice)     metrics
============  ====================================  ==========================  =============
arc_easy      ``"Question: {stem}\\nAnswer:"``        ``" " + choice text``       acc, acc_norm
arc_challenge same                                  same                        acc, acc_norm
openbookqa    ``"{question_stem}"``                   ``" " + choice text``       acc, acc_norm
piqa          ``"Question: {goal}\\nAnswer:"``        ``" " + sol1``, ``" " + sol2`` acc, acc_norm
hellaswag     ``preprocess(label + ": " + ctx)``      ``" " + preprocess(ending)`` acc, acc_norm
winogrande    ``sentence[:blank] + option`` (one     ``" " + text after blank``  acc
              context per option)                   (same for both)
============  ====================================  ==========================  =============

Data: the test splits of ARC (AI2, CC BY-SA 4.0) and OpenBookQA main (Apache-2.0), the
validation splits of PIQA (AFL-3.0), HellaSwag (MIT) and WinoGrande 1.1 dev (the
``winogrande_xl`` validation split lm-eval scores; CC-BY), vendored gzip-compressed in
``ganda/data/<task>/`` with their licence files (see ``ganda/data/KNOWLEDGE.md``).

**Winogrande** uses lm-eval's *partial* scoring: the contexts differ (the sentence up to the
blank, with each option filled in) and the continuation is the same (the rest of the sentence).
Such an example carries ``meta["contexts"]`` and ``meta["continuation"]``; score it with
:func:`ganda.scoring.score_example` (which ``evaluate_examples``, :func:`ganda.knowledge.evaluate_knowledge`
and :mod:`ganda.sweep` use). Its
``prompt``/``choices`` hold the sentence and the two options for display only.

**HellaSwag** here is not lm-eval's input byte for byte: the only copy available is a
preprocessed text export of all 10,042 validation items (klosax/hellaswag_text_data, made for
llama.cpp), whose first line per item is ``activity_label: ctx`` with the WikiHow ``[header]``,
``[step]``, ``[substeps]`` and ``[title]`` tags already removed. We apply lm-eval's
``preprocess`` again on top (strip; ``" [title]"`` -> ``". "``; remove any ``[...]``; collapse
double spaces), which also removes the few tags the export left. lm-eval builds the context as
``ctx_a + " " + ctx_b.capitalize()``, and the export only has ``ctx`` (``ctx_b`` not
capitalised); ``capitalize_ctx_b=True`` (default) approximates it by applying
``str.capitalize`` to the final sentence fragment of the context (after the last ``". "``,
``"! "`` or ``"? "``) when that fragment starts with a lower-case letter ("... on a roof. he" ->
"... on a roof. He"), which is what ``ctx_b`` is in the ActivityNet items. Expect scores close to,
not identical with, lm-eval's ``hellaswag``.

``acc_norm`` is lm-eval's: the choice's summed log-likelihood divided by the length in
characters of the choice *without* the target delimiter.
"""

from __future__ import annotations

import bz2
import re
from collections.abc import Sequence
from importlib import resources
from typing import Any

from ..errors import GandaError
from . import KNOWLEDGE_TASKS  # the ``knowledge`` group
from .base import Example, Task, read_jsonl, seeded_indices

__all__ = ["KNOWLEDGE_TASKS"]


def _data(*parts: str):
    return resources.files("ganda").joinpath("data", *parts)


def _labels(*parts: str) -> list[str]:
    return [x.strip() for x in _data(*parts).read_text(encoding="utf-8").splitlines() if x.strip()]


class _KnowledgeTask(Task):
    kind = "mc"
    metrics: tuple[str, ...] = ("acc", "acc_norm")
    bounds = {"n": (1, None)}

    def __init__(self, n: int | None = None) -> None:
        self.n = n
        self._docs: list[Example] | None = None

    def config(self) -> dict[str, Any]:
        return {"task": self.name, "size": self.n}

    def _load(self) -> list[Example]:  # pragma: no cover - interface
        raise NotImplementedError

    def all_examples(self) -> list[Example]:
        if self._docs is None:
            self._docs = self._load()
            for i, ex in enumerate(self._docs):  # the index in the file: lm-eval's doc_id
                ex.meta.setdefault("index", i)
        return self._docs

    def examples(self, limit: int | None = None, seed: int = 0) -> list[Example]:
        """The first ``limit`` documents in file order when ``seed`` is 0 (lm-eval's ``--limit``);
        another seed draws a seeded random sample of that size."""
        docs = self.all_examples()
        k = min(x for x in (limit, self.n, len(docs)) if x is not None)
        if seed == 0:
            return docs[:k]
        return [docs[i] for i in seeded_indices(len(docs), k, seed)]


def _mc(context: str, texts: Sequence[str], gold: int, **meta: Any) -> Example:
    return Example(prompt=context, choices=[" " + t for t in texts], gold=gold, meta=dict(meta))


class _ArcBase(_KnowledgeTask):
    """ARC's JSONL layout (``question: {stem, choices: [{label, text}]}``, ``answerKey``), which
    OpenBookQA shares; ``context`` is the task's ``doc_to_text`` around the stem."""

    file: tuple[str, ...] = ()
    context = "Question: {}\nAnswer:"

    def _load(self) -> list[Example]:
        out = []
        for d in read_jsonl(_data(*self.file)):
            q = d["question"]
            labels = [c["label"] for c in q["choices"]]
            out.append(_mc(self.context.format(q["stem"]), [c["text"] for c in q["choices"]],
                           labels.index(d["answerKey"].lstrip()), id=d["id"]))
        return out


class ArcEasyTask(_ArcBase):
    name = "arc_easy"
    file = ("arc", "ARC-Easy-Test.jsonl.gz")


class ArcChallengeTask(_ArcBase):
    name = "arc_challenge"
    file = ("arc", "ARC-Challenge-Test.jsonl.gz")


class OpenBookQATask(_ArcBase):
    name = "openbookqa"
    file = ("openbookqa", "test.jsonl.gz")
    context = "{}"


class PIQATask(_KnowledgeTask):
    name = "piqa"

    def _load(self) -> list[Example]:
        docs = read_jsonl(_data("piqa", "valid.jsonl.gz"))
        labels = _labels("piqa", "valid-labels.lst")
        if len(docs) != len(labels):
            raise GandaError("piqa: data and labels differ in length")
        return [_mc(f"Question: {d['goal']}\nAnswer:", [d["sol1"], d["sol2"]], int(lab))
                for d, lab in zip(docs, labels, strict=True)]


def hellaswag_preprocess(text: str) -> str:
    """lm-eval's ``hellaswag/utils.py:preprocess``."""
    text = text.strip()
    text = text.replace(" [title]", ". ")
    text = re.sub("\\[.*?\\]", "", text)
    text = text.replace("  ", " ")
    return text


_FRAGMENT = re.compile(r"^(.*[.!?] )([^.!?]*)$", re.S)


def capitalize_last_fragment(ctx: str) -> str:
    """Approximate lm-eval's ``ctx_b.capitalize()`` on a joined ``ctx`` (see the module docstring)."""
    m = _FRAGMENT.match(ctx)
    if not m:
        return ctx
    head, frag = m.groups()
    if frag[:1].islower():
        return head + frag.capitalize()
    return ctx


class HellaSwagTask(_KnowledgeTask):
    name = "hellaswag"

    def __init__(self, n: int | None = None, capitalize_ctx_b: bool = True) -> None:
        super().__init__(n)
        self.capitalize_ctx_b = capitalize_ctx_b

    def config(self) -> dict[str, Any]:
        return {**super().config(), "capitalize_ctx_b": self.capitalize_ctx_b}

    def _load(self) -> list[Example]:
        raw = bz2.decompress(_data("hellaswag", "hellaswag_val_full.txt.bz2").read_bytes()).decode("utf-8")
        lines = raw.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        if len(lines) % 6:
            raise GandaError("hellaswag: expected 6 lines per item")
        out = []
        for i in range(0, len(lines), 6):
            first, label, *endings = lines[i : i + 6]
            activity, sep, ctx = first.partition(": ")
            if self.capitalize_ctx_b and sep:
                ctx = capitalize_last_fragment(ctx)
            query = hellaswag_preprocess(activity + sep + ctx)
            out.append(_mc(query, [hellaswag_preprocess(e) for e in endings], int(label)))
        return out


class WinograndeTask(_KnowledgeTask):
    name = "winogrande"
    metrics = ("acc",)

    def _load(self) -> list[Example]:
        out = []
        for d in read_jsonl(_data("winogrande", "dev.jsonl.gz")):
            s = d["sentence"]
            idx = s.index("_")
            contexts = [s[:idx] + opt for opt in (d["option1"], d["option2"])]
            continuation = " " + s[idx + 1 :].strip()
            out.append(Example(
                prompt=s, choices=[d["option1"], d["option2"]], gold={"1": 0, "2": 1}[d["answer"]],
                meta={"contexts": contexts, "continuation": continuation, "id": d["qID"]},
            ))
        return out

