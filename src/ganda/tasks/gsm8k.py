"""GSM8K (grade-school maths word problems), as lm-evaluation-harness 0.4.13 runs it.

* ``gsm8k-cot`` (default 8 shots) is lm-eval's ``gsm8k_cot``: the 8 chain-of-thought exemplars
  of Wei et al. (written out below exactly as in ``lm_eval/tasks/gsm8k/gsm8k-cot.yaml``), each
  ``"Q: <question>\\nA: <reasoning> The answer is N."``, joined by ``"\\n\\n"``, then
  ``"Q: <test question>\\nA:"``.
* ``gsm8k`` (default 0 shots) is ``"Q: <question>\\nA:"`` alone; with ``cot=True`` and 0 shots it
  is lm-eval's ``gsm8k_cot_zeroshot`` (``"...\\nA: Let's think step by step."``).

Generation is greedy and stops at ``Q:``, ``</s>``, ``<|im_end|>`` or EOS (lm-eval's ``until``),
at most 256 new tokens (lm-eval's default ``max_gen_toks``). Two extractions, as lm-eval's
filters: *strict* ``The answer is (\\-?[0-9\\.\\,]+).`` (first match) and *flexible* (the last
number in the text). Exact match after lm-eval's normalisation (case-insensitive; ``,``, ``$``,
a trailing ``.`` and anything up to ``#### `` removed). ``match`` picks which one is the headline
accuracy; both are always recorded.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..errors import GandaError
from .base import Example, Task, read_jsonl, seeded_indices

DATA_DIR = Path(__file__).resolve().parent.parent / "data" / "gsm8k"

# lm_eval/tasks/gsm8k/gsm8k-cot.yaml (0.4.13), fewshot_config.samples: (question, target)
COT_EXEMPLARS: list[tuple[str, str]] = [
    ("There are 15 trees in the grove. Grove workers will plant trees in the grove today. After they are "
     "done, there will be 21 trees. How many trees did the grove workers plant today?",
     "There are 15 trees originally. Then there were 21 trees after some more were planted. So there must "
     "have been 21 - 15 = 6. The answer is 6."),
    ("If there are 3 cars in the parking lot and 2 more cars arrive, how many cars are in the parking lot?",
     "There are originally 3 cars. 2 more cars arrive. 3 + 2 = 5. The answer is 5."),
    ("Leah had 32 chocolates and her sister had 42. If they ate 35, how many pieces do they have left in "
     "total?",
     "Originally, Leah had 32 chocolates. Her sister had 42. So in total they had 32 + 42 = 74. After "
     "eating 35, they had 74 - 35 = 39. The answer is 39."),
    ("Jason had 20 lollipops. He gave Denny some lollipops. Now Jason has 12 lollipops. How many "
     "lollipops did Jason give to Denny?",
     "Jason started with 20 lollipops. Then he had 12 after giving some to Denny. So he gave Denny "
     "20 - 12 = 8. The answer is 8."),
    ("Shawn has five toys. For Christmas, he got two toys each from his mom and dad. How many toys does "
     "he have now?",
     "Shawn started with 5 toys. If he got 2 toys each from his mom and dad, then that is 4 more toys. "
     "5 + 4 = 9. The answer is 9."),
    ("There were nine computers in the server room. Five more computers were installed each day, from "
     "monday to thursday. How many computers are now in the server room?",
     "There were originally 9 computers. For each of 4 days, 5 more computers were added. So 5 * 4 = 20 "
     "computers were added. 9 + 20 is 29. The answer is 29."),
    ("Michael had 58 golf balls. On tuesday, he lost 23 golf balls. On wednesday, he lost 2 more. How "
     "many golf balls did he have at the end of wednesday?",
     "Michael started with 58 golf balls. After losing 23 on tuesday, he had 58 - 23 = 35. After losing "
     "2 more, he had 35 - 2 = 33 golf balls. The answer is 33."),
    ("Olivia has $23. She bought five bagels for $3 each. How much money does she have left?",
     "Olivia had 23 dollars. 5 bagels for 3 dollars each will be 5 x 3 = 15 dollars. So she has 23 - 15 "
     "dollars left. 23 - 15 is 8. The answer is 8."),
]

STOP = ["Q:", "</s>", "<|im_end|>"]
STRICT_RE = re.compile(r"The answer is (\-?[0-9\.\,]+).")
FLEXIBLE_RE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
_IGNORE = [re.compile(p) for p in (r",", r"\$", r"(?s).*#### ", r"\.$")]
INVALID = "[invalid]"


def extract_strict(text: str) -> str:
    """lm-eval ``strict-match``: the first ``The answer is N.`` (``[invalid]`` when absent)."""
    m = STRICT_RE.findall(text)
    return m[0].strip() if m else INVALID


def extract_flexible(text: str) -> str:
    """lm-eval ``flexible-extract``: the last number-like token in the text."""
    m = FLEXIBLE_RE.findall(text)
    return next(g for g in m[-1] if g).strip() if m else INVALID  # a match fills one of the two groups


def normalize(s: str) -> str:
    """lm-eval's exact-match normalisation for GSM8K (regexes_to_ignore, then lower-case)."""
    for rx in _IGNORE:
        s = rx.sub("", s)
    return s.lower()


def exact_match(pred: str, target: str) -> bool:
    return normalize(pred) == normalize(target)


def target_of(answer: str) -> str:
    """``doc_to_target``: the number after ``####`` in the reference solution."""
    return answer.split("####")[-1].strip()


@lru_cache(maxsize=4)
def read_test(data_dir: str) -> tuple[tuple[str, str], ...]:
    path = Path(data_dir) / "test.jsonl"
    if not path.is_file():
        raise GandaError(f"no GSM8K data at {path}")
    return tuple((d["question"], d["answer"]) for d in read_jsonl(path))


def build_prompt(question: str, shots: int, cot: bool) -> str:
    parts = [f"Q: {q}\nA: {t}" for q, t in COT_EXEMPLARS[:shots]]
    tail = "Q: " + question + "\nA:"
    if cot and shots == 0:
        tail += " Let's think step by step."
    return "\n\n".join([*parts, tail])


class GSM8KTask(Task):
    name = "gsm8k"
    kind = "generate"
    max_new_tokens = 256
    bounds = {"shots": (0, len(COT_EXEMPLARS)), "max_new_tokens": (1, None)}  # lm-eval's gsm8k_cot exemplars

    def __init__(self, shots: int = 0, cot: bool = False, match: str = "flexible", data_dir: str | None = None,
                 max_new_tokens: int | None = None) -> None:
        shots = int(shots)
        if match not in ("strict", "flexible"):
            raise GandaError("gsm8k: match must be 'strict' or 'flexible'")
        self.shots, self.cot, self.match = shots, bool(cot) or shots > 0, match
        self.data_dir = Path(data_dir) if data_dir else DATA_DIR
        if max_new_tokens:
            self.max_new_tokens = int(max_new_tokens)

    def config(self) -> dict[str, Any]:
        return {"task": self.name, "shots": self.shots, "cot": self.cot, "match": self.match,
                "max_new_tokens": self.max_new_tokens}

    def examples(self, limit: int | None = None, seed: int = 0) -> list[Example]:
        rows = read_test(str(self.data_dir))
        out = []
        for i in seeded_indices(len(rows), limit, f"gsm8k-{seed}"):
            q, a = rows[i]
            out.append(Example(prompt=build_prompt(q, self.shots, self.cot), target=target_of(a),
                               stop=list(STOP), meta={"index": i}))
        return out

    def extract(self, example: Example, generated: str) -> str:
        return extract_strict(generated) if self.match == "strict" else extract_flexible(generated)

    def metrics(self, example: Example, generated: str) -> dict[str, bool]:
        t = example.target or ""
        return {"strict": exact_match(extract_strict(generated), t),
                "flexible": exact_match(extract_flexible(generated), t)}

    def score_generation(self, example: Example, generated: str) -> bool:
        return self.metrics(example, generated)[self.match]


class GSM8KCoTTask(GSM8KTask):
    """lm-eval's ``gsm8k_cot``: 8-shot chain of thought."""

    name = "gsm8k-cot"

    def __init__(self, shots: int = 8, cot: bool = True, match: str = "flexible", data_dir: str | None = None,
                 max_new_tokens: int | None = None) -> None:
        super().__init__(shots=shots, cot=cot, match=match, data_dir=data_dir, max_new_tokens=max_new_tokens)
