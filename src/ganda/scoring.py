"""Multiple-choice scoring: log-likelihood of choices, accuracy with a CI, and the result record.

Conventions follow lm-eval so that numbers are comparable: a choice is a continuation of the
context (``" A"``, ``" 42"``), trailing whitespace of the context moves into the continuation,
``context + continuation`` is encoded whole and split at the length of the encoded context, and
the prediction is the argmax of the summed continuation log-probabilities (``acc``);
``acc_norm`` divides by the continuation's length in characters, not counting the leading space.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from tqdm.auto import tqdm

from .interventions import Intervention, apply, describe_all, query_positions
from .models.base import ModelAdapter
from .stats import wilson
from .tasks.base import Example


def add_bos(adapter: ModelAdapter) -> bool:
    """Gemma models need a BOS token (lm-eval adds it for them); Llama-style SmolLM2 does not."""
    mt = getattr(getattr(adapter.model, "config", None), "model_type", "") or ""
    return mt.startswith("gemma")


def encode(adapter: ModelAdapter, text: str) -> list[int]:
    ids = adapter.tokenizer(text, add_special_tokens=False).input_ids
    if add_bos(adapter) and adapter.tokenizer.bos_token_id is not None:
        ids = [adapter.tokenizer.bos_token_id, *ids]
    return ids


def encode_pair(adapter: ModelAdapter, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-eval's ``_encode_pair``: returns (context ids, continuation ids)."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces > 0:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    whole = encode(adapter, context + continuation)
    ctx = encode(adapter, context)
    return whole[: len(ctx)], whole[len(ctx) :]


@dataclass
class ChoiceScores:
    loglik: list[float]
    n_chars: list[int]

    @property
    def pred(self) -> int:
        return max(range(len(self.loglik)), key=lambda i: self.loglik[i])

    @property
    def pred_norm(self) -> int:
        vals = [ll / max(1, n) for ll, n in zip(self.loglik, self.n_chars, strict=True)]
        return max(range(len(vals)), key=lambda i: vals[i])


def choice_chars(choices: Sequence[str]) -> list[int]:
    """lm-eval's acc_norm lengths: each choice's characters without the leading target delimiter."""
    return [len(c[1:]) if c.startswith(" ") else len(c) for c in choices]


@torch.no_grad()
def score_choices(adapter: ModelAdapter, context: str, choices: Sequence[str]) -> ChoiceScores:
    """Summed log-likelihood of each continuation after ``context`` (one batched forward).

    When every continuation is one token after the same context (MMLU letters) a single
    forward of the context suffices; otherwise all ``context+choice`` rows run as one batch.
    """
    return _score_pairs(adapter, [(context, c) for c in choices], choice_chars(choices))


def example_pairs(ex: Example) -> list[tuple[str, str]]:
    """(context, continuation) per choice: one context for ordinary examples, one per choice
    for lm-eval's *partial* scoring (Winogrande: ``meta["contexts"]`` + ``meta["continuation"]``)."""
    if "contexts" in ex.meta:
        return [(c, ex.meta["continuation"]) for c in ex.meta["contexts"]]
    return [(ex.prompt, c) for c in ex.choices]


def norm_chars(ex: Example) -> list[int]:
    """lm-eval's acc_norm lengths for an example (the continuation without its leading space)."""
    return choice_chars([cont for _, cont in example_pairs(ex)])


@torch.no_grad()
def score_example(adapter: ModelAdapter, ex: Example) -> ChoiceScores:
    """Score one multiple-choice example, Winogrande-style partial scoring included."""
    return _score_pairs(adapter, example_pairs(ex), norm_chars(ex))


def pad_rows(adapter: ModelAdapter, rows: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``[rows, width]`` ids and attention mask on the model's device (lm-eval's
    batch layout); fails before any work if the longest row exceeds the context."""
    width = max(len(r) for r in rows)
    adapter.check_length(width)
    tok = adapter.tokenizer
    pad = (tok.pad_token_id or 0) if tok is not None else 0
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(list(r))
        mask[i, : len(r)] = 1
    return ids.to(adapter.device), mask.to(adapter.device)


Pairs = list[tuple[list[int], list[int]]]  # (context ids, continuation ids) per choice


def _encode_pairs(adapter: ModelAdapter, texts: Sequence[tuple[str, str]]) -> tuple[Pairs, bool]:
    """Encoded (context, continuation) pairs, and whether one row (their shared context) scores
    them all: every continuation is one token after the same context (MMLU letters)."""
    pairs = [encode_pair(adapter, c, t) for c, t in texts]
    single = len({tuple(p[0]) for p in pairs}) == 1 and all(len(p[1]) == 1 for p in pairs)
    return pairs, single


@torch.no_grad()
def _score_rows(adapter: ModelAdapter, items: Sequence[tuple[Pairs, bool, list[int]]]) -> list[ChoiceScores]:
    """One right-padded forward for one or several examples (``(pairs, single, n_chars)`` each):
    a shared-context example takes one row, any other one row per choice. Each row carries its own
    query and last-scored positions, so position-restricted interventions act on every row as
    they would alone; log-probabilities are taken only where a continuation token is scored."""
    rows: list[list[int]] = []
    qpos: list[int] = []
    last: list[int] = []
    where: list[list[int]] = []
    for pairs, single, _ in items:
        if single:
            rows.append(pairs[0][0])
            qpos.append(len(pairs[0][0]) - 1)
            last.append(len(pairs[0][0]) - 1)
            where.append([len(rows) - 1] * len(pairs))
            continue
        idx = []
        for ctx, cont in pairs:
            rows.append(ctx + cont)
            qpos.append(len(ctx) - 1)
            last.append(len(ctx) + len(cont) - 2)
            idx.append(len(rows) - 1)
        where.append(idx)
    dev = adapter.device
    ids, mask = pad_rows(adapter, rows)
    lone = len(items) == 1 and items[0][1]  # one shared-context row: nothing padded, no mask
    with query_positions(torch.tensor(qpos, device=dev), torch.tensor(last, device=dev)):
        logits = adapter.forward(ids, attention_mask=None if lone else mask)
    out = []
    for (pairs, _single, n_chars), idx in zip(items, where, strict=True):
        ll = []
        for r, (ctx, cont) in zip(idx, pairs, strict=True):
            pos = torch.arange(len(ctx) - 1, len(ctx) + len(cont) - 1, device=dev)
            logp = torch.log_softmax(logits[r, pos].float(), -1)
            ll.append(float(logp[torch.arange(len(cont), device=dev), torch.tensor(cont, device=dev)].sum()))
        out.append(ChoiceScores(ll, n_chars))
    return out


def _score_pairs(adapter: ModelAdapter, texts: Sequence[tuple[str, str]], n_chars: list[int]) -> ChoiceScores:
    pairs, single = _encode_pairs(adapter, texts)
    return _score_rows(adapter, [(pairs, single, n_chars)])[0]


SMALL_MODEL_PARAMS = 20_000_000
BATCH_ROWS = 64


def default_batch_rows(adapter: ModelAdapter) -> int:
    """Rows per forward when scoring many examples: batched for small models (the lab's, tiny
    test models), where Python and per-call overhead dominate a forward; one example per
    forward for real LMs, which keeps their numbers identical to lm-eval's one-request layout
    and bounds the ``rows x length x vocab`` logits."""
    return BATCH_ROWS if adapter.n_params() < SMALL_MODEL_PARAMS else 1


def score_examples(adapter: ModelAdapter, examples: Sequence[Example], *, batch_rows: int | None = None,
                   progress: bool = False, desc: str = "?") -> list[ChoiceScores]:
    """Scores of many examples: up to ``batch_rows`` rows per forward (default
    :func:`default_batch_rows`); ``batch_rows=1`` is :func:`score_example` one by one."""
    n = default_batch_rows(adapter) if batch_rows is None else max(1, int(batch_rows))
    if n == 1:
        return [score_example(adapter, ex) for ex in tqdm(examples, desc=desc, disable=not progress, leave=False)]
    out: list[ChoiceScores] = []
    chunk: list[tuple[Pairs, bool, list[int]]] = []
    size = 0
    bar = tqdm(total=len(examples), desc=desc, disable=not progress, leave=False)
    for ex in examples:
        pairs, single = _encode_pairs(adapter, example_pairs(ex))
        k = 1 if single else len(pairs)
        if chunk and size + k > n:
            out += _score_rows(adapter, chunk)
            bar.update(len(chunk))
            chunk, size = [], 0
        chunk.append((pairs, single, norm_chars(ex)))
        size += k
    if chunk:
        out += _score_rows(adapter, chunk)
        bar.update(len(chunk))
    bar.close()
    return out


@dataclass
class EvalResult:
    task: str
    model: str
    n: int
    correct: int
    accuracy: float
    ci95: tuple[float, float]
    seconds: float
    interventions: list[dict[str, Any]] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    acc_norm: float | None = None
    predictions: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def from_counts(cls, task: str, adapter: ModelAdapter, correct: int, n: int, started: float, *,
                    interventions: Sequence[Intervention] | None, config: dict[str, Any],
                    predictions: list[dict[str, Any]], correct_norm: int | None = None) -> EvalResult:
        """The one way a result is built (multiple-choice scoring and generation alike): accuracy
        and its Wilson interval from the counts, seconds since ``started`` (``time.perf_counter``)."""
        return cls(
            task=task, model=adapter.spec, n=n, correct=correct, accuracy=correct / n if n else 0.0,
            ci95=wilson(correct, n), seconds=time.perf_counter() - started,
            interventions=describe_all(interventions), config=config,
            acc_norm=(correct_norm / n if n else None) if correct_norm is not None else None,
            predictions=predictions,
        )

    def by_answer(self) -> list[dict[str, Any]]:
        """Accuracy split by the gold answer (see :func:`by_answer`); empty unless every gold answer
        is a choice index (generation tasks have text answers)."""
        if not self.predictions or not all(isinstance(p.get("gold"), int) for p in self.predictions):
            return []
        return by_answer(self.predictions)

    def answer_accuracy(self) -> dict[str, float | None]:
        """``{"A": accuracy on gold-A examples, "B": ...}``."""
        return {x["answer"]: x["accuracy"] for x in self.by_answer()}

    def to_json(self, with_predictions: bool = False) -> dict[str, Any]:
        d = asdict(self)
        d["ci95"] = list(self.ci95)
        if answers := self.by_answer():
            d["by_answer"] = answers
        if not with_predictions:
            d.pop("predictions")
        return d


ANSWER_LABELS = "ABCDEFGHIJ"


def by_answer(predictions: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Accuracy on the examples whose gold answer is A, B, C, ..., and how often each is predicted.

    Why: one accuracy hides *which* answers a head serves. In the lab Transformers the last
    layer's heads split the Aggregate step by answer letter (ablating ``lab-llama-wd``'s L3H0 takes
    gold A and B to 0% and leaves C and D at 100%), which is why no single head takes the task to
    chance. ``predictions``: :class:`EvalResult` rows with integer ``gold`` and ``pred``."""
    n_opts = 1 + max([max(p["gold"], p["pred"]) for p in predictions], default=-1)
    out = []
    for i in range(n_opts):
        gold = [p for p in predictions if p["gold"] == i]
        out.append({"answer": ANSWER_LABELS[i] if i < len(ANSWER_LABELS) else str(i), "n": len(gold),
                    "accuracy": sum(bool(p["correct"]) for p in gold) / len(gold) if gold else None,
                    "predicted": sum(p["pred"] == i for p in predictions) / len(predictions)})
    return out


def answers_text(rows: Sequence[dict[str, Any]]) -> str:
    """``by gold answer A 98% B 0% ...; predicted A 24% ...``: one line for a terminal."""
    acc = " ".join(f"{r['answer']} {_pct0(r['accuracy'])}" for r in rows)
    pred = " ".join(f"{r['answer']} {_pct0(r['predicted'])}" for r in rows)
    return f"by gold answer {acc}; predicted {pred}"


def _pct0(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def evaluate_examples(
    adapter: ModelAdapter,
    examples: Sequence[Example],
    interventions: Sequence[Intervention] | None = None,
    *,
    task_name: str = "?",
    config: dict[str, Any] | None = None,
    progress: bool = True,
    batch_rows: int | None = None,
) -> EvalResult:
    """Accuracy of the model on multiple-choice examples, under the given interventions
    (``batch_rows``: see :func:`score_examples`)."""
    t0 = time.perf_counter()
    if adapter.n_ctx is not None:  # fail before any work, not halfway through
        for ex in examples:
            adapter.check_length(len(encode(adapter, ex.prompt)))
    preds: list[dict[str, Any]] = []
    correct = correct_norm = 0
    with apply(adapter, interventions):
        scores = score_examples(adapter, examples, batch_rows=batch_rows, progress=progress, desc=task_name)
        for ex, sc in zip(examples, scores, strict=True):
            ok = sc.pred == ex.gold
            correct += ok
            correct_norm += sc.pred_norm == ex.gold
            preds.append({"pred": sc.pred, "gold": ex.gold, "loglik": sc.loglik, "correct": bool(ok)})
    return EvalResult.from_counts(task_name, adapter, correct, len(examples), t0, interventions=interventions,
                                  config=config or {}, predictions=preds, correct_norm=correct_norm)
