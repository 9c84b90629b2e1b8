"""Tasks: one module each, registered by name (:func:`ganda.registry.register_task`) and built
through :func:`get_task`."""

from __future__ import annotations

from typing import Any

from .. import registry
from ..errors import GandaError
from .base import Example, OptionError, Task, token_spans

# The built-in tasks (name -> "module:Class", imported on first use); plugins add theirs.
BUILTIN_TASKS: dict[str, str] = {
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
for _name, _target in BUILTIN_TASKS.items():
    registry.register_task(_name, _target, number_option="pairs" if _name == "kv" else None)
# the paper's knowledge score: the mean accuracy over its six tasks
KNOWLEDGE = "knowledge"
KNOWLEDGE_TASKS = ("arc_easy", "arc_challenge", "openbookqa", "piqa", "hellaswag", "winogrande")
registry.register_group(KNOWLEDGE, KNOWLEDGE_TASKS)
register_task = registry.register_task


def get_task(name: str, adapter: Any = None, **options: Any) -> Task:
    """Build a task by name; options that are None are left at the task's defaults. A numbered name
    (``kv5``) is its task with that option (``pairs=5``), as in an experiment's task list.

    Options are checked against the task's declaration (:meth:`Task.check_options`: names, types,
    bounds) and any problem is an :class:`OptionError`, one line on the command line.

    With ``adapter`` (the model the task will run on) a task class may take defaults from the
    model through a ``for_model(adapter, options) -> dict`` classmethod: the lab's tasks read the
    world a lab model was trained on from its ``lab.json``, so its facts are the ones it learned
    (and refuse a model whose world is unknown unless ``options`` name one). Options given
    explicitly win over those defaults. Such a task records the model it was built for, and
    :func:`ganda.evaluation.evaluate` refuses to score another with it (:meth:`Task.check_model`).
    """
    cls = registry.task_class(name)
    opts = {k: v for k, v in options.items() if v is not None}
    if cls is None and (spec := registry.parse_task_name(name)) is not None:
        return get_task(spec[0], adapter, **_numbered(name, spec[1], opts))
    if cls is None:
        raise GandaError(f"unknown task {name!r}; known: {', '.join(registry.task_names())}")
    opts = cls.check_options(opts, task=name)
    explicit = any(k in opts for k in getattr(cls, "model_options", ()))
    if adapter is not None and hasattr(cls, "for_model"):
        opts = {**cls.for_model(adapter, opts), **opts}
    try:
        task = cls(**opts)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, GandaError):
            raise
        raise OptionError(f"task {name!r}: {exc}") from None
    if hasattr(cls, "for_model"):  # its data come from a model: which one (Task.check_model)
        task.built_for = "*" if explicit else adapter.spec if adapter is not None else None
    return task


def _numbered(name: str, number: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """The options of a numbered name (``kv5``: ``pairs=5``) with the others given; the same option
    given twice with two values is refused."""
    for key, value in number.items():
        if options.get(key, value) != value:
            raise OptionError(f"task {name!r} has {key} {value}, and {key} {options[key]} is given too")
    return {**options, **number}


def task_for_model(name: str, task: Task, adapter: Any, **options: Any) -> Task:
    """``task`` rebuilt with ``adapter``'s defaults when its class takes any (else ``task``).

    Commands build the task before loading the model, so that a bad task name fails fast, then
    call this once the model is loaded; a model without a tokenizer is refused here, in one line."""
    adapter.require_tokenizer()
    if hasattr(type(task), "for_model"):
        task = get_task(name, adapter=adapter, **options)
    check_representable(name, task, adapter)
    return task


#: the share of unknown tokens in a task's prompts and choices above which its scores mean nothing
MAX_UNKNOWN = 0.05
SAMPLE = 8  # prompts tokenised for the check


def check_representable(name: str, task: Task, adapter: Any) -> None:
    """Refuse a task whose text the model's tokenizer cannot represent: more than :data:`MAX_UNKNOWN`
    of the tokens of its first prompts and choices are the unknown token (the lab tokenizer reads
    ``kv``'s English keys as ``<unk>``), or two choices of one prompt tokenise alike. Scores on such
    prompts are numbers without meaning (an accuracy of 0 that no head explains)."""
    tok = adapter.tokenizer
    unk = getattr(tok, "unk_token_id", None)
    if unk is None:
        return
    examples = task.examples(limit=SAMPLE, seed=0)
    total = unknown = 0
    for ex in examples:
        texts = [ex.prompt, *(ex.choices or [])]
        ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
        total += sum(len(i) for i in ids)
        unknown += sum(x == unk for i in ids for x in i)
        if ex.choices and len({tuple(i) for i in ids[1:]}) < len(ids) - 1:
            raise GandaError(f"task {name!r} cannot be scored on {adapter.spec}: its tokenizer reads two choices of one "
                             f"prompt alike ({', '.join(map(repr, ex.choices[:4]))})")
    if total and unknown / total > MAX_UNKNOWN:
        token = getattr(tok, "unk_token", None) or "the unknown token"
        raise GandaError(f"task {name!r} cannot be represented by {adapter.spec}'s tokenizer: {unknown} of {total} "
                         f"tokens of its first {len(examples)} prompts and choices ({unknown / total:.0%}) are {token}; "
                         "its scores would mean nothing (a lab model reads the lab tasks: lab-kv, lab-mmlu, ...)")


__all__ = ["KNOWLEDGE", "check_representable", "Example", "OptionError", "Task", "get_task", "register_task", "task_for_model", "token_spans"]
