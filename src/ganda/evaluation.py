"""The one entry point that evaluates a task: multiple-choice tasks by log-likelihood
(:mod:`ganda.scoring`), generation tasks by greedy generation (:mod:`ganda.generation`)."""

from __future__ import annotations

from collections.abc import Sequence

from .errors import GandaError
from .generation import evaluate_generation
from .interventions import Intervention
from .models.base import ModelAdapter
from .scoring import EvalResult, evaluate_examples
from .tasks.base import Example, Task


def evaluate(
    adapter: ModelAdapter,
    task: Task,
    interventions: Sequence[Intervention] | None = None,
    *,
    limit: int | None = None,
    seed: int = 0,
    progress: bool = True,
    prefix_cache: bool | None = None,
) -> EvalResult:
    """Accuracy of the model on a task's examples under the given interventions. A task that gives
    no examples (``limit=0``) is an error: an accuracy over nothing is no number.

    Multiple-choice examples are packed (each context once, its choices as short suffixes) and
    prompt prefixes shared by several examples (few-shot exemplars) run once, under the
    interventions; ``prefix_cache=False`` (or ``GANDA_PREFIX_CACHE=0``) runs every row whole."""
    task.check_model(adapter)  # a task whose data come from a model (the lab's world) scores that model only
    examples = task.examples(limit=limit, seed=seed)
    if not examples:
        raise GandaError(f"task {task.name!r} gave no examples to score (limit={limit})")
    return evaluate_on(adapter, task, examples, interventions, limit=limit, seed=seed, progress=progress,
                       prefix_cache=prefix_cache)


def evaluate_on(adapter: ModelAdapter, task: Task, examples: Sequence[Example],
                interventions: Sequence[Intervention] | None = None, *, limit: int | None, seed: int,
                progress: bool = True, prefix_cache: bool | None = None) -> EvalResult:
    """``task``'s ``examples`` (drawn with ``limit`` and ``seed``, which the result's config records)
    scored the task's way: multiple choice by log-likelihood, a generation task by exact match of
    its greedy generations (GSM8K, BBH). A shard of a task's examples is scored the same way."""
    if task.kind != "mc":
        res = evaluate_generation(adapter, task, examples, interventions, seed=seed, progress=progress,
                                  prefix_cache=prefix_cache)
        res.config.update(limit=limit, n=res.n)
        return res
    return evaluate_examples(
        adapter, examples, interventions, task_name=task.name,
        config=task.run_config(limit, len(examples), seed), progress=progress, prefix_cache=prefix_cache,
    )
