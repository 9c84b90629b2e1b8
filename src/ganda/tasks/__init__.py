"""Tasks: one module each, found by name through :func:`get_task`."""

from __future__ import annotations

import importlib
from typing import Any

from ..errors import GandaError
from .base import Example, Task, token_spans

# name -> "module:factory"; factories take keyword options (unknown ones are rejected).
TASKS: dict[str, str] = {
    "kv": "ganda.tasks.kv:KVTask",
    "letters": "ganda.tasks.letters:LettersTask",
    "mmlu": "ganda.tasks.mmlu:MMLUTask",
    "gsm8k": "ganda.tasks.gsm8k:GSM8KTask",
    "gsm8k-cot": "ganda.tasks.gsm8k:GSM8KCoTTask",
    "bbh": "ganda.tasks.bbh:BBHTask",
    "dream": "ganda.tasks.dream:DreamTask",
    "dream-letters": "ganda.tasks.dream:DreamLettersTask",
    # knowledge tasks (the paper's control: they should not move when G&A heads are ablated)
    "arc_easy": "ganda.tasks.knowledge:ArcEasyTask",
    "arc_challenge": "ganda.tasks.knowledge:ArcChallengeTask",
    "openbookqa": "ganda.tasks.knowledge:OpenBookQATask",
    "piqa": "ganda.tasks.knowledge:PIQATask",
    "hellaswag": "ganda.tasks.knowledge:HellaSwagTask",
    "winogrande": "ganda.tasks.knowledge:WinograndeTask",
}


def register_task(name: str, target: str) -> None:
    TASKS[name] = target


def get_task(name: str, **options: Any) -> Task:
    """Build a task by name; options that are None are left at the task's defaults."""
    if name not in TASKS:
        import ganda.lab  # noqa: F401  (registers the lab's synthetic-world tasks)
    if name not in TASKS:
        raise GandaError(f"unknown task {name!r}; known: {', '.join(sorted(TASKS))}")
    module, factory = TASKS[name].split(":")
    cls = getattr(importlib.import_module(module), factory)
    opts = {k: v for k, v in options.items() if v is not None}
    try:
        return cls(**opts)
    except TypeError as exc:
        raise GandaError(f"task {name!r}: {exc}") from None


__all__ = ["Example", "TASKS", "Task", "get_task", "register_task", "token_spans"]
