"""Task groups, lm-eval's ``group``: each member task scored as a task of its own (by the ordinary
scorer, :func:`ganda.scoring.evaluate_examples`) and the group's score, the unweighted mean of the
members' accuracies. ``knowledge`` (:mod:`ganda.tasks.knowledge`, scored like lm-eval 0-shot) is the
paper's control axis, which G&A ablations should leave intact."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from .errors import GandaError
from .intervals import ci
from .interventions import Intervention, apply, describe_all
from .models.base import ModelAdapter
from .scoring import evaluate_examples
from .tasks import KNOWLEDGE, KNOWLEDGE_TASKS, get_task


def group_score(per_task: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """A group's score from its members' ``{"accuracy", "n", ...}``: the unweighted mean accuracy
    (the paper's knowledge score), the examples in all, and each member's accuracy."""
    accs = {t: float(s["accuracy"]) for t, s in per_task.items()}
    return {"accuracy": sum(accs.values()) / max(1, len(accs)), **ci(None),
            "n": sum(int(s["n"]) for s in per_task.values()), "tasks": accs}


def evaluate_knowledge(
    adapter: ModelAdapter,
    interventions: Sequence[Intervention] | None = None,
    limit: int | None = None,
    *,
    tasks: Sequence[str] = KNOWLEDGE_TASKS,
    seed: int = 0,
    progress: bool = True,
) -> dict[str, Any]:
    """Each task's ``acc`` (and ``acc_norm`` where the task reports it) of the ``knowledge`` group
    (or ``tasks`` of it) and the mean ``acc`` over them, under ``interventions``: ``limit`` examples
    per task (the first ones, like lm-eval's ``--limit``, when ``seed`` is 0)."""
    if limit is not None and limit < 1:
        raise GandaError(f"{KNOWLEDGE}: limit must be at least 1, got {limit}")
    out: dict[str, Any] = {"tasks": {}, "limit": limit, "seed": seed, "interventions": describe_all(interventions)}
    t0 = time.perf_counter()
    with apply(adapter, interventions):
        for task_name in tasks:
            task = get_task(task_name, adapter=adapter)
            r = evaluate_examples(adapter, task.examples(limit=limit, seed=seed), task_name=task_name,
                                  progress=progress)
            res: dict[str, Any] = {"n": r.n, "acc": r.accuracy, **ci((r.ci_low, r.ci_high))}
            if "acc_norm" in getattr(task, "metrics", ()):
                res["acc_norm"] = r.acc_norm
            out["tasks"][task_name] = res
    out["mean"] = sum(r["acc"] for r in out["tasks"].values()) / max(1, len(out["tasks"]))
    out["seconds"] = time.perf_counter() - t0
    return out


__all__ = ["KNOWLEDGE_TASKS", "evaluate_knowledge", "group_score"]
