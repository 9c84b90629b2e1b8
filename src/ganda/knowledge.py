"""The knowledge score: each knowledge task's accuracy (:mod:`ganda.tasks.knowledge`, scored like
lm-eval 0-shot) and their mean, the paper's control axis that G&A ablations should leave intact."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from .errors import GandaError
from .interventions import Intervention, apply, describe_all
from .models.base import ModelAdapter
from .progress import tqdm
from .scoring import score_example
from .stats import wilson
from .tasks.knowledge import KNOWLEDGE_TASKS, make_task


def evaluate_knowledge(
    adapter: ModelAdapter,
    interventions: Sequence[Intervention] | None = None,
    limit: int | None = None,
    *,
    tasks: Sequence[str] = KNOWLEDGE_TASKS,
    seed: int = 0,
    progress: bool = True,
) -> dict[str, Any]:
    """Each knowledge task's ``acc`` (and ``acc_norm`` where lm-eval reports it) and the mean
    ``acc`` over the tasks (the paper's knowledge score), under ``interventions``.

    ``limit`` examples per task (the first ones, like lm-eval's ``--limit``, when ``seed`` is 0).
    """
    if limit is not None and limit < 1:
        raise GandaError(f"knowledge: limit must be at least 1, got {limit}")
    out: dict[str, Any] = {"tasks": {}, "limit": limit, "seed": seed, "interventions": describe_all(interventions)}
    t0 = time.perf_counter()
    with apply(adapter, interventions):
        for name in tasks:
            task = make_task(name)
            exs = task.examples(limit=limit, seed=seed)
            correct = correct_norm = 0
            for ex in tqdm(exs, desc=name, disable=not progress, leave=False):
                sc = score_example(adapter, ex)
                correct += sc.pred == ex.gold
                correct_norm += sc.pred_norm == ex.gold
            n = len(exs)
            res: dict[str, Any] = {"n": n, "acc": correct / n, "ci95": list(wilson(correct, n))}
            if "acc_norm" in task.metrics:
                res["acc_norm"] = correct_norm / n
            out["tasks"][name] = res
    out["mean"] = sum(r["acc"] for r in out["tasks"].values()) / max(1, len(out["tasks"]))
    out["seconds"] = time.perf_counter() - t0
    return out


__all__ = ["KNOWLEDGE_TASKS", "evaluate_knowledge"]
