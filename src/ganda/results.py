"""Run directories as pandas DataFrames, so any number ganda wrote can be filtered, joined and plotted.

``ganda.results.load(path, ...)`` reads run directories (and the directories under them: a demo's
``heads/``, a lab programme's steps) of every kind ganda writes, and ``ganda eval --predictions``
JSONL files, into four tables; each row carries ``run``, the directory (or file) it came from:

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

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import registry
from .effects import effect, mean_margin_or_nan, ordered
from .errors import GandaError
from .experiments.base import Experiment
from .intervals import split_all

if TYPE_CHECKING:
    import pandas as pd

#: the files ganda's own readers know: any result kind, a sweep, a ranking, ``ganda extends``
RUN_FILES = ("result.json", "results.jsonl", "ranking.json", "extends.json")
PREDICTION_COLUMNS = ["run", "condition", "task", "subject", "doc_id", "example", "gold", "pred", "pred_norm",
                      "correct", "correct_norm", "loglik"]


@dataclass
class _Tables:
    runs: list[dict[str, Any]] = field(default_factory=list)
    heads: list[dict[str, Any]] = field(default_factory=list)
    predictions: list[dict[str, Any]] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class Results:
    """The four tables of one or more runs (see the module docstring)."""

    runs: pd.DataFrame
    heads: pd.DataFrame
    predictions: pd.DataFrame
    rows: pd.DataFrame

    def __repr__(self) -> str:
        sizes = ", ".join(f"{k}: {len(getattr(self, k))} rows" for k in ("runs", "heads", "predictions", "rows"))
        return f"Results({sizes})"


def load(*paths: str | Path) -> Results:
    """Every run under ``paths`` (run directories, directories of runs, predictions JSONL files)."""
    if not paths:
        raise GandaError("results.load: no run directory given")
    t = _Tables()
    for p in paths:
        path = Path(p)
        if path.is_file() and path.suffix == ".jsonl":
            _predictions_file(path, t)
            continue
        if path.is_file():
            raise GandaError(f"{path} is a file, not a run directory (ganda.results.load reads run directories and "
                             "ganda eval --predictions .jsonl files)")
        if not path.is_dir():
            raise GandaError(f"{path}: no such run directory")
        runs = list(_run_dirs(path))
        if not runs:
            raise GandaError(f"{path} is not a ganda run directory (no {', '.join(dict.fromkeys([*RUN_FILES, *_readers()]))} in it or "
                              "under it)")
        for run in runs:
            try:
                _load_run(run, t)
            except (ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:  # one line, never a traceback
                if isinstance(exc, GandaError):
                    raise
                raise GandaError(f"{run}: its result files are damaged or not ganda's ({type(exc).__name__}: {exc})"
                                 ) from None
    try:
        import pandas as pd  # an optional heavy dependency: loaded when tables are built
    except ImportError:
        raise GandaError("ganda.results needs pandas: pip install 'ganda[dev]' or pandas") from None

    def frame(records: list[dict[str, Any]], columns: list[str] | None = None) -> pd.DataFrame:
        df = pd.DataFrame.from_records(records)
        return df.reindex(columns=columns) if columns and df.empty else df

    return Results(runs=frame(t.runs, ["run", "kind", "model", "task", "n", "accuracy"]),
                   heads=frame(t.heads, ["run", "head"]),
                   predictions=frame(t.predictions, PREDICTION_COLUMNS),
                   rows=frame(t.rows, ["run"]))


def _readers() -> dict[str, Any]:
    """What reads each file that makes a directory a run: every registered experiment's
    ``done_file`` (read by the experiment itself where it has a reader, else by the reader of that
    file), ``result.json`` of any result kind and ``ganda extends``' file."""
    out: dict[str, Any] = {"results.jsonl": _sweep, "ranking.json": _ranking, "result.json": _result,
                           "extends.json": _extends}
    for name in registry.experiment_names():
        exp = registry.experiment(name)
        if exp.read.__func__ is not Experiment.read.__func__:  # the experiment reads its own files
            out[exp.done_file] = _own_reader(exp)
        else:
            out.setdefault(exp.done_file, _result)
    return out


def _own_reader(exp: Any) -> Any:
    def read(run: Path, t: _Tables) -> None:
        got = exp.read(run) or {}
        for key in ("runs", "heads", "predictions", "rows"):
            getattr(t, key).extend({"run": str(run), **r} for r in got.get(key, []))
    return read


def _is_run(d: Path) -> bool:
    return any((d / f).is_file() for f in _readers())


def run_dirs(root: str | Path) -> list[Path]:
    """The runs :func:`load` reads under ``root`` (``root`` first when it is one): a grid's jobs, a
    lab programme's steps, every prompt set's."""
    return list(_run_dirs(Path(root)))


def _run_dirs(root: Path) -> Iterable[Path]:
    """``root`` if it is a run, then the runs below it (sorted, so tables keep one order); a
    ranking's ``verify/`` (the exact sweep of its top heads) is part of the ranking, not a run."""
    if _is_run(root):
        yield root
    if (root / "ranking.json").is_file():
        return
    for sub in sorted(p for p in root.iterdir() if p.is_dir()):
        yield from _run_dirs(sub)


def _load_run(run: Path, t: _Tables) -> None:
    for name, read in _readers().items():
        if (run / name).is_file():
            read(run, t)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise GandaError(f"{path}: not readable as JSON ({exc})") from None


def _task_name(task: Any) -> Any:
    return task.get("task") if isinstance(task, dict) else task


def _scalars(d: dict[str, Any] | None, skip: Iterable[str] = ()) -> dict[str, Any]:
    """The numbers, texts and flags of a summary (nested records and lists left out)."""
    return {k: v for k, v in (d or {}).items() if k not in skip and (v is None or isinstance(v, str | int | float))}


def _run_row(run: Path, kind: str, model: Any, task: Any, n: Any, accuracy: Any, more: dict[str, Any] | None = None
             ) -> dict[str, Any]:
    row = {"run": str(run), "kind": kind, "model": model, "task": _task_name(task), "n": n, "accuracy": accuracy}
    row.update({k: v for k, v in (more or {}).items() if k not in row})
    return row


def _prediction_rows(run: str, condition: str, task: Any, rec: dict[str, Any], ids: list[dict] | None = None
                     ) -> list[dict[str, Any]]:
    """A sweep record's per-example lists as one row per example."""
    out = []
    for i, (gold, pred, pred_norm, ll) in enumerate(zip(rec["gold"], rec["pred"], rec["pred_norm"], rec["loglik"],
                                                        strict=True)):
        key = ids[i] if ids else {"task": task, "subject": None, "doc_id": None}
        out.append({"run": run, "condition": condition, "task": key.get("task"), "subject": key.get("subject"),
                    "doc_id": key.get("doc_id"), "example": i, "gold": gold, "pred": pred, "pred_norm": pred_norm,
                    "correct": pred == gold, "correct_norm": pred_norm == gold, "loglik": ll})
    return out


def _sweep_records(path: Path) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """A finished sweep's ``results.jsonl``: its config, the intact baseline and one record per head."""
    lines = []
    for i, x in enumerate(path.read_text().splitlines(), 1):
        if not x.strip():
            continue
        try:
            rec = json.loads(x)
        except ValueError:
            rec = None
        if not isinstance(rec, dict):
            raise GandaError(f"{path}, line {i}: not a JSON object; the file is damaged or not ganda's")
        lines.append(rec)
    header = next((x for x in lines if x.get("type") == "header"), None)
    base = next((x for x in lines if x.get("type") == "baseline"), None)
    if header is None or base is None:
        raise GandaError(f"{path} is not a finished sweep (no header or baseline)")
    return header.get("config", {}), base, [x for x in lines if x.get("type") == "head"]


def _sweep_predictions(run: Path, cfg: dict[str, Any], base: dict[str, Any], heads: list[dict[str, Any]]
                       ) -> list[dict[str, Any]]:
    """Every example of a sweep, intact and under each head's ablation."""
    task, ids = _task_name(cfg.get("task")), cfg.get("ids")
    rows = _prediction_rows(str(run), "intact", task, base, ids)
    for r in heads:
        rows += _prediction_rows(str(run), r["head"], task, r, ids)
    return rows


def _sweep(run: Path, t: _Tables) -> None:
    """``results.jsonl``: header, intact baseline, one record per ablated head."""
    cfg, base, heads = _sweep_records(run / "results.jsonl")
    task = _task_name(cfg.get("task"))
    t.runs.append(_run_row(run, "sweep", cfg.get("model"), task, base["n"], base["acc"],
                           {"acc_norm": base["acc_norm"], "heads": len(heads), "seed": cfg.get("seed")}))
    gold_ll, margin = _gold_loglik(base), mean_margin_or_nan(base["loglik"], base["gold"])
    for r in heads:
        t.heads.append({"run": str(run), "head": r["head"], "layer": r["layer"], "index": r["index"],
                        "mixer": r.get("kind") or "", "n": r["n"], "acc": r["acc"], "acc_norm": r["acc_norm"],
                        "drop": base["acc"] - r["acc"], "drop_norm": base["acc_norm"] - r["acc_norm"],
                        "gold_loglik_drop": gold_ll - _gold_loglik(r),
                        "margin_drop": effect(margin, mean_margin_or_nan(r["loglik"], r["gold"]))})
    t.predictions += _sweep_predictions(run, cfg, base, heads)


def _gold_loglik(rec: dict[str, Any]) -> float:
    lls = [ll[g] for ll, g in zip(rec["loglik"], rec["gold"], strict=True)]
    return sum(lls) / max(1, len(lls))


def _ranking(run: Path, t: _Tables) -> None:
    """``ranking.json`` of ``ganda rank``: every head's attribution estimate, the exact effect of the
    verified ones, and both ranks; the predictions of its exact sweep (``verify/``), where it ran one."""
    d = _read_json(run / "ranking.json")
    if (run / "verify" / "results.jsonl").is_file():
        t.predictions += _sweep_predictions(run, *_sweep_records(run / "verify" / "results.jsonl"))
    seconds = d.get("seconds") or {}
    t.runs.append(_run_row(run, "rank", d.get("model"), d.get("task"), d.get("n"), None,
                           {"method": d.get("method"), "ablation": d.get("ablation"), "margin": d.get("margin"),
                            "metric": d.get("metric", "margin"), "clean_margin": d.get("clean"), "verified": d.get("verified"),
                            "spearman_verified": d.get("spearman_verified"), "seconds": seconds.get("total")}))
    rows = d.get("ranking") or []  # the final order: verified heads by signed exact effect, then the rest by estimate
    values = {col: {r["head"]: r[col] for r in rows if r.get(col) is not None} for col in ("estimate", "exact", "acc_drop")}
    ranks = {"estimate": ordered(values["estimate"], by_name=True),
             "exact": ordered(values["exact"], values["acc_drop"], by_name=True)}
    ranks = {col: {h: i + 1 for i, h in enumerate(order)} for col, order in ranks.items()}  # ganda rank's ranks
    audited = set(d.get("audited") or [])
    for i, r in enumerate(rows, 1):
        t.heads.append({"run": str(run), "head": r["head"], "rank": i, "estimate": r.get("estimate"),
                        "exact": r.get("exact"), "acc_drop": r.get("acc_drop"),
                        "rank_estimate": ranks["estimate"].get(r["head"]),
                        "rank_exact": ranks["exact"].get(r["head"]), "audited": r["head"] in audited})


def _result(run: Path, t: _Tables) -> None:
    """``result.json`` of any registered kind: the run row from its summary, its table as ``rows``,
    and its heads where it has some (``heads``, ``demo``, ``roles``)."""
    d = _read_json(run / "result.json")
    if not isinstance(d, dict):
        raise GandaError(f"{run / 'result.json'} is not a ganda result (not a JSON object)")
    d = split_all(d)  # intervals as two numbers, also from a file that wrote them otherwise
    kind = str(d.get("kind", "?"))
    cfg = d.get("config") if isinstance(d.get("config"), dict) else {}
    summary = d.get("summary") if isinstance(d.get("summary"), dict) else {}
    task = cfg.get("task") or d.get("task") or (",".join(cfg["tasks"]) if isinstance(cfg.get("tasks"), list) else None)
    n = next((x for x in (summary.get("n_measure"), summary.get("n_verify"), cfg.get("n"), d.get("n"), cfg.get("limit"))
              if x is not None), None)
    acc = summary.get("baseline_accuracy")
    t.runs.append(_run_row(run, kind, d.get("model") or _models(d), task, n, acc,
                           {"created": d.get("created"), **_scalars(summary, skip=("baseline_accuracy",))}))
    rows = d.get("rows") if kind != "sharpness" else d.get("differences")
    if isinstance(rows, list):
        t.rows += [{"run": str(run), **r} for r in rows if isinstance(r, dict)]
    heads = {"heads": d.get("all_heads"), "demo": d.get("heads") or d.get("candidates")}.get(kind)
    if heads is None and isinstance(rows, list) and rows and all(isinstance(r, dict) and "head" in r for r in rows):
        heads = rows
    for h in heads or []:
        t.heads.append({"run": str(run), **{k: v for k, v in h.items() if not isinstance(v, dict | list)}})


def _models(d: dict[str, Any]) -> str | None:
    """A sharpness run compares several models: their names, comma-separated."""
    models = d.get("models")
    return ",".join(models) if isinstance(models, dict) and models else None


def _extends(run: Path, t: _Tables) -> None:
    """``ganda extends``: ``extends.json`` (one result per task and condition) and, per task and
    condition, ``predictions/<task>.<condition>.jsonl``."""
    d = split_all(_read_json(run / "extends.json"))
    results = [r for r in d.get("results") or [] if isinstance(r, dict)]
    t.runs.append(_run_row(run, "extends", d.get("model"), ",".join(dict.fromkeys(r["task"] for r in results)),
                           d.get("limit"), None, {"heads": d.get("heads"), "control_heads": d.get("control_heads")}))
    t.rows += [{"run": str(run), **{k: v for k, v in r.items() if not isinstance(v, dict)}} for r in results]
    for r in results:
        path = run / "predictions" / f"{r['task']}.{r['condition']}.jsonl"
        if path.is_file():
            t.predictions += _prediction_records(path, run=str(run), condition=r["condition"])


def _prediction_records(path: Path, run: str, condition: str | None) -> list[dict[str, Any]]:
    """The rows of one predictions JSONL file (one JSON object per example)."""
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
    rows = []
    for i, rec in enumerate(recs):
        key = rec.get("id") or {}
        row = {"run": run, "condition": condition, "task": key.get("task"), "subject": key.get("subject"),
               "doc_id": key.get("doc_id"), "example": i}
        row.update({k: v for k, v in rec.items() if k != "id"})
        rows.append(row)
    return rows


def _predictions_file(path: Path, t: _Tables) -> None:
    """A ``ganda eval --predictions`` file: one JSON object per example."""
    rows = _prediction_records(path, run=str(path), condition=None)
    if not rows:
        raise GandaError(f"{path} holds no predictions")
    t.predictions += rows
    t.runs.append(_run_row(path, "predictions", None, rows[0]["task"], len(rows),
                           sum(bool(r["correct"]) for r in rows) / len(rows)))


__all__ = ["Results", "load"]
