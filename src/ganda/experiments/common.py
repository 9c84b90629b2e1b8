"""What every experiment shares: scoring a model on the paper's two axes (MMLU vs knowledge),
a result object that saves itself as JSON + CSV + PNG, and provenance for re-running.

Scores are summarised as plain dicts ``{"accuracy", "ci95", "n"}`` so results stay JSON.
``knowledge`` is the mean accuracy over the knowledge-focused tasks (``ganda.tasks.knowledge``);
when that module is missing the score is ``None`` and the result says so instead of failing.
"""

from __future__ import annotations

import csv
import datetime as _dt
import importlib.metadata as md
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import runio
from ..errors import GandaError
from ..interventions import Intervention, describe_all
from ..models.base import ModelAdapter
from ..stats import wilson

log = logging.getLogger(__name__)

CHANCE = {"mmlu": 0.25, "letters": 0.25}


def kv_task_name(name: str) -> tuple[str | None, int | None]:
    """``kv20`` -> ("kv", 20), ``lab-kv16`` -> ("lab-kv", 16), ``kv`` -> ("kv", None); else (None, None)."""
    for base in ("lab-kv", "kv"):
        if name == base:
            return base, None
        if name.startswith(base) and name[len(base):].isdigit():
            return base, int(name[len(base):])
    return None, None


def chance(task: str) -> float:
    """Chance accuracy of a task (kvN, lab-kvN: 1/N; unknown tasks: 0)."""
    base, pairs = kv_task_name(task)
    if pairs:
        return 1 / pairs
    if base is not None:
        return 0.1 if base == "kv" else 0.125
    return CHANCE.get(task.removeprefix("lab-"), 0.0)
KNOWN_TASKS = ("mmlu", "knowledge", "letters", "kv")
LAB_TASKS = ("lab-mmlu", "lab-knowledge", "lab-letters", "lab-kv")  # the CPU lab's tasks (ganda.lab)


def ganda_version() -> str:
    try:
        return md.version("ganda")
    except md.PackageNotFoundError:  # pragma: no cover
        return "?"


def parse_tasks(text: str | Sequence[str]) -> list[str]:
    items = [t.strip() for t in (text.split(",") if isinstance(text, str) else text) if t.strip()]
    bad = [t for t in items if t not in KNOWN_TASKS + LAB_TASKS and kv_task_name(t)[0] is None]
    if bad:
        raise GandaError(f"unknown task {bad[0]!r}; known: {', '.join(KNOWN_TASKS + LAB_TASKS)} "
                         "(kv20 = kv with 20 pairs, lab-kv16 = lab-kv with 16)")
    if not items:
        raise GandaError("no task given")
    return items


def _summary(acc: float, n: int, correct: int | None = None, **extra: Any) -> dict[str, Any]:
    c = round(acc * n) if correct is None else correct
    return {"accuracy": acc, "ci95": list(wilson(c, n)), "n": n, **extra}


def knowledge_available() -> bool:
    try:
        import ganda.tasks.knowledge as k  # noqa: F401

        return hasattr(k, "evaluate_knowledge")
    except ImportError:
        return False


def _knowledge(adapter: ModelAdapter, interventions: Sequence[Intervention], limit: int | None) -> dict[str, Any] | None:
    try:
        from ..tasks.knowledge import evaluate_knowledge
    except ImportError:
        log.warning("ganda.tasks.knowledge is not available: knowledge scores are skipped")
        return None
    res = evaluate_knowledge(adapter, list(interventions), limit)
    return _as_score(res)


def _as_score(res: Any) -> dict[str, Any] | None:
    """Accept an EvalResult, a dict or a float from the knowledge module."""
    if res is None:
        return None
    if isinstance(res, int | float):
        return {"accuracy": float(res), "ci95": None, "n": None}
    if hasattr(res, "accuracy"):
        n = getattr(res, "n", None)
        ci = getattr(res, "ci95", None)
        out = {"accuracy": float(res.accuracy), "ci95": list(ci) if ci else None, "n": n}
        per = getattr(res, "per_task", None) or getattr(res, "tasks", None)
        if isinstance(per, dict):
            out["tasks"] = {k: _as_score(v)["accuracy"] if _as_score(v) else None for k, v in per.items()}
        return out
    if isinstance(res, dict):
        for key in ("accuracy", "mean", "score", "acc"):
            if isinstance(res.get(key), int | float):
                out = {"accuracy": float(res[key]), "ci95": res.get("ci95"), "n": res.get("n")}
                per = res.get("tasks") or res.get("per_task")
                if isinstance(per, dict):
                    out["tasks"] = {
                        k: (v if isinstance(v, int | float) else (_as_score(v) or {}).get("accuracy"))
                        for k, v in per.items()
                    }
                return out
    raise GandaError(f"cannot read a knowledge score from {type(res).__name__}")


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
    _examples: dict[str, Any] = field(default_factory=dict, init=False, repr=False)

    def _task_examples(self, name: str):
        if name not in self._examples:
            from ..tasks import get_task

            base, pairs = kv_task_name(name)
            if base is not None:
                task = get_task(base, adapter=self.adapter, pairs=pairs)
            else:
                task = get_task(name, adapter=self.adapter)
            self._examples[name] = (task, task.examples(limit=self.limit, seed=self.seed))
        return self._examples[name]

    def score(self, interventions: Sequence[Intervention] = (), label: str = "") -> dict[str, Any]:
        """``{task: {"accuracy", "ci95", "n"} | None}`` for every task."""
        from ..scoring import evaluate_examples

        out: dict[str, Any] = {}
        for name in self.tasks:
            if name == "knowledge":
                klimit = self.knowledge_limit if self.knowledge_limit is not None else self.limit
                out[name] = _knowledge(self.adapter, interventions, klimit)
                continue
            task, examples = self._task_examples(name)
            r = evaluate_examples(self.adapter, examples, interventions, task_name=f"{name} {label}".strip(),
                                  progress=self.progress)
            out[name] = _summary(r.accuracy, r.n, r.correct)
        return out

    def config(self) -> dict[str, Any]:
        return {"tasks": self.tasks, "limit": self.limit, "knowledge_limit": self.knowledge_limit, "seed": self.seed}


def acc(scores: dict[str, Any], task: str) -> float | None:
    s = scores.get(task)
    return None if s is None else s["accuracy"]


def flat_scores(scores: dict[str, Any]) -> dict[str, Any]:
    """``{"mmlu": .5, "mmlu_lo": .4, "mmlu_hi": .6, ...}`` for CSV rows and tables."""
    out: dict[str, Any] = {}
    for t, s in scores.items():
        if s is None:
            out[t] = None
            continue
        out[t] = s["accuracy"]
        if s.get("ci95"):
            out[f"{t}_lo"], out[f"{t}_hi"] = s["ci95"]
    return out


@dataclass
class ExperimentResult:
    """Base of every experiment's result: JSON-able, saves itself, draws itself.

    Subclasses set ``kind``, fill ``rows`` (the table that becomes the CSV) and implement
    ``draw(out_dir) -> list[Path]``.
    """

    kind: str = "?"
    model: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)
    interventions: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "model": self.model,
            "ganda_version": ganda_version(),
            "created": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "summary": self.summary,
            "config": self.config,
            "rows": self.rows,
            "interventions": self.interventions,
            "notes": self.notes,
            **self.extra,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ExperimentResult:
        known = {"kind", "model", "config", "summary", "rows", "interventions", "notes"}
        extra = {k: v for k, v in d.items() if k not in known | {"ganda_version", "created"}}
        return cls(**{k: d[k] for k in known if k in d}, extra=extra)

    def draw(self, out_dir: Path) -> list[Path]:  # pragma: no cover - overridden
        return []

    def save(self, out_dir: str | Path, command: str | None = None) -> Path:
        """Write ``result.json``, ``<kind>.csv`` and the figures into ``out_dir``."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        d = self.to_json()
        if command:
            d["command"] = command
        runio.write_text(out / "result.json", json.dumps(d, indent=2, default=str))
        if self.rows:
            write_csv(out / f"{self.kind}.csv", self.rows)
        self.draw(out)
        return out


def write_csv(path: Path, rows: Sequence[dict[str, Any]]) -> Path:
    cols: list[str] = []
    for r in rows:
        for k in r:
            if k not in cols:
                cols.append(k)
    with runio.atomic_open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for r in rows:
            w.writerow({k: (json.dumps(v) if isinstance(v, list | dict) else v) for k, v in r.items()})
    return path


def describe_run(adapter: ModelAdapter, interventions: Sequence[Intervention] = ()) -> dict[str, Any]:
    return {"model": adapter.spec, "interventions": describe_all(interventions)}
