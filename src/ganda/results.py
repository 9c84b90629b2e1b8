"""Run directories as pandas DataFrames, so any number ganda wrote can be filtered, joined and plotted.

``ganda.results.load(path, ...)`` reads run directories (and the directories under them: a demo's
``heads/``, a lab programme's steps) of every registered kind, and ``ganda eval --predictions``
JSONL files, into four tables; each row carries ``run``, the directory (or file) it came from.
A run directory is read by its kind's registered result class alone
(:func:`ganda.experiments.read_run`, :meth:`ganda.experiments.ExperimentResult.tables`):

* ``runs``: one row per run: ``kind``, ``model``, ``task``, ``n``, ``accuracy`` (the intact
  baseline where the run has one), then the run's summary numbers;
* ``heads``: one row per head and run: a sweep's accuracy and drop per head, a ranking's estimate
  and exact effect, the pattern scores of ``ganda heads``, a demo's candidates, a roles run's labels;
* ``predictions``: one row per example and condition (``condition``: ``intact`` or the ablated head):
  ``task``, ``subject``, ``doc_id`` (see :meth:`ganda.tasks.base.Example.key`), ``gold``, ``pred``,
  ``pred_norm``, ``correct``, ``correct_norm`` and ``loglik`` (every choice's log-likelihood). The
  runs that keep their examples fill it: a sweep, a ranking (the exact sweep of its verified heads),
  ``ganda extends`` (each condition), a ``ganda eval --predictions`` file, and a demo's ``ranking/``.
  The other kinds (``prune``, ``retain``, ``kv_curve``, ``mask_last_row``, ``transplant``, ``roles``,
  ``heads``, ``sharpness``, ``circuit_path``, ``demo``, the lab's) write accuracies with their
  intervals, not their examples, and add no rows; ``circuit_edges`` keeps each verified edge's
  log-likelihoods per example in ``edges_exact.jsonl``, which is not read here;
* ``rows``: the table of an experiment (``<kind>.csv``: conditions by task scores).

Every interval is two numbers, ``<name>_ci_low`` and ``<name>_ci_high`` (:mod:`ganda.intervals`).

A table a run does not have is empty, not missing. pandas is imported when a table is built.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import experiments
from .errors import GandaError
from .experiments.common import prediction_records, run_row

if TYPE_CHECKING:
    import pandas as pd

PREDICTION_COLUMNS = ["run", "condition", "task", "subject", "doc_id", "example", "gold", "pred", "pred_norm",
                      "correct", "correct_norm", "loglik"]
TABLES = ("runs", "heads", "predictions", "rows")


@dataclass(frozen=True)
class Results:
    """The four tables of one or more runs (see the module docstring)."""

    runs: pd.DataFrame
    heads: pd.DataFrame
    predictions: pd.DataFrame
    rows: pd.DataFrame

    def __repr__(self) -> str:
        sizes = ", ".join(f"{k}: {len(getattr(self, k))} rows" for k in TABLES)
        return f"Results({sizes})"


def load(*paths: str | Path) -> Results:
    """Every run under ``paths`` (run directories, directories of runs, predictions JSONL files),
    each read by its kind's registered result class (:func:`ganda.experiments.read_run`)."""
    if not paths:
        raise GandaError("results.load: no run directory given")
    t: dict[str, list[dict[str, Any]]] = {name: [] for name in TABLES}
    for p in paths:
        path = Path(p)
        if path.is_file() and path.suffix == ".jsonl":
            _predictions_file(path, t)
            continue
        runs = runs_in(path)
        for run in runs:
            try:
                got = experiments.read_run(run).tables(str(run))  # type: ignore[union-attr]
            except (ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:  # one line, never a traceback
                if isinstance(exc, GandaError):
                    raise
                raise GandaError(f"{run}: its result files are damaged or not ganda's ({type(exc).__name__}: {exc})"
                                 ) from None
            for name in TABLES:
                t[name] += got.get(name, [])
    try:
        import pandas as pd  # an optional heavy dependency: loaded when tables are built
    except ImportError:
        raise GandaError("ganda.results needs pandas: pip install 'ganda[dev]' or pandas") from None

    def frame(records: list[dict[str, Any]], columns: list[str] | None = None) -> pd.DataFrame:
        df = pd.DataFrame.from_records(records)
        return df.reindex(columns=columns) if columns and df.empty else df

    return Results(runs=frame(t["runs"], ["run", "kind", "model", "task", "n", "accuracy"]),
                   heads=frame(t["heads"], ["run", "head"]),
                   predictions=frame(t["predictions"], PREDICTION_COLUMNS),
                   rows=frame(t["rows"], ["run"]))


def runs_in(path: str | Path) -> list[Path]:
    """The runs :func:`load` and ``ganda report`` read under a directory a user gave (the directory
    first when it is one): a grid's jobs, a lab programme's steps, every prompt set's. A file, a
    missing directory or one with no run in it or under it is refused in one line."""
    path = Path(path)
    if path.is_file():
        raise GandaError(f"{path} is a file, not a run directory")
    if not path.is_dir():
        raise GandaError(f"{path}: no such run directory")
    runs = list(_run_dirs(path))
    if not runs:
        raise GandaError(f"{path} is not a ganda run directory (no {', '.join(experiments.run_files())} in it or "
                         "under it)")
    return runs


def _run_dirs(root: Path) -> Iterable[Path]:
    """``root`` if it is a run, then the runs below it (sorted, so tables keep one order), unless
    its kind holds the directories below it (a ranking's ``verify/``, the exact sweep of its top heads)."""
    kind = experiments.run_kind(root)
    if kind is not None:
        yield root
        if experiments.result_class(kind).holds_below:
            return
    for sub in sorted(p for p in root.iterdir() if p.is_dir()):
        yield from _run_dirs(sub)


def _predictions_file(path: Path, t: dict[str, list[dict[str, Any]]]) -> None:
    """A ``ganda eval --predictions`` file: one JSON object per example."""
    rows = prediction_records(path, run=str(path), condition=None)
    if not rows:
        raise GandaError(f"{path} holds no predictions")
    t["predictions"] += rows
    t["runs"].append(run_row(str(path), "predictions", None, rows[0]["task"], len(rows),
                             sum(bool(r["correct"]) for r in rows) / len(rows)))


__all__ = ["Results", "load", "runs_in"]
