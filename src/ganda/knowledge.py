"""Task groups, lm-eval's ``group``: each member task scored as a task of its own (by the ordinary
scorer, :func:`ganda.scoring.evaluate_examples`) and the group's score, the unweighted mean of the
members' accuracies. ``knowledge`` (:mod:`ganda.tasks.knowledge`, scored like lm-eval 0-shot) is the
paper's control axis, which G&A ablations should leave intact."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from . import registry
from .errors import GandaError
from .intervals import ci
from .interventions import Intervention, apply, describe_all
from .models.base import ModelAdapter
from .scoring import evaluate_examples
from .tasks import KNOWLEDGE, get_task
from .tasks.knowledge import KNOWLEDGE_TASKS


def members_of(group: str | Sequence[str]) -> tuple[str, ...]:
    """A group's member tasks (a registered group's name, or the task names themselves)."""
    if not isinstance(group, str):
        return tuple(group)
    members = registry.group_members(group)
    if members is None:
        raise GandaError(f"{group!r} is not a task group; groups: {', '.join(registry.group_names())}")
    return members


def group_score(per_task: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """A group's score from its members' ``{"accuracy", "n", ...}``: the unweighted mean accuracy
    (the paper's knowledge score), the examples in all, and each member's accuracy."""
    accs = {t: float(s["accuracy"]) for t, s in per_task.items()}
    return {"accuracy": sum(accs.values()) / max(1, len(accs)), **ci(None),
            "n": sum(int(s["n"]) for s in per_task.values()), "tasks": accs}


def evaluate_group(
    adapter: ModelAdapter,
    group: str | Sequence[str] = KNOWLEDGE,
    interventions: Sequence[Intervention] | None = None,
    limit: int | None = None,
    *,
    seed: int = 0,
    progress: bool = True,
    name: str | None = None,
) -> dict[str, Any]:
    """Each member task's ``acc`` (and ``acc_norm`` where the task reports it) and the mean ``acc``
    over the members, under ``interventions``: ``limit`` examples per task (the first ones, like
    lm-eval's ``--limit``, when ``seed`` is 0). ``name``: what an error calls the group."""
    name = name or (group if isinstance(group, str) else "group")
    if limit is not None and limit < 1:
        raise GandaError(f"{name}: limit must be at least 1, got {limit}")
    members = members_of(group)
    out: dict[str, Any] = {"tasks": {}, "limit": limit, "seed": seed, "interventions": describe_all(interventions)}
    t0 = time.perf_counter()
    with apply(adapter, interventions):
        for task_name in members:
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


def evaluate_knowledge(
    adapter: ModelAdapter,
    interventions: Sequence[Intervention] | None = None,
    limit: int | None = None,
    *,
    tasks: Sequence[str] = KNOWLEDGE_TASKS,
    seed: int = 0,
    progress: bool = True,
) -> dict[str, Any]:
    """The ``knowledge`` group (or ``tasks`` of it) scored by :func:`evaluate_group`."""
    return evaluate_group(adapter, tuple(tasks), interventions, limit, seed=seed, progress=progress, name=KNOWLEDGE)


__all__ = ["KNOWLEDGE_TASKS", "evaluate_group", "evaluate_knowledge", "group_score", "members_of"]
