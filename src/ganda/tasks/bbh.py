"""BIG-Bench Hard: 27 tasks, 3-shot, with (``cot=True``) or without chain of thought.

Prompts follow lm-evaluation-harness 0.4.13 (``bbh_cot_fewshot_*`` / ``bbh_fewshot_*``), which
in turn are the authors' ``cot-prompts/<task>.txt`` (vendored in ``ganda/data/bbh``):

* CoT: the prompt file without its canary header (task description, blank line, the three
  ``Q: ...\\nA: Let's think step by step.\\n<reasoning> So the answer is X.`` exemplars separated
  by blank lines), then ``"\\n\\nQ: <input>\\nA: Let's think step by step.\\n"``.
* no CoT: the description, then each exemplar as ``"Q: <input>\\nA: X"`` (X read from the
  exemplar's ``So the answer is X.``), blank-line separated, then ``"\\n\\nQ: <input>\\nA:"``.

Generation is greedy and stops at ``</s>``, ``Q`` or a blank line (lm-eval's ``until``), at most
256 new tokens with CoT (lm-eval allows 1024; a 135M model that has not answered by 256 rarely
does) and 64 without. Answer extraction: with CoT lm-eval's ``(?<=the answer is )(.*)(?=.)``
(first match; ``[invalid]`` when absent), without CoT the stripped first line. The headline is
exact match with the target (``strict``); ``flexible`` also reads ``The answer is X`` in any case
and accepts a case-insensitive match,
a trailing period and, for lettered options ``(A)``, ``A``, ``A)``, ``A.`` or ``(A) <option text>``
(not ``A:``, which a collapsed model emits as a format echo).
Accuracy is reported per subtask and as the macro average over subtasks (``config``).

``limit`` samples evenly from each selected subtask (seeded), so the macro average stays fair.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..errors import GandaError
from .base import Example, Task, chosen_names, seeded_indices

DATA_DIR = Path(__file__).resolve().parent.parent / "data" / "bbh"
STOP = ["</s>", "Q", "\n\n"]
COT_RE = re.compile(r"(?<=the answer is )(.*)(?=.)")
COT_RE_ANYCASE = re.compile(r"(?<=answer is )(.*)(?=.)", re.IGNORECASE)
INVALID = "[invalid]"


def subtasks(data_dir: Path = DATA_DIR) -> list[str]:
    return sorted(p.stem for p in data_dir.glob("*.json"))


@lru_cache(maxsize=64)
def read_examples(data_dir: str, subtask: str) -> tuple[tuple[str, str], ...]:
    path = Path(data_dir) / f"{subtask}.json"
    with open(path, encoding="utf-8") as f:
        d = json.load(f)
    return tuple((e["input"], e["target"]) for e in d["examples"])


@lru_cache(maxsize=64)
def read_cot_prompt(data_dir: str, subtask: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """(description, ((input, cot_target), ...)) parsed from ``cot-prompts/<subtask>.txt``."""
    text = (Path(data_dir) / "cot-prompts" / f"{subtask}.txt").read_text(encoding="utf-8")
    body = text.split("-----\n", 1)[1]
    blocks = body.split("\n\nQ: ")
    description = blocks[0].strip("\n")
    shots = []
    for b in blocks[1:]:
        q, a = b.split("\nA: Let's think step by step.", 1)
        # sports_understanding's file has a space here where the others have a newline; lm-eval
        # renders every task with the newline, and so do we
        shots.append((q, a.strip()))
    return description, tuple(shots)


def final_answer(cot_target: str) -> str:
    """The X of an exemplar's ``So the answer is X.``."""
    m = re.search(r"So the answer is (.*)\.\s*$", cot_target.strip())
    if not m:
        raise GandaError(f"no 'So the answer is' in BBH exemplar: {cot_target[-80:]!r}")
    return m.group(1).strip()


def build_prompt(data_dir: str, subtask: str, question: str, cot: bool, shots: int = 3) -> str:
    description, exemplars = read_cot_prompt(data_dir, subtask)
    parts = [description]
    for q, a in exemplars[:shots]:
        parts.append(f"Q: {q}\nA: Let's think step by step.\n{a}" if cot else f"Q: {q}\nA: {final_answer(a)}")
    tail = f"Q: {question}\nA: Let's think step by step.\n" if cot else f"Q: {question}\nA:"
    return "\n\n".join([*parts, tail])


def extract_answer(text: str, cot: bool, anycase: bool = False) -> str:
    """lm-eval's extraction; ``anycase`` (flexible) also reads ``The answer is X.``."""
    if cot:
        m = (COT_RE_ANYCASE if anycase else COT_RE).findall(text)
        return m[0].strip() if m else INVALID
    return text.strip().split("\n")[0].strip()


_OPTION = re.compile(r"^\(([A-R])\)")


def flexible_match(pred: str, target: str) -> bool:
    p, t = pred.strip().rstrip(".").strip(), target.strip()
    if p == INVALID:
        return False
    if p.lower() == t.lower():
        return True
    mt = _OPTION.match(t)
    if mt:
        letter = mt.group(1)
        if p == letter or p.startswith(f"({letter})") or re.fullmatch(rf"{letter}[\).]?", p):
            return True
    return False


class BBHTask(Task):
    name = "bbh"
    kind = "generate"
    bounds = {"shots": (0, 3), "max_new_tokens": (1, None)}  # each task ships 3 exemplars

    def __init__(self, subtask: str | list[str] | None = None, cot: bool = True, shots: int = 3,
                 match: str = "strict", data_dir: str | None = None, max_new_tokens: int | None = None) -> None:
        self.data_dir = Path(data_dir) if data_dir else DATA_DIR
        known = subtasks(self.data_dir)
        if not known:
            raise GandaError(f"no BBH data in {self.data_dir}")
        chosen = chosen_names(subtask, known, "BBH subtask", f"known: {', '.join(known)}")
        if match not in ("strict", "flexible"):
            raise GandaError("bbh: match must be 'strict' or 'flexible'")
        self.subtasks, self.cot, self.shots, self.match = chosen, bool(cot), int(shots), match
        self.max_new_tokens = int(max_new_tokens) if max_new_tokens else (256 if self.cot else 64)

    def config(self) -> dict[str, Any]:
        sub = "all" if len(self.subtasks) == 27 else self.subtasks
        return {"task": self.name, "subtask": sub, "cot": self.cot, "shots": self.shots, "match": self.match,
                "max_new_tokens": self.max_new_tokens}

    def examples(self, limit: int | None = None, seed: int = 0) -> list[Example]:
        picks: list[tuple[str, int]] = []
        per, extra = divmod(limit, len(self.subtasks)) if limit is not None else (None, 0)
        for k, s in enumerate(self.subtasks):
            want = None if per is None else per + (1 if k < extra else 0)
            picks.extend((s, i) for i in seeded_indices(len(read_examples(str(self.data_dir), s)), want,
                                                        f"bbh-{s}-{seed}"))
        out = []
        for s, i in picks:
            q, t = read_examples(str(self.data_dir), s)[i]
            out.append(Example(prompt=build_prompt(str(self.data_dir), s, q, self.cot, self.shots), target=t,
                               stop=list(STOP), meta={"subtask": s, "index": i}))
        return out

    def extract(self, example: Example, generated: str) -> str:
        return extract_answer(generated, self.cot)

    def metrics(self, example: Example, generated: str) -> dict[str, bool]:
        pred = extract_answer(generated, self.cot)
        t = example.target or ""
        loose = extract_answer(generated, self.cot, anycase=True)
        return {"strict": pred == t.strip(), "flexible": flexible_match(pred, t) or flexible_match(loose, t)}

    def score_generation(self, example: Example, generated: str) -> bool:
        return self.metrics(example, generated)[self.match]

    def aggregate(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        """Per-subtask accuracy and the macro average over subtasks."""
        per: dict[str, list[int]] = {}
        for r in records:
            s = r.get("meta", {}).get("subtask", "?")
            c = per.setdefault(s, [0, 0])
            c[0] += bool(r["correct"])
            c[1] += 1
        accs = {s: c[0] / c[1] for s, c in per.items() if c[1]}
        return {"per_subtask": {s: {"correct": c[0], "n": c[1], "accuracy": accs[s]} for s, c in sorted(per.items())},
                "macro_accuracy": sum(accs.values()) / len(accs) if accs else 0.0}
