"""What every experiment shares: scoring a model on the paper's two axes (MMLU vs knowledge),
a result object that saves itself as JSON + CSV + PNG, and provenance for re-running.

Scores are summarised as plain dicts ``{"accuracy", "ci_low", "ci_high", "n"}`` so results stay JSON.
An experiment's task list names registered tasks (:func:`ganda.registry.register_task`), a number
after a task that declares one setting that option (``kv20``: ``kv`` with 20 pairs), and task
groups (:func:`ganda.registry.register_group`), such as ``knowledge``: the mean accuracy over the
knowledge tasks, each member scored as a task of its own (:func:`ganda.knowledge.group_score`).
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from .. import registry, runio
from ..errors import GandaError
from ..intervals import bounds, ci, split_all
from ..interventions import Intervention
from ..knowledge import group_score
from ..models.base import ModelAdapter
from ..scoring import EvalResult, evaluate_examples
from ..stats import paired_difference, pool_sets, wilson
from ..tasks import get_task

log = logging.getLogger(__name__)

def is_group(name: str) -> bool:
    """True for a task group's name (``knowledge``)."""
    return registry.group_members(name) is not None


def chance(task: str) -> float:
    """Chance accuracy of a name in a task list, as its task declares it (``Task.chance``; 0.0 for
    groups and unknown names)."""
    spec = registry.parse_task_name(task)
    if spec is None:
        return 0.0
    cls = registry.task_class(spec[0])
    return cls.chance(spec[1]) if cls is not None else 0.0


def _mc_task_names() -> list[str]:
    return [n for n in registry.task_names() if getattr(registry.task_class(n), "kind", None) == "mc"]


def task_columns(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The columns of result rows that hold a task's score (``knowledge``, ``mmlu``, ``kv20``, ...)."""
    return [k for k in runio.columns(rows) if is_group(k) or registry.parse_task_name(k) is not None]


def task_series(rows: Sequence[dict[str, Any]], tasks: Sequence[str] | None = None
                ) -> tuple[dict[str, list[Any]], dict[str, tuple[list[Any], list[Any]]]]:
    """What a figure of result rows draws: each task's scores over ``rows`` (``tasks``, default
    :func:`task_columns`) and, where every row has it, their 95% intervals (low, high)."""
    series, intervals = {}, {}
    for t in tasks or task_columns(rows):
        series[t] = [r.get(t) for r in rows]
        if all(f"{t}_ci_low" in r for r in rows):
            intervals[t] = ([r[f"{t}_ci_low"] for r in rows], [r[f"{t}_ci_high"] for r in rows])
    return series, intervals


def parse_tasks(text: str | Sequence[str]) -> list[str]:
    """An experiment's task list, checked before any model loads: every name a multiple-choice task
    (or a group such as ``knowledge``), every option it sets within the task's bounds."""
    items = [t.strip() for t in (text.split(",") if isinstance(text, str) else text) if t.strip()]
    for t in items:
        if is_group(t):
            continue
        spec = registry.parse_task_name(t)
        cls = registry.task_class(spec[0]) if spec is not None else None
        if cls is None or cls.kind != "mc":
            numbered = [n for n in _mc_task_names() if registry.number_option(n)]
            hint = "; ".join(f"{n}N: {n} with {registry.number_option(n)} N" for n in numbered)
            why = "unknown task" if cls is None else "not a multiple-choice task"
            raise GandaError(f"{why} {t!r}; experiments take: {', '.join([*registry.group_names(), *_mc_task_names()])}"
                             + (f" ({hint})" if hint else ""))
        if spec[1]:
            get_task(spec[0], **spec[1])  # kv1, lab-kv999: refused by the task's declared bounds
    if not items:
        raise GandaError("no task given")
    return items


def _identity(ex: Any) -> tuple[Any, ...]:
    """What makes two examples the same prompt: its text, choices, gold answer and target."""
    return (ex.prompt, tuple(ex.choices), ex.gold, ex.target)


def prompt_sets(draw: Callable[[int | None, int], list[Any]], limit: int | None, seed: int, count: int
                ) -> list[tuple[list[Any], bool]]:
    """A task's first ``count`` prompt sets, each with whether it is disjoint from the sets before it.

    Set k (0 first) is ``draw(limit, seed + k)`` without the prompts of sets 0 to k - 1. Where
    removing them leaves fewer than ``limit`` prompts, a larger draw of the same seed fills the set
    (a generated task's draw of one seed grows by adding prompts). A task whose draw ignores the
    seed (MMLU's first ``limit`` questions of each subject) cannot give a disjoint set: set k is
    then its plain draw, recorded as not disjoint. ``draw`` is ``task.examples``,
    ``(limit, seed) -> examples``; the sets are the same wherever they are drawn (a Ray worker
    draws the same ones)."""
    out: list[tuple[list[Any], bool]] = []
    seen: set[tuple[Any, ...]] = set()
    for k in range(count):
        first = draw(limit, seed + k)
        fresh = [ex for ex in first if _identity(ex) not in seen]
        if limit is not None and len(fresh) < len(first):
            fresh = [ex for ex in draw(2 * limit + len(seen), seed + k) if _identity(ex) not in seen][:limit]
        disjoint = len(fresh) >= len(first)
        chosen = fresh if disjoint else first
        out.append((chosen, disjoint))
        seen.update(_identity(ex) for ex in chosen)
    return out


def prompt_set(draw: Callable[[int | None, int], list[Any]], limit: int | None, seed: int, k: int
               ) -> tuple[list[Any], bool]:
    """Prompt set ``k`` of :func:`prompt_sets` (set 0 is the plain ``draw(limit, seed)``)."""
    return prompt_sets(draw, limit, seed, k + 1)[k]


def per_prompt(result: EvalResult) -> list[float]:
    """Each prompt's correctness (1.0 or 0.0), in order: what a paired comparison of two runs on
    the same prompts resamples."""
    return [float(bool(p["correct"])) for p in result.predictions]


def paired_drop(base: EvalResult, result: EvalResult, seed: int) -> dict[str, Any]:
    """``result``'s accuracy with its interval, and its drop from ``base`` on the same prompts
    (:func:`paired_difference`)."""
    return {"accuracy": result.accuracy, **ci((result.ci_low, result.ci_high)),
            **paired_difference(per_prompt(base), per_prompt(result), seed)}


def pool_over(records: Sequence[dict[str, Any]], name: str, within: tuple[float, float], interval: str | None = None
              ) -> dict[str, Any]:
    """The value ``name`` of one record per prompt set pooled over the sets, each set's interval
    ``interval`` (default ``name``; ``""``: ``ci_low``/``ci_high``) read from its record
    (:func:`ganda.stats.pool_sets`: the interval includes the between-set variation)."""
    key = name if interval is None else interval
    return pool_sets([r[name] for r in records], [bounds(r, key)[0] for r in records],
                     [bounds(r, key)[1] for r in records], within=within)


def task_score(acc: float, n: int, correct: int) -> dict[str, Any]:
    """A task's score as results record it: its accuracy, Wilson 95% interval and count."""
    return {"accuracy": acc, **ci(wilson(correct, n)), "n": n}


@dataclass
class Scorer:
    """Evaluates a fixed set of tasks with fixed examples under any interventions.

    Examples are built once (same questions for every condition, so differences between
    conditions are paired, not sampling noise).
    """

    adapter: ModelAdapter
    tasks: list[str]
    limit: int | None = 100
    knowledge_limit: int | None = None
    seed: int = 0
    progress: bool = True
    sample: bool = False  # mmlu: ``limit`` draws a seeded sample across subjects, not lm-eval's first N of each
    _examples: dict[str, Any] = field(default_factory=dict, init=False, repr=False)

    def _task_examples(self, name: str, limit: int | None | str = "default"):
        """``(task, examples)`` of a name in the task list (``limit``: default the scorer's)."""
        limit = self.limit if limit == "default" else limit
        key = (name, limit)
        if key not in self._examples:
            base, options = registry.parse_task_name(name) or (name, {})
            cls = registry.task_class(base)
            if self.sample and cls is not None and "sample" in cls.option_types():
                options = {**options, "sample": True}
            task = get_task(base, adapter=self.adapter, **options)
            self._examples[key] = (task, task.examples(limit=limit, seed=self.seed))
        return self._examples[key]

    def members(self, name: str) -> list[tuple[str, list[Any]]]:
        """A group's member tasks and their examples (``knowledge_limit`` each, default ``limit``)."""
        klimit = self.knowledge_limit if self.knowledge_limit is not None else self.limit
        return [(m, self._task_examples(m, klimit)[1]) for m in registry.group_members(name) or ()]

    def score(self, interventions: Sequence[Intervention] = (), label: str = "") -> dict[str, Any]:
        """``{task: {"accuracy", "ci_low", "ci_high", "n"} | None}`` for every task (a group: its members' mean,
        :func:`ganda.knowledge.group_score`)."""
        out: dict[str, Any] = {}

        def one(name: str, examples: list[Any]) -> dict[str, Any]:
            r = evaluate_examples(self.adapter, examples, interventions, task_name=f"{name} {label}".strip(),
                                  progress=self.progress)
            return task_score(r.accuracy, r.n, r.correct)

        for name in self.tasks:
            if is_group(name):
                out[name] = group_score({m: one(m, exs) for m, exs in self.members(name)})
            else:
                out[name] = one(name, self._task_examples(name)[1])
        return out

    def config(self) -> dict[str, Any]:
        return {"tasks": self.tasks, "limit": self.limit, "knowledge_limit": self.knowledge_limit, "seed": self.seed}


def pct(x: Any) -> str:
    """``0.915`` -> ``"91.5%"`` (anything that is not a number as it is)."""
    return f"{100 * x:.1f}%" if isinstance(x, int | float) else str(x)


def points(x: Any) -> str:
    """A difference of two accuracies: ``0.125`` -> ``"12.5 points"`` (a percentage of a percentage
    would read as a ratio)."""
    return f"{100 * x:.1f} points" if isinstance(x, int | float) else str(x)


def interval_text(pair: Sequence[float | None] | None, scale: float = 100.0) -> str:
    """An interval as text after its value: ``(0.03, 0.21)`` -> ``" [3.0, 21.0]"`` (``scale`` 100:
    percent or points, one decimal; ``scale`` 1: three decimals), ``""`` where there is none."""
    digits = 1 if scale == 100.0 else 3
    if not pair or len(pair) != 2 or None in pair:
        return ""
    return f" [{scale * pair[0]:.{digits}f}, {scale * pair[1]:.{digits}f}]"  # type: ignore[operator]


def points_ci(r: dict[str, Any], name: str = "drop") -> str:
    """A drop with its interval, as the prompt-set summaries give it: ``+12.0 points [3.0, 21.0]``."""
    return f"{100 * r[name]:+.1f} points{interval_text(bounds(r, name))}"


def acc(scores: dict[str, Any], task: str) -> float | None:
    s = scores.get(task)
    return None if s is None else s["accuracy"]


def flat_scores(scores: dict[str, Any]) -> dict[str, Any]:
    """``{"mmlu": .5, "mmlu_ci_low": .4, "mmlu_ci_high": .6, ...}`` for CSV rows and tables."""
    out: dict[str, Any] = {}
    for t, s in scores.items():
        if s is None:
            out[t] = None
            continue
        out[t] = s["accuracy"]
        if bounds(s)[0] is not None:
            out.update(ci(bounds(s), t))
    return out


@dataclass
class ExperimentResult:
    """Base of every experiment's result: JSON-able, saves itself, draws itself, says what it found.

    Subclasses set ``kind``, fill ``rows`` (the table that becomes the CSV) and implement
    ``draw(out_dir) -> list[Path]`` and ``headline() -> str``; registering the class
    (:func:`ganda.registry.register_result`) lets ``ganda report`` render saved runs of that kind.
    """

    kind: str = "?"
    model: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)
    interventions: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    #: the ``result.json`` the result was read from, as written (:meth:`read`)
    written: dict[str, Any] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        """Every interval as two numbers (:mod:`ganda.intervals`), also in a result read from a file
        that wrote it in another form."""
        self.summary, self.rows, self.extra = (split_all(x) for x in (self.summary, self.rows, self.extra))

    def to_json(self) -> dict[str, Any]:
        return split_all({
            "kind": self.kind,
            "model": self.model,
            "ganda_version": runio.ganda_version(),
            "created": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "summary": self.summary,
            "config": self.config,
            "rows": self.rows,
            "interventions": self.interventions,
            "notes": self.notes,
            **self.extra,
        })

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ExperimentResult:
        known = {"kind", "model", "config", "summary", "rows", "interventions", "notes"}
        extra = {k: v for k, v in d.items() if k not in known | {"ganda_version", "created"}}
        return cls(**{k: d[k] for k in known if k in d}, extra=extra)

    def draw(self, out_dir: Path) -> list[Path]:
        """Write the result's figures into ``out_dir`` and return their paths (none by default)."""
        return []

    def headline(self) -> str:
        """What the run found, in words and numbers: one line per fact, ``**...**`` around the
        numbers that matter (the report prints them in bold). Empty: nothing to headline."""
        return ""

    def save(self, out_dir: str | Path, command: str | None = None) -> Path:
        """Write ``result.json``, ``<kind>.csv`` and the figures into ``out_dir``."""
        out = self.save_json(out_dir, command)
        if self.rows:
            runio.write_csv(out / f"{self.kind}.csv", self.rows)
        self.draw(out)
        return out

    def save_json(self, out_dir: str | Path, command: str | None = None) -> Path:
        """Write ``result.json`` alone: what a run whose tables and figures its engine wrote adds,
        so that every run directory holds one (kind, model, options, summary, rows)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        d = self.to_json()
        if command:
            d["command"] = command
        runio.write_json(out / "result.json", d)
        return out

    # ---- reading: a run directory of this kind, as ganda.results.load and ganda report see it ----
    #: the report section's title (the kind where empty)
    title: ClassVar[str] = ""
    #: files other than ``result.json`` that make a directory a run of this kind (older formats,
    #: or a run's journal), the first present read by :meth:`read`
    files: ClassVar[tuple[str, ...]] = ()
    #: files of an unfinished run of this kind (its journal): they make a directory this kind's
    #: run for the output policy (``ganda.runio.run_kind``), and are not read
    claims: ClassVar[tuple[str, ...]] = ()
    #: the figures the report draws from the result when the run directory lacks them (empty: drawn
    #: only for a run directory without any PNG)
    figures: ClassVar[tuple[str, ...]] = ()
    #: the key of ``result.json`` that holds the result's table (``ganda.results.load``'s ``rows``)
    table: ClassVar[str] = "rows"
    #: the directories under a run of this kind are part of it, not runs of their own (a ranking's ``verify/``)
    holds_below: ClassVar[bool] = False

    @classmethod
    def read(cls, run_dir: Path) -> ExperimentResult:
        """The result of ``run_dir`` (its ``result.json``; a subclass with :data:`files` reads those too)."""
        d = read_json_object(Path(run_dir) / "result.json")
        try:
            res = cls.from_json(d)
        except Exception as exc:  # noqa: BLE001 - a result that cannot be rebuilt still shows as one
            log.warning("cannot rebuild the %s result: %s", d.get("kind"), exc)
            res = ExperimentResult.from_json(d)
        res.written = d
        return res

    def page(self) -> dict[str, Any]:
        """What the report shows of the result: the ``result.json`` it was read from, as written."""
        return self.written if self.written is not None else self.to_json()

    def tables(self, run: str) -> dict[str, list[dict[str, Any]]]:
        """The result's rows of :func:`ganda.results.load`'s ``runs``, ``heads``, ``predictions`` and
        ``rows`` tables (``run``: the column that names the run): the run row from the summary, the
        result's table as ``rows``, and its per-head records (a ``heads`` or ``all_heads`` list, or
        rows that each name a head) as ``heads``."""
        d = split_all(self.page())
        cfg = d.get("config") if isinstance(d.get("config"), dict) else {}
        summary = d.get("summary") if isinstance(d.get("summary"), dict) else {}
        task = cfg.get("task") or d.get("task") or (",".join(cfg["tasks"]) if isinstance(cfg.get("tasks"), list) else None)
        n = next((x for x in (summary.get("n_measure"), summary.get("n_verify"), cfg.get("n"), d.get("n"), cfg.get("limit"))
                  if x is not None), None)
        models = d.get("models")  # a comparison of several models names them all
        model = d.get("model") or (",".join(models) if isinstance(models, dict) and models else None)
        base = next((b for b in (summary.get("baseline_accuracy"), summary.get("baseline"))  # roles: "baseline"
                     if isinstance(b, int | float) and not isinstance(b, bool)), None)
        row = run_row(run, str(d.get("kind", self.kind)), model, task, n, base,
                      {"created": d.get("created"), **scalars(summary, skip=("baseline_accuracy",))})
        rows = [r for r in (d.get(self.table) if isinstance(d.get(self.table), list) else []) if isinstance(r, dict)]
        heads = next((x for x in (d.get("heads"), d.get("all_heads")) if is_head_records(x)), None)
        heads = heads if heads is not None else rows if is_head_records(rows) else []
        return {"runs": [row], "rows": [{"run": run, **r} for r in rows],
                "heads": [{"run": run, **{k: v for k, v in h.items() if not isinstance(v, dict | list)}} for h in heads]}


def read_json_object(path: Path) -> dict[str, Any]:
    """A result file's JSON object; a file that is not one is one error naming it."""
    try:
        d = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise GandaError(f"{path} is not valid JSON ({exc}); the file is damaged or not ganda's") from None
    if not isinstance(d, dict):
        raise GandaError(f"{path} is not a ganda result (a JSON {type(d).__name__}, not an object)")
    return d


def is_head_records(x: Any) -> bool:
    """A non-empty list of records that each name a head."""
    return isinstance(x, list) and bool(x) and all(isinstance(r, dict) and "head" in r for r in x)


def scalars(d: dict[str, Any] | None, skip: Sequence[str] = ()) -> dict[str, Any]:
    """The numbers, texts and flags of a summary (nested records and lists left out)."""
    return {k: v for k, v in (d or {}).items() if k not in skip and (v is None or isinstance(v, str | int | float))}


def run_row(run: str, kind: str, model: Any, task: Any, n: Any, accuracy: Any, more: dict[str, Any] | None = None
            ) -> dict[str, Any]:
    """One row of :func:`ganda.results.load`'s ``runs`` table (``accuracy``: the intact baseline)."""
    row = {"run": run, "kind": kind, "model": model, "task": task.get("task") if isinstance(task, dict) else task,
           "n": n, "accuracy": accuracy}
    row.update({k: v for k, v in (more or {}).items() if k not in row})
    return row


def prediction_records(path: Path, run: str, condition: str | None) -> list[dict[str, Any]]:
    """The rows of one predictions JSONL file (``ganda eval --predictions``: one JSON object per example)."""
    recs = []
    for i, line in enumerate(path.read_text().splitlines()):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            raise GandaError(f"{path}:{i + 1} is not a JSON line") from None
        if not isinstance(rec, dict) or "correct" not in rec:
            raise GandaError(f"{path}:{i + 1} is not a ganda prediction (no 'correct')")
        recs.append(rec)
    return [{**prediction_row(run, condition, rec.get("id") or {}, i), **{k: v for k, v in rec.items() if k != "id"}}
            for i, rec in enumerate(recs)]


def prediction_row(run: str, condition: str | None, key: dict[str, Any], example: int) -> dict[str, Any]:
    """What names a row of :func:`ganda.results.load`'s ``predictions`` table: the run, the condition
    (``intact`` or the ablated head) and the example (its ``key``: :meth:`ganda.tasks.base.Example.key`)."""
    return {"run": run, "condition": condition, "task": key.get("task"), "subject": key.get("subject"),
            "doc_id": key.get("doc_id"), "example": example}
