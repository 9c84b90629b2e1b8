"""Section 3 of the paper: cumulative layer pruning (Fig. 2) and remove-and-restore (Fig. 3).

**Pruning curve.** For k = N, N-s, ..., 1 keep only the first k decoder layers (final norm and LM
head kept, no healing) and score MMLU and the knowledge tasks on the same examples.

**Minimal model (the drop rule).** Walk the curve from the full model downwards and look at every
pair of consecutive evaluated points (k_prev > k). The *critical drop* is the pair with the largest
one-step MMLU decrease ``mmlu(k_prev) - mmlu(k)`` (ties: the pair met first while pruning from the
end, i.e. the largest k_prev). The minimal model keeps the first ``k_prev`` layers, i.e. layers
``0..k_prev-1``: every layer up to and including the last one before the drop. With step 1 the
*critical layer* is ``k`` (0-based), the layer whose removal causes the drop, and it is the last
layer of the minimal model. This is the paper's "smallest subnetwork that retains all layers up to
(and including) the layer before the sharp drop in MMLU". The summary also records the drop size,
and whether it is significant (the two Wilson 95% intervals do not overlap).

**Remove-and-restore.** On the minimal model (first m layers), for each layer i < m remove layer
i only, score, and put it back. The *critical layers* are those whose removal costs at least half
of the minimal model's MMLU margin above chance (``drop >= 0.5 * (mmlu_min - 0.25)``), sorted by
drop; the paper finds the last two layers (Gather and Aggregate layers).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from ..errors import GandaError
from ..interventions import KeepLayers, truncate
from ..models.base import ModelAdapter
from .common import CHANCE, ExperimentResult, Scorer, acc, flat_scores


def _series(rows: list[dict[str, Any]], task: str) -> tuple[list[Any], tuple[list[Any], list[Any]] | None]:
    ys = [r.get(task) for r in rows]
    if all(f"{task}_lo" in r for r in rows):
        return ys, ([r[f"{task}_lo"] for r in rows], [r[f"{task}_hi"] for r in rows])
    return ys, None


def _tasks_in(rows: list[dict[str, Any]]) -> list[str]:
    out: list[str] = []
    for r in rows:
        for k in r:
            if k in ("mmlu", "knowledge", "letters") or (k.startswith("kv") and not k.endswith(("_lo", "_hi"))):
                if k not in out:
                    out.append(k)
    return out


def find_drop(points: Sequence[tuple[int, float]]) -> dict[str, Any]:
    """The largest one-step decrease along ``(k, score)`` points sorted by decreasing k."""
    pts = sorted(points, key=lambda p: -p[0])
    if len(pts) < 2:
        raise GandaError("need at least two pruning points to find a drop")
    best = None
    for (k_prev, a), (k, b) in zip(pts, pts[1:], strict=False):
        drop = a - b
        if best is None or drop > best["drop"] + 1e-12:
            best = {"minimal_layers": k_prev, "critical_layer": k_prev - 1, "removed_to": k,
                    "drop_from": a, "drop_to": b, "drop": drop}
    assert best is not None
    return best


@dataclass
class PruneResult(ExperimentResult):
    kind: str = "prune"

    def draw(self, out_dir: Path) -> list[Path]:
        from ..report.figures import curves

        rows = sorted(self.rows, key=lambda r: r["layers"])
        x = [r["layers"] for r in rows]
        series, bands = {}, {}
        for t in _tasks_in(rows):
            ys, band = _series(rows, t)
            series[t] = ys
            if band:
                bands[t] = band
        vlines = {}
        if "minimal_layers" in self.summary:
            vlines[f"minimal model ({self.summary['minimal_layers']} layers)"] = self.summary["minimal_layers"]
        return [curves(x, series, Path(out_dir) / "prune.png", bands=bands, xlabel="layers kept (first k)",
                       hlines={"MMLU chance": CHANCE["mmlu"]} if "mmlu" in series else None, vlines=vlines,
                       title=f"Cumulative layer pruning: {self.model}")]


def prune_curve(
    adapter: ModelAdapter,
    scorer: Scorer,
    *,
    step: int = 1,
    min_layers: int = 1,
    drop_task: str = "mmlu",
) -> PruneResult:
    """Score the first-k-layer models for k = N, N-step, ..., min_layers (Fig. 2)."""
    n = len(adapter.decoder_layers())
    if step < 1:
        raise GandaError("--layers step must be >= 1")
    ks = list(range(n, min_layers - 1, -step))
    if ks[-1] != min_layers and min_layers >= 1:
        ks.append(min_layers)
    rows = []
    for k in tqdm(ks, desc="prune", leave=False, disable=not scorer.progress):
        ivs = [] if k == n else [truncate(k)]
        scores = scorer.score(ivs, label=f"k={k}")
        rows.append({"layers": k, "removed": n - k, **flat_scores(scores)})
    result = PruneResult(model=adapter.spec, config={**scorer.config(), "step": step, "num_layers": n,
                                                   "drop_task": drop_task}, rows=rows)
    pts = [(r["layers"], r[drop_task]) for r in rows if r.get(drop_task) is not None]
    if len(pts) >= 2:
        d = find_drop(pts)
        lo_prev = next(r for r in rows if r["layers"] == d["minimal_layers"]).get(f"{drop_task}_lo")
        hi_next = next(r for r in rows if r["layers"] == d["removed_to"]).get(f"{drop_task}_hi")
        d["significant"] = bool(lo_prev is not None and hi_next is not None and lo_prev > hi_next)
        if step > 1:
            result.notes.append(f"step {step}: the drop is located to within {step} layers; rerun with step 1 near it")
        result.summary = {**d, "full_" + drop_task: rows[0][drop_task]}
        if "knowledge" in scorer.tasks and rows[0].get("knowledge") is not None:
            mrow = next(r for r in rows if r["layers"] == d["minimal_layers"])
            result.summary["full_knowledge"] = rows[0]["knowledge"]
            result.summary["minimal_knowledge"] = mrow.get("knowledge")
    return result


@dataclass
class RemoveRestoreResult(ExperimentResult):
    kind: str = "remove_restore"

    def draw(self, out_dir: Path) -> list[Path]:
        from ..report.figures import bars

        rows = [r for r in self.rows if r.get("removed_layer") is not None]
        base = next((r for r in self.rows if r.get("removed_layer") is None), {})
        labels = [str(r["removed_layer"]) for r in rows]
        series, errors = {}, {}
        for t in _tasks_in(rows):
            ys, band = _series(rows, t)
            series[t] = ys
            if band:
                errors[t] = band
        hl = {f"minimal {t}": base[t] for t in series if base.get(t) is not None}
        hl["MMLU chance"] = CHANCE["mmlu"]
        return [bars(labels, series, Path(out_dir) / "remove_restore.png", errors=errors, hlines=hl,
                     title=f"Remove one layer and restore (minimal model, {self.summary.get('minimal_layers')} layers)",
                     ylabel="accuracy with the layer removed")]


def remove_restore(
    adapter: ModelAdapter, scorer: Scorer, minimal_layers: int, *, drop_task: str = "mmlu"
) -> RemoveRestoreResult:
    """Fig. 3: on the first ``minimal_layers`` layers, remove each layer once and restore it."""
    n = len(adapter.decoder_layers())
    if not 1 <= minimal_layers <= n:
        raise GandaError(f"minimal model of {minimal_layers} layers: the model has {n}")
    keep = list(range(minimal_layers))
    base = scorer.score([KeepLayers(keep)], label="minimal")
    rows: list[dict[str, Any]] = [{"removed_layer": None, **flat_scores(base)}]
    for i in tqdm(keep, desc="remove-restore", leave=False, disable=not scorer.progress):
        scores = scorer.score([KeepLayers([j for j in keep if j != i])], label=f"-L{i}")
        rows.append({"removed_layer": i, **flat_scores(scores)})
    result = RemoveRestoreResult(model=adapter.spec, rows=rows,
                                 config={**scorer.config(), "minimal_layers": minimal_layers, "drop_task": drop_task})
    b = acc(base, drop_task)
    summary: dict[str, Any] = {"minimal_layers": minimal_layers, f"minimal_{drop_task}": b}
    if b is not None:
        drops = sorted(((b - r[drop_task], r["removed_layer"]) for r in rows[1:] if r.get(drop_task) is not None),
                       reverse=True)
        margin = b - CHANCE.get(drop_task, 0.0)
        summary["critical_layers"] = [layer for d, layer in drops if margin > 0 and d >= 0.5 * margin]
        summary["largest_drops"] = [{"layer": layer, "drop": d} for d, layer in drops[:5]]
        if "knowledge" in base and base["knowledge"] is not None:
            summary["minimal_knowledge"] = base["knowledge"]["accuracy"]
    result.summary = summary
    return result
